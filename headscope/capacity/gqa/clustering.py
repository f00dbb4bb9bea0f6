"""Which KV heads are alike: K/V distances (from data or weights) and balanced partitions of the heads.

The similarity grouping mean-pools the KV heads whose keys and values are closest, so that pooling
loses the least. `kv_distances` measures the heads, `balanced_partition` splits them into equal groups
with the least mean-pooling error (`partition_cost`), and `random_balanced_groups` draws a uniformly
random equal split (the baseline every choice is compared with).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ...models.adapter import HeadModel
from ..convert.evaluate import token_batches
from .convert import adjacent_groups, check_convertible

# Above this many balanced partitions, similarity grouping uses local search instead of enumeration.
MAX_ENUMERATED_PARTITIONS = 20000


def enumerate_partitions(items: list[int], m: int) -> Iterator[list[list[int]]]:
    """All splits of `items` into groups of m (the group holding the first item comes first)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, m - 1):
        left = [h for h in rest if h not in others]
        for tail in enumerate_partitions(left, m):
            yield [[first, *others], *tail]


def _n_partitions(n: int, m: int) -> int:
    k = n // m
    return math.factorial(n) // (math.factorial(m) ** k * math.factorial(k))


def partition_cost(dist: np.ndarray, groups: Sequence[Sequence[int]]) -> float:
    """Mean-pooling error of a grouping: sum over groups of (1/m) * sum of pairwise squared distances.

    For vectors x_a in a group S of size m, sum_a ||x_a - mean_S||^2 = (1/m) sum_{a<b} ||x_a - x_b||^2.
    """
    total = 0.0
    for g in groups:
        total += sum(dist[a, b] for a, b in itertools.combinations(g, 2)) / len(g)
    return float(total)


def balanced_partition(dist: np.ndarray, kv_heads: int) -> list[list[int]]:
    """Split heads 0..n-1 into `kv_heads` equal groups minimising `partition_cost`.

    Exact (enumeration of all balanced partitions) when there are at most MAX_ENUMERATED_PARTITIONS of
    them (e.g. 8 heads in pairs: 105); otherwise local search from the adjacent grouping, swapping two
    heads of different groups while that lowers the cost. Both start from (and keep on ties) the
    adjacent grouping, so the result never costs more than it.
    """
    n = dist.shape[0]
    m = n // kv_heads
    best = adjacent_groups(n, kv_heads)
    best_cost = partition_cost(dist, best)
    tol = 1e-9 * max(1.0, abs(best_cost))
    if _n_partitions(n, m) <= MAX_ENUMERATED_PARTITIONS:
        for part in enumerate_partitions(list(range(n)), m):
            c = partition_cost(dist, part)
            if c < best_cost - tol:
                best, best_cost = part, c
    else:
        improved = True
        while improved:
            improved = False
            for gi, gj in itertools.combinations(range(kv_heads), 2):
                for a_i, b_i in itertools.product(range(m), range(m)):
                    trial = [list(g) for g in best]
                    trial[gi][a_i], trial[gj][b_i] = best[gj][b_i], best[gi][a_i]
                    c = partition_cost(dist, trial)
                    if c < best_cost - tol:
                        best, best_cost, improved = trial, c, True
    return sorted([sorted(g) for g in best])


def random_balanced_groups(n_kv: int, kv_heads: int, rng: np.random.Generator) -> list[list[int]]:
    """One uniformly random split of KV heads 0..n_kv-1 into `kv_heads` equal groups (sorted)."""
    m = n_kv // kv_heads
    p = [int(h) for h in rng.permutation(n_kv)]
    return sorted(sorted(p[j * m:(j + 1) * m]) for j in range(kv_heads))


def _gram(w: torch.Tensor, bias: torch.Tensor | None, n_kv: int) -> torch.Tensor:
    """[n_kv, n_kv] inner products of the heads' projection weights (bias as a constant input 1)."""
    w = w.detach().float()
    if bias is not None:
        w = torch.cat([w, bias.detach().float()[:, None]], dim=1)
    w = w.reshape(n_kv, -1)
    return w @ w.T


def kv_distances(hm: HeadModel, data: Any = None, *, max_length: int = 64, batch_size: int = 8,
                 limit: int | None = None, progress: bool = False) -> np.ndarray:
    """Per layer, squared distances between KV heads' K and V: `[n_layers, n_kv, n_kv]`.

    With `data`: distances between the heads' key and value projection outputs over all real tokens
    (RoPE is a per-position rotation, so pre- and post-RoPE key distances are equal). Without data:
    distances between the heads' projection weights. K and V parts are each divided by the mean squared
    norm of their heads so neither dominates.
    """
    n_kv = hm.n_kv_heads
    gk = torch.zeros(hm.n_layers, n_kv, n_kv, dtype=torch.float64)
    gv = torch.zeros_like(gk)
    if data is None:
        for layer in range(hm.n_layers):
            w = hm.qkv_weights(layer)
            gk[layer] = _gram(w.k, w.k_bias, n_kv).double()
            gv[layer] = _gram(w.v, w.v_bias, n_kv).double()
    else:
        todo = token_batches(hm, data, max_length, batch_size, limit)
        mask_now: list[torch.Tensor] = []

        def hook(store: torch.Tensor, layer: int) -> Callable[[nn.Module, Any, torch.Tensor], None]:
            def fn(_module: nn.Module, _inp: Any, out: torch.Tensor) -> None:
                x = out.detach()[mask_now[0].bool()]
                x = x.reshape(-1, n_kv, out.shape[-1] // n_kv).double()  # [tokens, kv_head, d_head]
                store[layer] += torch.einsum("nad,nbd->ab", x, x).cpu()
            return fn

        handles = []
        try:
            for layer in range(hm.n_layers):
                # The K and V projections' outputs, hooked through the adapter (GQA families keep them apart).
                proj = hm.projections(layer)
                handles.append(proj["k"].register_forward_hook(hook(gk, layer)))
                handles.append(proj["v"].register_forward_hook(hook(gv, layer)))
            with torch.no_grad():
                for b in tqdm(todo, desc="K/V similarity", disable=not progress):
                    mask_now[:] = [b.attention_mask.to(hm.device)]
                    hm.model(**b.model_inputs(hm.device), use_cache=False)
        finally:
            for h in handles:
                h.remove()

    def dist(g: torch.Tensor) -> torch.Tensor:
        diag = torch.diagonal(g, dim1=-2, dim2=-1)
        dd = diag[..., :, None] + diag[..., None, :] - 2 * g
        scale = diag.mean(-1).clamp_min(1e-30)[..., None, None]
        return dd.clamp_min(0) / scale

    return (dist(gk) + dist(gv)).numpy()


def similarity_groups(hm: HeadModel, kv_heads: int, data: Any = None, **kw: Any) -> list[list[list[int]]]:
    """Per layer, the balanced grouping of KV heads with the least K/V mean-pooling error (`kv_distances`)."""
    check_convertible(hm, kv_heads)
    dist = kv_distances(hm, data, **kw)
    return [balanced_partition(dist[layer], kv_heads) for layer in range(hm.n_layers)]
