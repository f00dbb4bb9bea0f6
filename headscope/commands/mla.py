"""`headscope mla MODEL --kv-rank R`: MHA/GQA -> MLA conversion -> OUT/model (checkpoint) and OUT/mla.json."""

from __future__ import annotations

import argparse
import json
import sys

from ..artifacts import MLA_JSON, MODEL_DIR, outputs
from ..capacity.kv_bytes import human_bytes
from ..capacity.mla import SUPPORTED_MODEL_TYPES
from ..capacity.mla.checkpoint import save_mla
from ..capacity.mla.to_latent import convert_and_evaluate
from ..capacity.options import MlaOptions
from ..errors import HeadscopeError
from ..io import atomic_write_text, prepare_out_dir, staged
from ..models.adapter import HeadModel
from ..models.checkpoint import how_it_loads
from ..options.cli import verb_parser
from ..provenance import provenance
from ._common import load_from_args
from ._uptrain import check_uptrain_args, read_uptrain_texts

OUTPUTS = outputs("mla")  # model/, mla.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "mla", MlaOptions,
        help="convert a LLaMA-like model to multi-head latent attention (MHA2MLA), optionally uptrain, save",
        description="Keep RoPE on a few key dimensions per KV head (the frequencies with the largest query x key "
                    "2-norms), factor the other key dimensions and the values jointly into a rank-R latent by SVD "
                    "(Ji et al. 2025, MHA2MLA), optionally uptrain by distillation, and write a checkpoint "
                    "(OUT/model, reloads with headscope.load_model or trust_remote_code) plus OUT/mla.json: "
                    "perplexity before / after / uptrained on held-out text and KV-cache bytes measured from a "
                    f"real generation cache beside the formula. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    # What needs no model is refused before anything loads; convert_and_evaluate checks the rank against the
    # model's full rank (check_mla) right after loading, before any work or any file.
    if args.kv_rank < 1:
        raise HeadscopeError(f"--kv-rank must be at least 1; got {args.kv_rank}")
    if args.rope_dims is not None and (args.rope_dims < 2 or args.rope_dims % 2):
        raise HeadscopeError(f"--rope-dims must be an even number of at least 2 (each rotary frequency rotates "
                             f"2 dimensions); got {args.rope_dims}")
    check_uptrain_args(args)
    if args.device_map is not None:
        raise HeadscopeError("mla builds new latent-attention modules in memory and cannot convert a dispatched "
                             f"model (--device-map {args.device_map}); use --device (and --dtype bfloat16 to halve "
                             "the memory)")
    out = prepare_out_dir(args.out, args.force, OUTPUTS)
    data, heldout = read_uptrain_texts(args)  # passed on, never read again
    hm = model or load_from_args(args)
    final, report = convert_and_evaluate(
        hm, args.kv_rank, args.rope_dims, selection=args.selection, data=data, heldout=heldout,
        uptrain_steps=args.steps, loss=args.loss, lr=args.lr, max_length=args.max_length,
        batch_size=args.batch_size, seed=args.seed, progress=True)
    prov = provenance("mla", hm, data, args, heldout=heldout)  # the original model (conversion leaves it untouched)
    report = {**report, "provenance": prov}
    with staged(out, args.force) as stage:  # model/ and mla.json appear together, or neither
        save_mla(final, stage / MODEL_DIR.name)
        atomic_write_text(stage / MLA_JSON.name, json.dumps(report, indent=2) + "\n")

    r = report
    print(f"{r['model']}: {r['n_layers']} layers, {r['n_heads']} query / {r['n_kv_heads']} KV heads, d_head "
          f"{r['d_head']} -> MLA: latent rank {r['kv_rank']} (full rank {r['full_rank']}), {r['rope_dims']} RoPE "
          f"dims per KV head ({r['selection']})")
    print(f"perplexity on {r['heldout']} ({r['heldout_passages']} passages, <= {r['max_length']} tokens):")
    print(f"  before      {r['ppl_before']:10.3f}")
    print(f"  converted   {r['ppl_after']:10.3f}   KL to original {r['kl_after']:.4f} nats/token")
    if r["ppl_uptrained"] is not None:
        print(f"  uptrained   {r['ppl_uptrained']:10.3f}   ({args.steps} steps, {args.loss}, lr {args.lr:g}, "
              f"on {r['data']})  KL to original {r['kl_uptrained']:.4f}")
    for key, label in (("kv_bytes_before", "before"), ("kv_bytes_after", "after")):
        k = r[key]
        print(f"KV cache {label:<6} {k['bytes_per_token']:>7} B/token; {k['measured']:>9} B measured "
              f"({human_bytes(k['measured'])}, batch {k['batch']} x {k['seq_len']} tokens, {k['dtype']}), formula "
              f"{k['calculated']} B {'(equal)' if k['match'] else '(DIFFERENT)'}")
    print(f"\nwrote {' and '.join(str(out / n) for n in OUTPUTS)}; the model has {how_it_loads(out / MODEL_DIR.name)}",
          file=sys.stderr)
    return 0
