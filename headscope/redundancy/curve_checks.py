"""Checks of a pruning curve's settings that need no model and no data: what `PruneOptions.check` and the curve
engine (`curves.loop`) both refuse. Outside the `curves` package so that the options can import them while the
engine imports the options."""

from __future__ import annotations

import math

from ..errors import HeadscopeError
from ..eval.metrics import METRICS
from .importance.criteria import check_method
from .unit_kinds import unit_kind


def check_args(fraction: float | None, target_drop: float | None, step: float, recover_steps: int,
               method: str, unit: str | None = None) -> None:
    """Raise a clear error on a bad unit, fraction, target drop, step, recovery count or method (for `unit`;
    None: a head unit)."""
    kind = unit_kind(unit or "head")
    share = "heads" if kind.scope == "heads" else "parameters"
    check_method(kind.name, method)  # an unknown name raises, with a did-you-mean
    if kind.scope == "heads" and fraction is not None and not 0.0 <= fraction < 1.0:
        raise HeadscopeError(f"fraction must be in [0, 1) (share of heads to remove), got {fraction}; "
                             f"e.g. 0.4 removes 40% of the heads")
    if kind.scope != "heads" and fraction is not None and not 0.0 < fraction < 1.0:
        raise HeadscopeError(f"fraction must be in (0, 1) (share of parameters to remove), got {fraction}")
    if target_drop is not None and not (target_drop >= 0.0 and math.isfinite(target_drop)):
        raise HeadscopeError(f"target drop must be a non-negative share, got {target_drop}; e.g. 0.01 for 1%")
    if not 0.0 < step < 1.0:
        raise HeadscopeError(f"step must be in (0, 1) (share of {share} removed per step), got {step}; e.g. 0.05")
    if recover_steps < 0:
        raise HeadscopeError(f"recovery steps must be >= 0, got {recover_steps}")
    if kind.scope != "heads" and target_drop is not None:
        raise HeadscopeError(f"a target drop is for head units; with unit {kind.name!r} give a fraction, the share "
                             f"of parameters to remove (e.g. 0.3)")
    if fraction is None and target_drop is None:
        raise HeadscopeError("give a fraction of heads to remove (e.g. 0.4) or a target drop (e.g. 0.01 for 1%)"
                             if kind.scope == "heads" else
                             f"unit {kind.name!r} needs a fraction, the share of all parameters to remove (e.g. 0.3)")


def check_target_drop(metric: str, target_drop: float | None) -> None:
    """Refuse a target drop a bounded metric cannot reach (e.g. 200% of fidelity, a cosine)."""
    bound = METRICS.get(metric).max_drop
    if target_drop is not None and bound is not None and target_drop >= bound:
        raise HeadscopeError(f"target drop {target_drop:.0%} cannot be reached with metric {metric!r}: its largest "
                             f"possible drop is {bound:.0%}; give a target drop below it, e.g. 1% or 5%")


__all__ = ["check_args", "check_target_drop"]
