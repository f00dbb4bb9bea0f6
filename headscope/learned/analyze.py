"""`analyze`: stream data through a model and return per-head attention statistics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..attention.kernel import check_output
from ..data import batches, pad_id, prepare_tokens, resolve_max_length, token_classes
from ..distributed import all_reduce_stats, is_main, shard_indices
from ..models.adapter import HeadModel
from ..stats import COUNT, DEFAULT_BLOCK, HeadStats, check_block, collect_stats, collect_stats_kernel, statistic_of
from ..table import HeadTable
from ..uncertainty import IntervalSettings, bootstrap, split_half
from ..version import versions

log = logging.getLogger(__name__)


def run_stats(hm: HeadModel, ids: list[list[int]], batch_size: int, progress: bool = False, *,
              block: int = DEFAULT_BLOCK, eager: bool = False, output: str = "blocks",
              passages: Sequence[int] | None = None, n_passages: int | None = None) -> HeadStats:
    """Stream token-id sequences through the model in batches and return the summed statistics.

    Sums are also kept per passage (`HeadStats.passage_sums`): `passages` names each sequence's index in the
    data (default 0, 1, ...; a rank of a data-parallel run passes its shard's indices) out of `n_passages`.

    Attention statistics come from the statistics kernel in blocks of `block` queries (no T x T map);
    `eager=True` reads them from eager attention's full maps instead (the reference; same numbers).
    By default (`output="blocks"`) the kernel computes each layer's output from the very blocks the
    statistics read (eager's output, one attention per layer); `output="sdpa"` calls sdpa for the output
    as well (measured slower at every T: docs/stats_kernel.md).
    """
    check_block(block)
    check_output(output)
    index = list(passages) if passages is not None else list(range(len(ids)))
    stats = HeadStats(hm.n_layers, hm.n_heads).track_passages(n_passages if n_passages is not None else len(ids))
    flags = token_classes(hm)
    n_batches = (len(ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches, desc="analyze", unit="batch", disable=not progress, leave=False)
    collector = collect_stats(hm, stats, flags) if eager else collect_stats_kernel(hm, stats, flags, block, output)
    try:
        with collector as session, torch.inference_mode():
            for batch in batches(ids, batch_size, pad_id=pad_id(hm)):
                session.set_batch(batch.attention_mask, batch.input_ids, [index[i] for i in batch.index])
                hm.model(**batch.model_inputs(hm.device), use_cache=False)
                bar.update(1)
    finally:
        bar.close()
    return stats


def analyze(
    hm: HeadModel,
    data: Any = None,
    *,
    max_length: int | None = None,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    progress: bool = False,
    block: int = DEFAULT_BLOCK,
    eager: bool = False,
    intervals: IntervalSettings | None = None,
) -> HeadTable:
    """Per-head attention statistics of `hm` over `data` (default: the built-in English sample).

    `data` is a path (.txt / .jsonl / .conllu), a TextSource, a list of strings, or a list of
    token-id lists. Returns a HeadTable whose columns are listed in `headscope.stats.STATISTICS`.
    Statistics come from the statistics kernel in blocks of `block` queries (the model keeps its sdpa
    forward); `eager=True` reads them from eager attention's full T x T maps instead (the reference:
    same numbers, memory and time growing as T^2), switching the model to eager for the run only.
    Each statistic comes with its bootstrap interval over the passages (`intervals`: level, resamples, method,
    seed; default 95%, 1,000, BCa) as columns `<name>_lo` and `<name>_hi`.
    """
    check_block(block)
    torch.manual_seed(seed)
    np.random.seed(seed)
    max_len = resolve_max_length(hm, max_length)
    tokens = prepare_tokens(hm, data, max_len, limit)
    # torchrun / --workers: each rank scans whole batches of its own, the sums are added (headscope.distributed)
    mine = shard_indices(tokens.ids, batch_size)
    stats = all_reduce_stats(run_stats(hm, [tokens.ids[i] for i in mine], batch_size, progress and is_main(),
                                       block=block, eager=eager, passages=mine, n_passages=len(tokens.ids)))
    return table_from_stats(hm, stats, {
        "data": tokens.source, "passages": len(tokens), "truncated": tokens.truncated, "max_length": max_len,
        "batch_size": batch_size, "seed": seed,
    }, intervals)


def stat_intervals(stats: HeadStats, settings: IntervalSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Each statistic's mean with its bootstrap interval (`<name>_lo`, `<name>_hi`) and the split-half
    stability of its ranking over heads, from the per-passage sums."""
    sums = stats.passage_sums()
    if sums is None:
        return {}, {}
    columns: dict[str, np.ndarray] = {}
    stability: dict[str, Any] = {}
    for name in stats.names():
        one = sums.select([name, f"{name}{COUNT}"])
        iv = bootstrap(one, statistic_of(name), settings)
        columns[f"{name}_lo"], columns[f"{name}_hi"] = iv.lo, iv.hi
        stability[name] = split_half(one, statistic_of(name), seed=settings.seed).record()
    return columns, stability


def table_from_stats(hm: HeadModel, stats: HeadStats, meta: dict[str, Any],
                     intervals: IntervalSettings | None = None) -> HeadTable:
    """A HeadTable of the statistics' means (each followed by its interval's bounds when the statistics
    hold per-passage sums), with model facts, versions, the interval settings, the split-half stability
    of every statistic and the raw sums in meta."""
    settings = intervals or IntervalSettings()
    bounds, stability = stat_intervals(stats, settings)
    columns: dict[str, np.ndarray] = {}
    for name, mean in stats.means().items():
        columns[name] = mean
        if f"{name}_lo" in bounds:
            columns[f"{name}_lo"], columns[f"{name}_hi"] = bounds[f"{name}_lo"], bounds[f"{name}_hi"]
    extra = {"intervals": settings.record(), "stability": stability} if bounds else {}
    return HeadTable(hm.n_layers, hm.n_heads, columns, {
        "model": hm.name, "model_source": hm.source, "model_type": hm.config.model_type,
        "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head_record,
        "causal": hm.causal, "tokens_seen": stats.tokens, **meta, **extra, "versions": versions(),
        "stats": stats.to_dict(),
    })
