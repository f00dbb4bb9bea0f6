"""`headscope score [MODEL] --method ...`: head importance -> importance.csv, importance.json, rank_correlation.csv."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import (
    outputs,
)
from ..distributed import is_main
from ..eval.evaluate import read_task_data
from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..redundancy import verbs
from ..redundancy.importance import CRITERIA
from ..redundancy.options import ScoreOptions

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


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = ScoreOptions.from_namespace(args)  # validated by the CLI: methods, metric, --l0-* included
    heads = options.unit == "head"
    outputs_ = OUTPUTS if heads else UNIT_OUTPUTS
    out = prepare_out_dir(options.out, options.force, outputs_)
    data = read_task_data(options.data, options.limit)  # bad data fails before the model loads
    hm = model or options.load()
    result = verbs.score(hm, data, options, progress=True)
    # every rank holds the merged table; rank 0 alone writes and prints
    if not is_main():
        return 0
    result.save(out, options.force)  # the files appear together, or none
    print("\n".join(result.lines()))
    print(f"\nwrote {', '.join(str(out / n) for n in outputs_)}", file=sys.stderr)
    return 0
