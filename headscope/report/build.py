"""Assemble the page's data from its sections, in the order the page shows them.

Each section module reads its files through `Sources` (by the names declared in
`headscope.artifacts`) and returns a `Part`: its data, its summary sentences and, when its files are
absent or unusable, a note saying which verb to run or what is wrong with the file.

A new section needs no page code: its module returns a Part whose `panel(...)` calls add titled
tables and figures at the end of a question (see `sources.Part.panel`); add its call to `collect`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..artifacts import IMPORTANCE_CSV, artifact
from ..table import HeadTable
from . import causal, circuit, cost, pruning, sweep
from .causal import causal_part
from .gqa import gqa_part
from .heads import GRID_PLOT_COLUMNS, grid_plot_name, heads_part
from .kv import kv_part
from .kv_quality import kv_quality_part
from .longctx import longctx_part
from .origins import provenance_part
from .pruning import importance_part, prune_part
from .roles import ROLE_BARS_PNG, roles_part
from .similarity import similarity_part
from .sources import MALFORMED, Part, Sources, clean, unreadable
from .study import apply as apply_study
from .study import study_part
from .units import units_part

__all__ = ["collect", "figure_names"]

log = logging.getLogger(__name__)

NO_EXAMPLES = ("no example sentences: give the model (`headscope report MODEL`) and data with passages of "
               "4..24 tokens")


def figure_names() -> list[str]:
    """Every PNG the report may write beside report.html (all prefixed `report-`)."""
    return [*pruning.PLOT_NAMES.values(), *sweep.PLOT_NAMES.values(), *map(grid_plot_name, GRID_PLOT_COLUMNS),
            ROLE_BARS_PNG, *causal.PLOT_NAMES.values(), *circuit.PLOT_NAMES.values(), *cost.PLOT_NAMES.values()]


def _section(src: Sources, make: Callable[[], Part]) -> Part:
    """One section's Part; a file whose content its section cannot use (a value of the wrong kind, a block of
    the wrong shape) leaves that section empty and is named in the report's problems: the rest is reported."""
    src.touched.clear()
    try:
        return make()
    except MALFORMED as e:
        names = [n for n in dict.fromkeys(src.touched) if n in src.found] or ["?"]
        name = names[-1]  # the file read last when the section failed
        where = str(src.found[name]) if name in src.found else "a file of this section"
        note = f"{where} could not be used ({unreadable(e)}); the rest of the report is shown: rerun " \
               f"`headscope {artifact(name).verb if name in src.found else 'VERB'}` to rewrite it"
        log.warning("%s", note)
        src.problems[name] = note
        return Part()


def collect(table: HeadTable | None, src: Sources, figs: dict[str, bytes] | None, examples: list[dict[str, Any]],
            model_meta: dict[str, Any], special_names: str = "special tokens", config: Any = None,
            records: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's data: every section present or a note saying why not, plus the summary sentences. The
    figures drawn beside the page go into `figs` (name -> PNG bytes) when it is given."""
    meta = {**model_meta, **({k: v for k, v in table.meta.items() if k not in ("stats", "versions")}
                              if table is not None else {})}
    n_layers = int(meta.get("n_layers") or (table.n_layers if table is not None else 0))
    n_heads = int(meta.get("n_heads") or (table.n_heads if table is not None else 0))
    sections: list[Callable[[], Part]] = [
        lambda: heads_part(table, src, figs, special_names),
        lambda: roles_part(src, n_layers, n_heads, figs),
        lambda: causal_part(src, n_layers, n_heads, figs),
        lambda: circuit.circuit_part(src, figs),
        lambda: longctx_part(src),
        lambda: similarity_part(src, n_layers, n_heads),
        lambda: sweep.sweep_part(src, figs),
        lambda: kv_part(src, meta, config),
        lambda: gqa_part(src, meta.get("model_type")),
        lambda: kv_quality_part(src),
        lambda: importance_part(src, n_layers, n_heads, figs),
        lambda: prune_part(src, figs),
        lambda: cost.cost_part(src, figs),
        lambda: units_part(src),
        lambda: provenance_part(src, records or {}),
        lambda: study_part(src),
    ]
    parts = [_section(src, make) for make in sections]
    data: dict[str, Any] = {"model": clean(meta), "n_layers": n_layers, "n_heads": n_heads, "missing": {},
                            "text": {"q1": [], "q2": [], "q3": []}, "descriptions": {}, "columns": {},
                            "examples": examples, "plots": {}, "plots_written": [],
                            "panels": []}
    if not examples:
        data["missing"]["examples"] = NO_EXAMPLES
    for p in parts:
        for k, v in p.data.items():
            if k in ("columns", "descriptions"):
                data[k].update(v)
            else:
                data[k] = v
        for q, sentences in p.text.items():
            data["text"][q] += sentences
        data["missing"].update(p.missing)
        data["plots_written"] += p.plots
        data["panels"] += p.panels
    # Importance criteria are grid columns too: the page colours heads by them beside the statistics.
    for name, values in data.pop("importance", {}).items():
        data["columns"].setdefault(name, values)
        data["descriptions"].setdefault(name, IMPORTANCE_CSV.meaning(name))
    # a study's refused or left-out stages: one line each, not a to-do
    apply_study(data)
    data["problems"] = list(src.problems.values()) + ([data.pop("data_mismatch")] if "data_mismatch" in data else [])
    data["sources"] = {k: str(v) for k, v in src.found.items()}
    return data
