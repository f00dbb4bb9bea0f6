"""The uncertainty of a pruning curve: every point's metric and drop with an interval over the held-out
passages, and whether two points can be told apart.

The metric of every point is measured on the SAME held-out passages as the unpruned model, so the
drop's interval is paired: each bootstrap resample takes the same passages for the point and for the
baseline (`headscope.uncertainty.bootstrap` on their joined per-passage sums), which removes the
passage-to-passage variation both share. Two points are "not distinguishable" when the paired
interval of their metric difference holds 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...eval.metrics import METRICS
from ...uncertainty import IntervalSettings, PassageSums, Sums, bootstrap


def _sums(base: dict[str, list[float]], point: dict[str, list[float]], key: str = "") -> PassageSums:
    return PassageSums({"b_num": np.asarray(base["num"]), "b_den": np.asarray(base["den"]),
                        "num": np.asarray(point[f"{key}num"]), "den": np.asarray(point[f"{key}den"])})


def _ratio(s: Sums, num: str, den: str) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return s[num] / s[den]


def point_intervals(metric: str, base: dict[str, list[float]], point: dict[str, list[float]],
                    settings: IntervalSettings, key: str = "") -> dict[str, float]:
    """`metric_lo/_hi` and `drop_lo/_hi` of one point (`key` "rec_" for the recovered model's), paired with the
    baseline's passages."""
    entry = METRICS.get(metric)
    drop = np.vectorize(entry.drop, otypes=[float])
    sums = _sums(base, point, key)
    m = bootstrap(sums, lambda s: _ratio(s, "num", "den"), settings)
    d = bootstrap(sums, lambda s: drop(_ratio(s, "b_num", "b_den"), _ratio(s, "num", "den")), settings)
    suffix = "_recovered" if key else ""
    return {f"metric{suffix}_lo": float(m.lo), f"metric{suffix}_hi": float(m.hi),
            f"drop{suffix}_lo": float(d.lo), f"drop{suffix}_hi": float(d.hi)}


def difference_interval(a: dict[str, list[float]], b: dict[str, list[float]], settings: IntervalSettings,
                        key_a: str = "", key_b: str = "") -> tuple[float, float, float]:
    """The metric of `b` minus that of `a` on the same passages, with its paired interval: (value, lo, hi)."""
    sums = PassageSums({"a_num": np.asarray(a[f"{key_a}num"]), "a_den": np.asarray(a[f"{key_a}den"]),
                        "b_num": np.asarray(b[f"{key_b}num"]), "b_den": np.asarray(b[f"{key_b}den"])})
    iv = bootstrap(sums, lambda s: _ratio(s, "b_num", "b_den") - _ratio(s, "a_num", "a_den"), settings)
    return float(iv.value), float(iv.lo), float(iv.hi)


def distinguishable(a: dict[str, list[float]], b: dict[str, list[float]], settings: IntervalSettings,
                    key: str = "") -> dict[str, Any]:
    """Whether two points' metrics differ beyond noise (the paired interval of the difference excludes 0)."""
    value, lo, hi = difference_interval(a, b, settings, key, key)
    return {"difference": value, "lo": lo, "hi": hi, "distinguishable": bool(lo > 0 or hi < 0)}


__all__ = ["difference_interval", "distinguishable", "point_intervals"]
