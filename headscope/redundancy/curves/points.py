"""The one point record of a pruning curve, for every unit kind.

Relative drop: read by the metric's registry entry (`drop`): for `lm_loss` the perplexity increase,
exp(loss - loss_0) - 1; for metrics where higher is better (m_0 - m) / |m_0|. "Within 1%" means
drop <= 0.01.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...eval.metrics import METRICS


@dataclass
class CurvePoint:
    """One point of a pruning curve: what went at this step, and the metric with everything removed so far."""

    step: int  # 0 = unpruned
    # units removed so far: heads (head curves), or attention sub-layers, blocks and neurons
    n_removed: int
    # share of the curve's scope removed so far: of all heads, or of all parameters
    fraction_removed: float
    metric: float  # the metric with those units switched off
    drop: float  # relative drop of the metric (see the module docstring)
    metric_recovered: float | None = None  # after recovery training (None without recovery)
    drop_recovered: float | None = None
    removed: list[str] = field(default_factory=list)  # units removed AT THIS STEP: L3H7, A3, B7, F2:n
    extra: dict[str, float] = field(default_factory=dict)  # extra measures, e.g. wordsim353 Spearman
    extra_recovered: dict[str, float] = field(default_factory=dict)
    params_removed: int | None = None  # parameters removed so far (parameter-scope curves)
    # median seconds of one forward of the physically pruned model
    latency_s: float | None = None
    # original latency / this latency (median of interleaved ratios)
    speedup: float | None = None
    flop_speedup: float | None = None  # original FLOPs / these FLOPs (the ideal)
    # the confidence intervals of metric and drop (and of their recovered twins), paired with the baseline
    bounds: dict[str, float] = field(default_factory=dict)
    # per held-out passage: the metric's numerators and denominators (num, den; rec_num, rec_den recovered)
    passages: dict[str, list[float]] = field(default_factory=dict, repr=False)

    @property
    def fraction_params(self) -> float:
        """The share of parameters removed (the x axis of parameter-scope curves)."""
        return self.fraction_removed


def relative_drop(metric: str, base: float, value: float) -> float:
    """How much worse `value` is than `base`, as the metric's entry reads it (perplexity increase for
    lm_loss, else the relative fall of a higher-is-better metric or rise of a lower-is-better one)."""
    return METRICS.get(metric).drop(base, value)


def within_target(point: CurvePoint, target: float, recovered: bool = False) -> bool:
    """Whether `point`'s drop (recovered, with `recovered`) stays within `target`: by the upper bound of its
    interval when the point has one, else by its point estimate (the rule of claims.py)."""
    key = "drop_recovered" if recovered else "drop"
    value = point.bounds.get(f"{key}_hi", getattr(point, key))
    return value is not None and value <= target + 1e-12


__all__ = ["CurvePoint", "relative_drop", "within_target"]
