"""`headscope tasks [MODEL] --tasks lm_ptb,lm_gum,...`: the same heads scored under several tasks ->
tasks.csv, task_correlation.csv, task_specific.csv, tasks.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..redundancy import verbs
from ..redundancy.importance.tasks import TASKS
from ..redundancy.options import TasksOptions

# tasks.csv, task_correlation.csv, task_specific.csv, tasks.json
OUTPUTS = outputs("tasks")


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
    options = TasksOptions.from_namespace(args)  # validated by the CLI: unknown tasks and methods included
    out = prepare_out_dir(options.out, options.force, OUTPUTS)
    hm = model or options.load()
    result = verbs.tasks(hm, None, options, progress=True)
    result.save(out, options.force)  # the four files appear together, or none
    print("\n".join(result.lines()))
    print(f"\nwrote {', '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0
