"""Confidence intervals by resampling passages, and exact binomial intervals for counts.

`bootstrap(sums, statistic, settings)` draws `B` resamples of the rows of `sums` (passages, with
replacement, seeded), applies `statistic` to each resample's sums and reads the interval off the
replicates. Two methods:

- `bca` (the default): Efron's bias-corrected and accelerated percentile interval. The bias correction
  z0 is the normal quantile of the share of replicates below the estimate; the acceleration `a` comes from
  the jackknife (each row left out in turn), which costs one statistic evaluation over `rows` leave-one-out
  sums, cheap because every figure is a statistic of sums. BCa is second-order accurate and transformation
  respecting, which matters for headscope's figures: ratios (token-weighted means), perplexity increases
  exp(l - l0) - 1 and bounded masses near 0 or 1 are skewed, where the plain percentile interval covers
  less than its level.
- `percentile`: the replicates' quantiles alone (first-order accurate; for comparison).

Both use the expanded quantile of `expanded_z` (Hesterberg 2015): at tens of passages the plain bootstrap
covers less than its level, and the expansion (a t quantile times sqrt(n / (n - 1))) restores it.

Figures are computed on whole passages: tokens within a passage are not independent, so resampling
tokens would understate the uncertainty. With fewer than 2 rows no interval exists (NaN bounds).

`binomial_interval(k, n, level)` is the exact Clopper-Pearson interval of a proportion (needle counts).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import beta
from scipy.stats import t as student_t

from ..data.limits import WORK, check_at_most, check_fits_memory
from ..errors import HeadscopeError, OptionError
from .passages import PassageSums, Statistic

METHODS = ("bca", "percentile")
# Replicates evaluated per block, so memory stays B_block x rows x shape whatever B is.
_BLOCK = 250


@dataclass(frozen=True)
class IntervalSettings:
    """How intervals are computed: confidence level, resamples, method and seed (JSON records all four)."""

    level: float = 0.95
    B: int = 1000
    method: str = "bca"
    seed: int = 0

    def __post_init__(self) -> None:
        check_settings(self.level, self.B, self.method)

    def record(self) -> dict[str, Any]:
        """What a JSON file records beside every interval."""
        return {"level": self.level, "B": self.B, "method": self.method, "seed": self.seed,
                "resampled": "passages, with replacement"}


def check_settings(level: Any, B: Any, method: str = "bca") -> None:
    """Refuse a level outside (0, 1), fewer than 100 resamples or an unknown method (one line each)."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.0 < float(level) < 1.0 or \
            math.isnan(float(level)):
        raise OptionError("ci", f"must be a confidence level in (0, 1), e.g. 0.95; got {level!r}")
    if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 100:
        raise OptionError("bootstrap", f"must be an integer of at least 100 resamples (default 1000); got {B!r}")
    check_at_most("bootstrap", int(B), *WORK["bootstrap"])
    if method not in METHODS:
        raise HeadscopeError(f"unknown interval method {method!r}; choose one of {', '.join(METHODS)}")


@dataclass(frozen=True)
class Interval:
    """A figure with its interval: `value`, `lo`, `hi` (arrays shaped like the figure; NaN where none)."""

    value: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    settings: IntervalSettings

    def columns(self, name: str) -> dict[str, np.ndarray]:
        """`{name: value, name_lo: lo, name_hi: hi}` (the CSV columns of one figure)."""
        return {name: self.value, f"{name}_lo": self.lo, f"{name}_hi": self.hi}


def resample_weights(rows: int, B: int, seed: int) -> Iterator[np.ndarray]:
    """Bootstrap counts in blocks of at most `_BLOCK` resamples, `[block, rows]`: each resample a draw of `rows`
    rows with replacement; the same seed gives the same resamples (memory O(block x rows) whatever B)."""
    rng = np.random.default_rng(seed)
    for start in range(0, B, _BLOCK):
        b = min(_BLOCK, B - start)
        idx = rng.integers(0, rows, size=(b, rows))
        w = np.zeros((b, rows))
        np.add.at(w, (np.arange(b)[:, None], idx), 1.0)
        yield w


def one_blas_thread() -> AbstractContextManager[Any]:
    """BLAS on one thread for the resampling products: they are small (`[250, rows] x [rows, heads]`), and a
    multi-threaded OpenBLAS spends far longer synchronising than computing them (measured 80x slower on 2 busy
    cores, benchmarks/bench_uncertainty.py). Without threadpoolctl, BLAS keeps its own setting."""
    try:
        from threadpoolctl import threadpool_limits  # a dependency of headscope; tolerated when absent
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def replicates(sums: PassageSums, statistic: Statistic, B: int, seed: int) -> np.ndarray:
    """The statistic on `B` resamples of the rows: `[B, *figure]`."""
    with one_blas_thread():
        out = [np.asarray(statistic(sums.weighted(w)), dtype=float) for w in resample_weights(sums.rows, B, seed)]
    return np.concatenate(out, axis=0)


def _quantiles(reps: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per-element quantiles of `reps` `[B, *shape]` at levels `q` `[*shape]` (NaN replicates left out)."""
    srt = np.sort(reps, axis=0)  # NaN sort last
    n = np.sum(~np.isnan(reps), axis=0)
    pos = np.clip(q, 0.0, 1.0) * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    frac = pos - lo
    a = np.take_along_axis(srt, lo[None], axis=0)[0]
    b = np.take_along_axis(srt, hi[None], axis=0)[0]
    out = a + frac * (b - a)
    return np.where(n > 0, out, np.nan)


def expanded_z(alpha: float, rows: int) -> float:
    """The normal quantile a two-sided interval uses, widened for `rows` rows: sqrt(n / (n - 1)) x Student's
    t quantile with n - 1 degrees of freedom (Hesterberg's expanded bootstrap). The plain bootstrap's spread
    is the plug-in one (divided by n, not n - 1) and its quantiles are normal-like, so at tens of passages it
    covers less than its level (measured: 0.92 at 32 normal passages for 95%); the expansion restores it and
    vanishes as n grows."""
    return math.sqrt(rows / (rows - 1)) * float(student_t.ppf(1 - alpha / 2, rows - 1))


def _bca_levels(value: np.ndarray, reps: np.ndarray, jack: np.ndarray, rows: int,
                alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The BCa-adjusted lower and upper quantile levels of each element (with the expanded quantile), from
    the replicates `[B, *figure]` and the jackknife values `[rows, *figure]`."""
    # Elements without a value (a statistic a causal model cannot have) are all NaN: no warning for them.
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        valid = ~np.isnan(reps)
        # Replicates within rounding of the estimate are ties: otherwise float noise in a degenerate
        # distribution (a head whose removal changes nothing) would swing z0, and the bounds with it.
        tol = 1e-9 * (np.abs(value) + np.nan_to_num(np.nanstd(reps, axis=0)))
        tie = np.abs(reps - value) <= tol
        below = np.sum((reps < value) & ~tie & valid, axis=0) + 0.5 * np.sum(tie & valid, axis=0)
        share = below / np.maximum(valid.sum(0), 1)
        z0 = ndtri(np.clip(share, 1e-6, 1 - 1e-6))
        centred = np.nanmean(jack, axis=0) - jack
        num = np.nansum(centred ** 3, axis=0)
        den = 6.0 * np.nansum(centred ** 2, axis=0) ** 1.5
        a = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
        levels = []
        zq = expanded_z(alpha, rows)
        for z in (-zq, zq):
            levels.append(ndtr(z0 + (z0 + z) / (1 - a * (z0 + z))))
    return levels[0], levels[1]


def interval_from(value: np.ndarray, reps: np.ndarray, jack: np.ndarray | None, rows: int,
                  settings: IntervalSettings) -> Interval:
    """The interval of a figure from its bootstrap replicates `[B, *figure]` (and, for BCa, its jackknife
    values `[rows, *figure]`): for figures derived from several statistics' replicates, e.g. a Spearman
    correlation between two criteria computed on the same resamples."""
    value = np.asarray(value, dtype=float)
    if rows < 2:
        nan = np.full(value.shape, np.nan)
        return Interval(value, nan, nan.copy(), settings)
    alpha = 1.0 - settings.level
    if settings.method == "bca" and jack is not None:
        q_lo, q_hi = _bca_levels(value, reps, jack, rows, alpha)
    else:
        tail = float(ndtr(-expanded_z(alpha, rows)))
        q_lo, q_hi = np.full(value.shape, tail), np.full(value.shape, 1 - tail)
    lo, hi = _quantiles(reps, q_lo), _quantiles(reps, q_hi)
    bad = np.isnan(value)
    return Interval(value, np.where(bad, np.nan, lo), np.where(bad, np.nan, hi), settings)


def jackknife(sums: PassageSums, statistic: Statistic) -> np.ndarray:
    """The statistic with each row left out in turn: `[rows, *figure]`."""
    return np.asarray(statistic(sums.leave_one_out()), dtype=float)


def bootstrap(sums: PassageSums, statistic: Statistic, settings: IntervalSettings | None = None) -> Interval:
    """The figure `statistic(total sums)` with its bootstrap interval over the rows of `sums`."""
    st = settings or IntervalSettings()
    value = np.asarray(statistic(sums.total()), dtype=float)
    if sums.rows < 2:
        return interval_from(value, np.empty((0, *value.shape)), None, sums.rows, st)
    # [B, *figure] replicates, then their sorted copy and NaN mask: refused before they are drawn when they cannot fit
    check_fits_memory("bootstrap", st.B, 3 * 8 * max(1, value.size), f"the replicates of {value.size:,} values")
    reps = replicates(sums, statistic, st.B, st.seed)
    jack = jackknife(sums, statistic) if st.method == "bca" else None
    return interval_from(value, reps, jack, sums.rows, st)


def bootstrap_many(sums: PassageSums, statistics: Mapping[str, Statistic],
                   settings: IntervalSettings | None = None) -> dict[str, Interval]:
    """`bootstrap` of several figures of the same passages, all on the same resamples (paired)."""
    return {name: bootstrap(sums, fn, settings) for name, fn in statistics.items()}


def binomial_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a proportion k / n: (lo, hi); (nan, nan) when n is 0."""
    if n <= 0:
        return math.nan, math.nan
    alpha = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


__all__ = ["METHODS", "Interval", "IntervalSettings", "binomial_interval", "bootstrap", "bootstrap_many",
           "check_settings", "expanded_z", "interval_from", "jackknife", "one_blas_thread", "replicates",
           "resample_weights"]
