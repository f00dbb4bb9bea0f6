"""PNG figures (matplotlib, Agg backend) for people who paste plots into papers."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..io import atomic_write_bytes


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)  # never needs a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path | None) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    data = buf.getvalue()
    if path is not None:
        atomic_write_bytes(path, data)
    return data


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def heads_grid(values: np.ndarray, title: str, path: Path | None = None) -> bytes:
    """A layers x heads heat map of one column (layer 0 at the top)."""
    plt = _plt()
    n_layers, n_heads = values.shape
    fig, ax = plt.subplots(figsize=(max(3.0, 0.45 * n_heads + 1.6), max(2.2, 0.28 * n_layers + 1.0)))
    im = ax.imshow(np.asarray(values, float), cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(0, n_layers, max(1, n_layers // 15)))
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.05)
    return _save(fig, path)


def importance_grids(columns: dict[str, np.ndarray], path: Path | None = None) -> bytes:
    """One layers x heads heat map per importance criterion, each on its own rank scale."""
    plt = _plt()
    names = list(columns)
    n = len(names)
    n_layers, n_heads = next(iter(columns.values())).shape
    ncol = min(n, 4)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, squeeze=False,
                             figsize=(ncol * max(2.4, 0.3 * n_heads + 1), nrow * max(2.0, 0.2 * n_layers + 1)))
    for ax, name in zip(axes.flat, names):
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
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("importance rank per criterion (bright = more important)", fontsize=10)
    return _save(fig, path)


def prune_curve(rows: Sequence[dict[str, Any]], metric_name: str = "metric", path: Path | None = None,
                columns: tuple[str, str] = ("metric", "metric_recovered")) -> bytes:
    """Metric vs fraction of heads removed, with and without recovery."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    x = [_num(r.get("fraction_removed")) for r in rows]
    for col, label, style in ((columns[0], "no recovery", "o-"), (columns[1], "with recovery", "s--")):
        y = [_num(r.get(col)) for r in rows]
        if any(not math.isnan(v) for v in y):
            ax.plot(x, y, style, label=label, markersize=3)
    ax.set_xlabel("fraction of heads removed")
    ax.set_ylabel(metric_name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("pruning curve", fontsize=10)
    return _save(fig, path)


def redundancy_profile(rows: Sequence[dict[str, Any]], path: Path | None = None) -> bytes:
    """Removable heads per layer as bars over the layer's head count."""
    plt = _plt()
    layers = [int(_num(r.get("layer"))) for r in rows]
    heads = [_num(r.get("heads")) for r in rows]
    removable = [_num(r.get("removable")) for r in rows]
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    if not all(math.isnan(h) for h in heads):
        ax.bar(layers, heads, color="#dddddd", label="heads")
    rec = [_num(r.get("removable_recovered")) for r in rows]
    if not all(math.isnan(v) for v in rec):
        ax.bar([l + 0.2 for l in layers], rec, width=0.4, color="#4e79a7", label="removable with recovery")
        ax.bar([l - 0.2 for l in layers], removable, width=0.4, color="#c0504d", label="removable")
    else:
        ax.bar(layers, removable, color="#c0504d", label="removable")
    ax.set_xticks(layers if len(layers) <= 16 else layers[:: max(1, len(layers) // 15)])
    ax.set_xlabel("layer")
    ax.set_ylabel("heads")
    ax.legend(fontsize=8)
    ax.set_title("layer-wise redundancy", fontsize=10)
    return _save(fig, path)


def sweep_plot(rows: Sequence[dict[str, Any]], quality: str, speed: str | None, path: Path | None = None,
               heads: str = "heads", group: str = "kv_heads", title: str = "head-count sweep") -> bytes:
    """Quality (and speed, dotted, on a second axis) against the number of heads, one line per group."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.5))
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r.get(group), []).append(r)
    ax2 = ax.twinx() if speed else None
    for i, (g, rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: _num(r.get(heads)))
        x = [_num(r.get(heads)) for r in rs]
        line, = ax.plot(x, [_num(r.get(quality)) for r in rs], "o-", markersize=4,
                        label=quality if g in (None, quality) else f"{quality}, {g}")
        if ax2 is not None:
            ax2.plot(x, [_num(r.get(speed)) for r in rs], "x:", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("query heads")
    ax.set_ylabel(quality)
    ax.grid(alpha=0.3)
    if ax2 is not None:
        ax2.set_ylabel(f"{speed} (dotted)", color="gray")
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title + " (fixed d_model)", fontsize=10)
    return _save(fig, path)
