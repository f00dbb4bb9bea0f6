"""Question 3: importance per criterion and their agreement (score's files), the pruning curve, the
layer-wise redundancy and the pruned model (prune's files)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import plots
from ..artifacts import (
    IMPORTANCE_CSV,
    PRUNE_CURVE_CSV,
    PRUNE_JSON,
    RANK_CORRELATION_CSV,
    REDUNDANCY_CSV,
)
from ..heads import Head
from ..redundancy.curves.claims import drop_claim, level_of
from .sources import Part, Sources, clean, data_url

PLOT_NAMES = {"importance": "report-importance.png", "prune_curve": "report-prune-curve.png",
              "redundancy": "report-redundancy.png"}
# the importance.csv family holding one column per criterion
IMPORTANCE = "importance_<method>"


def importance_columns(src: Sources, n_layers: int, n_heads: int) -> dict[str, list]:
    """importance.csv's criteria as flat row-major lists over the heads (None where the file has no value)."""
    t = src.csv(IMPORTANCE_CSV.name)
    if t is None:
        return {}
    if len(t.rows) != n_layers * n_heads or any(not (0 <= r["layer"] < n_layers and 0 <= r["head"] < n_heads)
                                                 for r in t.rows):
        src.fault(IMPORTANCE_CSV.name, f"has {len(t.rows)} rows that do not cover this model's {n_layers} layers x "
                                       f"{n_heads} heads")
        return {}
    out: dict[str, list] = {}
    for c in IMPORTANCE_CSV.members(IMPORTANCE, t.columns):
        flat: list = [None] * (n_layers * n_heads)
        for r in t.rows:
            flat[int(r["layer"]) * n_heads + int(r["head"])] = r[c]
        out[c] = flat
    return out


def spearman_sentence(rc: dict[str, Any]) -> str | None:
    """How far the criteria agree: mean, closest and furthest pairwise rank correlation."""
    names, vals = rc["names"], rc["values"]
    pairs = [(names[i], names[j], vals[i][j]) for i in range(len(names)) for j in range(i + 1, len(names))
             if vals[i][j] is not None]
    if not pairs:
        return None
    mean = sum(p[2] for p in pairs) / len(pairs)
    lo = min(pairs, key=lambda p: p[2])
    hi = max(pairs, key=lambda p: p[2])
    agree = "largely agree" if mean > 0.7 else "partly agree" if mean > 0.3 else "disagree"
    return (f"The importance criteria {agree} on which heads matter: mean rank correlation {mean:.2f}; "
            f"closest {hi[0]} vs {hi[1]} ({hi[2]:.2f}), furthest {lo[0]} vs {lo[1]} ({lo[2]:.2f}).")


def importance_part(src: Sources, n_layers: int, n_heads: int, figs: dict[str, bytes] | None) -> Part:
    """Importance grids per criterion, the rank-correlation matrix, and which heads matter most."""
    part = Part()
    importance = importance_columns(src, n_layers, n_heads) if n_layers else {}
    part.data["importance"] = importance
    part.data["importance_columns"] = list(importance)
    if not importance:
        part.missing["importance"] = src.note(IMPORTANCE_CSV.name)
    else:
        first = next(iter(importance))
        vals = sorted([(i // n_heads, i % n_heads, v) for i, v in enumerate(importance[first]) if v is not None],
                      key=lambda t: -t[2])
        if vals:
            part.say("q3", f"By {first.removeprefix('importance_')}, the most important heads are "
                           + ", ".join(Head(l, h).name for l, h, _ in vals[:4]) + (" ..." if len(vals) > 4 else "")
                           + "; the least important are "
                           + ", ".join(Head(l, h).name for l, h, _ in vals[-3:][::-1]) + ".")
        if figs is not None:
            figs[PLOT_NAMES["importance"]] = plots.importance_grids(
                {k: np.array([np.nan if x is None else x for x in v], float).reshape(n_layers, n_heads)
                 for k, v in importance.items()})
            part.plots.append(PLOT_NAMES["importance"])
    rc = src.matrix(RANK_CORRELATION_CSV.name)
    if rc is None:
        part.missing["rank_correlation"] = src.note(RANK_CORRELATION_CSV.name)
    else:
        part.data["rank_correlation"] = rc
        s = spearman_sentence(rc)
        if s:
            part.say("q3", s)
    return part


def summary_sentences(summary: dict[str, Any]) -> list[str]:
    """prune.json in words: what can go within each drop, decided on the interval's upper bound (`drop_claim`),
    without and with recovery, and the saved model's size."""
    out = []
    of = "of perplexity" if summary["metric"] == "lm_loss" else f"of {summary['metric']}"
    n = summary.get("heldout_passages")
    for level, w in summary["within"].items():
        s = drop_claim(level_of(level), w, n).sentence(of=of)
        r = w.get("recovered")  # present when the run trained between steps (--recover)
        if r is not None:
            s += "; with recovery training between steps, " + drop_claim(level_of(level), r, n).sentence(of=of)
        out.append(s[0].upper() + s[1:] + ".")
    sm = summary.get("saved_model")  # present with --save-model
    if sm is not None and sm["parameters_original"]:
        out.append(f"The physically pruned model keeps {sm['heads_kept']} heads and "
                   f"{sm['parameters'] / sm['parameters_original']:.1%} of the parameters "
                   f"({sm['parameters']:,} of {sm['parameters_original']:,}).")
    return out


def redundancy_sentences(rows: list[dict[str, Any]], target_drop: float | None, by: str | None = None,
                         said_none: bool = False) -> list[str]:
    """Where the heads sit that the curve removed before its drop passed the target, without and with recovery
    training, judged as prune.json's `within_target_by` says (older files: by the point estimate).
    `said_none`: prune.json's sentences already say when no head can go, so a count of zero adds nothing."""
    at = f"the target drop ({target_drop:.0%})" if target_drop is not None else "the target drop"
    judged = "the upper bound of its drop's interval" if by and by.startswith("the upper bound") else \
        "its point estimate"
    cols = ["removable"] + (["removable_recovered"] if any(r.get("removable_recovered") is not None for r in rows)
                            else [])
    out = []
    for col in cols:
        how = " with recovery" if col.endswith("recovered") else ""
        total = sum(r[col] for r in rows)
        if not total:
            if said_none:
                continue
            out.append(f"The curve's first step{how} already passes {at} by {judged.replace('its ', 'the ')}.")
            continue
        top = max(rows, key=lambda r: r[col])
        low = min(rows, key=lambda r: r[col])
        out.append(f"Of the {total:g} heads the curve removed{how} before {judged} passed {at}, layer "
                   f"{top['layer']:g} gave the most ({top[col]:g} of {top['heads']:g}), layer {low['layer']:g} the "
                   f"fewest ({low[col]:g} of {low['heads']:g}).")
    return out


def prune_part(src: Sources, figs: dict[str, bytes] | None) -> Part:
    """The pruning curve and redundancy figures and tables, and prune.json's summary, with sentences."""
    part = Part()
    res: dict[str, Any] = {}
    part.data["prune"] = res
    summary = src.json(PRUNE_JSON.name)
    if summary is None:
        part.missing["prune_summary"] = src.note(PRUNE_JSON.name)
    else:
        res["summary"] = {k: clean(v) for k, v in summary.items() if not isinstance(v, (dict, list))}
        res["details"] = {k: clean(v) for k, v in summary.items() if isinstance(v, (dict, list))}
        part.say("q3", *summary_sentences(summary))
    curve = src.csv(PRUNE_CURVE_CSV.name)
    if curve is None:
        part.missing["prune_curve"] = src.note(PRUNE_CURVE_CSV.name)
    else:
        show = [c for c in curve.columns if c != "removed"]  # the removed-heads lists make the table unreadable
        res["curve"] = {"columns": show, "rows": [{c: r[c] for c in show} for r in curve.rows]}
        # Without prune.json the metric's name is unknown; the perplexity columns exist only for lm_loss.
        metric = summary["metric"] if summary else "lm_loss" if "perplexity" in curve.columns else "metric"
        y = "perplexity" if metric == "lm_loss" else "metric"
        rows = [r for r in curve.rows if isinstance(r["fraction_removed"], (int, float))
                and isinstance(r[y], (int, float))]
        if rows and not part.text.get("q3"):
            base = min(rows, key=lambda r: r["fraction_removed"])
            mid = min(rows, key=lambda r: abs(r["fraction_removed"] - 0.5))
            label = "perplexity" if y == "perplexity" else metric
            s = (f"Removing {mid['fraction_removed']:.0%} of the heads ({mid['n_removed']}) moves {label} from "
                 f"{base[y]:.4g} to {mid[y]:.4g}")
            if isinstance(mid[f"{y}_recovered"], (int, float)):
                s += f"; with recovery training it is {mid[f'{y}_recovered']:.4g}"
            part.say("q3", s + ".")
        if rows:
            kw: dict[str, Any] = {}
            if summary:
                kw = dict(baseline=summary["baseline"], target_drop=summary["target_drop"],
                          higher_is_better=summary["higher_is_better"], recover_steps=summary["recover_steps"],
                          title=f"{summary['model']}: pruning by {summary['method']}")
            png = plots.pruning_curve(rows, metric=metric, **kw)
            res["curve"]["plot"] = data_url(png)
            if figs is not None:
                figs[PLOT_NAMES["prune_curve"]] = png
                part.plots.append(PLOT_NAMES["prune_curve"])
    red = src.csv(REDUNDANCY_CSV.name)
    if red is None:
        part.missing["redundancy"] = src.note(REDUNDANCY_CSV.name)
    else:
        res["redundancy"] = {"columns": red.columns, "rows": red.rows}
        if red.rows:
            target = summary["target_drop"] if summary else None
            part.say("q3", *redundancy_sentences(red.rows, target, summary.get("within_target_by") if summary else None,
                                                 said_none=summary is not None))
            png = plots.redundancy_profile(red.rows, target_drop=target)
            res["redundancy"]["plot"] = data_url(png)
            if figs is not None:
                figs[PLOT_NAMES["redundancy"]] = png
                part.plots.append(PLOT_NAMES["redundancy"])
    return part
