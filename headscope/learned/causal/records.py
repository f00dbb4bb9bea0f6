"""The record the patch Result carries: patching.json (`PatchRecord`), typed where code reads it; every other key
is kept as it came (`Record.rest`) and the file is written with its keys in their order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...options.record import Estimate, IntervalsUsed, Record

__all__ = ["PatchRecord"]


@dataclass
class PatchRecord(Record):
    """patching.json: the metric on clean and corrupt prompts, the intervals, and what each method found beside
    the per-head table (exact vs attribution agreement, composition scores, path patching)."""

    metric: str
    direction: str
    M_clean: Estimate  # patching.json's key: the metric M on the clean prompts
    M_corrupt: Estimate
    pairs: dict[str, Any]  # where the pairs came from, how many, which were left out
    intervals: IntervalsUsed
    # with both methods: Spearman and the heads that differ most
    agreement: dict[str, Any] | None = None
    # K/Q/V composition's strongest pairs, or why none was computed
    composition: dict[str, Any] | str | None = None
    paths: dict[str, Any] | None = None  # path patching: receivers, senders, strongest paths
    provenance: dict[str, Any] | None = None
