"""The records question 3's Results carry: prune.json and units.json (`PruneSummary`), unit_importance.json
(`UnitScoreMeta`) and the tasks' correlations and task-specific heads, typed where code reads them (the printout,
the study); every other key is kept as it came (`Record.rest`) and each file is written with its keys in their
order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..options.record import IntervalsUsed, Record

__all__ = ["PruneSummary", "TaskCorrelation", "TaskSpecific", "UnitRow", "UnitScoreMeta", "UntilStable"]


@dataclass
class UnitRow(Record):
    """A row of unit_importance.csv: one unit (a layer's attention sub-layer or block, or one FFN neuron) and its
    importance by each method, in `rest` as importance_<method> (the methods vary by run)."""

    unit: str
    layer: int
    index: int

    def importance(self, method: str) -> float:
        """The unit's importance by `method` (its importance_<method> column)."""
        return float(self.rest[f"importance_{method}"])


@dataclass
class UnitScoreMeta(Record):
    """unit_importance.json: the passages, the metric and its value, the methods and what each took."""

    passages: int
    metric: str
    metric_value: float
    methods: list[str]
    seconds: dict[str, float]  # "method" (or "m1+m2", scored together) -> seconds
    provenance: dict[str, Any]


@dataclass
class TaskCorrelation(Record):
    """Two tasks' Spearman rank correlation over heads, with its interval."""

    a: str
    b: str
    spearman: float
    lo: float
    hi: float


@dataclass
class TaskSpecific(Record):
    """A head in the top 10% for `task` and the bottom half for `other` (a task_specific.csv row)."""

    task: str
    other: str
    head: str


@dataclass
class UntilStable(Record):
    """How many scoring passages the unpruned ranking needed to reach its split-half target (--until-stable)."""

    target: float
    reached: bool
    passages: int
    available: int


@dataclass
class PruneSummary(Record):
    """prune.json (units.json): the curve's settings and summary, typed where code reads them; the curve's own
    summary (within target, claims, points, ...) is kept as it came."""

    model: str
    method: str
    metric: str
    unit: str
    higher_is_better: bool
    baseline: float
    intervals: IntervalsUsed
    heldout: str
    heldout_passages: int
    until_stable: UntilStable | None = None  # with --until-stable
    saved_model: dict[str, Any] | None = None  # with --save-model: where, and the pruned model's shape
    # with --protect: the heads kept out of the pruning order, what each carries, and whether the curve stopped early
    protected: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
