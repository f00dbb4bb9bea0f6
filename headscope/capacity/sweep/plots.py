"""The sweep's two figures, drawn by one function for the `sweep` verb and the report alike:
quality vs query heads and training speed vs query heads, one line per task, KV layout, d_head rule
(and step budget when runs differ), seeds averaged with min-max bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...artifacts import SWEEP_QUALITY_PNG, SWEEP_SPEED_PNG
from ...errors import HeadscopeError
from ...plots import figure, save_png
from .tasks import PAIR_VOCAB, SYNTHETIC_TASKS

__all__ = ["FIGURES", "mean_by_heads", "plot_sweep", "sweep_figure"]

FIGURES = {"quality": SWEEP_QUALITY_PNG.name, "speed": SWEEP_SPEED_PNG.name}


def mean_by_heads(
    heads: Sequence[int], values: Sequence[float]
) -> tuple[list[int], list[float], list[float], list[float], int]:
    """Group values by head count: (sorted head counts, means, minima, maxima, most runs of one head count)."""
    uh = sorted(set(heads))
    per_h = [[v for h, v in zip(heads, values, strict=True) if h == u] for u in uh]
    return (uh, [sum(v) / len(v) for v in per_h], [min(v) for v in per_h], [max(v) for v in per_h],
            max(len(v) for v in per_h))


def _series(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """Rows per line: (task, KV layout, d_head rule and, when runs differ in length, the step budget)."""
    by_series: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    several_budgets = len({int(r["steps"]) for r in rows}) > 1
    for r in rows:
        # MHA rows vs GQA/MQA rows stay apart, and so do runs of different lengths.
        kv_series = "MHA" if r["n_kv_heads"] == r["n_heads"] else f"kv={r['n_kv_heads']}"
        dh_series = (
            "d_head=d/h" if int(r["d_head"]) * int(r["n_heads"]) == int(r["d_model"]) else f"d_head={r['d_head']}"
        )
        if several_budgets:
            dh_series += f", {int(r['steps'])} steps"
        by_series.setdefault((str(r["task"]), kv_series, dh_series), []).append(r)
    return by_series


def sweep_figure(rows: Sequence[Mapping[str, Any]], which: str, path: Path | None = None) -> bytes:
    """sweep.csv rows as the quality figure (accuracy for the synthetic tasks, bits per token for ptb) or
    the speed figure (training tokens per wall and per CPU second); PNG bytes, written to `path` if given."""
    if which not in FIGURES:
        raise HeadscopeError(f"unknown sweep figure {which!r}; choose one of {', '.join(FIGURES)}")
    if not rows:
        raise HeadscopeError("no sweep rows to draw")
    fig, ax = figure(6, 4)
    several_budgets = len({int(r["steps"]) for r in rows}) > 1
    by_series = _series(rows)
    for (task, kvs, dhs), rs in sorted(by_series.items(), key=lambda kv: (kv[0][0], kv[0][1], len(kv[0][2]), kv[0][2])):
        rs = sorted(rs, key=lambda r: int(r["n_heads"]))
        hs = [int(r["n_heads"]) for r in rs]
        if which == "quality":
            if task in SYNTHETIC_TASKS:
                lines = [([100 * float(r["val_acc"]) for r in rs], "", "o-")]
                ax.set_ylabel("accuracy, % (held-out; xor: every input)")
            else:
                lines = [([float(r["val_bits_per_token"]) for r in rs], "", "o-")]
                ax.set_ylabel("valid bits per token (lower is better)")
        else:
            # Wall-clock speed is inflated by whatever else runs on the machine; CPU-time speed is not.
            lines = [([float(r["tokens_per_s"]) for r in rs], " (wall clock)", "o-"),
                     ([float(r["tokens_per_cpu_s"]) for r in rs], " (per CPU second)", "s--")]
            ax.set_ylabel("training tokens / s")
        for ys, suffix, style in lines:
            # Several rows per head count (seeds): the mean, bars from min to max, and every run as a dot.
            uh, means, lows, highs, n_max = mean_by_heads(hs, ys)
            label = f"{task} {kvs} {dhs}{suffix}" + (f", mean of {n_max} seeds (bars: min-max)" if n_max > 1 else "")
            line = ax.plot(uh, means, style, label=label)[0]
            if n_max > 1:
                ax.errorbar(uh, means, yerr=[[m - lo for m, lo in zip(means, lows, strict=True)],
                                             [hi - m for m, hi in zip(means, highs, strict=True)]],
                            fmt="none", ecolor=line.get_color(), capsize=3, lw=1)
                ax.plot(hs, ys, ".", color=line.get_color(), alpha=0.5, ms=4)
            for h, y in zip(uh, means, strict=True):
                d_head = next(r["d_head"] for r in rs if int(r["n_heads"]) == h)
                ax.annotate(f"{d_head}", (h, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_xscale("log", base=2)
    all_h = sorted({int(r["n_heads"]) for r in rows})
    ax.set_xticks(all_h, [str(h) for h in all_h])
    if which == "quality" and all(r["task"] in SYNTHETIC_TASKS for r in rows):
        # Small differences near 100 % must not look like large ones; show the scale that matters.
        for task in sorted({str(r["task"]) for r in rows}):
            if task == "xor":
                ceiling, text = 75.0, "xor, one head, any weights: at most 75 % (proved)"
            else:
                ceiling = 100 * (1 / PAIR_VOCAB + (1 - 1 / PAIR_VOCAB) / 2)
                text = f"pair, one head, equal weights: at most {ceiling:.0f} %"
            ax.axhline(ceiling, color="grey", ls=":", lw=1)
            ax.annotate(text, (all_h[0], ceiling), fontsize=7, textcoords="offset points", xytext=(2, 3), color="grey")
        ax.set_ylim(0, 105)
    ax.set_xlabel("query heads (labels: d_head)")
    r0 = rows[0]
    budget = "" if several_budgets else f"{r0['steps']} steps x "
    ax.set_title(f"d_model={r0['d_model']}, {r0['n_layers']} layer(s), {budget}{r0['batch']}x{r0['seq']} tokens",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def plot_sweep(rows: Sequence[Mapping[str, Any]], out: str | Path) -> list[Path]:
    """Write the sweep's figures into `out` (sweep_quality.png, sweep_speed.png); return their paths."""
    paths = [Path(out) / name for name in FIGURES.values()]
    for which, path in zip(FIGURES, paths, strict=True):
        sweep_figure(rows, which, path)
    return paths
