"""`headscope tasks [MODEL] --tasks lm_ptb,lm_gum,...`: the same heads scored under several tasks ->
tasks.csv, task_correlation.csv, task_specific.csv, tasks.json."""

from __future__ import annotations

import argparse
import csv
import io
import sys

from ..artifacts import TASK_CORRELATION_CSV, TASK_SPECIFIC_CSV, TASKS_CSV, TASKS_JSON, outputs
from ..io import atomic_write_text, prepare_out_dir, staged
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..provenance import provenance
from ..redundancy.importance import CRITERIA
from ..redundancy.importance.tasks import (
    TASKS,
    check_tasks_usable,
    parse_tasks,
    task_correlation_intervals,
    task_correlations,
    task_importance,
    task_specific,
)
from ..redundancy.options import TasksOptions
from ._common import load_from_args

OUTPUTS = outputs("tasks")  # tasks.csv, task_correlation.csv, task_specific.csv, tasks.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "tasks", TasksOptions,
        help="head importance under several tasks, their rank correlation, task-specific heads",
        description="Score the same heads under several tasks and write tasks.csv (importance per task), "
                    "task_correlation.csv (task x task Spearman), task_specific.csv (heads in the top 10% of one "
                    "task and the bottom half of another) and tasks.json. Tasks: " + "; ".join(TASKS.help_lines()),
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    tasks = parse_tasks(args.tasks)  # unknown tasks, labelled tasks without labels: before anything loads
    CRITERIA.get(args.method)
    out = prepare_out_dir(args.out, args.force, OUTPUTS)
    hm = model or load_from_args(args)
    check_tasks_usable(hm, tasks)
    prov = provenance("tasks", hm, None, args)
    table = task_importance(hm, tasks, method=args.method, limit=args.limit, max_length=args.max_length,
                            batch_size=args.batch_size, seed=args.seed, progress=True)
    corr = task_correlations(table)
    intervals = task_correlation_intervals(table)
    specific = task_specific(table)
    table = table.with_columns(meta={"provenance": prov, "correlation_intervals": {
        "level": 0.95, "method": "Fisher z over heads, Bonett-Wright variance (the tasks' data noise not included)",
        "pairs": intervals}})
    buf = io.StringIO()
    fields = [f.name for f in TASK_SPECIFIC_CSV.fields]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in specific:
        w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    with staged(out, args.force) as stage:  # the four files appear together, or none
        table.to_csv(stage / TASKS_CSV.name)
        table.to_json(stage / TASKS_JSON.name)
        atomic_write_text(stage / TASK_CORRELATION_CSV.name, corr.to_csv(float_format="%.4f", lineterminator="\n"))
        atomic_write_text(stage / TASK_SPECIFIC_CSV.name, buf.getvalue())
    print(f"{hm.name}: {table.n_layers} layers x {table.n_heads} heads; tasks "
          + ", ".join(f"{t} ({s:.0f} s)" for t, s in table.meta["seconds"].items()))
    print("\nSpearman rank correlation between tasks [95% interval over heads: Fisher z, Bonett-Wright variance; "
          "the noise of each task's data is not in it]:")
    names = list(corr.columns)
    cell = {(c["a"], c["b"]): f"{c['spearman']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}]" for c in intervals}
    width = max([len(n) for n in names] + [18])
    print(" " * width + "".join(f"  {n:>{width}}" for n in names))
    for a in names:
        row = [cell.get((a, b)) or cell.get((b, a)) or ("1" if a == b else "-") for b in names]
        print(f"{a:<{width}}" + "".join(f"  {v:>{width}}" for v in row))
    pairs: dict[tuple[str, str], list[str]] = {}
    for r in specific:
        pairs.setdefault((r["task"], r["other"]), []).append(r["head"])
    if pairs:
        print("\nheads in the top 10% for one task and the bottom half for another:")
        for (t, o), heads in pairs.items():
            print(f"  {t} not {o}: {' '.join(heads)}")
    print(f"\nwrote {', '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0
