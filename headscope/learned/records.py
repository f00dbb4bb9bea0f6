"""The records question 1's Results carry: roles.json (`RolesReport`) and clusters.json (`ClustersRecord`), typed
where code reads them (the printout, syntax.csv, card export, the study); every other key is kept as it came
(`Record.rest`) and each file is written with its keys in their order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..options.record import IntervalsUsed, Record

__all__ = ["Cluster", "ClustersRecord", "RolesReport", "RolesText"]


@dataclass
class RolesText(Record):
    """The passages the short-range roles were scored on."""

    data: str
    passages: int
    # what the first position holds (a special token, or a word)
    first_token: str
    until_stable: dict[str, Any] | None = None  # with --until-stable: target, reached, passages, stability


@dataclass
class RolesReport(Record):
    """roles.json: the census (each role's heads with score, interval and baseline), the heads each role holds,
    the uncertain ones, the intervals and stability; syntax, coreference and the long-range record (with a head
    card once one is recorded) where they were measured."""

    text: RolesText
    induction: dict[str, Any]  # the repeated sequences induction was scored on
    intervals: IntervalsUsed
    roles: dict[str, list[str]]  # head name -> its roles
    # head name -> roles passing on the estimate but not on its bound
    uncertain: dict[str, list[str]]
    uncertain_heads: int
    census: dict[str, list[dict[str, Any]]]  # role -> its heads: head, score, lo, hi, baseline
    stability: dict[str, dict[str, Any]]  # score -> split-half stability of its ranking
    syntax: dict[str, Any] | None = None  # with a treebank: relations, info
    coreference: dict[str, Any] | None = None  # with coreference data
    provenance: dict[str, Any] | None = None
    long_context: dict[str, Any] | None = None  # with long=N: the long-range census, needles, a head card


@dataclass
class Cluster(Record):
    """Near-duplicate heads: every pair inside has js <= js_max and cka >= cka_min."""

    heads: list[str]
    size: int
    max_js: float
    mean_js: float
    min_cka: float
    mean_cka: float


@dataclass
class ClustersRecord(Record):
    """clusters.json: the clustering rule and its thresholds, the clusters, the similarity run's settings."""

    js_max: float
    cka_min: float
    rule: str
    clusters: list[Cluster]
    # the similarity run: model, data, queries, tokens, CKA estimator, ...
    meta: dict[str, Any]
    intervals: IntervalsUsed
    provenance: dict[str, Any]
