"""Per-passage contributions: what every statistic, criterion and metric accumulates, so that any figure can
be re-computed on a resample of the passages.

A figure headscope reports is a *statistic of sums over passages*: a mean (sum of values / number of
passages), a ratio (sum of numerators / sum of denominators: a token-weighted mean, a metric), a
difference of ratios (an ablation: the metric with a head off minus the metric with it on, on the same
passages), or a function of those (a layer-normalised gradient, a Spearman correlation). `PassageSums`
keeps each summed quantity per passage, `[rows, *shape]`, so the figure, its bootstrap replicates and
its jackknife values are the same statistic applied to differently weighted sums of the same rows.

Memory: rows x quantities x shape float64 numbers, e.g. 256 passages x 22 arrays (11 statistics, sum and
count) x 270 heads = 12 MB for SmolLM2. When there are more passages than `max_rows` (default 4,096), the
rows are fixed-size groups of consecutive passages instead (passage i goes to row i // group_size): the
bootstrap then resamples groups (a block bootstrap of group sums), which is valid while groups are
independent and slightly conservative otherwise; the grouping depends only on the passage count, never on
batching, so results stay batch-size invariant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

# Rows kept per quantity before passages are pooled into fixed-size groups (module docstring).
MAX_ROWS = 4096

Sums = Mapping[str, np.ndarray]
# A statistic maps summed quantities `{name: [*lead, *shape]}` to the figure `[*lead, *out]`; it must work on
# any leading dimensions (replicates, jackknife rows) and on the plain total (no leading dimension).
Statistic = Callable[[Sums], np.ndarray]


def group_size(n_passages: int, max_rows: int = MAX_ROWS) -> int:
    """Passages per row: 1 up to `max_rows` passages, else the smallest size that fits them in `max_rows` rows."""
    return max(1, math.ceil(n_passages / max_rows))


class PassageSums:
    """Named per-row sums `[rows, *shape]` (a row is one passage, or one group of passages)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], passages_per_row: int = 1) -> None:
        self.arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
        rows = {v.shape[0] for v in self.arrays.values()}
        if len(rows) > 1:
            raise ValueError(f"per-passage arrays disagree on the number of rows: {sorted(rows)}")
        self.rows = rows.pop() if rows else 0
        self.passages_per_row = passages_per_row

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def names(self) -> list[str]:
        return list(self.arrays)

    def total(self) -> dict[str, np.ndarray]:
        """Each quantity summed over all rows."""
        return {k: v.sum(0) for k, v in self.arrays.items()}

    def weighted(self, weights: np.ndarray) -> dict[str, np.ndarray]:
        """Sums under row weights `[R, rows]` (bootstrap counts): `{name: [R, *shape]}`."""
        w = np.asarray(weights, dtype=np.float64)
        return {k: np.tensordot(w, v, axes=(1, 0)) for k, v in self.arrays.items()}

    def leave_one_out(self) -> dict[str, np.ndarray]:
        """Sums without each row in turn (the jackknife): `{name: [rows, *shape]}`."""
        return {k: v.sum(0)[None] - v for k, v in self.arrays.items()}

    def take(self, rows: Sequence[int] | np.ndarray) -> "PassageSums":
        """The rows `rows` only (e.g. one half of a split)."""
        idx = np.asarray(rows, dtype=int)
        return PassageSums({k: v[idx] for k, v in self.arrays.items()}, self.passages_per_row)

    def select(self, names: Iterable[str], prefix: str = "") -> "PassageSums":
        """The quantities `names` only (renamed `prefix + name`)."""
        return PassageSums({prefix + n: self.arrays[n] for n in names}, self.passages_per_row)

    def join(self, other: "PassageSums", prefix: str = "") -> "PassageSums":
        """Both sets of quantities over the same rows (`other`'s named `prefix + name`)."""
        if other.rows != self.rows or other.passages_per_row != self.passages_per_row:
            raise ValueError(f"cannot join per-passage sums of {other.rows} rows into {self.rows}")
        return PassageSums({**self.arrays, **{prefix + k: v for k, v in other.arrays.items()}},
                           self.passages_per_row)

    @classmethod
    def concat(cls, parts: Sequence["PassageSums"]) -> "PassageSums":
        """The rows of `parts` one after the other (passages read in chunks); all hold the same quantities."""
        if not parts:
            raise ValueError("nothing to concatenate")
        names = parts[0].names()
        if any(p.names() != names or p.passages_per_row != parts[0].passages_per_row for p in parts):
            raise ValueError("per-passage sums of different quantities or groupings cannot be concatenated")
        return cls({n: np.concatenate([p[n] for p in parts], axis=0) for n in names}, parts[0].passages_per_row)

    def to_dict(self) -> dict[str, object]:
        """Lists for JSON or npz (`from_dict` reads them back)."""
        return {"passages_per_row": self.passages_per_row, "arrays": {k: v.tolist() for k, v in self.arrays.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "PassageSums":
        arrays = d.get("arrays")
        if not isinstance(arrays, Mapping):
            raise ValueError("per-passage sums need an 'arrays' mapping of name -> [rows, ...] lists")
        per_row = d.get("passages_per_row", 1)
        if not isinstance(per_row, (int, float, str)):
            raise ValueError(f"per-passage sums' passages_per_row must be a number, got {per_row!r}")
        return cls({k: np.asarray(v, dtype=float) for k, v in arrays.items()}, int(per_row))


class Accumulator:
    """Per-passage sums filled while streaming: `add(name, passages, values)` scatters each passage's values
    into its row, whatever the batching (so the totals are batch-size invariant to rounding)."""

    def __init__(self, n_passages: int, max_rows: int = MAX_ROWS) -> None:
        self.n_passages = n_passages
        self.per_row = group_size(n_passages, max_rows)
        self.n_rows = math.ceil(n_passages / self.per_row) if n_passages else 0
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, passages: Sequence[int] | np.ndarray, values: np.ndarray,
            where: tuple[slice | int, ...] = ()) -> None:
        """Add `values` `[len(passages), *shape]` to the rows of `passages` (`where`: a sub-block of the shape,
        e.g. `(layer,)` for one layer's heads)."""
        v = np.asarray(values, dtype=np.float64)
        rows = np.asarray(passages, dtype=int) // self.per_row
        if name not in self.arrays:
            raise KeyError(f"quantity {name!r} was not declared; call declare({name!r}, shape) first")
        target = self.arrays[name]
        np.add.at(target, (rows, *where), v)  # type: ignore[arg-type]  # numpy's stubs take no slices in the index tuple

    def declare(self, name: str, shape: tuple[int, ...]) -> None:
        """Make room for quantity `name` of `shape` per row (zeros); a second call keeps what is there."""
        if name not in self.arrays:
            self.arrays[name] = np.zeros((self.n_rows, *shape))

    def result(self) -> PassageSums:
        return PassageSums(self.arrays, self.per_row)

    @classmethod
    def holding(cls, sums: PassageSums, n_passages: int) -> "Accumulator":
        """An accumulator already holding `sums` (e.g. chunks of passages read in turn and concatenated)."""
        acc = cls(0)
        acc.n_passages, acc.per_row, acc.n_rows = n_passages, sums.passages_per_row, sums.rows
        acc.arrays = {k: v.copy() for k, v in sums.arrays.items()}
        return acc


def ratio(num: str, den: str) -> Statistic:
    """The statistic sum(num) / sum(den) (NaN where nothing was counted)."""

    def stat(s: Sums) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(s[den] > 0, s[num] / np.where(s[den] > 0, s[den], 1.0), np.nan)

    return stat


def mean_of(name: str, count: str) -> Statistic:
    """The mean of per-passage values: sum(name) / sum(count), `count` holding 1 per passage."""
    return ratio(name, count)


__all__ = ["MAX_ROWS", "Accumulator", "PassageSums", "Statistic", "Sums", "group_size", "mean_of", "ratio"]
