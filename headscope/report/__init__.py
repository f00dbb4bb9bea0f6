"""The offline HTML report: the three questions on one page, plus PNG figures.

`render_report(out_dir, model=..., from_dirs=[...])` reads the files the other verbs wrote (heads.csv,
roles.json, importance.csv, prune_curve.csv, sweep.csv, ...: the names and columns declared in
`headscope.artifacts`), one module per section (heads, roles, similarity, sweep, kv, gqa, pruning),
computes what is cheap itself (statistics when heads.csv is missing, attention maps of a few short
example sentences) and writes `report.html` plus `report-*.png` into `out_dir`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..artifacts import HEADS_CSV, HEADS_JSON, REPORT_HTML
from ..data import read_texts
from ..errors import HeadscopeError
from ..io import atomic_write_text, prepare_out_dir, staged
from ..learned.analyze import analyze
from ..models import load_model
from ..models.adapter import HeadModel
from ..provenance import model_record, provenance
from .build import collect, figure_names
from .examples import example_maps
from .html import page
from .mixing import check_one_model
from .sources import Sources, read_heads

log = logging.getLogger(__name__)

__all__ = ["REPORT_NAME", "check_report_args", "render_report", "report_data"]

REPORT_NAME = REPORT_HTML.name


def _special_names(hm: HeadModel | None) -> str:
    tok = getattr(hm, "tokenizer", None)
    if tok is None:
        return "special tokens"
    skip = ("[UNK]", "[PAD]", "[MASK]", "<unk>", "<pad>")
    names = [t for t in getattr(tok, "all_special_tokens", []) if t not in skip]
    return "/".join(names[:3]) if names else "special tokens"


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
    stage: str | Path | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready dict (computes statistics if heads.csv is absent).

    Files it writes (computed heads.csv/.json, the figures) go to `stage` when given (render_report's staging
    folder, moved into `out_dir` with the page), else into `out_dir`."""
    out = Path(out_dir)
    write_to = Path(stage) if stage is not None else out
    dirs = [Path(d) for d in (from_dirs or [])] + [out]
    src = Sources.scan(dirs)
    hm: HeadModel | None
    check_report_args(sentences, max_length, limit)
    hm = load_model(model, device=device) if isinstance(model, str) else model
    records = check_one_model(src, model_record(hm) if hm is not None else None)  # before any work: never mix models
    table = read_heads(src)
    texts = None
    token_ids = None
    if data is not None and not isinstance(data, (str, Path)) and len(data) and not isinstance(data[0], str) \
            and not hasattr(data, "texts"):
        token_ids = [list(map(int, t)) for t in data]  # token-id sentences (models without a tokenizer)
    if hm is not None:
        if table is not None and (table.n_layers, table.n_heads) != (hm.n_layers, hm.n_heads):
            raise HeadscopeError(
                f"{src.get(HEADS_CSV.name)} has {table.n_layers} layers x {table.n_heads} heads but the model "
                f"{hm.name} has {hm.n_layers} x {hm.n_heads}; give the matching model or another --from")
        if hm.tokenizer is not None and token_ids is None:
            texts = read_texts(data, None).texts if (data is None or isinstance(data, (str, Path))) else \
                list(getattr(data, "texts", data))
        if table is None:
            log.info("no usable heads.csv in %s; computing the statistics", ", ".join(map(str, dirs)))
            table = analyze(hm, data, max_length=max_length, limit=limit, progress=progress)
            table = table.with_columns(meta={"provenance": provenance(
                "report", hm, read_texts(data, limit) if data is None or isinstance(data, (str, Path)) else data,
                {"max_length": max_length, "limit": limit})})
            if src.get(HEADS_CSV.name) is None:  # never replace a file the user has, even an unusable one
                write_to.mkdir(parents=True, exist_ok=True)
                table.to_csv(write_to / HEADS_CSV.name)
                table.to_json(write_to / HEADS_JSON.name)
                src.found[HEADS_CSV.name] = write_to / HEADS_CSV.name
                records[HEADS_CSV.name] = table.meta["provenance"]
    model_meta: dict[str, Any] = {}
    if hm is not None:
        model_meta = {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
                      "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head_record, "causal": hm.causal,
                      "model_type": hm.config.model_type}
    elif table is None:
        why = src.problems.get(HEADS_CSV.name, f"no heads.csv in {', '.join(map(str, dirs))}")
        raise HeadscopeError(f"nothing to report: {why}, and no model given; "
                             f"run `headscope analyze MODEL --out {out}` or pass the model")
    examples = example_maps(hm, texts, sentences, token_ids) if hm is not None else []
    write_to.mkdir(parents=True, exist_ok=True)
    return collect(table, src, write_to, examples, model_meta, _special_names(hm), write_plots=write_plots,
                   config=hm.config if hm is not None else None, records=records)


def check_from_dirs(from_dirs: Sequence[str | Path] | None) -> None:
    """Each --from is an existing folder (a file is named, with the folder to give instead)."""
    for d in from_dirs or ():
        p = Path(d)
        if p.is_file():
            raise HeadscopeError(f"--from {str(p)!r} is a file; --from takes the folder holding a verb's outputs: "
                                 f"give --from {str(p.parent)!r}")
        if not p.is_dir():
            raise HeadscopeError(f"--from {str(p)!r} does not exist; give a folder holding other verbs' outputs")


def check_report_args(sentences: int, max_length: int | None, limit: int | None) -> None:
    """Refuse report options out of range before anything is loaded or computed."""
    if not isinstance(sentences, int) or sentences < 0:
        raise HeadscopeError(f"--sentences must be 0 or more (0 = no example maps); got {sentences}")
    if max_length is not None and max_length < 2:
        raise HeadscopeError(f"--max-length must be at least 2 tokens; got {max_length}")
    if limit is not None and limit < 1:
        raise HeadscopeError(f"--limit must be at least 1; got {limit}")


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
    names = [REPORT_NAME, *figure_names()]
    check_report_args(sentences, max_length, limit)
    check_from_dirs(from_dirs)
    prepare_out_dir(out, force, names)
    with staged(out, force) as stage:  # the page, its figures (and computed heads.csv/.json) together, or none
        d = report_data(out, model, from_dirs, data, sentences, max_length, limit, True, device, progress, stage)
        # Paths on the page name the files where they will be, not the staging folder they were written in.
        atomic_write_text(stage / REPORT_NAME, page(d).replace(str(stage), str(out)))
    return out / REPORT_NAME
