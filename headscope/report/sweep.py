"""Question 2's head-count sweep: sweep.csv's table, the sweep's own two figures, and the best configuration."""

from __future__ import annotations

from typing import Any

from ..artifacts import SWEEP_CSV
from ..capacity.sweep.plots import sweep_figure
from ..capacity.sweep.tasks import SYNTHETIC_TASKS
from .sources import Part, Sources, data_url

PLOT_NAMES = {"quality": "report-sweep.png", "speed": "report-sweep-speed.png"}


def layout_name(row: dict[str, Any]) -> str:
    """MHA, MQA or 'GQA (kv=2)' for a sweep.csv row."""
    h, kv = row["n_heads"], row["n_kv_heads"]
    return "MHA" if kv == h else "MQA" if kv == 1 else f"GQA (kv={kv:g})"


def quality_column(task: str) -> tuple[str, bool]:
    """The column a task is judged by and whether higher is better: accuracy for the synthetic tasks,
    bits per token for language modelling."""
    return ("val_acc", True) if task in SYNTHETIC_TASKS else ("val_bits_per_token", False)


def sweep_part(src: Sources, figs: dict[str, bytes] | None) -> Part:
    """sweep.csv as a table, the quality and speed figures of one task (ptb first), and two sentences."""
    part = Part()
    t = src.csv(SWEEP_CSV.name)
    if t is None:
        part.missing["sweep"] = src.note(SWEEP_CSV.name)
        return part
    sweep: dict[str, Any] = {"columns": t.columns, "rows": t.rows}
    part.data["sweep"] = sweep
    tasks = sorted({str(r["task"]) for r in t.rows})
    if not tasks:
        return part
    task = "ptb" if "ptb" in tasks else tasks[0]
    quality, higher_better = quality_column(task)
    ok = [r for r in t.rows if str(r["task"]) == task and isinstance(r[quality], (int, float))]
    if not ok:
        return part
    best = (max if higher_better else min)(ok, key=lambda r: r[quality])
    several_widths = len({r["d_model"] for r in ok}) > 1
    s = (f"Best {quality} on the {task} task: {best[quality]:.4g} with {best['n_heads']:g} "
         f"head{'s' if best['n_heads'] != 1 else ''} of d_head {best['d_head']:g}")
    if layout_name(best) != "MHA":
        s += f", {layout_name(best)}"
    if several_widths:
        s += f", d_model {best['d_model']:g}"
    one = [r for r in ok if r["n_heads"] == 1]
    if one and one[0] is not best:
        s += f"; a single head gets {one[0][quality]:.4g}"
    part.say("q2", s + f" ({'higher' if higher_better else 'lower'} is better).")
    fast = max(ok, key=lambda r: r["tokens_per_s"])
    slow = min(ok, key=lambda r: r["tokens_per_s"])
    part.say("q2", f"Training speed runs from {slow['tokens_per_s']:.3g} tokens_per_s ({slow['n_heads']:g} heads) "
                   f"to {fast['tokens_per_s']:.3g} ({fast['n_heads']:g} heads).")
    for which, name in PLOT_NAMES.items():
        png = sweep_figure(ok, which)
        sweep["plot" if which == "quality" else f"plot_{which}"] = data_url(png)
        if figs is not None:
            figs[name] = png
            part.plots.append(name)
    return part
