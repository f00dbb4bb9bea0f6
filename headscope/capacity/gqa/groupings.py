"""The groupings: which old KV heads share a new one. One registered function per grouping.

A grouping is a function `(hm, kv_heads, options) -> plan` registered in `GROUPINGS` with one line of
help; the plan holds `groups` (per layer, `groups[layer][new] = [old KV heads]`), `grouping_used` (what
was used, e.g. after a fallback) and whatever the grouping measured on the way. `plan_groups` and
`convert_to_gqa` look a grouping up by name, and the CLI's `--grouping` choices and help are read from
the registry, so a new grouping is one decorated function (and its test).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ...models.adapter import HeadModel
from ...registry import Registry
from ..convert.evaluate import compare
from . import clustering
from .convert import Groups, adjacent_groups, check_convertible, pool_kv_heads
from .search import search_groups

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupingOptions:
    """What a grouping may use besides the model and G: calibration data and how to read it, and settings."""

    data: Any = None  # calibration text (never the held-out text)
    max_length: int = 64
    batch_size: int = 8
    limit: int | None = None
    # similarity: keep adjacent groups when they do better on `data`
    fallback: bool = True
    search_candidates: int = 8  # search: random candidates per layer
    seed: int = 0  # search and random: seed of the random groupings
    progress: bool = False

    @property
    def reading(self) -> dict[str, Any]:
        """Keyword arguments for reading `data` (kv_distances, compare, search_groups)."""
        return dict(max_length=self.max_length, batch_size=self.batch_size, limit=self.limit)


GroupingFn = Callable[[HeadModel, int, GroupingOptions], dict[str, Any]]
GROUPINGS: Registry[GroupingFn] = Registry("grouping")


def _one_grouping(hm: HeadModel, kv_heads: int) -> bool:
    """G = 1 (one group of all heads) or G = n_kv (every head alone): there is nothing to choose."""
    return kv_heads in (1, hm.n_kv_heads)


def _adjacent(hm: HeadModel, kv_heads: int) -> list[list[list[int]]]:
    return [adjacent_groups(hm.n_kv_heads, kv_heads) for _ in range(hm.n_layers)]


@GROUPINGS.register("mean", help="adjacent KV heads share a new one: [0..m-1], [m..2m-1], ... (the paper's recipe)")
def mean_grouping(hm: HeadModel, kv_heads: int, opts: GroupingOptions) -> dict[str, Any]:
    """Adjacent groups (Ainslie et al.'s recipe)."""
    return {"grouping_used": "mean", "groups": _adjacent(hm, kv_heads)}


@GROUPINGS.register("similarity", help="group the KV heads whose keys/values on --data (or weights, without data) "
                                       "are closest, permuting query heads to match; falls back to adjacent groups "
                                       "when they do better on --data")
def similarity_grouping(hm: HeadModel, kv_heads: int, opts: GroupingOptions) -> dict[str, Any]:
    """Per layer, the balanced grouping with the least K/V mean-pooling error, checked against adjacent.

    With data and `opts.fallback`, the similarity groups are kept only if the converted model's KL from
    the original on the calibration data is no worse than with adjacent groups.
    """
    adjacent = _adjacent(hm, kv_heads)
    if _one_grouping(hm, kv_heads):
        return {"grouping_used": "similarity (only one grouping possible: same as mean)", "groups": adjacent}
    dist = clustering.kv_distances(hm, opts.data, progress=opts.progress, **opts.reading)
    groups = [clustering.balanced_partition(dist[layer], kv_heads) for layer in range(hm.n_layers)]
    plan: dict[str, Any] = {
        "grouping_used": "similarity",
        "groups": groups,
        "similarity_on": "data" if opts.data is not None else "weights",
        "pooling_error_adjacent": float(
            sum(clustering.partition_cost(dist[l], adjacent[l]) for l in range(hm.n_layers))
        ),
        "pooling_error_similarity": float(
            sum(clustering.partition_cost(dist[l], groups[l]) for l in range(hm.n_layers))
        ),
        "layers_regrouped": [l for l in range(hm.n_layers) if groups[l] != adjacent[l]],
    }
    if groups == adjacent:
        plan["grouping_used"] = "similarity (same as adjacent)"
        return plan
    if opts.fallback and opts.data is not None:
        models = {"similarity": pool_kv_heads(hm, kv_heads, groups), "adjacent": pool_kv_heads(hm, kv_heads, adjacent)}
        scores = compare(hm, models, opts.data, progress=opts.progress, **opts.reading)
        kl_sim, kl_adj = scores["similarity"]["kl"], scores["adjacent"]["kl"]
        plan.update(calibration_kl_similarity=kl_sim, calibration_kl_adjacent=kl_adj)
        if kl_sim > kl_adj:
            log.info("similarity groups did worse on calibration data (KL %.4f > %.4f); using adjacent", kl_sim, kl_adj)
            plan.update(grouping_used="mean (similarity fell back: worse on calibration data)", groups=adjacent)
    return plan


@GROUPINGS.register("search", help="per layer, pick among adjacent, similarity and --search-candidates random "
                                   "groupings the one with the lowest KL from the original model on --data (one "
                                   "greedy pass over the layers; about n_layers x (N+2) forward passes over --data)")
def search_grouping(hm: HeadModel, kv_heads: int, opts: GroupingOptions) -> dict[str, Any]:
    """`search_groups` (needs data; never ends worse on it than the better of adjacent / similarity)."""
    found = search_groups(hm, kv_heads, opts.data, candidates=opts.search_candidates, seed=opts.seed,
                          progress=opts.progress, **opts.reading)
    used = "search (only one grouping possible: same as mean)" if found.get("search_skipped") else "search"
    return {"grouping_used": used, **found}


@GROUPINGS.register("random", help="a uniformly random equal split of the KV heads per layer, drawn with --seed "
                                   "(a baseline: what a grouping choice must beat)")
def random_grouping(hm: HeadModel, kv_heads: int, opts: GroupingOptions) -> dict[str, Any]:
    """Per layer, an independent seeded random balanced grouping."""
    if _one_grouping(hm, kv_heads):
        return {"grouping_used": "random (only one grouping possible: same as mean)", "groups": _adjacent(hm, kv_heads)}
    rng = np.random.default_rng(opts.seed)
    groups = [clustering.random_balanced_groups(hm.n_kv_heads, kv_heads, rng) for _ in range(hm.n_layers)]
    return {"grouping_used": "random", "groups": groups}


def plan_groups(hm: HeadModel, kv_heads: int, grouping: str = "mean", data: Any = None, *, fallback: bool = True,
                max_length: int = 64, batch_size: int = 8, limit: int | None = None, search_candidates: int = 8,
                seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Choose the KV groups for `grouping` (a name in `GROUPINGS`), with what was compared.

    Keys: grouping, grouping_used, groups, and what the grouping measured. For "similarity" with `data`
    and `fallback`, the similarity groups are kept only if the converted model's KL divergence from the
    original on `data` (the calibration text, not the held-out text) is no worse than with adjacent
    groups; otherwise adjacent groups are used and `grouping_used` says so. For "search", `search_groups`
    (which needs `data`; `fallback` does not apply) with `search_candidates` random candidates.
    """
    check_convertible(hm, kv_heads)
    entry = GROUPINGS.get(grouping)
    opts = GroupingOptions(data=data, max_length=max_length, batch_size=batch_size, limit=limit, fallback=fallback,
                           search_candidates=search_candidates, seed=seed, progress=progress)
    return {"grouping": grouping, **entry.fn(hm, kv_heads, opts)}


def convert_to_gqa(hm: HeadModel, kv_heads: int, grouping: str = "mean", data: Any = None, *,
                   groups: Sequence[Groups] | None = None, **options: Any) -> HeadModel:
    """A new model with `kv_heads` KV heads: K/V projections mean-pooled within groups (input untouched).

    `grouping`: a name in `GROUPINGS` ("mean": adjacent groups; "similarity": the groups themselves,
    without the calibration fallback; "search": needs data; "random"), with `plan_groups`' keyword
    `options`; or pass `groups[layer] = [[old kv heads of new head 0], ...]` explicitly. Query heads are
    permuted so each new group's query heads are contiguous, which leaves their function unchanged.
    """
    check_convertible(hm, kv_heads)
    GROUPINGS.get(grouping)  # an unknown name is an error even when groups are given
    if groups is None:
        groups = plan_groups(hm, kv_heads, grouping, data, **{"fallback": False, **options})["groups"]
    return pool_kv_heads(hm, kv_heads, groups)
