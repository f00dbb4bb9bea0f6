"""Uncertainty, in the foundation: every figure with its interval and every ranking with its stability.

Statistics, criteria and metrics accumulate per-passage contributions (`passages.PassageSums`); this
package turns them into confidence intervals (`bootstrap`: BCa by default, B = 1000 resamples of the
passages, seeded) and split-half stability of rankings (`stability`), for every verb and the report.
"""

from __future__ import annotations

from .bootstrap import (
                        METHODS,
                        Interval,
                        IntervalSettings,
                        binomial_interval,
                        bootstrap,
                        bootstrap_many,
                        check_settings,
                        expanded_z,
                        interval_from,
                        jackknife,
                        replicates,
                        resample_weights,
)
from .passages import MAX_ROWS, Accumulator, PassageSums, Statistic, Sums, group_size, mean_of, ratio
from .stability import (
                        MIN_STABLE_PASSAGES,
                        Stability,
                        check_until_stable,
                        chunk_spans,
                        default_k,
                        lowest,
                        rank,
                        spearman,
                        spearman_brown,
                        spearman_interval,
                        spearman_rows,
                        split_half,
)

__all__ = ["MAX_ROWS", "METHODS", "MIN_STABLE_PASSAGES", "Accumulator", "Interval", "IntervalSettings",
           "PassageSums", "Stability", "Statistic", "Sums", "binomial_interval", "bootstrap", "bootstrap_many",
           "check_settings", "check_until_stable", "chunk_spans", "default_k", "expanded_z", "group_size",
           "interval_from", "jackknife", "lowest", "mean_of", "rank", "ratio", "replicates", "resample_weights",
           "spearman", "spearman_brown", "spearman_interval", "spearman_rows", "split_half"]
