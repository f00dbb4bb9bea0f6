"""The offline HTML report: the three questions on one page, plus PNG figures.

`report(hm, options=ReportOptions(out=..., from_dirs=(...)))` (`headscope.report.verbs`) reads the files the
other verbs wrote (heads.csv, roles.json, importance.csv, prune_curve.csv, sweep.csv, ...: the names and columns
declared in `headscope.artifacts`), one module per section (heads, roles, similarity, sweep, kv, gqa, pruning),
computes what is cheap itself (statistics when heads.csv is missing, attention maps of a few short example
sentences) and returns the page and its figures; `save(out)` writes `report.html` plus `report-*.png`.
`render_report(out_dir, model=..., from_dirs=[...])` does both in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..artifacts import HEADS_CSV, HEADS_JSON
from ..io import atomic_write_bytes, prepare_out_dir
from ..models import load_model
from ..models.adapter import HeadModel
from .build import figure_names
from .options import ReportOptions, check_from_dirs, check_report_args
from .verbs import REPORT_NAME, ReportResult, build, report

__all__ = ["REPORT_NAME", "ReportOptions", "ReportResult", "check_report_args", "render_report", "report",
           "report_data"]


def report_data(
    out_dir: str | Path,
    model: str | HeadModel | None = None,
    from_dirs: Sequence[str | Path] | None = None,
    data: Any = None,
    sentences: int = 3,
    max_length: int | None = None,
    limit: int | None = None,
    write_plots: bool = True,
    device: str = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready dict (computes statistics if heads.csv is absent).

    The computed heads.csv/.json and, with `write_plots`, the figures are written into `out_dir`."""
    out = Path(out_dir)
    check_report_args(sentences, max_length, limit)
    hm = load_model(model, device=device) if isinstance(model, str) else model
    built = build(out, hm, from_dirs, data, sentences, max_length, limit, figures=write_plots, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    if built.heads is not None:
        built.heads.to_csv(out / HEADS_CSV.name)
        built.heads.to_json(out / HEADS_JSON.name)
    for name, png in built.figures.items():
        atomic_write_bytes(out / name, png)
    return built.data


def render_report(
    out_dir: str | Path,
    model: str | HeadModel | None = None,
    from_dirs: Sequence[str | Path] | None = None,
    data: Any = None,
    sentences: int = 3,
    force: bool = False,
    max_length: int | None = None,
    limit: int | None = None,
    device: str = "cpu",
    progress: bool = False,
) -> Path:
    """Write `out_dir/report.html` (self-contained, offline) and its PNG figures; return the HTML path.

    `model` (a name, path or HeadModel) enables the example attention maps and computes statistics
    when no heads.csv exists; `from_dirs` are searched before `out_dir` for the other verbs' files.
    Refuses to overwrite an existing report without `force`.
    """
    out = Path(out_dir)
    check_report_args(sentences, max_length, limit)
    check_from_dirs(from_dirs)
    prepare_out_dir(out, force, [REPORT_NAME, *figure_names()])
    hm = load_model(model, device=device) if isinstance(model, str) else model
    options = ReportOptions(out=str(out), force=force, from_dirs=tuple(str(d) for d in from_dirs or ()),
                            sentences=sentences, max_length=max_length, limit=limit)
    result = report(hm, data, options, progress=progress)
    # the page, its figures (and computed heads.csv/.json) together, or none
    result.save(out, force)
    return out / REPORT_NAME
