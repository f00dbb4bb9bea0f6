"""`headscope report [MODEL]`: one offline HTML page answering the three questions, plus PNG figures."""

from __future__ import annotations

import argparse
import sys

from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..report import REPORT_NAME, report
from ..report.build import figure_names
from ..report.options import ReportOptions


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
    options = ReportOptions.from_namespace(args)  # validated by the CLI: --sentences, --from included
    # a clashing --out is refused before a (possibly large) model loads
    out = prepare_out_dir(options.out, options.force, [REPORT_NAME, *figure_names()])
    hm = None if options.no_model else model or options.load()
    result = report(hm, None, options, progress=True)
    # the page, its figures (and computed heads.csv/.json) together, or none
    result.save(out, options.force)
    path = out / REPORT_NAME
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1024:.0f} KiB); open it in any browser, it needs no network", file=sys.stderr)
    return 0
