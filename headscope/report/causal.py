"""Question 1, causally: what patching each head does to the task's metric (patching.csv, patching.json), the
top heads with their intervals and role labels (roles.csv), and the strongest paths between heads (paths.csv;
without it, patching.json's strongest K-composition pairs).

Everything read here is data: names are shown as text (the page never parses it as markup), and only names of
the declared shape (`L3H2`, `logits`; via q, k, v or direct) are drawn into a figure.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import plots
from ..artifacts import PATCHING_CSV, PATCHING_JSON, PATHS_CSV, ROLES_CSV
from ..heads import Head, split_heads
from .sources import Part, Sources, Table, data_url

__all__ = ["PLOT_NAMES", "causal_part"]

TITLE = "What heads do, causally"
PATHS_TITLE = "Strongest paths between heads"
TOP_HEADS = 10
TOP_PATHS = 12
PLOT_NAMES = {"effect": "report-patching.png", "paths": "report-paths.png"}
VIA = ("q", "k", "v", "direct")


def num(v: Any) -> float:
    """A value as a float; NaN for anything that is not a finite number (text, None, bools, inf)."""
    x = plots.num(v)
    return x if math.isfinite(x) else math.nan


def fmt(v: Any, lo: Any = None, hi: Any = None, bounds: bool = True) -> str:
    """`+0.440 [+0.400, +0.480]`: a value and its interval (`n/a` for a missing value or bound)."""
    def one(x: Any) -> str:
        x = num(x)
        return "n/a" if math.isnan(x) else f"{x:+.3f}"
    return one(v) + (f" [{one(lo)}, {one(hi)}]" if bounds else "")


def interval(d: Any) -> str:
    """patching.json's {value, lo, hi} as text."""
    d = d if isinstance(d, dict) else {}
    return fmt(d.get("value"), d.get("lo"), d.get("hi"))


def index(v: Any) -> int | None:
    """A count or index (a whole number >= 0, as int or float); None for anything else."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 and v == int(v)
    return int(v) if ok else None


def is_index(v: Any) -> bool:
    return index(v) is not None


def grid_of(src: Sources, table: Table, n_layers: int, n_heads: int) -> tuple[int, int] | None:
    """The layers x heads of patching.csv (the model's when known); None, with a note, for a file that does not
    hold one row per head of such a grid."""
    if not table.rows or not all(is_index(r["layer"]) and is_index(r["head"]) for r in table.rows):
        src.fault(PATCHING_CSV.name, "holds no rows, or layer/head values that are not whole numbers")
        return None
    cells = {(int(r["layer"]), int(r["head"])) for r in table.rows}
    shape = (max(l for l, _ in cells) + 1, max(h for _, h in cells) + 1)
    if n_layers and n_heads and shape != (n_layers, n_heads):
        src.fault(PATCHING_CSV.name, f"is for {shape[0]} layers x {shape[1]} heads, not this model's "
                                     f"{n_layers} x {n_heads}")
        return None
    if len(cells) != len(table.rows) or len(cells) != shape[0] * shape[1]:
        src.fault(PATCHING_CSV.name, f"does not hold exactly one row per head of {shape[0]} x {shape[1]}")
        return None
    return shape


def role_labels(src: Sources) -> dict[str, dict[str, str]]:
    """roles.csv's role labels per head (`L3H2` -> roles, uncertain roles), when it is found and has them."""
    t = src.csv(ROLES_CSV.name) if src.get(ROLES_CSV.name) is not None else None
    if t is None or "roles" not in t.columns:
        return {}
    out: dict[str, dict[str, str]] = {}
    for r in t.rows:
        if is_index(r["layer"]) and is_index(r["head"]):
            out[Head(int(r["layer"]), int(r["head"])).name] = {
                "roles": str(r.get("roles") or "").replace(";", ", "),
                "uncertain roles": str(r.get("uncertain_roles") or "").replace(";", ", ")}
    return out


def top_rows(table: Table, key: str, roles: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The TOP_HEADS heads with the largest |key|, each column with its interval, role labels beside them."""
    ranked = sorted((r for r in table.rows if not math.isnan(num(r.get(key)))), key=lambda r: -abs(num(r[key])))
    rows = []
    for r in ranked[:TOP_HEADS]:
        name = Head(int(r["layer"]), int(r["head"])).name
        row: dict[str, Any] = {"head": name}
        for col in ("effect", "attribution", "dla"):
            if col in table.columns:
                row[col] = fmt(r.get(col), r.get(f"{col}_lo"), r.get(f"{col}_hi"))
        if roles:
            row.update(roles.get(name, {"roles": "", "uncertain roles": ""}))
        rows.append(row)
    return rows


def run_text(meta: dict[str, Any] | None, key: str) -> tuple[list[str], str]:
    """Sentences on the run (metric, M(clean), M(corrupt), pairs, intervals, agreement) and the pairs' count."""
    m = meta or {}
    pairs = m["pairs"] if isinstance(m.get("pairs"), dict) else {}
    n, skipped = index(pairs.get("n")), index(pairs.get("skipped"))
    count = "an unknown number of" if n is None else str(n)
    iv = m["intervals"] if isinstance(m.get("intervals"), dict) else {}
    level = num(iv.get("level"))
    how = (f"{level:.0%} " if not math.isnan(level) else "") + f"{iv.get('method', '')} bootstrap".strip()
    text = [f"Metric `{m['metric']}` ({m['direction']}) over {count} pairs from `{pairs.get('source')}`"
            + (f" ({skipped} left out: the tokenizer cannot hold them)" if skipped else "")
            + f": M(clean) {interval(m['M_clean'])}, M(corrupt) {interval(m['M_corrupt'])}."] if meta else []
    text.append(f"Map and table (the top {TOP_HEADS} heads by |{key}|): the "
                f"{'exact effect' if key == 'effect' else 'attribution estimate'} of patching each head (1 = the "
                "head alone restores the clean metric); [lo, hi]: " + how + f" intervals over the {count} pairs"
                + (f" ({iv['B']} resamples)." if is_index(iv.get("B")) else "."))
    ag = m.get("agreement")
    if isinstance(ag, dict):
        heads = index(ag.get("heads"))
        text.append(f"Attribution vs exact: Spearman {fmt(ag.get('spearman'), bounds=False)} over "
                    f"{'an unknown number of' if heads is None else heads} heads (a point value: patching.json "
                    "records no interval for it).")
    return text, count


def draw_grid(table: Table, key: str, shape: tuple[int, int], count: str) -> bytes:
    values = np.full(shape, np.nan)
    for r in table.rows:
        values[int(r["layer"]), int(r["head"])] = num(r.get(key))
    what = "exact effect" if key == "effect" else "attribution estimate"
    return plots.heads_grid(values, f"patching each head: {what} ({count} pairs)", signed=True)


def causal_part(src: Sources, n_layers: int, n_heads: int, figs: dict[str, bytes] | None = None) -> Part:
    """Two panels at the end of question 1: the heads (heat map, top heads with intervals and roles, the run's
    M(clean)/M(corrupt) and agreement), and the strongest paths. Absent without patching.csv."""
    part = Part()
    table = src.csv(PATCHING_CSV.name)
    if table is None:
        if PATCHING_CSV.name in src.problems:  # found but unusable: say so; not run: no section at all
            part.panel("q1", TITLE, note=src.note(PATCHING_CSV.name))
        return part
    key = "effect" if "effect" in table.columns else "attribution" if "attribution" in table.columns else None
    shape = grid_of(src, table, n_layers, n_heads)
    if key is None or shape is None:
        if key is None:
            src.fault(PATCHING_CSV.name, "has neither an effect nor an attribution column")
        part.panel("q1", TITLE, note=src.note(PATCHING_CSV.name))
        return part
    meta = src.json(PATCHING_JSON.name)
    text, count = run_text(meta, key)
    if meta is None:
        text.append(src.note(PATCHING_JSON.name) + ": M(clean), M(corrupt) and the pairs are not shown")
    png = draw_grid(table, key, shape, count)
    if figs is not None:
        figs[PLOT_NAMES["effect"]] = png
        part.plots.append(PLOT_NAMES["effect"])
    rows = top_rows(table, key, role_labels(src))
    if rows:
        part.say("q1", f"Patching {rows[0]['head']} moves the task's metric most: "
                       f"{'effect' if key == 'effect' else 'attribution'} {rows[0][key]} ({count} pairs).")
    columns = list(rows[0]) if rows else []
    part.panel("q1", TITLE, columns, rows, text=text, plot=data_url(png))
    paths_panel(part, src, meta, count, figs)
    return part


def drawable(sender: Any, receiver: Any, via: Any, value: float) -> list[dict[str, Any]]:
    """A path as the figure takes it: one arrow, or one from each head of a set of senders patched together
    (`L17H4+L20H0`, the same value); none when a name is not of the declared shape."""
    heads = split_heads(sender)
    r = None if receiver == "logits" else Head.read(receiver)
    if heads is None or (r is None and receiver != "logits") or via not in VIA or math.isnan(value):
        return []
    return [{"sender": s, "receiver": r, "via": via, "value": value} for s in heads]


def path_rows(t: Table) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """paths.csv's strongest TOP_PATHS rows by |effect| (table rows, as the file gives them) and those of them the
    figure can draw; and how many rows the file has with a number in effect."""
    ranked = sorted((r for r in t.rows if not math.isnan(num(r.get("effect")))), key=lambda r: -abs(num(r["effect"])))
    rows, edges = [], []
    for i, r in enumerate(ranked[:TOP_PATHS], 1):
        rows.append({"#": i, "sender": str(r["sender"]), "receiver": str(r["receiver"]), "via": str(r["via"]),
                     "effect": fmt(r["effect"], r.get("effect_lo"), r.get("effect_hi"))})
        edges += [{**e, "label": f"#{i}"} for e in drawable(r["sender"], r["receiver"], r["via"], num(r["effect"]))]
    return rows, edges, len(ranked)


def composition_rows(comp: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """patching.json's strongest K-composition pairs as table rows and figure edges."""
    rows, edges = [], []
    pairs = comp.get("k") if isinstance(comp, dict) else None
    for i, p in enumerate([p for p in pairs if isinstance(p, dict)] if isinstance(pairs, list) else [], 1):
        score = num(p.get("score"))
        rows.append({"#": i, "sender": str(p.get("sender")), "receiver": str(p.get("receiver")),
                     "K-composition": fmt(score, bounds=False)})
        edges += [{**e, "label": f"#{i}"} for e in drawable(p.get("sender"), p.get("receiver"), "k", score)
                  if e["receiver"] is not None]
    return rows[:TOP_PATHS], edges[:TOP_PATHS]


def paths_panel(part: Part, src: Sources, meta: dict[str, Any] | None, count: str,
                figs: dict[str, bytes] | None) -> None:
    """The strongest paths of paths.csv (path patching) with their intervals; without it, the strongest
    K-composition pairs of patching.json (scores of the weights: no sampling, so no interval)."""
    t = src.csv(PATHS_CSV.name)
    if t is not None:
        rows, edges, n = path_rows(t)
        text = [f"The {len(rows)} strongest of the {n} paths in paths.csv by |effect| (1 = the path alone restores "
                f"the clean metric), each with its interval over the {count} pairs; arrows: sender -> receiver, "
                "coloured by what of the receiver they reach (q, k, v; direct: straight to the logits), marked with "
                "their rank (#) in the table; a set of senders patched together (L17H4+L20H0) is one path drawn as "
                "an arrow from each of its heads, all with its rank."]
        run = meta.get("paths") if meta is not None else None
        if isinstance(run, dict) and isinstance(run.get("receivers"), list):
            text.append(f"Receivers: {', '.join(map(str, run['receivers'])) or 'the logits alone'}"
                        + (f" ({run['chosen']})." if isinstance(run.get("chosen"), str) else "."))
        title, label = "path patching: strongest paths", "effect"
    else:
        comp = meta.get("composition") if meta is not None else None
        rows, edges = composition_rows(comp)
        if not rows:
            why = (f"composition {comp}" if isinstance(comp, str) else src.note(PATCHING_JSON.name) if meta is None
                   else "patching.json holds no K-composition pairs")
            part.panel("q1", PATHS_TITLE, note=f"no paths: no {PATHS_CSV.name} (path patching), and {why}")
            return
        text = [f"No paths.csv (path patching): the {len(rows)} strongest K-composition pairs from patching.json "
                "instead (Elhage et al. 2021; scores of the weights alone, the same for any pairs: no interval). "
                "A score says a receiver's keys can read the sender's output, not that the task uses it."]
        title, label = "strongest K-composition pairs (weights)", "K-composition"
    drawn = len({e["label"] for e in edges})  # a set of senders is one row, several arrows
    if drawn < len(rows):
        text.append(f"{len(rows) - drawn} of these rows are not drawn: their names are not of the form L3H2 "
                    "or logits, or via is not one of q, k, v, direct.")
    plot = None
    if edges:
        png = plots.path_graph(edges, title, label)
        plot = data_url(png)
        if figs is not None:
            figs[PLOT_NAMES["paths"]] = png
            part.plots.append(PLOT_NAMES["paths"])
    part.panel("q1", PATHS_TITLE, list(rows[0]) if rows else [], rows, text=text, plot=plot,
               note=None if rows else "paths.csv holds no path with a number in effect")
