"""`headscope kvcache MODEL --keep-full 25%`: head-aware KV caches (full KV for chosen heads, sink +
window for the rest) against the full cache and a random choice at equal bytes -> kvcache.csv, kvcache.json."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import KVCACHE_CSV, KVCACHE_JSON, outputs, write_csv
from ..capacity.kv_bytes import attention_shape, human_bytes, load_config
from ..capacity.kvcache.cache import check_supported, check_supported_config, check_window
from ..capacity.kvcache.choice import ScoresFile, parse_budgets, read_scores_file, scores_matrix
from ..capacity.kvcache.compare import Settings, check_context, check_positions, compare, retrieval_scores
from ..capacity.kvcache.evaluate import long_passages
from ..capacity.kvcache.learned import learned_rows, passkey_prompts
from ..capacity.kvcache.uptrain import training_batches
from ..capacity.options import KvcacheOptions
from ..data import read_texts
from ..errors import HeadscopeError
from ..export.cards import check_card_path, duo_pattern, write_duo
from ..io import atomic_write_text, prepare_out_dir, staged
from ..models import BUILTINS, load_model
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..provenance import check_made_for, provenance
from ..table import to_jsonable
from ..train import check_settings
from ._common import interval_settings
from ._kv_learned import learned_settings

OUTPUTS = outputs("kvcache")  # kvcache.csv, kvcache.json
IN_PROCESS_SCORES = ("retrieval_score",)  # scores --by can compute without --from


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "kvcache", KvcacheOptions,
        help="head-aware KV cache: full KV for chosen heads, sink + window for the rest (DuoAttention-style)",
        description="Keep the full KV cache only for the KV heads a per-head score ranks highest (default: Wu et al.'s "
                    "retrieval score, measured here on needle haystacks), and only the first --sink and the last "
                    "--window tokens for the others; evaluate perplexity on long text, needle retrieval and KV bytes "
                    "read per decoding step, against the full cache and a random choice of full heads at equal bytes. "
                    "A KV head is windowed only when all its query heads are (GQA). See docs/kvcache.md.",
    )
    p.set_defaults(func=run)


def _precheck_model(name: str, context: int) -> bool:
    """Refuse an unsupported family, an MQA model or a too long context from the config alone, before weights load.
    Whether the context was checked against the model's positions (not for a hub id: once it is loaded)."""
    if name not in BUILTINS and not Path(name).expanduser().is_dir():
        return False  # a hub id: checked once loaded
    cfg = load_config(name)
    shape = attention_shape(cfg)
    check_supported_config(name, shape.model_type, shape.n_heads, shape.n_kv_heads)
    check_positions(context, cfg.get("max_position_embeddings"))
    return True


def _check_args(args: argparse.Namespace) -> tuple[list[float], Any, Any, ScoresFile | None, bool]:
    """Every option, before any model loads: budgets, window, counts, the score source, the data. Returns what it
    read (the data, the training data, the --from file) for the run to use, and whether the context was checked
    against the model's positions."""
    if args.threshold is not None and args.keep_full is not None:
        raise HeadscopeError("give --keep-full (a share of KV heads) or --threshold (a score), not both")
    budgets = parse_budgets(args.keep_full or "25%")
    check_window(args.sink, args.window)
    for flag, value, low in (("--context", args.context, 2), ("--limit", args.limit, 1),
                             ("--needles", args.needles, 0), ("--chunk", args.chunk, 1),
                             ("--haystacks", args.haystacks, 1)):
        if value < low:
            raise HeadscopeError(f"{flag} must be at least {low}; got {value}")
    check_context(args.context, args.sink, args.window)
    if args.uptrain_steps < 0:
        raise HeadscopeError(f"--uptrain-steps must be 0 or more steps; got {args.uptrain_steps}")
    if args.uptrain_steps:
        check_settings(args.uptrain_steps, args.uptrain_lr)
        for flag, value in (("--train-length", args.train_length), ("--batch-size", args.batch_size)):
            if value < (2 if flag == "--train-length" else 1):
                raise HeadscopeError(f"{flag} must be at least {2 if flag == '--train-length' else 1}; got {value}")
        if args.threshold is not None:
            raise HeadscopeError("--uptrain-steps trains one model per --keep-full budget; it does not take "
                                 "--threshold")
    if args.threshold is not None and not math.isfinite(args.threshold):
        raise HeadscopeError(f"--threshold must be a finite number; got {args.threshold}")
    if args.scores is None and args.by not in IN_PROCESS_SCORES:
        raise HeadscopeError(f"--by {args.by!r} needs --scores FILE (a heads.csv or roles.csv holding it); without "
                             f"--scores headscope measures only {', '.join(IN_PROCESS_SCORES)}")
    scores_file = read_scores_file(args.scores, args.by) if args.scores is not None else None
    data = read_texts(args.data)
    train = read_texts(args.train_data) if args.uptrain_steps and args.train_data is not None else None
    positions_checked = _precheck_model(args.model, args.context)
    return budgets, data, train, scores_file, positions_checked


def _after_evaluation(texts: list[str], used: int, passages: int) -> list[str]:
    """The texts after the last one the evaluation passages came from (`used` of them)."""
    rest = texts[used:]
    if not rest:
        raise HeadscopeError(f"--data has no text left for uptraining after the {passages} evaluation "
                             f"passage(s); give --train-data or fewer --passages")
    return rest


def _row_line(r: dict[str, Any]) -> str:
    label = r["method"] if r["method"] == "full" else f"{r['method']} {r['budget']:.1%}"
    label += f" +{r['uptrain_steps']}" if r.get("uptrain_steps") else ""
    return (f"{label:<16} {r['full_kv_heads']:>8} {r['windowed_kv_heads']:>6} {r['riders']:>6} "
            f"{human_bytes(r['kv_bytes_measured']):>12} {r['kv_ratio']:>6.3f} {r['perplexity']:>11.3f} "
            f"{r['needle_accuracy']:>8.2f}")


def _print_uncertainty(rows: list[dict[str, Any]], level: float) -> None:
    """Whether each choice beats its random control beyond noise, and the needles' exact intervals."""
    for r in rows:
        if "vs_random" in r:
            v = r["vs_random"]
            print(f"vs random at {r['budget']:.1%}: {v['verdict']} ({level:.0%} paired {v['method']} interval over "
                  f"{v['passages']} passage(s))")
    parts = []
    for r in rows:
        if r["needles"]:
            label = r["method"] if r["method"] == "full" else f"{r['method']} {r['budget']:.1%}"
            parts.append(f"{label} {r['needle_accuracy']:.2f} [{r['needle_accuracy_lo']:.2f}, "
                         f"{r['needle_accuracy_hi']:.2f}] of {r['needles']}")
    if parts:
        print(f"needles ({level:.0%} exact binomial intervals): " + "; ".join(parts))


def _print_row(r: dict[str, Any]) -> None:
    """Each cache's row on stderr as soon as it is measured (a long run shows its results as it goes)."""
    print(f"done: {_row_line(r)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    card = check_card_path(args.export_card, "duo", args.force) if args.export_card is not None else None
    out = prepare_out_dir(args.out, args.force, OUTPUTS)  # refuse before any slow work
    budgets, data, train, scores_file, positions_checked = _check_args(args)
    learned = learned_settings(args)  # None unless --choose learned; checked before the model loads
    hm = model or load_model(args.model, device=args.device)
    if not positions_checked:
        check_positions(args.context, hm.max_positions)
    check_supported(hm)  # before any pass over the model
    if hm.tokenizer is None:
        raise HeadscopeError(f"{hm.name} has no tokenizer; kvcache builds text")
    passages, used = long_passages(hm.tokenizer, data.texts, args.context, args.limit)
    # Passkey prompts from the text after the perplexity passages; too little of it refuses before any slow work.
    prompts = passkey_prompts(hm.tokenizer, data.texts[used:], args.context, learned.prompts, args.seed) \
        if learned is not None else []
    settings = Settings(sink=args.sink, window=args.window, context=args.context, budgets=tuple(budgets),
                        threshold=args.threshold, needles=args.needles, chunk=args.chunk,
                        random_control=not args.no_random, seed=args.seed, uptrain=args.uptrain_steps, loss=args.loss,
                        lr=args.uptrain_lr, intervals=interval_settings(args))
    batches, train_info = [], None
    if args.uptrain_steps:
        texts = train.texts if train is not None else _after_evaluation(data.texts, used, len(passages))
        batches = training_batches(hm.tokenizer, texts, args.train_length, args.batch_size)
        train_info = {"data": train.source if train is not None else f"{data.source} after the evaluation passages",
                      "texts": len(texts), "passage_tokens": args.train_length, "batch": args.batch_size,
                      "batches": len(batches), "steps": args.uptrain_steps, "loss": args.loss, "lr": args.uptrain_lr}
    score_info: dict[str, Any] = {"by": args.by, "from": args.scores}
    if scores_file is not None:
        check_made_for(scores_file.path, hm, "--from")  # its provenance: another model's file is refused
        scores = scores_matrix(scores_file, hm.n_layers, hm.n_heads)
    else:
        scores, info = retrieval_scores(hm, args.context, args.haystacks, args.seed, progress=True)
        score_info.update(info)
    rows = compare(hm, passages, scores, args.by, settings, progress=True, on_row=_print_row, train_batches=batches)
    if learned is not None:  # DuoAttention's learned alphas: rows beside the score's and random's at equal bytes
        more, score_info["learned"] = learned_rows(hm, passages, prompts, settings, learned, progress=True,
                                                   on_row=_print_row)
        rows += more

    report = {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads,
              "d_head": hm.d_head,
              "settings": {"sink": args.sink, "window": args.window, "context": args.context, "budgets": budgets,
                           "threshold": args.threshold, "scores": score_info, "data": data.source,
                           "passages": len(passages), "needles": args.needles, "chunk": args.chunk,
                           "random_control": not args.no_random, "seed": args.seed, "uptrain": train_info},
              "rows": rows, "scores": scores.tolist(), "provenance": provenance("kvcache", hm, data, args)}
    # The rows also hold full_heads, riders, answers and bytes_stored: kvcache.json's, not columns.
    columns = [x for c in KVCACHE_CSV.columns() for x in (c, f"{c}_lo", f"{c}_hi") if any(x in r for r in rows)]
    with staged(out, args.force) as stage:  # both files appear together, or neither
        write_csv(stage, KVCACHE_CSV, rows, columns)
        atomic_write_text(stage / KVCACHE_JSON.name, json.dumps(to_jsonable(report), indent=2) + "\n")
    if card is not None:  # outside --out: written (atomically) once the set is in place
        if learned is not None:  # DuoAttention's own pattern: the learned alphas, [layers, KV heads] in [0, 1]
            pattern, chosen = np.asarray(score_info["learned"]["alpha"], float), "the learned alphas (--choose learned)"
        else:
            pattern, chosen = duo_pattern(scores, hm.n_kv_heads), f"--by {args.by}"
        write_duo(card, pattern, sink=args.sink, recent=args.window, force=args.force,
                  source=f"headscope kvcache: {hm.name}, {chosen}")

    print(f"{hm.name}: {hm.n_layers} layers x {hm.n_kv_heads} KV heads ({hm.group_size} query heads each); "
          f"sink {args.sink} + window {args.window}; {len(passages)} passage(s) of {args.context} tokens from "
          f"{data.source}; {args.needles} needle(s); full heads by {args.by}"
          f"{' from ' + args.scores if args.scores else ''}")
    print(f"{'cache':<16} {'KV full':>8} {'freed':>6} {'riders':>6} {'bytes/step':>12} {'ratio':>6} "
          f"{'perplexity':>11} {'needles':>8}")
    for r in rows:
        print(_row_line(r))
    if args.uptrain_steps:
        assert train_info is not None, "set above whenever --uptrain is given"
        print(f"+N: after N uptraining steps ({args.loss}, lr {args.uptrain_lr:g}) on {train_info['batches']} "
              f"batch(es) of "
              f"{args.batch_size} x {args.train_length} tokens from {train_info['data']}")
    print(f"bytes/step: K and V read by one decoding step at {args.context} tokens, measured = formula in every row")
    _print_uncertainty(rows, args.ci)
    print(f"\nwrote {' and '.join(str(out / n) for n in OUTPUTS)}{' and ' + str(card) if card else ''}",
          file=sys.stderr)
    return 0
