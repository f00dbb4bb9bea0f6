"""Stability of a ranking: would the same heads come out on top (or bottom) with other passages?

`split_half` splits the passages at random into two disjoint halves, computes the figure on each, and
reports (averaged over `splits` random splits, seeded, to smooth the luck of one split):

- `spearman`: the rank correlation of the two halves' figures over the heads (finite values only);
- `spearman_brown`: 2r / (1 + r), the split-half estimate of the reliability of the figure computed on
  ALL the passages (each half holds half the data; Spearman-Brown's prophecy formula for doubling);
- `overlap`: how many of the `k` least important heads of one half are among the `k` least important of
  the other (`k` default: 10% of the heads, at least 1).

For a figure that is a mean of independent per-passage values with true spread `s_true` across heads and
per-passage noise `s_noise`, each half of n/2 passages has reliability rho = s_true² / (s_true² +
s_noise² / (n/2)); for normal scores the expected Pearson correlation of the halves is rho and the Spearman
correlation (6/pi) asin(rho/2) (tests/test_uncertainty.py checks both on simulated data).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import OptionError
from .passages import PassageSums, Statistic

# The fewest passages --until-stable starts from (two halves of four).
MIN_STABLE_PASSAGES = 8


def rank(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), 0-based, of a 1-D array without NaN."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    _, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / counts)[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two figures over their elements where both are finite (NaN when
    fewer than 3 remain or one side is constant)."""
    x, y = np.asarray(a, float).ravel(), np.asarray(b, float).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3:
        return math.nan
    rx, ry = rank(x[ok]), rank(y[ok])
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx ** 2).sum() * (ry ** 2).sum()))
    return float((rx * ry).sum() / den) if den > 0 else math.nan


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's correlation of each row of `a` and `b` `[R, K]` (finite columns only, the same in both)."""
    # scipy.stats takes ~1 s to import; only these replicate correlations need it
    from scipy.stats import rankdata

    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra ** 2).sum(-1) * (rb ** 2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def spearman_brown(r: float) -> float:
    """The reliability of the whole from the correlation of two halves: 2r / (1 + r)."""
    return 2 * r / (1 + r) if r == r and r > -1 else math.nan


def lowest(values: np.ndarray, k: int) -> set[int]:
    """Flat indices of the `k` smallest finite values (the least important heads)."""
    v = np.asarray(values, float).ravel()
    idx = np.flatnonzero(np.isfinite(v))
    return set(idx[np.argsort(v[idx], kind="stable")[:k]].tolist())


@dataclass(frozen=True)
class Stability:
    """Split-half agreement of a figure over heads (module docstring)."""

    spearman: float
    spearman_brown: float
    # mean count, over the splits, of the k lowest shared by both halves
    overlap: float
    k: int
    splits: int
    passages: int  # rows split (passages, or groups of passages)
    seed: int

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, what: str = "ranking") -> str:
        """One line for the console."""
        return (f"split-half stability of the {what} ({self.passages} passages, {self.splits} random splits): "
                f"Spearman {self.spearman:.2f} between halves, {self.spearman_brown:.2f} for all passages "
                f"(Spearman-Brown); {self.overlap:.1f} of the {self.k} least important heads shared")


def default_k(n_elements: int) -> int:
    """10% of the heads, at least one."""
    return max(1, math.ceil(0.1 * n_elements))


def split_half(sums: PassageSums, statistic: Statistic, *, seed: int = 0, splits: int = 10,
               k: int | None = None) -> Stability:
    """Split-half stability of `statistic` over random halves of the rows of `sums` (module docstring)."""
    n = sums.rows
    value = np.asarray(statistic(sums.total()), float)
    k = k or default_k(int(np.isfinite(value).sum()) or value.size)
    if n < 4:
        return Stability(math.nan, math.nan, math.nan, k, 0, n, seed)
    rng = np.random.default_rng(seed)
    rs, overlaps = [], []
    for _ in range(splits):
        perm = rng.permutation(n)
        half = n // 2
        a = np.asarray(statistic(sums.take(perm[:half]).total()), float)
        b = np.asarray(statistic(sums.take(perm[half:2 * half]).total()), float)
        rs.append(spearman(a, b))
        overlaps.append(len(lowest(a, k) & lowest(b, k)))
    r = float(np.nanmean(rs)) if np.isfinite(rs).any() else math.nan
    return Stability(r, spearman_brown(r), float(np.mean(overlaps)), k, splits, n, seed)


def spearman_interval(r: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """An interval for Spearman's r over `n` paired elements (heads): Fisher's z with Bonett & Wright's (2000)
    variance (1 + r²/2) / (n - 3). It treats the heads as the sample; the noise of the data each ranking was
    computed on is not in it (use a paired bootstrap of per-passage contributions where they exist)."""
    if not math.isfinite(r) or n < 4:
        return math.nan, math.nan
    # scipy.stats takes ~1 s to import; only this interval needs it
    from scipy.stats import norm

    z, se = math.atanh(max(min(r, 1 - 1e-12), -1 + 1e-12)), math.sqrt((1 + r * r / 2) / (n - 3))
    q = float(norm.ppf(1 - (1 - level) / 2))
    return math.tanh(z - q * se), math.tanh(z + q * se)


def check_until_stable(until_stable: float | None, available: int) -> None:
    """Refuse a target stability outside (0, 1), or one with fewer than 8 passages to split (every verb's
    --until-stable: score, prune, roles)."""
    if until_stable is None:
        return
    if isinstance(until_stable, bool) or not isinstance(until_stable, (int, float)) or \
            not 0.0 < float(until_stable) < 1.0:
        raise OptionError("until_stable", f"must be a split-half stability in (0, 1), e.g. 0.9; got {until_stable!r}")
    if available < MIN_STABLE_PASSAGES:
        raise OptionError("until_stable", f"needs at least {MIN_STABLE_PASSAGES} passages to split in halves; the "
                                          f"text holds {available} (raise limit or give more text)", also=("limit",))


def chunk_spans(n: int, until_stable: float | None, chunk: int) -> list[tuple[int, int]]:
    """Passage ranges [lo, hi) to read in turn: all at once without `until_stable`, else a first chunk of at
    least `MIN_STABLE_PASSAGES` and then `chunk` passages at a time."""
    if until_stable is None:
        return [(0, n)]
    first = max(MIN_STABLE_PASSAGES, chunk)
    bounds = [0, *range(first, n, chunk), n]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


__all__ = ["MIN_STABLE_PASSAGES", "Stability", "check_until_stable", "chunk_spans", "default_k", "lowest", "rank",
           "spearman", "spearman_brown", "spearman_interval", "spearman_rows", "split_half"]
