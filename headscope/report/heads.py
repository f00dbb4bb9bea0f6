"""Question 1's grid: every head's numbers from heads.csv, its roles, and the summary sentences."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .. import plots
from ..artifacts import HEADS_CSV, ROLES_CSV
from ..heads import Head
from ..table import HeadTable
from .sources import Part, Sources, clean

# Columns drawn as PNG heat maps beside the page (the page itself colours the grid by any column).
GRID_PLOT_COLUMNS = ("entropy_norm", "mean_distance", "first_token_mass", "prev_token_mass", "special_mass")


def grid_plot_name(column: str) -> str:
    """File name of a column's heat map, prefixed so it never clashes with a verb's own figures."""
    return f"report-heads-{column}.png"


def _heads_list(items: Sequence[tuple[int, int, float]], k: int = 4) -> str:
    return ", ".join(Head(l, h).name for l, h, _ in items[:k]) + (" ..." if len(items) > k else "")


def role_names(value: object) -> list[str]:
    """The roles in one cell of heads.csv's `roles` column (';'-separated; empty or NaN for none)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return [r.strip() for r in str(value).split(";") if r.strip()]


# The heads-table counts are point estimates of a plain 0.5 cut; the role census counts a role on its rule,
# beside its baseline, on the interval's bound: two different counts, each labelled as what it is.
POINT_NOTE = "a cut at 0.5 of the mean weight, not the role census, which applies each role's rule to the " \
             "interval's bound"


def summarise_heads(table: HeadTable, special_names: str) -> list[str]:
    """Plain sentences about the per-head statistics and roles of this model."""
    total = table.n_layers * table.n_heads
    out: list[str] = []

    def above(col: str, thr: float) -> list[tuple[int, int, float]]:
        v = np.asarray(table[col], float)
        return sorted([(l, h, float(v[l, h])) for l, h in table.heads() if v[l, h] > thr], key=lambda t: -t[2])

    # Encoders rest on [CLS]/[SEP]; models whose special tokens get no weight rest on the first token.
    sink_col = "special_mass" if np.nanmax(np.asarray(table["special_mass"], float)) > 0 else "first_token_mass"
    sinks = above(sink_col, 0.5)
    where = special_names if sink_col == "special_mass" else "the first token"
    out.append(f"By the point estimate, {len(sinks)} of {total} heads put more than half their attention on {where}"
               + (f" (strongest: {_heads_list(sinks, 3)})" if sinks else "")
               + f"; such heads mostly 'rest' there when they have nothing to do ({POINT_NOTE}).")
    prev = above("prev_token_mass", 0.5)
    out.append(f"By the point estimate, {len(prev)} of {total} heads put over half their attention one token back"
               + (f": {_heads_list(prev)}" if prev else "") + f" ({POINT_NOTE}).")
    e = np.nanmean(np.asarray(table["entropy_norm"], float), axis=1)
    trend = "broader" if e[-1] > e[0] + 0.05 else "sharper" if e[-1] < e[0] - 0.05 else "about as focused"
    out.append(f"Attention gets {trend} with depth: mean normalised entropy is {e[0]:.2f} in layer 0 and "
               f"{e[-1]:.2f} in layer {table.n_layers - 1} (1 = uniform over the context).")
    (l, h, d), = table.top("mean_distance", 1)
    out.append(f"The longest-range head is {Head(l, h)}, looking {d:.1f} tokens away on average.")
    if "roles" in table:
        families: dict[str, set[tuple[int, int]]] = {}
        none = 0
        for l, h in table.heads():
            names = role_names(table["roles"][l, h])
            none += not names
            for r in names:
                families.setdefault(r.split(":", 1)[0], set()).add((l, h))
        if families:
            parts = ", ".join(f"{r} {len(c)}" for r, c in sorted(families.items(), key=lambda t: -len(t[1])))
            out.append(f"Heads per role family in the role census (each role's rule on the interval's bound; a head "
                       f"can hold several): {parts}; {none} heads hold no role above its baseline.")
        if "uncertain_roles" in table:
            unsure = sum(bool(role_names(table["uncertain_roles"][l, h])) for l, h in table.heads())
            if unsure:
                out.append(f"{unsure} heads pass a role's rule on the point estimate but not on its confidence bound: "
                           "they are marked uncertain (grey in the grid), not assigned.")
    return out


def heads_part(table: HeadTable | None, src: Sources, figs: dict[str, bytes] | None, special_names: str) -> Part:
    """The grid's numeric columns (flat, row-major), the roles column, the summary and the heat maps (into `figs`,
    name -> PNG bytes, when given)."""
    part = Part()
    if table is None:
        part.missing["heads"] = src.note(HEADS_CSV.name)
        return part
    columns = {name: clean(np.asarray(arr).ravel().tolist()) for name, arr in table.columns.items()
               if np.asarray(arr).dtype.kind == "f"}
    part.data["columns"] = columns
    part.data["descriptions"] = {c: ROLES_CSV.meaning(c) for c in [*columns, "roles"] if ROLES_CSV.meaning(c)}
    if "roles" in table:
        part.data["roles"] = [";".join(role_names(table["roles"][l, h])) for l, h in table.heads()]
    if "uncertain_roles" in table:  # the grid greys heads whose only roles are uncertain
        part.data["uncertain"] = [";".join(role_names(table["uncertain_roles"][l, h])) for l, h in table.heads()]
    part.say("q1", *summarise_heads(table, special_names))
    if figs is not None:
        for col in GRID_PLOT_COLUMNS:
            figs[grid_plot_name(col)] = plots.heads_grid(np.asarray(table[col], float),
                                                         f"{col}: {HEADS_CSV.meaning(col)}")
            part.plots.append(grid_plot_name(col))
    return part
