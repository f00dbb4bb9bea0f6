"""`report` as a library function: the page and its figures built in memory from the files other verbs wrote
(and the model, when given), written only by `ReportResult.save`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..artifacts import HEADS_CSV, HEADS_JSON, REPORT_HTML
from ..data import read_texts
from ..errors import HeadscopeError
from ..io import atomic_write_bytes, atomic_write_text
from ..learned.analyze import analyze
from ..models.adapter import HeadModel
from ..options import Record, Result, check_data
from ..provenance import model_record, provenance
from ..table import HeadTable
from .build import collect
from .examples import example_maps
from .html import page
from .mixing import check_one_model
from .options import ReportOptions, check_report_args
from .sources import Sources, read_heads

log = logging.getLogger(__name__)

REPORT_NAME = REPORT_HTML.name


def _special_names(hm: HeadModel | None) -> str:
    tok = getattr(hm, "tokenizer", None)
    if tok is None:
        return "special tokens"
    skip = ("[UNK]", "[PAD]", "[MASK]", "<unk>", "<pad>")
    names = [t for t in getattr(tok, "all_special_tokens", []) if t not in skip]
    return "/".join(names[:3]) if names else "special tokens"


@dataclass
class Built:
    """What the page shows (`data`, JSON-ready), the figures drawn beside it and the statistics computed here
    (None when heads.csv was read, or when a file of that name is there and must not be replaced)."""

    data: dict[str, Any]
    figures: dict[str, bytes]
    heads: HeadTable | None


def build(out: Path, hm: HeadModel | None, from_dirs: Sequence[str | Path] | None = None, data: Any = None,
          sentences: int = 3, max_length: int | None = None, limit: int | None = None, figures: bool = True,
          progress: bool = False) -> Built:
    """Everything the page shows, from the files in `from_dirs` then `out` (statistics computed when heads.csv is
    absent); writes nothing. Paths on the page name the files in `out`."""
    dirs = [Path(d) for d in (from_dirs or [])] + [out]
    src = Sources.scan(dirs)
    check_report_args(sentences, max_length, limit)
    records = check_one_model(src, model_record(hm) if hm is not None else None)  # before any work: never mix models
    table = read_heads(src)
    computed = None
    texts = None
    token_ids = None
    if data is not None and not isinstance(data, (str, Path)) and len(data) and not isinstance(data[0], str) \
            and not hasattr(data, "texts"):
        token_ids = [list(map(int, t)) for t in data]  # token-id sentences (models without a tokenizer)
    if hm is not None:
        if table is not None and (table.n_layers, table.n_heads) != (hm.n_layers, hm.n_heads):
            raise HeadscopeError(
                f"{src.get(HEADS_CSV.name)} has {table.n_layers} layers x {table.n_heads} heads but the model "
                f"{hm.name} has {hm.n_layers} x {hm.n_heads}; give the matching model or another folder (from_dirs)",
                fields=("from_dirs",))
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
                computed = table
                src.found[HEADS_CSV.name] = out / HEADS_CSV.name
                records[HEADS_CSV.name] = table.meta["provenance"]
    model_meta: dict[str, Any] = {}
    if hm is not None:
        model_meta = {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
                      "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head_record, "causal": hm.causal,
                      "model_type": hm.config.model_type}
    elif table is None:
        why = src.problems.get(HEADS_CSV.name, f"no heads.csv in {', '.join(map(str, dirs))}")
        raise HeadscopeError(f"nothing to report: {why}, and no model given; "
                             f"analyze a model into {str(out)!r} first, or give the model")
    examples = example_maps(hm, texts, sentences, token_ids) if hm is not None else []
    figs: dict[str, bytes] = {}
    d = collect(table, src, figs if figures else None, examples, model_meta, _special_names(hm),
                config=hm.config if hm is not None else None, records=records)
    return Built(d, figs, computed)


@dataclass
class ReportData(Record):
    """What the page embeds (`build.collect`), typed where code reads it: the grid's shape and columns; each
    section's part (figures, tables, census, ...) is kept as it came, JSON-ready."""

    n_heads: int
    # the grid's numbers: column -> one value per head, row-major
    columns: dict[str, list[Any]] | None = None


@dataclass
class ReportResult(Result):
    """The report: report.html (one self-contained offline page), its report-*.png figures and, when they were
    computed here, heads.csv and heads.json."""

    page: str
    figures: dict[str, bytes]
    heads: HeadTable | None
    data: ReportData  # what the page embeds

    def __post_init__(self) -> None:
        computed = (HEADS_CSV.name, HEADS_JSON.name) if self.heads is not None else ()
        self.files = (REPORT_NAME, *self.figures, *computed)

    def write(self, folder: Path) -> None:
        if self.heads is not None:
            self.heads.to_csv(folder / HEADS_CSV.name)
            self.heads.to_json(folder / HEADS_JSON.name)
        for name, png in self.figures.items():
            atomic_write_bytes(folder / name, png)
        atomic_write_text(folder / REPORT_NAME, self.page)

    def lines(self) -> list[str]:
        return []  # the CLI prints only where it wrote the page (to stderr)

    def to_pandas(self) -> pd.DataFrame:
        """Every head's numbers the page's grid shows, one row per head."""
        n_heads = self.data.n_heads
        columns = self.data.columns or {}
        n = len(next(iter(columns.values()))) if columns else 0
        return pd.DataFrame({"layer": [i // n_heads for i in range(n)], "head": [i % n_heads for i in range(n)],
                             **columns})


def report(hm: HeadModel | None, data: Any = None, options: ReportOptions | None = None, *, progress: bool = False,
           **changes: Any) -> ReportResult:
    """`headscope report` on a loaded model (or None: only what the files hold): the page and its figures.

    The sections read the files other verbs wrote in `options.from_dirs`, then `options.out`. `data`: the text
    for computed statistics and the example sentences (passages, token-id lists, a corpus name or a file; None:
    `options.data`). Keywords override single options: `report(hm, from_dirs=("runs/a",), sentences=2)`.
    """
    check_data(data)
    opts = (options or ReportOptions()).replace(**changes).validate()
    built = build(Path(opts.out), None if opts.no_model else hm, opts.from_dirs, opts.data if data is None else data,
                  opts.sentences, opts.max_length, opts.limit, figures=True, progress=progress)
    return ReportResult(page=page(built.data), figures=built.figures, heads=built.heads,
                        data=ReportData.from_json(built.data))
