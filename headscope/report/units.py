"""Question 3 beyond single heads: the unit curves (attention sub-layers, blocks, FFN neurons) and head
importance across tasks (task x task rank correlation, task-specific heads), as generic panels."""

from __future__ import annotations

from typing import Any

from ..artifacts import TASK_CORRELATION_CSV, TASK_SPECIFIC_CSV, UNIT_CURVE_CSV, UNITS_JSON
from .sources import Part, Sources


def _curve_sentence(info: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    name = "perplexity" if "perplexity" in rows[0] else "metric"
    last = rows[-1]
    s = (f"Removing {info['unit']} units by {info['method']} up to {last['fraction_params']:.0%} of the parameters "
         f"moves the {name} from {rows[0][name]:.4g} to {last[name]:.4g}")
    if last.get("speedup") is not None:
        s += f" (forward {last['speedup']:.2f}x faster, FLOP-ideal {last['flop_speedup']:.2f}x)"
    return s + "."


def units_part(src: Sources) -> Part:
    """unit_curve.csv / units.json and task_correlation.csv / task_specific.csv as q3 panels."""
    part = Part()
    curve, info = src.csv(UNIT_CURVE_CSV.name), src.json(UNITS_JSON.name)
    if curve is not None and info is not None and curve.rows:
        cols = [c for c in ("fraction_params", "params_removed", "perplexity", "metric", "drop", "perplexity_recovered",
                            "speedup", "flop_speedup", "removed") if c in curve.columns]
        sentence = _curve_sentence(info, curve.rows)
        part.panel("q3", f"Units beyond heads: {info['unit']} ({info['method']})", cols,
                   [{c: r.get(c) for c in cols} for r in curve.rows], text=[sentence])
        part.say("q3", sentence)
    else:
        part.panel("q3", "Units beyond heads", note=src.note(UNIT_CURVE_CSV.name, UNITS_JSON.name))
    corr = src.matrix(TASK_CORRELATION_CSV.name)
    if corr is not None:
        names = corr["names"]
        rows = [
            {"task": r, **{n: v for n, v in zip(names, vals, strict=True)}}
            for r, vals in zip(corr["rows"], corr["values"], strict=True)
        ]
        specific = src.csv(TASK_SPECIFIC_CSV.name)
        text = ["Spearman rank correlation of head importance between tasks (1 = the same order)."]
        if specific is not None and specific.rows:
            pairs: dict[str, list[str]] = {}
            for r in specific.rows:
                pairs.setdefault(f"{r['task']} but not {r['other']}", []).append(str(r["head"]))
            text += [f"Top 10% for {k}: {' '.join(v[:12])}" for k, v in pairs.items()]
        part.panel("q3", "Head importance across tasks", ["task", *names], rows, text=text)
        lo = min(((a, b, corr["values"][i][j]) for i, a in enumerate(corr["rows"]) for j, b in enumerate(names)
                  if j > i), key=lambda t: t[2], default=None)
        if lo is not None:
            part.say("q3", f"Which heads matter depends on the task: head rankings for {lo[0]} and {lo[1]} agree "
                           f"least (Spearman {lo[2]:.2f}).")
    else:
        part.panel("q3", "Head importance across tasks", note=src.note(TASK_CORRELATION_CSV.name))
    return part


__all__ = ["units_part"]
