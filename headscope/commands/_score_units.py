"""`headscope score --unit attention|block|ffn`: importance of units beyond heads -> unit_importance.csv/.json."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys

from ..artifacts import UNIT_IMPORTANCE_CSV, UNIT_IMPORTANCE_JSON, outputs
from ..errors import HeadscopeError, did_you_mean
from ..eval.evaluate import read_task_data
from ..eval.metrics import METRICS
from ..io import atomic_write_text, prepare_out_dir
from ..provenance import provenance
from ..redundancy.pruning.masks import UNIT_KINDS
from ..redundancy.importance.units import UNIT_SCORE_METHODS, score_units
from ._common import load_from_args

UNIT_OUTPUTS = outputs("score --unit")  # unit_importance.csv, unit_importance.json


def run_units(args: argparse.Namespace) -> int:
    """Score every attention sub-layer, block or FFN neuron; options checked before the model loads."""
    unit = args.unit
    if unit not in UNIT_KINDS:
        raise HeadscopeError(f"unknown unit {unit!r}{did_you_mean(unit, UNIT_KINDS)}; choose {', '.join(UNIT_KINDS)}")
    methods = None if args.method in (None, "all") else [m.strip() for m in args.method.split(",") if m.strip()]
    for m in methods or ():
        if m not in UNIT_SCORE_METHODS[unit]:
            raise HeadscopeError(f"unit {unit!r} is scored by {', '.join(UNIT_SCORE_METHODS[unit])}, not {m!r}"
                                 f"{did_you_mean(m, UNIT_SCORE_METHODS[unit])}")
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
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / UNIT_IMPORTANCE_CSV.name, buf.getvalue())
    meta["provenance"] = prov
    atomic_write_text(out / UNIT_IMPORTANCE_JSON.name, json.dumps(meta, indent=2, default=str) + "\n")
    print(f"{hm.name}: {unit} importance on {meta['passages']} passages, metric {meta['metric']} = "
          f"{meta['metric_value']:.4f}")
    for m in meta["methods"]:
        col = f"importance_{m}"
        if unit == "ffn":
            per_layer = {}
            for r in rows:
                per_layer.setdefault(r["layer"], []).append(r[col])
            print(f"  {m}: per-layer mean " + " ".join(f"L{l}:{sum(v) / len(v):.3g}" for l, v in per_layer.items()))
        else:
            order = sorted(rows, key=lambda r: r[col])
            print(f"  {m} ({meta['seconds'][m]:.1f} s), least important first: "
                  + " ".join(f"L{r['layer']}:{r[col]:.3g}" for r in order))
    print(f"\nwrote {', '.join(str(out / n) for n in UNIT_OUTPUTS)}", file=sys.stderr)
    return 0
