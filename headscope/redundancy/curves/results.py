"""What a pruning curve gives: its points, where it crosses a drop, the per-layer redundancy, and the
physically pruned model at the chosen point.

Relative drop: read by the metric's registry entry (`drop`): for `lm_loss` the perplexity increase,
exp(loss - loss_0) - 1; for metrics where higher is better (m_0 - m) / |m_0|. "Within 1%" means
drop <= 0.01. The largest fraction within a drop is the last point before the curve first exceeds
it (a later point that dips back under does not count).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import HeadscopeError
from ...eval.metrics import METRICS
from ...models.adapter import HeadModel
from ..pruning.heads import prune_heads
from ...table import HeadTable, head_name, parse_head


@dataclass
class CurveRow:
    """One point of a pruning curve."""

    step: int
    n_removed: int
    fraction_removed: float
    metric: float
    drop: float
    metric_recovered: float | None = None
    drop_recovered: float | None = None
    removed: list[str] = field(default_factory=list)  # heads removed at this step, e.g. ["L3H7"]
    extra: dict[str, float] = field(default_factory=dict)  # extra measures, e.g. wordsim353 Spearman
    extra_recovered: dict[str, float] = field(default_factory=dict)


@dataclass
class PruneResult:
    """A pruning curve plus where it crosses the requested drop and the per-layer redundancy."""

    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    method: str
    metric: str
    higher_is_better: bool
    unit: str
    rows: list[CurveRow]
    target_drop: float
    recover_steps: int
    meta: dict[str, Any] = field(default_factory=dict)
    recovered_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    recovered_n_removed: int | None = None  # the curve point `recovered_state` belongs to

    @property
    def total_heads(self) -> int:
        return self.n_layers * self.n_heads

    @property
    def baseline(self) -> float:
        return self.rows[0].metric

    def removed_order(self, upto: int | None = None) -> list[tuple[int, int]]:
        """Heads in the order they were removed, up to `upto` removed heads."""
        heads = [parse_head(h) for r in self.rows for h in r.removed]
        return heads[:upto] if upto is not None else heads

    def best(self, drop: float | None = None, recovered: bool = False) -> CurveRow:
        """The last curve point before the drop first exceeds `drop` (default: target_drop)."""
        limit = self.target_drop if drop is None else drop
        best = self.rows[0]
        for r in self.rows:
            d = r.drop_recovered if recovered else r.drop
            if d is None:
                break
            if d > limit + 1e-12:
                break
            best = r
        return best

    def redundancy(self, drop: float | None = None) -> list[dict[str, Any]]:
        """Per layer: heads, how many can go within `drop` (and with recovery, if it was run)."""
        plain = self.removed_order(self.best(drop).n_removed)
        rec = self.removed_order(self.best(drop, True).n_removed) if self.recover_steps else None
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
        for r in self.rows:
            for h in r.removed:
                l, hh = parse_head(h)
                at[l, hh] = r.fraction_removed
        keep = self.best(drop).n_removed
        removable = np.zeros((self.n_layers, self.n_heads))
        for l, h in self.removed_order(keep):
            removable[l, h] = 1.0
        return HeadTable(self.n_layers, self.n_heads, {"removed_at": at, "removable": removable},
                         {"model": self.model, "method": self.method, "metric": self.metric,
                          "target_drop": self.target_drop if drop is None else drop})

    def summary(self) -> dict[str, Any]:
        """What prune.json holds: settings, baseline, and the largest fractions within drops."""
        levels = sorted({0.01, 0.05, self.target_drop})
        within = {}
        for lv in levels:
            key = f"{lv * 100:g}%"
            b = self.best(lv)
            within[key] = {"fraction_removed": b.fraction_removed, "n_removed": b.n_removed,
                           "metric": b.metric, "drop": b.drop}
            if self.recover_steps:
                br = self.best(lv, True)
                within[key]["recovered"] = {"fraction_removed": br.fraction_removed, "n_removed": br.n_removed,
                                            "metric": br.metric_recovered, "drop": br.drop_recovered}
        b = self.best()
        return {
            "model": self.model, "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "method": self.method, "metric": self.metric, "higher_is_better": self.higher_is_better,
            "unit": self.unit, "recover_steps": self.recover_steps, "target_drop": self.target_drop,
            "baseline": self.baseline,
            "baseline_perplexity": self._derived("perplexity", self.baseline),
            "largest_fraction_within_target": b.fraction_removed,
            "heads_removed_within_target": [head_name(l, h) for l, h in self.removed_order(b.n_removed)],
            "largest_fraction_within_target_recovered":
                self.best(recovered=True).fraction_removed if self.recover_steps else None,
            "within": within, "points": len(self.rows), **self.meta,
        }

    def _derived(self, name: str, value: float | None) -> float | None:
        """A figure the metric derives from a value (e.g. perplexity from lm_loss), None when it has none."""
        fn = METRICS.get(self.metric).derived.get(name)
        return fn(value) if fn is not None and value is not None else None

    def curve_records(self) -> list[dict[str, Any]]:
        """prune_curve.csv rows."""
        derived = METRICS.get(self.metric).derived
        recs = []
        for r in self.rows:
            rec = {"step": r.step, "fraction_removed": r.fraction_removed, "n_removed": r.n_removed,
                   "metric": r.metric, "drop": r.drop}
            rec.update({name: fn(r.metric) for name, fn in derived.items()})
            rec["metric_recovered"] = r.metric_recovered
            rec["drop_recovered"] = r.drop_recovered
            rec.update({f"{name}_recovered": self._derived(name, r.metric_recovered) for name in derived})
            rec.update(r.extra)
            rec.update({f"{k}_recovered": v for k, v in r.extra_recovered.items()})
            rec["removed"] = " ".join(r.removed)
            recs.append(rec)
        return recs


def relative_drop(metric: str, base: float, value: float) -> float:
    """How much worse `value` is than `base`, as the metric's entry reads it (perplexity increase for
    lm_loss, else the relative fall of a higher-is-better metric or rise of a lower-is-better one)."""
    return METRICS.get(metric).drop(base, value)


def pruned_model(hm: HeadModel, result: PruneResult, *, drop: float | None = None,
                 recovered: bool | None = None) -> HeadModel:
    """The physically pruned model at the largest fraction within `drop` (default: the run's target).

    With a recovery run (the default when it had recovery steps) the recovered weights are used:
    they exist for the last point of a `fraction` run and the best point of a `target_drop` run.
    """
    recovered = bool(result.recover_steps) if recovered is None else recovered
    if recovered and result.recovered_state is None:
        raise HeadscopeError("this result holds no recovered weights (run prune_curve with recover_steps > 0)")
    point = result.rows[-1] if result.meta.get("fraction") is not None else result.best(drop, recovered)
    heads = result.removed_order(point.n_removed)
    base = hm
    if recovered:
        if point.n_removed != result.recovered_n_removed:
            raise HeadscopeError(
                f"recovered weights exist for {result.recovered_n_removed} removed heads, not {point.n_removed}; "
                f"rerun with fraction={point.fraction_removed:.4g} to get a recovered model at that point")
        model = copy.deepcopy(hm.model)
        model.load_state_dict(result.recovered_state)
        base = HeadModel(model=model, tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
    return prune_heads(base, heads) if heads else base


__all__ = ["CurveRow", "PruneResult", "pruned_model", "relative_drop"]
