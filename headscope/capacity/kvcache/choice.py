"""Which KV heads keep their full KV: by a per-head score (top share or threshold), or at random.

Scores are per query head (`[n_layers, n_heads]`, higher = keep full), e.g. Wu et al.'s retrieval
score or any HeadTable column. The cache stores KV heads, and a KV head can be windowed only when
every query head of its group is, so a KV head's score is the largest score of its query heads.
Query heads that a score alone would window but that stay full because a group mate is kept are
"riders": `Choice.riders` counts them (what GQA costs the head-aware cache).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import HeadscopeError, OptionError, did_you_mean
from ...heads import Head
from .cache import CachePlan


def parse_budget(text: str) -> float:
    """'25%' or '0.25' -> 0.25; refuses anything outside (0, 1]."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise OptionError("keep_full", f"{text!r} is not a share of KV heads; give e.g. 25% or 0.25") from None
    if not (math.isfinite(value) and 0 < value <= 1):
        raise OptionError("keep_full", f"{text!r} must lie in (0, 1] (0% < share <= 100% of KV heads kept full); "
                                       f"e.g. 25% or 0.25")
    return value


def parse_budgets(text: str) -> list[float]:
    """A comma-separated list of budgets ('12.5%,25%,50%'), each in (0, 1]."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise OptionError("keep_full", f"{text!r} names no budget; give e.g. 25% or 12.5%,25%,50%")
    return [parse_budget(p) for p in parts]


def kv_head_scores(scores: np.ndarray, n_kv_heads: int) -> np.ndarray:
    """`[n_layers, n_kv_heads]`: each KV head's score, the largest of its query heads' (NaN counts as -inf)."""
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2 or s.shape[1] % n_kv_heads:
        raise HeadscopeError(f"head scores of shape {s.shape} do not split into {n_kv_heads} KV heads per layer")
    s = np.where(np.isnan(s), -np.inf, s)
    return s.reshape(s.shape[0], n_kv_heads, -1).max(-1)


def n_full_for(budget: float, total: int) -> int:
    """KV heads a budget keeps: the nearest whole number to budget x total, at least 1."""
    return max(1, min(total, int(math.floor(budget * total + 0.5))))


@dataclass(frozen=True)
class Choice:
    """The full KV heads of one cache, how they were chosen, and what GQA made them cost."""

    full: np.ndarray  # bool [n_layers, n_kv_heads]
    method: str  # 'full', 'score' or 'random'
    chosen_by: str = ""
    budget: float = 1.0
    riders: int = 0  # query heads kept full only because a group mate is

    def plan(self, group_size: int, sink: int, window: int) -> CachePlan:
        full = tuple(tuple(int(h) for h in np.flatnonzero(row)) for row in self.full)
        return CachePlan(full, self.full.shape[1], group_size, sink, window)

    @property
    def n_full(self) -> int:
        return int(self.full.sum())

    def full_heads(self) -> list[list[int]]:
        """Per layer, the KV heads kept full (JSON-ready)."""
        return [[int(h) for h in np.flatnonzero(row)] for row in self.full]


def _riders(scores: np.ndarray, full: np.ndarray, cut: float) -> int:
    """Query heads in full KV heads whose own score is below `cut`."""
    s = np.where(np.isnan(np.asarray(scores, float)), -np.inf, np.asarray(scores, float))
    group = s.shape[1] // full.shape[1]
    in_full = np.repeat(full, group, axis=1)
    return int((in_full & (s < cut)).sum())


def choose_full(n_layers: int, n_kv_heads: int, group_size: int) -> Choice:
    """Every KV head full: the ordinary cache."""
    return Choice(np.ones((n_layers, n_kv_heads), bool), "full")


def choose_top(scores: np.ndarray, n_kv_heads: int, budget: float, chosen_by: str, seed: int = 0) -> Choice:
    """The `budget` share of KV heads with the highest scores; ties broken at random (seeded)."""
    kv = kv_head_scores(scores, n_kv_heads)
    total = kv.size
    k = n_full_for(budget, total)
    tiebreak = np.random.default_rng(seed).random(total)
    order = np.lexsort((tiebreak, -kv.ravel()))  # highest score first, ties in random order
    flat = np.zeros(total, bool)
    flat[order[:k]] = True
    full = flat.reshape(kv.shape)
    cut = float(kv.ravel()[order[k - 1]])
    return Choice(full, "score", chosen_by, budget, _riders(scores, full, cut))


def choose_threshold(scores: np.ndarray, n_kv_heads: int, threshold: float, chosen_by: str) -> Choice:
    """KV heads with a query head scoring at least `threshold`."""
    full = kv_head_scores(scores, n_kv_heads) >= threshold
    if not full.any():
        best = (
            float(np.nanmax(np.asarray(scores, float)))
            if np.isfinite(np.nanmax(np.asarray(scores, float)))
            else math.nan
        )
        raise HeadscopeError(f"no head's {chosen_by} reaches threshold={threshold:g} (the highest is {best:g}); "
                             f"lower the threshold or use keep_full", fields=("threshold", "keep_full"))
    return Choice(full, "score", chosen_by, float(full.mean()), _riders(scores, full, threshold))


def choose_random(n_layers: int, n_kv_heads: int, n_full: int, seed: int, budget: float) -> Choice:
    """`n_full` KV heads at random (seeded): the control at equal bytes."""
    rng = np.random.default_rng(seed)
    full = np.zeros(n_layers * n_kv_heads, bool)
    full[rng.choice(full.size, size=n_full, replace=False)] = True
    return Choice(full.reshape(n_layers, n_kv_heads), "random", "", budget)


_COLUMN = re.compile(r"^-?[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ScoresFile:
    """A per-head CSV read once (when a verb checks its options): where it is, the score column, and its rows."""

    path: Path
    column: str  # the column's name, without the '-' of `by`
    sign: float  # -1.0 when `by` was '-COLUMN' (keep the lowest full)
    rows: tuple[dict[str, str], ...]


def read_scores_file(path: str | Path, column: str) -> ScoresFile:
    """Read a per-head CSV (heads.csv, roles.csv, importance.csv) once, refusing a missing file, a bad column name,
    or a file without `layer`, `head` and the column; `scores_matrix` then fits it to a model."""
    p = Path(path)
    if not p.is_file():
        raise OptionError("scores", f"{str(path)!r} is not a file; give a heads.csv or roles.csv written by "
                                    f"headscope")
    if not _COLUMN.match(column):
        raise OptionError("by", f"{column!r} is not a column name; give e.g. retrieval_score or -streaming_share")
    name = column[1:] if column.startswith("-") else column
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields = list(reader.fieldnames or [])
            rows = tuple(reader)
    except UnicodeDecodeError:
        raise OptionError("scores", f"{str(path)!r} is not UTF-8 text; give a CSV written by headscope") from None
    missing = [c for c in ("layer", "head", name) if c not in fields]
    if missing:
        raise HeadscopeError(f"{p} has no column {missing[0]!r}{did_you_mean(missing[0], fields)}; its columns: "
                             f"{', '.join(fields) or '(none)'}")
    return ScoresFile(p, name, -1.0 if column.startswith("-") else 1.0, rows)


def check_scores_file(path: str | Path, column: str) -> tuple[Path, str]:
    """Refuse a missing file, a bad column name, or a CSV without `layer`, `head` and the column;
    returns the path and the column's name without its '-'."""
    f = read_scores_file(path, column)
    return f.path, f.column


def scores_matrix(f: ScoresFile, n_layers: int, n_heads: int) -> np.ndarray:
    """`[n_layers, n_heads]` scores from the file's column (negated for '-COLUMN'); refuses heads the model lacks,
    a head twice, and a file that does not cover every head."""
    p, name = f.path, f.column
    out = np.full((n_layers, n_heads), np.nan)
    seen = np.zeros((n_layers, n_heads), bool)
    for lineno, row in enumerate(f.rows, start=2):
        try:
            layer, head, value = int(row["layer"]), int(row["head"]), float(row[name] or "nan")
        except ValueError:
            raise HeadscopeError(f"{p}:{lineno}: layer, head and {name} must be numbers; got "
                                 f"{row['layer']!r}, {row['head']!r}, {row[name]!r}") from None
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise HeadscopeError(f"{p}:{lineno}: head {Head(layer, head)} is not in this model ({n_layers} layers x "
                                 f"{n_heads} heads): the file belongs to another model")
        if seen[layer, head]:
            raise HeadscopeError(f"{p}:{lineno}: head {Head(layer, head)} appears twice; give a file written by "
                                 f"headscope")
        seen[layer, head] = True
        out[layer, head] = f.sign * value
    # another model's file fits inside this one's grid (e.g. 18 x 4 heads in 30 x 9)
    if not seen.all():
        raise HeadscopeError(f"{p} has rows for {int(seen.sum())} of this model's {seen.size} heads ({n_layers} layers "
                             f"x {n_heads}); give a file written for this model, one row per head")
    if np.isnan(out).all():
        raise HeadscopeError(f"{p}: column {name!r} holds no numbers for this model's heads")
    return out


def read_scores(path: str | Path, column: str, n_layers: int, n_heads: int) -> np.ndarray:
    """`[n_layers, n_heads]` scores from column `column` of a per-head CSV (heads.csv, roles.csv, importance.csv:
    columns `layer`, `head`, ...). A leading '-' negates the column (keep the lowest full)."""
    return scores_matrix(read_scores_file(path, column), n_layers, n_heads)


__all__ = [
    "Choice",
    "ScoresFile",
    "check_scores_file",
    "choose_full",
    "choose_random",
    "choose_threshold",
    "choose_top",
    "kv_head_scores",
    "n_full_for",
    "parse_budget",
    "parse_budgets",
    "read_scores",
    "read_scores_file",
    "scores_matrix",
]
