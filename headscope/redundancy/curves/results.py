"""What a pruning curve gives, for every unit kind: its points, where it crosses a drop, the per-layer
redundancy (head curves), the rows of its CSV and JSON files, and the physically pruned model.

The largest fraction within a drop is the last point before the curve first exceeds it (a later point
that dips back under does not count).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import HeadscopeError
from ...eval.metrics import METRICS
from ...heads import Head
from ...models.adapter import HeadModel
from ...table import HeadTable, head_name, parse_head
from ...uncertainty import IntervalSettings
from ..pruning.heads import prune_heads
from ..pruning.masks import UnitMask
from ..pruning.units import prune_units
from .claims import summary_claims
from .intervals import distinguishable
from .points import CurvePoint


@dataclass
class CurveResult:
    """A pruning curve of one unit kind, its settings, and what it needs to build the pruned model."""

    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    unit: str
    # "heads" or "parameters": what fraction_removed is a share of
    scope: str
    method: str
    metric: str
    higher_is_better: bool
    points: list[CurvePoint]
    target_drop: float
    recover_steps: int
    n_parameters: int = 0
    scores: dict[str, Any] = field(default_factory=dict)  # parameter-scope curves: the one-shot unit scores
    meta: dict[str, Any] = field(default_factory=dict)
    removed_names: list[str] = field(default_factory=list)  # parameter-scope: every unit at the last point
    last_mask: UnitMask | None = field(default=None, repr=False)  # parameter-scope: what is off at the last point
    recovered_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    recovered_n_removed: int | None = None  # the point `recovered_state` belongs to (n_removed)
    intervals: IntervalSettings = field(default_factory=IntervalSettings)  # how the points' intervals were made

    @property
    def rows(self) -> list[CurvePoint]:
        """The points (head curves call them rows)."""
        return self.points

    @property
    def total_heads(self) -> int:
        return self.n_layers * self.n_heads

    @property
    def baseline(self) -> float:
        return self.points[0].metric

    def removed_order(self, upto: int | None = None) -> list[Head]:
        """Heads in the order they were removed, up to `upto` removed heads (head curves)."""
        heads = [parse_head(h) for r in self.points for h in r.removed]
        return heads[:upto] if upto is not None else heads

    def best(self, drop: float | None = None, recovered: bool = False, confident: bool = False) -> CurvePoint:
        """The last curve point before the drop first exceeds `drop` (default: target_drop); with `confident`,
        before the upper bound of the drop's interval first exceeds it."""
        limit = self.target_drop if drop is None else drop
        best = self.points[0]
        key = ("drop_recovered" if recovered else "drop") + ("_hi" if confident else "")
        for r in self.points:
            d = r.bounds.get(key) if confident else (r.drop_recovered if recovered else r.drop)
            if d is None or not d <= limit + 1e-12:
                break
            best = r
        return best

    @property
    def has_intervals(self) -> bool:
        """Whether every point after the unpruned one has its drop's interval (per-passage sums were kept)."""
        return len(self.points) > 1 and all("drop_hi" in p.bounds for p in self.points[1:])

    def claimed(self, drop: float | None = None, recovered: bool = False) -> CurvePoint:
        """The point a claim names (claims.py's rule): the last before the drop's upper bound first passes `drop`,
        or by the point estimate when the curve has no intervals."""
        return self.best(drop, recovered, confident=self.has_intervals)

    def next_step(self, point: CurvePoint, recovered: bool = False) -> dict[str, Any] | None:
        """Whether `point` and the point after it differ beyond noise (paired over the held-out passages);
        None at the last point or without per-passage sums."""
        i = self.points.index(point)
        key = "rec_" if recovered else ""
        if i + 1 >= len(self.points) or f"{key}num" not in self.points[i + 1].passages:
            return None
        here = dict(point.passages)
        if f"{key}num" not in here and i == 0 and "num" in here:  # the baseline is its own recovered model
            here[f"{key}num"], here[f"{key}den"] = here["num"], here["den"]
        if f"{key}num" not in here:
            return None
        return distinguishable(here, self.points[i + 1].passages, self.intervals, key)

    def redundancy(self, drop: float | None = None) -> list[dict[str, Any]]:
        """Per layer: heads, how many can go within `drop` (and with recovery, if it was run)."""
        plain = self.removed_order(self.claimed(drop).n_removed)
        rec = self.removed_order(self.claimed(drop, True).n_removed) if self.recover_steps else None
        out = []
        for layer in range(self.n_layers):
            row: dict[str, Any] = {"layer": layer, "heads": self.n_heads,
                                   "removable": sum(1 for l, _ in plain if l == layer)}
            if rec is not None:
                row["removable_recovered"] = sum(1 for l, _ in rec if l == layer)
            out.append(row)
        return out

    def redundancy_table(self, drop: float | None = None) -> HeadTable:
        """A HeadTable with `removed_at` (fraction at which each head went; NaN if kept) and `removable`."""
        at = np.full((self.n_layers, self.n_heads), np.nan)
        for r in self.points:
            for name in r.removed:
                layer, head = parse_head(name)
                at[layer, head] = r.fraction_removed
        removable = np.zeros((self.n_layers, self.n_heads))
        for layer, head in self.removed_order(self.claimed(drop).n_removed):
            removable[layer, head] = 1.0
        return HeadTable(self.n_layers, self.n_heads, {"removed_at": at, "removable": removable},
                         {"model": self.model, "method": self.method, "metric": self.metric,
                          "target_drop": self.target_drop if drop is None else drop})

    def _derived(self, name: str, value: float | None) -> float | None:
        """A figure the metric derives from a value (e.g. perplexity from lm_loss), None when it has none."""
        fn = METRICS.get(self.metric).derived.get(name)
        return fn(value) if fn is not None and value is not None else None

    def _metric_columns(self, p: CurvePoint) -> dict[str, Any]:
        """metric, drop and the derived figures (perplexity), each followed by its interval's bounds; then the
        same for the recovered model."""
        derived = METRICS.get(self.metric).derived
        rec: dict[str, Any] = {}
        for suffix, value, drop in (("", p.metric, p.drop), ("_recovered", p.metric_recovered, p.drop_recovered)):
            b = p.bounds
            rec.update({f"metric{suffix}": value, f"metric{suffix}_lo": b.get(f"metric{suffix}_lo"),
                        f"metric{suffix}_hi": b.get(f"metric{suffix}_hi"), f"drop{suffix}": drop,
                        f"drop{suffix}_lo": b.get(f"drop{suffix}_lo"), f"drop{suffix}_hi": b.get(f"drop{suffix}_hi")})
            for name in derived:
                rec.update({f"{name}{suffix}": self._derived(name, value),
                            f"{name}{suffix}_lo": self._derived(name, b.get(f"metric{suffix}_lo")),
                            f"{name}{suffix}_hi": self._derived(name, b.get(f"metric{suffix}_hi"))})
        # a curve without per-passage sums (an older partial checkpoint): no bound columns
        if not p.bounds:
            rec = {k: v for k, v in rec.items() if not k.endswith(("_lo", "_hi"))}
        return rec

    def records(self) -> list[dict[str, Any]]:
        """The rows of the curve's CSV: prune_curve.csv (head curves) or unit_curve.csv (parameter scope)."""
        out = []
        so_far: list[str] = []
        for p in self.points:
            if self.scope == "heads":
                rec = {"step": p.step, "fraction_removed": p.fraction_removed, "n_removed": p.n_removed,
                       **self._metric_columns(p), **p.extra,
                       **{f"{k}_recovered": v for k, v in p.extra_recovered.items()}, "removed": " ".join(p.removed)}
            else:
                so_far = _merge_names(so_far, p.removed)
                rec = {"step": p.step, "unit": self.unit, "fraction_params": p.fraction_removed,
                       "params_removed": p.params_removed, **self._metric_columns(p),
                       "latency_s": p.latency_s, "speedup": p.speedup, "flop_speedup": p.flop_speedup,
                       "removed": " ".join(so_far)}
            out.append(rec)
        return out

    def curve_records(self) -> list[dict[str, Any]]:
        """prune_curve.csv rows (the name head curves have always used)."""
        return self.records()

    def summary(self) -> dict[str, Any]:
        """What the curve's JSON holds (besides provenance): prune.json or units.json."""
        return self._head_summary() if self.scope == "heads" else self._unit_summary()

    def _within(self, level: float) -> dict[str, Any]:
        """The largest fraction within a drop: by the point estimate, by the interval's upper bound
        (`confident`), and whether the answer can be told apart from the next step (`next_step`)."""
        out: dict[str, Any] = {}
        for _, recovered in (("", False), ("recovered", True)):
            if recovered and not self.recover_steps:
                continue
            b, c = self.best(level, recovered), self.best(level, recovered, confident=True)
            key = "_recovered" if recovered else ""
            entry = {"fraction_removed": b.fraction_removed, "n_removed": b.n_removed,
                     "metric": b.metric_recovered if recovered else b.metric,
                     "drop": b.drop_recovered if recovered else b.drop,
                     "drop_lo": b.bounds.get(f"drop{key}_lo"), "drop_hi": b.bounds.get(f"drop{key}_hi"),
                     "confident": {"fraction_removed": c.fraction_removed, "n_removed": c.n_removed,
                                   "drop": c.drop_recovered if recovered else c.drop,
                                   "drop_lo": c.bounds.get(f"drop{key}_lo"), "drop_hi": c.bounds.get(f"drop{key}_hi")},
                     "next_step": self.next_step(b, recovered)}
            if recovered:
                out["recovered"] = entry
            else:
                out.update(entry)
        return out

    def _head_summary(self) -> dict[str, Any]:
        within = {f"{lv * 100:g}%": self._within(lv) for lv in sorted({0.01, 0.05, self.target_drop})}
        b = self.claimed()
        return {
            "model": self.model, "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "method": self.method, "metric": self.metric, "higher_is_better": self.higher_is_better,
            "unit": self.unit, "recover_steps": self.recover_steps, "target_drop": self.target_drop,
            "baseline": self.baseline, "baseline_perplexity": self._derived("perplexity", self.baseline),
            "largest_fraction_within_target": b.fraction_removed,
            "heads_removed_within_target": [head_name(l, h) for l, h in self.removed_order(b.n_removed)],
            "largest_fraction_within_target_recovered":
                self.claimed(recovered=True).fraction_removed if self.recover_steps else None,
            "within_target_by": "the upper bound of the drop's interval" if self.has_intervals else
                                "the point estimate (the curve kept no per-passage sums)",
            "within": within, "claims": {k: c.record() for k, c in summary_claims(
                {"within": within, "heldout_passages": self.meta.get("heldout_passages")}).items()},
            "points": len(self.points), "intervals": self.intervals.record(), **self.meta,
            **({"learned": self.scores} if self.scores else {}),  # learned plans (l0): the gates' record
        }

    def _unit_summary(self) -> dict[str, Any]:
        points: list[dict[str, Any]] = []
        so_far: list[str] = []
        for p in self.points:
            so_far = _merge_names(so_far, p.removed)
            points.append({"step": p.step, "removed": list(so_far), "params_removed": p.params_removed,
                           "fraction_params": p.fraction_removed, "metric": p.metric, "drop": p.drop,
                           "metric_recovered": p.metric_recovered, "drop_recovered": p.drop_recovered,
                           "latency_s": p.latency_s, "speedup": p.speedup, "flop_speedup": p.flop_speedup,
                           **p.bounds})
        return {"model": self.model, "unit": self.unit, "method": self.method, "metric": self.metric,
                "higher_is_better": self.higher_is_better, "n_parameters": self.n_parameters,
                "baseline": self.baseline, "points": points, "scores": self.scores,
                "intervals": self.intervals.record(), **self.meta}

    def pruned_model(self, hm: HeadModel, *, drop: float | None = None, recovered: bool | None = None) -> HeadModel:
        """The physically pruned model: head curves at their last point (a fraction run) or, with a target (a
        fraction then only caps the curve), the largest fraction whose drop's upper bound stays within `drop`
        (default: the run's target; the point estimate when the curve has no intervals), parameter-scope curves
        at their last point; with the recovered weights when recovery ran (and `recovered` is not False)."""
        recovered = bool(self.recover_steps) if recovered is None else recovered
        if recovered and self.recovered_state is None:
            raise HeadscopeError("this result holds no recovered weights (run the curve with recover_steps > 0)")
        if self.scope == "heads":
            # a target run (a fraction, if given too, only caps it) saves the point its claim names
            by_target = self.meta.get("target_mode") or self.meta.get("fraction") is None
            point = self.claimed(drop, recovered) if by_target else self.points[-1]
        else:
            point = self.points[-1]
        if recovered and point.n_removed != self.recovered_n_removed:
            raise HeadscopeError(
                f"recovered weights exist for {self.recovered_n_removed} removed units, not {point.n_removed}; "
                f"rerun with fraction={point.fraction_removed:.4g} to get a recovered model at that point")
        base = hm
        if recovered:
            model = copy.deepcopy(hm.model)
            assert self.recovered_state is not None, "a recovered model is asked for only when the run recovered"
            model.load_state_dict(self.recovered_state)
            base = HeadModel(model=model, tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
        if self.scope != "heads":
            return prune_units(base, self.last_mask or UnitMask())
        heads = self.removed_order(point.n_removed)
        return prune_heads(base, heads) if heads else base

    def point_dicts(self) -> list[dict[str, Any]]:
        """Every point as a plain dict (the partial checkpoint's rows)."""
        return [asdict(p) for p in self.points]


def _merge_names(so_far: list[str], new: list[str]) -> list[str]:
    """Unit names removed so far: attention sub-layers and blocks in removal order, then FFN neurons as
    `F<layer>:<count>` per layer (counts added up), layers in order."""
    names = [n for n in so_far if not n.startswith("F")]
    counts: dict[int, int] = {}
    for n in [*so_far, *new]:
        if n.startswith("F"):
            layer, count = n[1:].split(":")
            counts[int(layer)] = counts.get(int(layer), 0) + int(count)
        elif n not in names:
            names.append(n)
    return names + [f"F{l}:{n}" for l, n in sorted(counts.items())]


def pruned_model(hm: HeadModel, result: CurveResult, *, drop: float | None = None,
                 recovered: bool | None = None) -> HeadModel:
    """`result.pruned_model(hm, drop=..., recovered=...)`."""
    return result.pruned_model(hm, drop=drop, recovered=recovered)


# The names head curves and unit curves used before they shared one engine.
PruneResult = UnitCurve = CurveResult

__all__ = ["CurveResult", "PruneResult", "UnitCurve", "pruned_model"]
