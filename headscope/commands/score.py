"""`headscope score [MODEL] --method ...`: head importance -> importance.csv, importance.json, rank_correlation.csv."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import torch

from ..artifacts import (
    IMPORTANCE_CSV,
    IMPORTANCE_JSON,
    RANK_CORRELATION_CSV,
    UNIT_IMPORTANCE_CSV,
    UNIT_IMPORTANCE_JSON,
    outputs,
    write_csv,
)
from ..distributed import is_main
from ..errors import HeadscopeError, did_you_mean
from ..eval.evaluate import read_task_data
from ..eval.metrics import METRICS
from ..io import atomic_write_text, prepare_out_dir, staged
from ..options.cli import verb_parser
from ..provenance import provenance
from ..redundancy.importance import CRITERIA, check_method, parse_methods, rank_correlations, score, score_units
from ..redundancy.options import ScoreOptions
from ..table import parse_head
from ._common import (
    grid,
    interval_settings,
    load_from_args,
)
from ._l0 import l0_settings

OUTPUTS = outputs("score")  # importance.csv, importance.json, rank_correlation.csv
UNIT_OUTPUTS = outputs("score --unit")  # unit_importance.csv, unit_importance.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "score", ScoreOptions,
        help="head importance: ablation, gradient (Michel et al.), Taylor, IG, entropy, output norm",
        description="Score every head by one or more criteria (higher = more important) and write "
                    "importance.csv, importance.json and the Spearman rank-correlation matrix between "
                    "criteria. Methods: " + "; ".join(CRITERIA.help_lines()),
    )
    p.set_defaults(func=run)


def parse_pruned(text: str | None, n_layers: int, n_heads: int) -> torch.Tensor | None:
    """A gate tensor with the listed heads at 0 (None when nothing is listed)."""
    if not text:
        return None
    gates = torch.ones(n_layers, n_heads)
    for item in text.split(","):
        if item.strip():
            layer, head = parse_head(item)
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise HeadscopeError(f"--pruned: head {item.strip()} does not exist; the model has "
                                     f"L0..L{n_layers - 1} and H0..H{n_heads - 1}")
            gates[layer, head] = 0
    if not gates.any():  # nothing left to score: every importance would be NaN and every Spearman undefined
        raise HeadscopeError(f"--pruned lists all {n_layers * n_heads} heads; leave at least one head unpruned "
                             f"to score")
    return gates


def run(args: argparse.Namespace) -> int:
    if args.unit != "head":
        return _run_units(args)
    # unknown methods fail before anything loads
    methods = parse_methods(",".join(args.methods or ("gradient", "ablation")))
    if args.metric != "auto" and args.metric not in METRICS:
        raise HeadscopeError(f"unknown metric {args.metric!r}{did_you_mean(args.metric, METRICS)}; "
                             f"choose auto or one of {', '.join(METRICS)}")
    if args.ig_steps < 1:
        raise HeadscopeError(f"--ig-steps must be at least 1, got {args.ig_steps}")
    l0 = l0_settings(args, 0.5)  # checked even when l0 is not chosen: a bad value is never silently ignored
    options = {"l0": {"settings": l0}} if "l0" in methods else None
    out = prepare_out_dir(args.out, args.force, OUTPUTS)
    data = read_task_data(args.data, args.limit)  # bad data fails before the model loads
    hm = load_from_args(args)
    gates = parse_pruned(args.pruned, hm.n_layers, hm.n_heads)
    prov = provenance("score", hm, data, args)  # before scoring: the model as loaded
    table = score(hm, data, methods, metric=args.metric, gates=gates, max_length=args.max_length,
                  batch_size=args.batch_size, ig_steps=args.ig_steps, seed=args.seed,
                  limit=args.limit if isinstance(data, str) else None, intervals=interval_settings(args),
                  until_stable=args.until_stable, options=options, progress=True)
    if not is_main():  # every rank holds the merged table; rank 0 alone writes and prints
        return 0
    corr = rank_correlations(table)
    table = table.with_columns(meta={"provenance": prov})
    with staged(out, args.force) as stage:  # the three files appear together, or none
        table.to_csv(stage / IMPORTANCE_CSV.name)
        table.to_json(stage / IMPORTANCE_JSON.name)
        atomic_write_text(stage / RANK_CORRELATION_CSV.name, corr.to_csv(float_format="%.4f", lineterminator="\n"))

    m = table.meta
    value = m["metric_value"]
    extra = f" (perplexity {m['metric_details']['perplexity']:.2f})" if "perplexity" in m["metric_details"] else ""
    print(f"{hm.name}: {m['n_layers']} layers x {m['n_heads']} heads, {m['passages']} passages, "
          f"{m['tokens_seen']} tokens from {m['data']}; metric {m['metric']} = {value:.4f}{extra}")
    for method in methods:
        col = f"importance_{method}"
        print()
        about = CRITERIA.get(method).help
        print(grid(table, col, about) if _fits(table[col]) else
              grid(table.with_columns({col: _scaled(table[col])[0]}), col,
                   f"{about}; shown x{_scaled(table[col])[1]:g}"))
        top = [t for t in table.top(col, 5) if t[2] == t[2]]
        lo, hi = table[f"{col}_lo"], table[f"{col}_hi"]
        if method in m.get("learned", {}):
            r = m["learned"][method]
            print("  top: " + ", ".join(f"L{l}H{h} {v:.4g}" for l, h, v in top) + f"  (learned in {r['steps_done']} "
                  f"steps, {r['closed_units']} of {r['units']} gates closed; no interval: learned over all passages)")
            continue
        print("  top: " + ", ".join(f"L{l}H{h} {v:.4g} [{lo[l, h]:.3g}, {hi[l, h]:.3g}]" for l, h, v in top))
    print("\nSpearman rank correlation between criteria:")
    print(corr.round(2).to_string())
    _print_uncertainty(m)
    print(f"\nwrote {', '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0


def _print_uncertainty(m: dict[str, Any]) -> None:
    """Each ranking's split-half stability, the correlations' intervals, and what --until-stable reached."""
    iv = m["intervals"]
    print(f"\nuncertainty ({iv['level']:.0%} {iv['method']} bootstrap over {m['passages']} passages, {iv['B']} "
          f"resamples; intervals in importance.csv as importance_<method>_lo/_hi):")
    for method, st in m["stability"].items():
        print(f"  {method:<14} split-half Spearman {st['spearman']:.2f}, {st['spearman_brown']:.2f} for all "
              f"passages (Spearman-Brown); {st['overlap']:.1f} of the {st['k']} least important heads shared")
    for c in m["rank_correlations"]:
        print(f"  Spearman {c['a']} vs {c['b']}: {c['spearman']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}]")
    u = m.get("until_stable")
    if u:
        state = "reached" if u["reached"] else "NOT reached"
        print(f"  --until-stable {u['target']}: {state} with {u['passages']} of the {u['available']} passages "
              f"available" + ("" if u["reached"] else "; raise --limit or give more data"))


def _fits(values: np.ndarray) -> bool:
    """Whether a column reads well with two decimals."""
    v = np.abs(np.asarray(values, float))
    v = v[np.isfinite(v)]
    return v.size == 0 or 0.05 <= v.max() < 1000


def _scaled(values: np.ndarray) -> tuple[np.ndarray, float]:
    """The column times a power of ten that brings its largest magnitude into [1, 10)."""
    v = np.abs(np.asarray(values, float))
    v = v[np.isfinite(v)]
    if v.size == 0 or v.max() == 0:
        return np.asarray(values, float), 1.0
    factor = 10.0 ** (-np.floor(np.log10(v.max())))
    return np.asarray(values, float) * factor, float(factor)


def _run_units(args: argparse.Namespace) -> int:
    """`score --unit attention|block|ffn`: every such unit scored; options checked before the model loads."""
    unit = args.unit
    methods = None if args.methods in (None, ("all",)) else [m for m in args.methods if m]
    for m in methods or ():
        check_method(unit, m)
    if args.metric != "auto":
        METRICS.get(args.metric)
    if args.pruned:
        raise HeadscopeError("--pruned applies to heads; with --unit score the whole model")
    out = prepare_out_dir(args.out, args.force, UNIT_OUTPUTS)
    data = read_task_data(args.data, args.limit)
    hm = load_from_args(args)
    prov = provenance("score", hm, data, args)
    rows, meta = score_units(hm, data, unit, methods, metric=args.metric, max_length=args.max_length,
                             batch_size=args.batch_size, seed=args.seed,
                             limit=args.limit if isinstance(data, str) else None, progress=True)
    meta["provenance"] = prov
    with staged(out, args.force) as stage:
        write_csv(stage, UNIT_IMPORTANCE_CSV, rows)
        atomic_write_text(stage / UNIT_IMPORTANCE_JSON.name, json.dumps(meta, indent=2, default=str) + "\n")
    _print_units(hm.name, unit, rows, meta)
    print(f"\nwrote {', '.join(str(out / n) for n in UNIT_OUTPUTS)}", file=sys.stderr)
    return 0


def _print_units(name: str, unit: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    print(f"{name}: {unit} importance on {meta['passages']} passages, metric {meta['metric']} = "
          f"{meta['metric_value']:.4f}")
    for m in meta["methods"]:
        col = f"importance_{m}"
        if unit == "ffn":
            per_layer: dict[int, list[float]] = {}
            for r in rows:
                per_layer.setdefault(r["layer"], []).append(r[col])
            print(f"  {m}: per-layer mean " + " ".join(f"L{l}:{sum(v) / len(v):.3g}" for l, v in per_layer.items()))
        else:
            order = sorted(rows, key=lambda r: r[col])
            seconds = next(v for k, v in meta["seconds"].items() if m in k.split("+"))
            print(f"  {m} ({seconds:.1f} s), least important first: "
                  + " ".join(f"L{r['layer']}:{r[col]:.3g}" for r in order))
