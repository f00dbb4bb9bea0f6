"""`headscope gqa MODEL --kv-heads G`: MHA->GQA/MQA conversion -> OUT/model (checkpoint) and OUT/gqa.json."""

from __future__ import annotations

import argparse
import json
import sys

from ..artifacts import GQA_JSON, MODEL_DIR, outputs
from ..capacity.gqa import convert_and_evaluate
from ..capacity.kv_bytes import human_bytes
from ..capacity.options import GqaOptions
from ..io import atomic_write_text, prepare_out_dir, staged
from ..models.adapter import HeadModel
from ..models.checkpoint import how_it_loads, save_model
from ..options.cli import verb_parser
from ..provenance import provenance
from ._common import load_from_args
from ._uptrain import check_uptrain_args, read_uptrain_texts

OUTPUTS = outputs("gqa")  # model/, gqa.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "gqa", GqaOptions,
        help="convert a LLaMA-like model to fewer KV heads (GQA/MQA), optionally uptrain, save",
        description="Mean-pool the K/V projections of groups of KV heads into KV heads (Ainslie et al. 2023), "
                    "optionally uptrain by distillation, and write a standard checkpoint (OUT/model) plus a report "
                    "(OUT/gqa.json): perplexity before / after conversion / after uptraining on held-out text, and "
                    "KV-cache bytes measured from a real generation cache beside the calculator. "
                    "Supported: llama, mistral, qwen2.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    out = prepare_out_dir(args.out, args.force, OUTPUTS)  # refuse before any slow work
    check_uptrain_args(args)
    data, heldout = read_uptrain_texts(args)  # bad data fails before the model loads; passed on, never read again
    hm = model or load_from_args(args)
    # convert_and_evaluate checks --kv-heads against the model first, before any work.
    final, report = convert_and_evaluate(
        hm,
        args.kv_heads,
        args.grouping,
        data=data,
        heldout=heldout,
        uptrain_steps=args.steps,
        loss=args.loss,
        lr=args.lr,
        train=args.train,
        max_length=args.max_length,
        batch_size=args.batch_size,
        fallback=not args.no_fallback,
        seed=args.seed,
        search_candidates=args.search_candidates,
        progress=True,
    )
    prov = provenance("gqa", hm, data, args, heldout=heldout)  # the original model (conversion leaves it untouched)
    report = {**report, "provenance": prov}
    with staged(out, args.force) as stage:  # model/ and gqa.json appear together, or neither
        save_model(final, stage / MODEL_DIR.name)
        atomic_write_text(stage / GQA_JSON.name, json.dumps(report, indent=2) + "\n")

    r = report
    print(f"{r['model']}: {r['n_layers']} layers, {r['n_heads']} query heads, "
          f"{r['n_kv_heads_before']} -> {r['n_kv_heads_after']} KV heads; grouping {r['grouping_used']}")
    if r.get("search_trace"):
        print(f"search: calibration KL on {r['data']}: adjacent {r['calibration_kl_adjacent']:.4f}, similarity "
              f"{r['calibration_kl_similarity']:.4f}, start ({r['search_start']}) {r['calibration_kl_start']:.4f} -> "
              f"{r['calibration_kl_search']:.4f} after {r['kl_evaluations']} KL evaluations "
              f"({r['search_seconds']:.1f} s); layers changed: {r['layers_changed_by_search']}")
    print(f"perplexity on {r['heldout']} ({len(heldout)} passages, <= {r['max_length']} tokens):")
    print(f"  before      {r['ppl_before']:10.3f}")
    print(f"  converted   {r['ppl_after']:10.3f}   KL to original {r['kl_after']:.4f} nats/token")
    if r["ppl_uptrained"] is not None:
        print(f"  uptrained   {r['ppl_uptrained']:10.3f}   ({args.steps} steps, {args.loss}, "
              f"{args.train}, lr {args.lr:g}, "
              f"on {r['data']})  KL to original {r['kl_uptrained']:.4f}")
    for key, label in (("kv_bytes_before", "before"), ("kv_bytes_after", "after")):
        k = r[key]
        print(f"KV cache {label:<6} {k['measured']:>10} B measured ({human_bytes(k['measured'])}, batch {k['batch']} x "
              f"{k['seq_len']} tokens, {k['dtype']}), calculator {k['calculated']} B "
              f"{'(equal)' if k['match'] else '(DIFFERENT)'}")
    print(f"\nwrote {' and '.join(str(out / n) for n in OUTPUTS)}; the model has {how_it_loads(out / MODEL_DIR.name)}",
          file=sys.stderr)
    return 0
