"""`headscope analyze [MODEL]`: per-head attention statistics -> heads.csv, heads.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..data import read_texts
from ..distributed import check_ranks, is_main
from ..io import prepare_out_dir
from ..learned import verbs
from ..learned.options import AnalyzeOptions
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..stats import STATISTICS

OUTPUTS = outputs("analyze")  # heads.csv, heads.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "analyze", AnalyzeOptions,
        help="per-head attention statistics (entropy, distance, sink, ...)",
        description="Stream text through a model and write per-head attention statistics "
                    "to heads.csv and heads.json. Columns: " + ", ".join(STATISTICS),
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = AnalyzeOptions.from_namespace(args)
    out = prepare_out_dir(options.out, options.force, OUTPUTS)  # refuse before any slow work
    source = read_texts(options.data, options.limit)  # bad data fails before the model loads
    check_ranks(len(source), "passages")  # torchrun / --workers: every rank needs a passage
    hm = model or options.load()
    result = verbs.analyze(hm, source, options, progress=True)
    # every rank holds the merged table; rank 0 alone writes and prints
    if not is_main():
        return 0
    result.save(out, options.force)  # both files appear together, or neither
    print("\n".join(result.lines()))
    print(f"\nwrote {' and '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0
