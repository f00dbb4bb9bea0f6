"""The uncertainty foundation against simulations whose true values are known.

- coverage: 95% intervals cover the true mean / ratio in 93-97% of 2,000 simulated data sets (in chunks of
  100 data sets; each chunk resamples with its own seed), for normal, skewed and bounded per-passage values;
- the bootstrap interval of a mean over many passages agrees with the normal-theory interval;
- split-half stability on data of known reliability equals its theoretical value;
- the same seed gives the same intervals; accumulation does not depend on batching; counts get exact
  binomial intervals; bad settings are one-line errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from headscope.errors import HeadscopeError
from headscope.uncertainty import (
    Accumulator,
    IntervalSettings,
    PassageSums,
    binomial_interval,
    bootstrap,
    check_settings,
    ratio,
    spearman,
    spearman_brown,
    split_half,
)

DATASETS, CHUNK = 2000, 100


def _coverage(draw, truth: float, n: int, method: str = "bca") -> float:
    """Share of simulated data sets (`draw(rng, n, d)` -> (num, den) `[n, d]`) whose interval holds `truth`."""
    rng = np.random.default_rng(12345)
    hits = 0
    for c in range(DATASETS // CHUNK):
        num, den = draw(rng, n, CHUNK)
        iv = bootstrap(PassageSums({"num": num, "den": den}), ratio("num", "den"),
                       IntervalSettings(method=method, seed=c))
        hits += int(np.sum((iv.lo <= truth) & (truth <= iv.hi)))
    return hits / DATASETS


def _normal(rng, n, d):
    return rng.normal(1.0, 2.0, (n, d)), np.ones((n, d))


def _exponential(rng, n, d):  # skewed per-passage values (an attention mass, a loss change)
    return rng.exponential(1.0, (n, d)), np.ones((n, d))


def _token_weighted(rng, n, d):  # a ratio: per-passage sums over a varying number of tokens
    den = rng.poisson(20, (n, d)) + 1.0
    return rng.lognormal(0.0, 0.5, (n, d)) * den, den


def _bounded(rng, n, d):  # a mass near its upper bound, per passage over 5-40 queries
    den = rng.integers(5, 40, (n, d)).astype(float)
    return rng.beta(18, 2, (n, d)) * den, den


@pytest.mark.parametrize("draw, truth", [(_normal, 1.0), (_exponential, 1.0), (_token_weighted, math.exp(0.125)),
                                         (_bounded, 0.9)], ids=["normal", "exponential", "ratio", "bounded"])
def test_95_percent_intervals_cover_the_truth_95_percent_of_the_time(draw, truth):
    got = _coverage(draw, truth, n=64)
    assert 0.93 <= got <= 0.97, f"coverage {got:.3f} of {DATASETS} data sets of 64 passages"


def test_bootstrap_of_a_mean_agrees_with_normal_theory():
    """2,000 passages: BCa and percentile bounds within 5% of the half-width of mean +- 1.96 s / sqrt(n) (the
    Monte Carlo error of a 2.5% quantile of 20,000 resamples is about 1% of the half-width)."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.3, 1.5, (2000, 5))
    sums = PassageSums({"num": x, "den": np.ones_like(x)})
    mean, se = x.mean(0), x.std(0, ddof=1) / math.sqrt(len(x))
    for method in ("bca", "percentile"):
        iv = bootstrap(sums, ratio("num", "den"), IntervalSettings(method=method, B=20000, seed=1))
        half = 1.96 * se
        assert np.allclose(iv.value, mean, atol=1e-12)
        assert np.all(np.abs(iv.lo - (mean - half)) < 0.05 * half), (method, iv.lo, mean - half)
        assert np.all(np.abs(iv.hi - (mean + half)) < 0.05 * half), (method, iv.hi, mean + half)


def test_split_half_stability_equals_its_theoretical_value():
    """Heads with true scores ~ N(0, 1), passages adding N(0, s²) noise: each half of n/2 passages has
    reliability rho = 1 / (1 + s² / (n/2)); for normal scores the halves' Spearman is (6/pi) asin(rho/2).
    20,000 heads keep the sampling error of a correlation below 0.01 (the tolerance is 0.03)."""
    rng = np.random.default_rng(7)
    heads, n = 20000, 80
    for noise in (2.0, 5.0, 12.0):
        true = rng.normal(0.0, 1.0, heads)
        x = true[None, :] + rng.normal(0.0, noise, (n, heads))
        st = split_half(PassageSums({"num": x, "den": np.ones_like(x)}), ratio("num", "den"), seed=3, splits=40)
        rho = 1.0 / (1.0 + noise ** 2 / (n / 2))
        want = 6 / math.pi * math.asin(rho / 2)
        assert abs(st.spearman - want) < 0.03, (noise, st.spearman, want)
        assert abs(st.spearman_brown - spearman_brown(st.spearman)) < 1e-12
        full = 1.0 / (1.0 + noise ** 2 / n)  # the reliability of all n passages
        assert abs(st.spearman_brown - 6 / math.pi * math.asin(full / 2)) < 0.05, (noise, st.spearman_brown, full)


def test_split_half_overlap_of_the_least_important_heads():
    """Ten planted dead heads among 100 are the ten lowest in both halves; with pure noise the halves share
    about k²/heads of their k lowest (100 of 1,000 heads: 10) and do not correlate."""
    rng = np.random.default_rng(1)
    x = rng.normal(5.0, 0.5, (40, 100))
    x[:, :10] = rng.normal(0.0, 0.5, (40, 10))
    st = split_half(PassageSums({"num": x, "den": np.ones_like(x)}), ratio("num", "den"), k=10)
    assert st.overlap == 10 and st.k == 10
    noise = rng.normal(0.0, 1.0, (40, 1000))
    st = split_half(PassageSums({"num": noise, "den": np.ones_like(noise)}), ratio("num", "den"), k=100, splits=20)
    assert 4 < st.overlap < 18 and abs(st.spearman) < 0.1, st


def test_same_seed_same_intervals_and_another_seed_others():
    rng = np.random.default_rng(0)
    s = PassageSums({"num": rng.exponential(1.0, (30, 7)), "den": np.ones((30, 7))})
    a, b = (bootstrap(s, ratio("num", "den"), IntervalSettings(seed=5)) for _ in range(2))
    c = bootstrap(s, ratio("num", "den"), IntervalSettings(seed=6))
    assert np.array_equal(a.lo, b.lo) and np.array_equal(a.hi, b.hi)
    assert not np.array_equal(a.lo, c.lo)


def test_a_dead_head_holds_zero_and_a_strong_head_stays_above_its_threshold():
    """A planted dead head (no weight on its key in any passage) has [0, 0], which holds 0; a head putting
    0.9 of its weight there, with passage-to-passage spread, keeps its lower bound above a 0.5 threshold."""
    rng = np.random.default_rng(2)
    queries = rng.integers(8, 30, 48).astype(float)
    dead = np.zeros(48)
    strong = rng.beta(45, 5, 48) * queries
    iv = bootstrap(PassageSums({"num": np.stack([dead, strong], 1), "den": np.stack([queries, queries], 1)}),
                   ratio("num", "den"))
    assert iv.lo[0] <= 0.0 <= iv.hi[0]
    assert iv.lo[1] > 0.5 and iv.lo[1] < iv.value[1] < iv.hi[1]


def test_accumulation_does_not_depend_on_batching():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(37, 4, 3))
    results = []
    for batch in (1, 3, 16):
        acc = Accumulator(37)
        acc.declare("x", (4, 3))
        order = rng.permutation(37)  # batches of passages in any order, as sorted-by-length batching gives
        for i in range(0, 37, batch):
            idx = order[i:i + batch]
            acc.add("x", idx, values[idx])
        results.append(acc.result()["x"])
    assert all(np.allclose(r, values, atol=1e-12) for r in results)


def test_many_passages_are_pooled_into_fixed_groups():
    acc = Accumulator(10_000, max_rows=100)
    acc.declare("x", ())
    acc.add("x", np.arange(10_000), np.ones(10_000))
    s = acc.result()
    assert s.rows == 100 and s.passages_per_row == 100 and np.all(s["x"] == 100)
    # the block bootstrap of group sums still covers on iid data (a mean over groups of 100 passages)
    rng = np.random.default_rng(4)
    x = rng.normal(0.0, 1.0, (100, 400))  # 400 data sets of 100 groups
    iv = bootstrap(PassageSums({"n": x, "d": np.ones_like(x)}, 100), ratio("n", "d"))
    assert 0.92 <= np.mean((iv.lo <= 0) & (0 <= iv.hi)) <= 0.98


def test_binomial_interval_is_clopper_pearson():
    lo, hi = binomial_interval(0, 10)
    assert lo == 0.0 and abs(hi - (1 - 0.025 ** (1 / 10))) < 1e-12
    lo, hi = binomial_interval(10, 10)
    assert hi == 1.0 and abs(lo - 0.025 ** (1 / 10)) < 1e-12
    lo, hi = binomial_interval(3, 4)
    assert 0.19 < lo < 0.2 and 0.99 < hi < 1.0  # 0.1941, 0.9937 (Clopper & Pearson 1934)
    assert all(math.isnan(v) for v in binomial_interval(0, 0))


def test_spearman_ignores_nan_and_handles_ties():
    a = np.array([1.0, 2.0, np.nan, 4.0, 4.0, 6.0])
    b = np.array([2.0, 1.0, 5.0, 3.0, 3.0, 9.0])
    from scipy.stats import spearmanr

    ok = ~np.isnan(a)
    assert abs(spearman(a, b) - spearmanr(a[ok], b[ok]).statistic) < 1e-12


def test_fewer_than_two_passages_give_no_interval():
    iv = bootstrap(PassageSums({"n": np.ones((1, 3)), "d": np.ones((1, 3))}), ratio("n", "d"))
    assert np.all(np.isnan(iv.lo)) and np.all(iv.value == 1.0)


@pytest.mark.parametrize("level, B, message", [(0.0, 1000, "^ci "), (1.0, 1000, "^ci "), (float("nan"), 1000, "^ci "),
                                               (0.95, 99, "^bootstrap "), (0.95, 100.5, "^bootstrap "),
                                               (0.95, True, "^bootstrap ")])
def test_bad_settings_are_one_line_errors(level, B, message):
    with pytest.raises(HeadscopeError, match=message):
        check_settings(level, B)
