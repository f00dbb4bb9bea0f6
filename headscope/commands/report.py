"""`headscope report [MODEL]`: one offline HTML page answering the three questions, plus PNG figures."""

from __future__ import annotations

import argparse
import sys

from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..report import REPORT_NAME, render_report
from ..report.build import figure_names
from ..report.options import ReportOptions
from ._common import load_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "report", ReportOptions,
        help="offline HTML report of every result in an output directory",
        description="Write report.html (one self-contained offline page: what the heads learn, "
                    "whether more heads help, which heads are redundant) and report-*.png into "
                    "--out. Sections read the files other verbs wrote (--from directories, then "
                    "--out); a missing one says which verb to run. Statistics are computed here "
                    "when heads.csv is absent, and every head's attention map is drawn for a few "
                    "short example sentences.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    if args.no_model:
        model = None
    else:  # a clashing --out is refused before a (possibly large) model loads
        prepare_out_dir(args.out, args.force, [REPORT_NAME, *figure_names()])
        model = model or load_from_args(args)
    path = render_report(args.out, model=model, from_dirs=args.from_dirs,
                         data=args.data, sentences=args.sentences, force=args.force, max_length=args.max_length,
                         limit=args.limit, device=args.device, progress=True)
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1024:.0f} KiB); open it in any browser, it needs no network", file=sys.stderr)
    return 0
