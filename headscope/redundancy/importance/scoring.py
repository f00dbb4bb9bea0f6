"""`score`: every head by each chosen criterion, as one HeadTable; and the criteria's rank agreement."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from ...data import Tokens
from ...distributed import run_on_main
from ...errors import HeadscopeError
from ...eval.evaluate import MetricResult, Reference, evaluate_prepared, make_reference, prepare
from ...eval.metrics import METRICS, resolve_metric
from ...models.adapter import HeadModel
from ...table import HeadTable
from ...version import versions
from .criteria import CRITERIA, ScoreContext, base_gates, parse_methods, shares


def score(
    hm: HeadModel,
    data: Any,
    methods: str | Sequence[str] = ("gradient",),
    *,
    metric: str = "auto",
    gates: torch.Tensor | None = None,
    reference: Reference | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
    ig_steps: int = 16,
    seed: int = 0,
    limit: int | None = None,
    progress: bool = False,
) -> HeadTable:
    """Score every head by each criterion; one column `importance_<method>` each (higher = more important).

    `methods` are names in `CRITERIA` (comma-separated, a list, or 'all'). `gates` is the current mask
    `[L, H]` (0 = already pruned: NaN in every column). Fidelity compares against `reference` (the
    unpruned model's outputs; built here when None).
    """
    chosen = parse_methods(methods)
    if batch_size < 1:
        raise HeadscopeError(f"batch_size must be at least 1, got {batch_size}")
    if ig_steps < 1:
        raise HeadscopeError(f"ig_steps must be at least 1, got {ig_steps}")
    if isinstance(data, Tokens):
        prep, metric = data, resolve_metric(hm, metric, data.labels is not None)
    else:
        prep, metric = prepare(hm, data, metric, max_length, limit)
    base = base_gates(hm, gates)
    if METRICS.get(metric).needs_reference:
        if reference is None:
            reference = make_reference(hm, prep, batch_size=batch_size, progress=progress)
        reference.check(prep)
    torch.manual_seed(seed)
    ctx = ScoreContext(hm, prep, metric, base, reference, batch_size, ig_steps, seed, progress)
    cols: dict[str, np.ndarray] = {}
    timings: dict[str, float] = {}
    for method in chosen:
        if method in cols:
            continue  # computed together with an earlier method (one backward pass, one analyze run)
        # Criteria sharing one computation are timed as one entry, e.g. "gradient+gradient_raw+taylor".
        group = [m for m in chosen if shares(CRITERIA.get(m)) == shares(CRITERIA.get(method))]
        t0 = time.perf_counter()
        for m in group:  # torchrun / --workers: `sharded` criteria split their work, the others run on rank 0
            fn = CRITERIA.get(m).fn
            cols[m] = np.array(fn(ctx) if CRITERIA.get(m).meta.get("sharded") else run_on_main(lambda: fn(ctx)),
                               dtype=float)
        timings["+".join(group)] = time.perf_counter() - t0
    base_result: MetricResult = ctx.base_result or evaluate_prepared(hm, prep, metric, gates=base,
                                                                     reference=reference, batch_size=batch_size)
    pruned = (base == 0).cpu().numpy()
    absent = np.zeros_like(pruned)
    absent[hm.headless_layers] = True  # layers without softmax heads (Qwen3.5's linear attention): no importance
    columns = {}
    for method in chosen:
        v = cols[method]
        if v.shape != pruned.shape:
            raise HeadscopeError(f"importance criterion {method!r} returned shape {v.shape}; "
                                 f"expected [n_layers, n_heads] = {list(pruned.shape)}")
        v[pruned | absent] = np.nan
        columns[f"importance_{method}"] = v
    meta = {
        "model": hm.name, "model_source": hm.source, "model_type": hm.config.model_type,
        "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head,
        "causal": hm.causal, "data": prep.source, "passages": len(prep.ids), "tokens_seen": prep.n_tokens,
        "max_length": prep.max_length, "batch_size": batch_size, "seed": seed, "ig_steps": ig_steps,
        "metric": metric, "metric_value": base_result.value, "metric_details": base_result.details,
        "higher_is_better": base_result.higher_is_better, "methods": chosen,
        "pruned_heads": int(pruned.sum()), "convention": "higher importance = more important; pruned heads NaN",
        "seconds": timings, "versions": versions(),
    }
    return HeadTable(hm.n_layers, hm.n_heads, columns, meta)


def rank_correlations(table: HeadTable) -> Any:
    """Spearman correlation between every pair of `importance_*` columns (pairwise over non-NaN heads)."""
    import pandas as pd  # pandas takes ~0.5 s to import; only this summary needs it

    names = [c for c in table.columns if c.startswith("importance_")]
    if not names:
        raise HeadscopeError(f"the table has no importance_* columns (columns: {', '.join(table.columns)}); "
                             f"run headscope score first")
    df = pd.DataFrame({n.removeprefix("importance_"): np.asarray(table[n], float).ravel() for n in names})
    return df.corr(method="spearman")


def layer_norms(column: np.ndarray) -> np.ndarray:
    """Per-layer L2 norm of a `[L, H]` column, ignoring NaN (pruned) heads."""
    return np.sqrt(np.nansum(np.asarray(column, float) ** 2, axis=-1))


__all__ = ["layer_norms", "rank_correlations", "score"]
