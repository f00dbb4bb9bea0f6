"""PNG figures (matplotlib, Agg backend): one function per figure, used by the verbs and the report alike.

Each function takes rows shaped like the file the figure is drawn from (the columns declared in
`headscope.artifacts`), returns the PNG bytes and, given a path, also writes them atomically.
The head-count sweep's figures live beside the sweep, in `headscope.capacity.sweep.plots`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Figures are built without pyplot: no display, no global backend switch, nothing left open.
from matplotlib.figure import Figure

from .heads import Head
from .io import atomic_write_bytes

__all__ = ["VERDICT_COLOURS", "cost_bars", "draw_cost_bars", "figure", "heads_grid",
           "importance_grids", "num", "path_graph", "pruning_curve", "pruning_curves",
           "redundancy_profile", "save_png"]


def figure(width: float, height: float, nrows: int = 1, ncols: int = 1) -> tuple[Figure, Any]:
    """A new figure of `width` x `height` inches and its axes (a 2-D array when nrows or ncols > 1)."""
    fig = Figure(figsize=(width, height))
    if nrows == 1 and ncols == 1:
        return fig, fig.subplots()
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def save_png(fig: Figure, path: Path | None = None) -> bytes:
    """The figure as PNG bytes (110 dpi, tight box); written atomically to `path` if given."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    data = buf.getvalue()
    if path is not None:
        atomic_write_bytes(path, data)
    return data


def num(v: Any) -> float:
    """A cell as a float: NaN for empty, missing or non-numeric cells (bools are not numbers here)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def heads_grid(values: np.ndarray, title: str, path: Path | None = None, signed: bool = False) -> bytes:
    """A layers x heads heat map of one column (layer 0 at the top); `signed`: a diverging map centred on 0."""
    n_layers, n_heads = values.shape
    fig, ax = figure(max(3.0, 0.45 * n_heads + 1.6), max(2.2, 0.28 * n_layers + 1.0))
    a = np.asarray(values, float)
    top = float(np.nanmax(np.abs(a))) if signed and np.isfinite(a).any() else 0.0
    scale = {"cmap": "RdBu_r", "vmin": -(top or 1.0), "vmax": top or 1.0} if signed else {"cmap": "viridis"}
    im = ax.imshow(a, aspect="auto", **scale)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(0, n_layers, max(1, n_layers // 15)))
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.05)
    return save_png(fig, path)


def importance_grids(columns: Mapping[str, np.ndarray], path: Path | None = None) -> bytes:
    """One layers x heads heat map per importance criterion, each on its own rank scale."""
    names = list(columns)
    n = len(names)
    n_layers, n_heads = next(iter(columns.values())).shape
    ncol = min(n, 4)
    nrow = math.ceil(n / ncol)
    fig, axes = figure(ncol * max(2.4, 0.3 * n_heads + 1), nrow * max(2.0, 0.2 * n_layers + 1), nrow, ncol)
    cells = np.asarray(axes, dtype=object).reshape(-1)  # one criterion: figure() gives a single Axes, not a grid
    for ax, name in zip(cells, names, strict=False):  # the grid may hold more axes than names
        v = np.asarray(columns[name], float)
        # Ranks make criteria with different units comparable at a glance.
        flat = v.ravel()
        ranks = np.full(flat.shape, np.nan)
        ok = ~np.isnan(flat)
        ranks[ok] = np.argsort(np.argsort(flat[ok])) / max(1, ok.sum() - 1)
        ax.imshow(ranks.reshape(v.shape), cmap="magma", aspect="auto", vmin=0, vmax=1)
        ax.set_title(name.removeprefix("importance_"), fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
    for ax in cells[n:]:
        ax.axis("off")
    fig.suptitle("importance rank per criterion (bright = more important)", fontsize=10)
    return save_png(fig, path)


def pruning_curve(rows: Sequence[Mapping[str, Any]], *, metric: str, target_drop: float | None = None,
                  baseline: float | None = None, higher_is_better: bool = False, recover_steps: int | None = None,
                  title: str = "pruning curve", path: Path | None = None) -> bytes:
    """A pruning curve as a figure, for every unit kind: prune_curve.csv (x: share of heads removed) or
    unit_curve.csv (x: share of parameters) rows against the metric (perplexity, log scale, for lm_loss),
    with recovery training when the rows have it, the target-drop limit when `baseline` and `target_drop`
    are given (prune.json's `baseline`, `target_drop`, `higher_is_better`), each curve's confidence interval
    as a band when the rows carry `_lo` / `_hi` bounds, and, when the rows were timed, the measured forward
    speedup beside the FLOP-ideal one."""
    lm = metric == "lm_loss"
    y, label = ("perplexity", "perplexity") if lm else ("metric", metric)
    heads = "fraction_removed" in rows[0] if rows else True
    x = [100 * num(r.get("fraction_removed" if heads else "fraction_params")) for r in rows]
    timed = any(not math.isnan(num(r.get("speedup"))) for r in rows)
    fig, axes = figure(11.0 if timed else 6.4, 4.2, 1, 2 if timed else 1)
    ax = axes[0][0] if timed else axes
    line = ax.plot(x, [num(r.get(y)) for r in rows], "o-", label="pruned (masked)")[0]
    _band(ax, x, rows, y, line.get_color())
    recovered = [num(r.get(f"{y}_recovered")) for r in rows]
    if any(not math.isnan(v) for v in recovered):
        per_point = f" ({recover_steps} steps/point)" if recover_steps else ""
        line = ax.plot(x, recovered, "s--", label=f"pruned + recovery{per_point}")[0]
        _band(ax, x, rows, f"{y}_recovered", line.get_color())
    if baseline is not None and target_drop is not None:
        base = math.exp(baseline) if lm else baseline
        # For LMs the drop is a perplexity increase; for other metrics a relative fall (or rise).
        limit = base * (1 + target_drop) if (lm or not higher_is_better) else base - abs(base) * target_drop
        ax.axhline(limit, color="grey", lw=0.8, ls=":", label=f"{target_drop:.0%} drop")
    if lm:
        ax.set_yscale("log")
    ax.set_xlabel("heads removed (%)" if heads else "parameters removed (%)")
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if timed:
        right = axes[0][1]
        right.plot(x, [num(r.get("speedup")) for r in rows], "o-", label="measured")
        right.plot(x, [num(r.get("flop_speedup")) for r in rows], "k:", label="FLOP-ideal")
        right.set_xlabel(ax.get_xlabel())
        right.set_ylabel("forward speedup (x)")
        right.legend(fontsize=8)
        right.grid(alpha=0.3)
    return save_png(fig, path)


def _band(ax: Any, x: Sequence[float], rows: Sequence[Mapping[str, Any]], column: str, colour: str) -> None:
    """The confidence interval of `column` (its `_lo` / `_hi` cells) as a shaded band, when the rows have it."""
    lo = [num(r.get(f"{column}_lo")) for r in rows]
    hi = [num(r.get(f"{column}_hi")) for r in rows]
    if any(not math.isnan(v) for v in lo + hi):
        ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)


def pruning_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], *, title: str,
                   path: Path | None = None) -> bytes:
    """Several unit curves on one figure: perplexity (log scale) against the share of parameters removed,
    solid without and dashed with recovery, one colour per curve (`curves`: label -> unit_curve.csv rows,
    each with `fraction_params`, `perplexity` and, when recovered, `perplexity_recovered`)."""
    if not curves:
        raise ValueError("no curves to draw")
    fig, ax = figure(6.5, 4.2)
    for i, (label, rows) in enumerate(curves.items()):
        colour = f"C{i}"
        x = [100 * num(r.get("fraction_params")) for r in rows]
        ax.plot(x, [num(r.get("perplexity")) for r in rows], "o-", color=colour, label=label)
        rec = [num(r.get("perplexity_recovered")) for r in rows]
        if rows and not any(math.isnan(v) for v in rec):
            ax.plot(x, rec, "s--", color=colour, label=f"{label} + recovery")
    ax.set_xlabel("parameters removed (%)")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=9)
    return save_png(fig, path)


def role_bars(bars: Sequence[Mapping[str, Any]], path: Path | None = None) -> bytes:
    """Role scores as horizontal bars with their confidence intervals (error bars), one per (role, head) of `bars`
    (`role`, `head`, `score`, `lo`, `hi`, `uncertain`), assigned heads coloured by role, uncertain ones grey."""
    if not bars:
        raise ValueError("no role scores to draw")
    fig, ax = figure(6.0, max(2.0, 0.22 * len(bars) + 0.8))
    roles = list(dict.fromkeys(str(b["role"]) for b in bars))
    y = list(range(len(bars)))[::-1]
    colours = ["#bbbbbb" if b.get("uncertain") else f"C{roles.index(str(b['role'])) % 10}" for b in bars]
    score = [num(b.get("score")) for b in bars]
    lo, hi = [num(b.get("lo")) for b in bars], [num(b.get("hi")) for b in bars]
    err = [[max(0.0, s - l) if not math.isnan(l) else 0.0 for s, l in zip(score, lo, strict=True)],
           [max(0.0, h - s) if not math.isnan(h) else 0.0 for s, h in zip(score, hi, strict=True)]]
    ax.barh(y, score, xerr=err, color=colours, ecolor="#333333", capsize=2, height=0.7)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{b['role']} {b['head']}" + (" (uncertain)" if b.get("uncertain") else "") for b in bars],
                       fontsize=6)
    ax.set_xlabel("role score (bars: 95% interval over passages; grey: uncertain, not assigned)")
    ax.set_title("strongest heads per role", fontsize=9)
    return save_png(fig, path)


def redundancy_profile(rows: Sequence[Mapping[str, Any]], path: Path | None = None,
                       target_drop: float | None = None) -> bytes:
    """redundancy.csv as bars: removable heads per layer (and with recovery) over the layer's head count; the
    legend sits below the axes, so it never covers a bar, and a curve that removed no head says so."""
    layers = [int(num(r.get("layer"))) for r in rows]
    heads = [num(r.get("heads")) for r in rows]
    removable = [num(r.get("removable")) for r in rows]
    fig, ax = figure(5.2, 3.0)
    ax.bar(layers, heads, color="#dddddd", label="heads")
    rec = [num(r.get("removable_recovered")) for r in rows]
    if not all(math.isnan(v) for v in rec):
        ax.bar([l + 0.2 for l in layers], rec, width=0.4, color="#4e79a7", label="removable with recovery")
        ax.bar([l - 0.2 for l in layers], removable, width=0.4, color="#c0504d", label="removable")
    else:
        ax.bar(layers, removable, color="#c0504d", label="removable")
    ax.set_xticks(layers if len(layers) <= 16 else layers[:: max(1, len(layers) // 15)])
    ax.set_xlabel("layer")
    ax.set_ylabel("heads")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    within = f" within a {target_drop:.0%} drop" if target_drop is not None else ""
    ax.set_title(f"heads removable{within}, per layer", fontsize=10)
    if all(v == 0 or math.isnan(v) for v in [*removable, *rec]):
        ax.text(0.5, 0.5, f"no head removable{within}", transform=ax.transAxes, ha="center", va="center",
                fontsize=9, color="#555555", bbox={"facecolor": "white", "edgecolor": "#cccccc"})
    return save_png(fig, path)


VIA_COLOURS = {"q": "#4e79a7", "k": "#e15759", "v": "#59a14f", "direct": "#7f7f7f"}
# Each kind of path bends its own way, so that q, k and v paths between the same two heads do not overlap.
VIA_BEND = {"q": 0.12, "k": 0.3, "v": -0.12, "direct": -0.3}


def path_graph(edges: Sequence[Mapping[str, Any]], title: str, value_label: str, path: Path | None = None) -> bytes:
    """Heads as nodes (x: layer, y: head) and `edges` (`sender` (layer, head), `receiver` (layer, head) or None for
    the logits, `via` q/k/v/direct, `value`, `label`) as arrows, wider for larger |value|, dashed when negative,
    coloured and bent by `via`, each marked with its `label` (a short text, e.g. its rank in a table; the labels of
    repeated paths are joined on one arrow, drawn as the first)."""
    if not edges:
        raise ValueError("no paths to draw")
    same: dict[tuple[Any, Any, str], dict[str, Any]] = {}  # one arrow per path, the first (strongest) drawn
    for e in edges:
        k = (e["sender"], e["receiver"], str(e["via"]))
        same[k] = {**e, "label": f"{same[k]['label']}, {e['label']}"} if k in same else dict(e)
    edges = list(same.values())
    layers = [e["sender"][0] for e in edges] + [e["receiver"][0] for e in edges if e["receiver"] is not None]
    logits = any(e["receiver"] is None for e in edges)
    first, out_x = min(layers), max(layers) + 1
    heads = sorted({e["sender"][1] for e in edges} | {e["receiver"][1] for e in edges if e["receiver"] is not None})
    row = {h: i for i, h in enumerate(heads)}
    mid = (len(heads) - 1) / 2

    def at(node: tuple[int, int] | None) -> tuple[float, float]:
        return (out_x, mid) if node is None else (node[0], row[node[1]])

    fig, ax = figure(min(12.0, 1.4 * (out_x - first + 1) + 2.5), min(10.0, 0.55 * len(heads) + 1.6))
    ax.set_xlim(first - 0.6, out_x + (0.6 if logits else -0.4))
    ax.set_ylim(len(heads) - 0.2, -0.8)  # head 0 at the top
    top = max(abs(num(e["value"])) for e in edges) or 1.0
    for e in edges:
        a, b = at(e["sender"]), at(e["receiver"])
        v, bend = num(e["value"]), VIA_BEND.get(str(e["via"]), 0.0)
        ax.annotate("", xy=b, xytext=a, arrowprops={
            "arrowstyle": "-|>", "color": VIA_COLOURS.get(str(e["via"]), "#333333"), "shrinkA": 11, "shrinkB": 11,
            "lw": 0.6 + 3.0 * abs(v) / top, "linestyle": "--" if v < 0 else "-", "connectionstyle": f"arc3,rad={bend}"})
        # The label sits on the curve's middle: arc3 bends in display space, so the point is found there.
        p0, p2 = ax.transData.transform(a), ax.transData.transform(b)
        d = p2 - p0
        x, y = ax.transData.inverted().transform((p0 + p2) / 2 + 0.5 * bend * np.array([d[1], -d[0]]))
        ax.text(x, y, str(e["label"]), fontsize=6, ha="center", va="center", parse_math=False,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    for n in {e["sender"] for e in edges} | {e["receiver"] for e in edges}:
        x, y = at(n)
        ax.plot([x], [y], "o", ms=22, color="#f2f2f2", mec="#555555")
        ax.text(x, y, "logits" if n is None else Head(*n).name, fontsize=6, ha="center", va="center",
                parse_math=False)
    for via, colour in VIA_COLOURS.items():
        ax.plot([], [], color=colour, label=via)
    ax.legend(fontsize=7, title="via", title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xticks(range(first, out_x + int(logits)))
    ax.set_xticklabels([str(l) for l in range(first, out_x)] + (["out"] if logits else []))
    ax.set_yticks(range(len(heads)))
    ax.set_yticklabels([str(h) for h in heads])
    ax.set_xlabel(f"layer (arrow width: |{value_label}|; dashed: negative)")
    ax.set_ylabel("head")
    ax.set_title(title, fontsize=9)
    return save_png(fig, path)


CIRCUIT_COLOURS = {"q": "#4e79a7", "k": "#e15759", "v": "#59a14f", "mlp": "#b07aa1", "logits": "#7f7f7f"}


def circuit_graph(edges: Sequence[Mapping[str, Any]], n_layers: int, n_heads: int, title: str,
                  path: Path | None = None) -> bytes:
    """A circuit's edges between nodes placed by layer: `sender` and `receiver` as (x, y) positions (x: layer, the
    embeddings at -1, a layer's MLP half a layer after its heads, the logits at n_layers; y: head, MLPs below the
    heads), `kind` the receiver's input (q, k, v, mlp, logits) and `value` the edge's score: lines wider and darker
    for larger |value|, coloured by kind, dashed when negative."""
    if not edges:
        raise ValueError("no edges to draw")
    fig, ax = figure(min(14.0, 0.32 * n_layers + 3.5), min(8.0, 0.3 * n_heads + 2.5))
    top = max(abs(num(e["value"])) for e in edges) or 1.0
    nodes: set[tuple[float, float]] = set()
    for e in sorted(edges, key=lambda e: abs(num(e["value"]))):  # the strongest drawn last, on top
        (x0, y0), (x1, y1), v = e["sender"], e["receiver"], num(e["value"])
        w = abs(v) / top
        ax.plot([x0, x1], [y0, y1], color=CIRCUIT_COLOURS.get(str(e["kind"]), "#333333"), lw=0.3 + 2.5 * w,
                alpha=0.25 + 0.7 * w, linestyle="--" if v < 0 else "-")
        nodes.update({(x0, y0), (x1, y1)})
    xs, ys = zip(*nodes, strict=True)
    ax.plot(xs, ys, "o", ms=4, color="#f2f2f2", mec="#555555", zorder=3)
    for kind, colour in CIRCUIT_COLOURS.items():
        ax.plot([], [], color=colour, label=kind)
    ax.legend(fontsize=7, title="into", title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_ylim(n_heads + 0.8, -1.0)
    ax.set_yticks([*range(n_heads), n_heads])
    ax.set_yticklabels([str(h) for h in range(n_heads)] + ["MLP"], fontsize=7)
    ax.set_xlabel("layer (-1: embeddings; last: logits)")
    ax.set_ylabel("head")
    ax.set_title(title, fontsize=9)
    return save_png(fig, path)


def faithfulness_curve(curve: Sequence[Mapping[str, Any]], title: str, path: Path | None = None) -> bytes:
    """Faithfulness against the fraction of edges kept (log x), its interval as a band, beside the random circuits
    of the same sizes (with theirs) and the line at 1."""
    fig, ax = figure(5.0, 3.2)
    x = [num(p["fraction"]) for p in curve]
    for key, colour, label in (("faithfulness", "#4e79a7", "top edges by |score|"),
                               ("random", "#7f7f7f", "random edges")):
        ax.plot(x, [num(p[key]) for p in curve], "o-", ms=3, color=colour, label=label)
        if all(f"{key}_lo" in p for p in curve):
            ax.fill_between(x, [num(p[f"{key}_lo"]) for p in curve], [num(p[f"{key}_hi"]) for p in curve],
                            color=colour, alpha=0.2, lw=0)
    ax.axhline(1.0, color="#333333", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("fraction of edges in the circuit")
    ax.set_ylabel("faithfulness")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return save_png(fig, path)


# compare.csv's verdicts and their colours: lost red, kept blue, gained green, cannot tell grey.
VERDICT_COLOURS = {"lost": "#d62728", "kept": "#1f77b4", "gained": "#2ca02c", "cannot tell": "#a0a0a0"}


def draw_cost_bars(ax: Any, rows: Sequence[Mapping[str, Any]], tolerance: float | None) -> list[Any]:
    """One horizontal bar per capability (first at the top): its relative change, its interval as an error bar,
    coloured by verdict, with the tolerance band (+-`tolerance`, a share) shaded when it is known. Each row holds
    `label`, `relative`, `relative_lo`, `relative_hi` (shares of BASE's value; NaN: not drawn) and `verdict`.
    Returns the bars, in the rows' order."""
    y = np.arange(len(rows))[::-1]  # the first row at the top
    value = np.array([num(r["relative"]) for r in rows])
    lo = np.array([num(r["relative_lo"]) for r in rows])
    hi = np.array([num(r["relative_hi"]) for r in rows])
    colours = [VERDICT_COLOURS.get(str(r["verdict"]), "#ffffff") for r in rows]
    if tolerance is not None:
        ax.axvspan(-tolerance, tolerance, color="#dddddd", zorder=0, label=f"tolerance +-{tolerance:.0%}")
    bars = list(ax.barh(y, np.nan_to_num(value), color=colours, edgecolor="#333333", lw=0.4, zorder=2))
    # error bars: the distance from the value to each bound (NaN bounds draw nothing)
    err = np.abs(np.vstack([value - lo, hi - value]))
    ax.errorbar(value, y, xerr=err, fmt="none", ecolor="#222222", elinewidth=0.9, capsize=3, zorder=3)
    ax.scatter(value, y, c=colours, s=14, edgecolors="#333333", linewidths=0.4, zorder=4)  # a change of 0 shows too
    ax.axvline(0.0, color="#333333", lw=0.6)
    ax.set_yticks(y)
    ax.set_yticklabels([str(r["label"]) for r in rows], fontsize=7)
    finite = np.abs(np.concatenate([value, lo, hi]))
    finite = finite[np.isfinite(finite)]
    # a change past 100% (a perplexity that grows 100-fold): log beyond 10%
    if finite.size and finite.max() > 1.0:
        ax.set_xscale("symlog", linthresh=0.1)
    ax.xaxis.set_major_formatter(_percent)
    ax.tick_params(labelsize=7)
    ax.set_xlabel("change relative to BASE's value, with its paired interval")
    shown = [v for v in VERDICT_COLOURS if any(str(r["verdict"]) == v for r in rows)]
    # a legend entry per verdict present (an empty patch of its colour)
    for v in shown:
        ax.barh([np.nan], [np.nan], color=VERDICT_COLOURS[v], label=v)
    ax.legend(fontsize=7, loc="best")
    return bars


def _percent(x: float, _pos: Any = None) -> str:
    return f"{x:+.0%}" if x else "0"


def cost_bars(rows: Sequence[Mapping[str, Any]], tolerance: float | None, title: str,
              path: Path | None = None) -> bytes:
    """What a compressed model kept and lost against its original (compare.csv, `draw_cost_bars`)."""
    fig, ax = figure(6.0, max(1.8, 0.32 * len(rows) + 1.2))
    draw_cost_bars(ax, rows, tolerance)
    ax.set_title(title, fontsize=9)
    return save_png(fig, path)
