"""MHA -> GQA/MQA conversion of LLaMA-like decoders: group KV heads, mean-pool, uptrain, save.

A model with `n_heads` query heads and `n_kv_heads` key/value heads is turned into one with `G`
KV heads (G divides n_kv_heads). Each new KV head is the mean of the K and V projections (weights
and biases) of the old KV heads in its group (Ainslie et al. 2023, "GQA"). Which old KV heads share a
new one is the *grouping*:

- ``mean``: adjacent groups (old heads 0..m-1 -> new 0, m..2m-1 -> new 1, ...), the paper's recipe.
- ``similarity``: groups chosen to minimise the mean-pooling error of the K and V outputs on data
  (or of the K/V weights without data), in equal-size groups.
- ``search``: per layer, the candidate grouping (adjacent, similarity from data and from weights, N
  seeded random ones) with the lowest KL from the original model on calibration data, chosen by one
  greedy pass over the layers.

For every grouping other than adjacent, the query heads (rows of q_proj and the matching columns of
o_proj) are then permuted so every new group's query heads are contiguous, because transformers'
`repeat_kv` maps query head h to KV head h // (n_heads / G).

RoPE needs no special care: keys are rotated *after* projection, by a rotation that is linear and
the same for every head, so mean-pooling the projection weights equals mean-pooling rotated keys.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .analyze import pad_id, prepare_tokens
from .data import TextSource, batches, read_texts
from .errors import HeadscopeError
from .models.adapter import HeadModel
from .models.specs import SPECS, get_path, set_path

log = logging.getLogger(__name__)

#: config.model_type values whose checkpoints carry `num_key_value_heads` and whose attention
#: reads it (LLaMA-like decoders). Encoders (BERT) and GPT-2 have no such field.
SUPPORTED_MODEL_TYPES = tuple(t for spec in SPECS if spec.kv_heads_in_config for t in spec.model_types)
GROUPINGS = ("mean", "similarity", "search")
LOSSES = ("kd", "lm")
#: What uptraining updates: the attention projections (q/k/v/o) of every layer, or every parameter.
TRAINABLE = ("attention", "all")

# Above this many balanced partitions, similarity grouping uses local search instead of enumeration.
MAX_ENUMERATED_PARTITIONS = 20000


# --- input checks --------------------------------------------------------------------------------
def check_convertible(hm: HeadModel, kv_heads: int) -> None:
    """Raise a clear error unless `hm` can be converted to `kv_heads` KV heads."""
    mt = hm.config.model_type
    if not hm.spec.kv_heads_in_config:
        raise HeadscopeError(
            f"GQA conversion supports LLaMA-like decoders ({', '.join(SUPPORTED_MODEL_TYPES)}); model type {mt!r} "
            f"({hm.spec.family} family) is not one: its config has no num_key_value_heads, so every query head "
            f"has its own K/V by construction and plain transformers could not load a checkpoint with fewer KV heads"
        )
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, (int, np.integer)):
        raise HeadscopeError(f"--kv-heads must be a whole number, got {kv_heads!r}")
    n_kv, n_heads = hm.n_kv_heads, hm.n_heads
    divisors = [g for g in range(1, n_kv + 1) if n_kv % g == 0]
    if kv_heads < 1:
        raise HeadscopeError(f"--kv-heads must be at least 1 (1 = MQA), got {kv_heads}; choose one of {divisors}")
    if kv_heads > n_kv:
        raise HeadscopeError(
            f"--kv-heads {kv_heads} is larger than the model's current {n_kv} KV heads; conversion only merges KV "
            f"heads (it cannot invent new ones); choose one of {divisors}"
        )
    if n_kv % kv_heads:
        raise HeadscopeError(
            f"--kv-heads {kv_heads} does not divide the model's {n_kv} KV heads ({n_heads} query heads): groups "
            f"must be equal; choose one of {divisors}"
        )
    for layer in range(hm.n_layers):
        if hm.heads_in_layer(layer) != n_heads:
            raise HeadscopeError(
                f"layer {layer} has {hm.heads_in_layer(layer)} query heads, not {n_heads}: the model was pruned; "
                f"GQA conversion needs the same head count in every layer"
            )


def adjacent_groups(n_kv_heads: int, kv_heads: int) -> list[list[int]]:
    """Adjacent grouping: old KV heads [0..m-1], [m..2m-1], ... with m = n_kv_heads // kv_heads."""
    m = n_kv_heads // kv_heads
    return [list(range(j * m, (j + 1) * m)) for j in range(kv_heads)]


def _check_groups(groups: Sequence[Sequence[int]], n_kv: int, kv_heads: int, layer: int) -> list[list[int]]:
    flat = sorted(int(h) for g in groups for h in g)
    m = n_kv // kv_heads
    if len(groups) != kv_heads or any(len(g) != m for g in groups) or flat != list(range(n_kv)):
        raise HeadscopeError(
            f"layer {layer}: groups {[list(g) for g in groups]} are not a split of KV heads 0..{n_kv - 1} into "
            f"{kv_heads} groups of {m}"
        )
    return [[int(h) for h in g] for g in groups]


# --- head permutation ----------------------------------------------------------------------------
def _rows(w: torch.Tensor, order: Sequence[int], d_head: int) -> torch.Tensor:
    """Reorder head blocks of `d_head` rows (dim 0) of a Linear weight or bias."""
    blocks = w.reshape(-1, d_head, *w.shape[1:])
    return blocks[list(order)].reshape(w.shape).clone()


def _cols(w: torch.Tensor, order: Sequence[int], d_head: int) -> torch.Tensor:
    """Reorder head blocks of `d_head` columns (dim 1) of a Linear weight."""
    blocks = w.reshape(w.shape[0], -1, d_head)
    return blocks[:, list(order)].reshape(w.shape).clone()


def _kv_order_for(query_order: Sequence[int], n_heads: int, n_kv: int, layer: int) -> list[int]:
    """The KV-head order implied by a query-head order, or an error if it would break repeat_kv."""
    g = n_heads // n_kv
    if sorted(query_order) != list(range(n_heads)):
        raise HeadscopeError(f"layer {layer}: {list(query_order)} is not a permutation of heads 0..{n_heads - 1}")
    kv_order = []
    for j in range(n_kv):
        owners = {int(h) // g for h in query_order[j * g:(j + 1) * g]}
        if len(owners) != 1:
            raise HeadscopeError(
                f"layer {layer}: query heads {list(query_order[j * g:(j + 1) * g])} would share KV slot {j} but "
                f"use different KV heads {sorted(owners)}; keep the {g} query heads of each KV head together"
            )
        kv_order.append(owners.pop())
    return kv_order


def _permute_layer(hm: HeadModel, block: nn.Module, query_order: Sequence[int], kv_order: Sequence[int]) -> None:
    """Reorder query heads (q_proj rows, o_proj columns) and KV heads (k/v rows) of one layer in place."""
    d = hm.d_head
    with torch.no_grad():
        q = get_path(block, hm.spec.q_proj)
        q.weight.copy_(_rows(q.weight, query_order, d))
        if q.bias is not None:
            q.bias.copy_(_rows(q.bias, query_order, d))
        o = get_path(block, hm.spec.out_proj)
        o.weight.copy_(_cols(o.weight, query_order, d))  # o_proj bias is per output feature: unchanged
        for path in (hm.spec.k_proj, hm.spec.v_proj):
            lin = get_path(block, path)
            lin.weight.copy_(_rows(lin.weight, kv_order, d))
            if lin.bias is not None:
                lin.bias.copy_(_rows(lin.bias, kv_order, d))


def permute_query_heads(hm: HeadModel, orders: dict[int, Sequence[int]] | Sequence[Sequence[int]]) -> HeadModel:
    """A copy of `hm` whose query heads are reordered per layer (the function is unchanged).

    `orders[layer][p]` is the old query head placed at position p. The rows of q_proj and the matching
    columns of o_proj move together; for GQA the query heads of each KV head must stay together and the
    KV heads (k_proj/v_proj rows) move with them, since query head h reads KV head h // group_size.
    """
    check_convertible(hm, hm.n_kv_heads)
    items = orders.items() if isinstance(orders, dict) else enumerate(orders)
    model = copy.deepcopy(hm.model)
    out = HeadModel(model=model, tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
    for layer, order in items:
        hm.check_head(int(layer), 0)
        order = [int(h) for h in order]
        kv_order = _kv_order_for(order, hm.n_heads, hm.n_kv_heads, int(layer))
        _permute_layer(out, out.layers[int(layer)], order, kv_order)
    return out


# --- similarity grouping -------------------------------------------------------------------------
def _partitions(items: list[int], m: int):
    """All splits of `items` into groups of m (the group holding the first item comes first)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, m - 1):
        left = [h for h in rest if h not in others]
        for tail in _partitions(left, m):
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
        for part in _partitions(list(range(n)), m):
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


def _kv_linears(hm: HeadModel, layer: int) -> tuple[nn.Linear, nn.Linear]:
    block = hm.layers[layer]
    return get_path(block, hm.spec.k_proj), get_path(block, hm.spec.v_proj)


def _gram_from_weights(lin: nn.Linear, n_kv: int, d_head: int) -> torch.Tensor:
    """[n_kv, n_kv] inner products of the heads' projection weights (bias as a constant input 1)."""
    w = lin.weight.detach().float()
    if lin.bias is not None:
        w = torch.cat([w, lin.bias.detach().float()[:, None]], dim=1)
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
    n_kv, d = hm.n_kv_heads, hm.d_head
    gk = torch.zeros(hm.n_layers, n_kv, n_kv, dtype=torch.float64)
    gv = torch.zeros_like(gk)
    if data is None:
        for layer in range(hm.n_layers):
            k, v = _kv_linears(hm, layer)
            gk[layer] = _gram_from_weights(k, n_kv, d).double()
            gv[layer] = _gram_from_weights(v, n_kv, d).double()
    else:
        ids, _, _, _, _ = prepare_tokens(hm, data, max_length, limit)
        mask_now: list[torch.Tensor] = []

        def hook(store: torch.Tensor, layer: int):
            def fn(_module, _inp, out):
                x = out.detach()[mask_now[0].bool()].reshape(-1, n_kv, d).double()  # [tokens, kv_head, d_head]
                store[layer] += torch.einsum("nad,nbd->ab", x, x)
            return fn

        handles = []
        try:
            for layer in range(hm.n_layers):
                k, v = _kv_linears(hm, layer)
                handles.append(k.register_forward_hook(hook(gk, layer)))
                handles.append(v.register_forward_hook(hook(gv, layer)))
            with torch.no_grad():
                for b in tqdm(list(batches(ids, batch_size, pad_id(hm))), desc="K/V similarity", disable=not progress):
                    mask_now[:] = [b.attention_mask]
                    hm.model(**b.model_inputs(hm.device))
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


# --- conversion ----------------------------------------------------------------------------------
def _pool(w: torch.Tensor, order: Sequence[int], kv_heads: int, d_head: int) -> torch.Tensor:
    """Reorder KV head blocks (dim 0) and mean-pool consecutive groups: [n_kv*d, ...] -> [G*d, ...]."""
    blocks = w.reshape(-1, d_head, *w.shape[1:])[list(order)]  # [n_kv, d_head, ...]
    m = blocks.shape[0] // kv_heads
    return blocks.reshape(kv_heads, m, d_head, *w.shape[1:]).mean(1).reshape(kv_heads * d_head, *w.shape[1:])


def convert_to_gqa(hm: HeadModel, kv_heads: int, grouping: str = "mean", data: Any = None, *,
                   groups: Sequence[Sequence[Sequence[int]]] | None = None, **similarity_kw: Any) -> HeadModel:
    """A new model with `kv_heads` KV heads: K/V projections mean-pooled within groups (input untouched).

    `grouping`: "mean" (adjacent groups), "similarity" (groups from `similarity_groups(hm, kv_heads,
    data)`) or "search" (`search_groups(hm, kv_heads, data)`, needs data); or pass `groups[layer] = [[old kv heads of new head 0], ...]` explicitly. Query heads are
    permuted so each new group's query heads are contiguous, which leaves their function unchanged.
    """
    check_convertible(hm, kv_heads)
    if grouping not in GROUPINGS:
        raise HeadscopeError(f"grouping {grouping!r} is not known; choose one of {', '.join(GROUPINGS)}")
    n_heads, n_kv, d = hm.n_heads, hm.n_kv_heads, hm.d_head
    if groups is None:
        if grouping == "similarity":
            groups = similarity_groups(hm, kv_heads, data, **similarity_kw)
        elif grouping == "search":
            groups = search_groups(hm, kv_heads, data, **similarity_kw)["groups"]
        else:
            groups = [adjacent_groups(n_kv, kv_heads)] * hm.n_layers
    if len(groups) != hm.n_layers:
        raise HeadscopeError(f"groups has {len(groups)} layers; the model has {hm.n_layers}")
    groups = [_check_groups(g, n_kv, kv_heads, layer) for layer, g in enumerate(groups)]

    model = copy.deepcopy(hm.model)
    model.config.num_key_value_heads = kv_heads
    out = HeadModel(model=model, tokenizer=hm.tokenizer, name=f"{hm.name}-kv{kv_heads}",
                    source=f"gqa({hm.source or hm.name})")
    with torch.no_grad():
        for layer, layer_groups in enumerate(groups):
            block = out.layers[layer]
            new_params = _layer_params(hm, layer, layer_groups, kv_heads)
            for path in (out.spec.k_proj, out.spec.v_proj):
                old = get_path(block, path)
                new = nn.Linear(old.in_features, kv_heads * d, bias=old.bias is not None,
                                dtype=old.weight.dtype, device=old.weight.device)
                new.weight.requires_grad_(old.weight.requires_grad)
                set_path(block, path, new)
            _write_layer_params(out, layer, new_params)
            # The attention module cached its head counts at construction (LLaMA feeds n_heads //
            # n_kv_heads to repeat_kv); a freshly loaded checkpoint computes them from the config.
            out.set_head_counts(layer, n_heads, kv_heads)
    return out


def _layer_params(hm: HeadModel, layer: int, layer_groups: Sequence[Sequence[int]],
                  kv_heads: int) -> dict[tuple[str, str], torch.Tensor]:
    """The converted attention tensors of one layer of `hm` for `layer_groups`, keyed (module path, attr).

    Query heads (q_proj rows and bias, o_proj columns) are reordered so each group's query heads are
    contiguous; K/V rows are reordered and mean-pooled per group. `hm` itself is not modified.
    """
    block, spec, d = hm.layers[layer], hm.spec, hm.d_head
    g_old = hm.n_heads // hm.n_kv_heads
    kv_order = [h for g in layer_groups for h in g]
    query_order = [kv * g_old + i for kv in kv_order for i in range(g_old)]
    out: dict[tuple[str, str], torch.Tensor] = {}
    with torch.no_grad():
        q = get_path(block, spec.q_proj)
        out[(spec.q_proj, "weight")] = _rows(q.weight, query_order, d)
        if q.bias is not None:
            out[(spec.q_proj, "bias")] = _rows(q.bias, query_order, d)
        out[(spec.out_proj, "weight")] = _cols(get_path(block, spec.out_proj).weight, query_order, d)
        for path in (spec.k_proj, spec.v_proj):
            lin = get_path(block, path)
            out[(path, "weight")] = _pool(lin.weight, kv_order, kv_heads, d)
            if lin.bias is not None:
                out[(path, "bias")] = _pool(lin.bias, kv_order, kv_heads, d)
    return out


def _write_layer_params(hm: HeadModel, layer: int, params: dict[tuple[str, str], torch.Tensor]) -> None:
    """Copy `_layer_params` output into layer `layer` of an already converted model (in place)."""
    block = hm.layers[layer]
    with torch.no_grad():
        for (path, attr), t in params.items():
            getattr(get_path(block, path), attr).copy_(t)


def expand_kv_heads(hm: HeadModel) -> HeadModel:
    """The inverse direction, exactly: a copy where every query head has its own KV head (MHA).

    Each KV head's K/V rows are repeated for the query heads that read it, which is what `repeat_kv`
    does at run time, so outputs are unchanged; the cache grows by the group size. Useful to study
    regrouping from an MHA starting point.
    """
    check_convertible(hm, hm.n_kv_heads)
    g, d = hm.group_size, hm.d_head
    model = copy.deepcopy(hm.model)
    model.config.num_key_value_heads = hm.n_heads
    out = HeadModel(model=model, tokenizer=hm.tokenizer, name=f"{hm.name}-mha", source=hm.source)
    with torch.no_grad():
        for layer in range(hm.n_layers):
            block = out.layers[layer]
            for path in (out.spec.k_proj, out.spec.v_proj):
                old = get_path(block, path)
                new = nn.Linear(old.in_features, hm.n_heads * d, bias=old.bias is not None,
                                dtype=old.weight.dtype, device=old.weight.device)
                # query head h reads KV head h // g: block h of the new projection is old block h // g
                new.weight.copy_(old.weight.reshape(hm.n_kv_heads, d, -1).repeat_interleave(g, 0).reshape(-1, old.in_features))
                if old.bias is not None:
                    new.bias.copy_(old.bias.reshape(hm.n_kv_heads, d).repeat_interleave(g, 0).reshape(-1))
                set_path(block, path, new)
            out.set_head_counts(layer, hm.n_heads, hm.n_heads)  # see convert_to_gqa
    return out


# --- data ----------------------------------------------------------------------------------------
def load_text(spec: str | Path | None, limit: int | None = None, default: str = "ptb-valid") -> TextSource:
    """Text for calibration/uptraining/evaluation: `ptb-train|ptb-valid|ptb-test` or a file (`read_texts`)."""
    return read_texts(spec if spec is not None else default, limit)


# --- evaluation ----------------------------------------------------------------------------------
def _token_batches(hm: HeadModel, data: Any, max_length: int, batch_size: int, limit: int | None):
    ids, _, _, _, _ = prepare_tokens(hm, data, max_length, limit)
    return list(batches(ids, batch_size, pad_id(hm)))


def _shifted_nll(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL over real positions, and how many there were."""
    target_ok = (mask[:, 1:] * mask[:, :-1]).bool()  # [batch, pos-1]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return nll[target_ok].sum(), target_ok.sum()


def compare(reference: HeadModel, candidates: dict[str, HeadModel], data: Any, *, max_length: int = 64,
            batch_size: int = 8, limit: int | None = None, progress: bool = False) -> dict[str, dict[str, float]]:
    """One pass over `data`: perplexity of `reference` and of each candidate, and each candidate's mean
    per-token KL(reference || candidate) in nats (0 = same next-token distributions).

    Perplexity is exp of the mean next-token NLL over all real positions (the first token of a passage
    is not predicted). Returns {"reference": {"ppl"}, name: {"ppl", "kl"}, ...}.
    """
    nll = {name: 0.0 for name in ["reference", *candidates]}
    kl = {name: 0.0 for name in candidates}
    count = 0
    with torch.no_grad():
        for b in tqdm(_token_batches(reference, data, max_length, batch_size, limit), desc="evaluate",
                      disable=not progress):
            inp = b.model_inputs(reference.device)
            ok = (inp["attention_mask"][:, 1:] * inp["attention_mask"][:, :-1]).bool()  # [batch, pos-1]
            target = inp["input_ids"][:, 1:][ok]
            r = torch.log_softmax(reference.model(**inp).logits[:, :-1].float(), -1)[ok]  # [tokens, vocab]
            nll["reference"] -= float(r.gather(-1, target[:, None]).sum())
            for name, cand in candidates.items():
                c_inp = {k: v.to(cand.device) for k, v in inp.items()}
                c = torch.log_softmax(cand.model(**c_inp).logits[:, :-1].float(), -1)[ok.to(cand.device)].to(r.device)
                nll[name] -= float(c.gather(-1, target[:, None]).sum())
                kl[name] += float((r.exp() * (r - c)).sum(-1).clamp_min(0).sum())
            count += int(ok.sum())
    if count == 0:
        raise HeadscopeError("evaluation needs passages of at least 2 tokens; all were shorter")
    out: dict[str, dict[str, float]] = {"reference": {"ppl": math.exp(nll["reference"] / count)}}
    for name in candidates:
        out[name] = {"ppl": math.exp(nll[name] / count), "kl": kl[name] / count}
    out["reference"]["tokens"] = count
    return out


def perplexity(hm: HeadModel, data: Any, **kw: Any) -> float:
    """Token-level perplexity (exp of the mean next-token NLL over all real positions) on `data`."""
    return compare(hm, {}, data, **kw)["reference"]["ppl"]


def kl_divergence(reference: HeadModel, model: HeadModel, data: Any, **kw: Any) -> float:
    """Mean per-token KL(reference || model) of next-token distributions on `data`, in nats."""
    return compare(reference, {"model": model}, data, **kw)["model"]["kl"]


def cache_bytes(cache: Any) -> int:
    """Bytes of all key and value tensors held by a transformers cache (e.g. DynamicCache)."""
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if t is not None:
                total += t.numel() * t.element_size()
    return int(total)


def measure_kv_bytes(hm: HeadModel, batch: int = 1, prompt_len: int = 16, new_tokens: int = 4,
                     seed: int = 0) -> tuple[int, int]:
    """KV-cache bytes after greedy generation of `new_tokens` from random prompts: (bytes, cached length)."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(hm.model.get_input_embeddings().num_embeddings)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(hm.device)
    with torch.no_grad():
        out = hm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                                return_dict_in_generate=True, pad_token_id=pad_id(hm))
    # transformers 5 names the returned cache `cache` (older releases: `past_key_values`).
    cache = getattr(out, "cache", None) or out.past_key_values
    return cache_bytes(cache), int(cache.get_seq_length())


# --- uptraining ----------------------------------------------------------------------------------
@dataclass
class UptrainLog:
    """Loss per step of an uptraining run and the settings used."""

    losses: list[float] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def uptrain(student: HeadModel, data: Any, steps: int, *, teacher: HeadModel | None = None, loss: str = "kd",
            lr: float = 1e-3, train: str = "attention", batch_size: int = 8, max_length: int = 64, limit: int | None = None,
            weight_decay: float = 0.0, seed: int = 0, progress: bool = False) -> tuple[HeadModel, UptrainLog]:
    """A copy of `student` trained for `steps` AdamW steps on `data` (input untouched).

    `loss="kd"`: KL(teacher || student) on next-token distributions (teacher = the original model);
    `loss="lm"`: plain next-token cross-entropy. `train="attention"` updates only the q/k/v/o projections
    (what conversion changed, and about a fifth of the weight-gradient work on SmolLM2), `"all"` every
    parameter (as Ainslie et al. do, with far more data). Gradients are clipped to norm 1.
    """
    if steps < 0:
        raise HeadscopeError(f"uptraining steps must be 0 or more, got {steps}")
    if loss not in LOSSES:
        raise HeadscopeError(f"uptraining loss {loss!r} is not known; choose one of {', '.join(LOSSES)}")
    if loss == "kd" and teacher is None:
        raise HeadscopeError("loss='kd' distils from a teacher: pass teacher= (the original model) or use loss='lm'")
    if train not in TRAINABLE:
        raise HeadscopeError(f"train={train!r} is not known; choose one of {', '.join(TRAINABLE)}")
    settings = dict(steps=steps, loss=loss, lr=lr, train=train, batch_size=batch_size, max_length=max_length,
                    weight_decay=weight_decay, seed=seed, optimizer="AdamW", grad_clip=1.0)
    model = copy.deepcopy(student.model)
    out = HeadModel(model=model, tokenizer=student.tokenizer, name=f"{student.name}-uptrained", source=student.source)
    log_ = UptrainLog(settings=settings)
    if steps == 0:
        return out, log_
    todo = _token_batches(student, data, max_length, batch_size, limit)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if train == "attention":
        spec = out.spec
        names = {f"{path}.{kind}" for path in (spec.q_proj, spec.k_proj, spec.v_proj, spec.out_proj)
                 for kind in ("weight", "bias")}
        chosen = [p for layer in out.layers for n, p in layer.named_parameters() if n in names]
    else:
        chosen = list(model.parameters())
    ids_chosen = {id(p) for p in chosen}
    frozen = [p for p in model.parameters() if id(p) not in ids_chosen and p.requires_grad]
    for p in frozen:  # on the private copy only; restored below so the returned model is not left frozen
        p.requires_grad_(False)
    params = [p for p in chosen if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    model.train()
    order: list[int] = []
    try:
        for _ in tqdm(range(steps), desc=f"uptrain ({loss})", disable=not progress):
            if not order:
                order = list(rng.permutation(len(todo)))
            b = todo[order.pop()]
            inp = b.model_inputs(student.device)
            logits = model(**inp).logits[:, :-1].float()
            ok = (inp["attention_mask"][:, 1:] * inp["attention_mask"][:, :-1]).bool()
            if loss == "kd":
                with torch.no_grad():
                    t_logp = torch.log_softmax(teacher.model(**inp).logits[:, :-1].float(), -1)[ok]
                s_logp = torch.log_softmax(logits, -1)[ok]
                value = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
            else:
                value = nn.functional.cross_entropy(logits[ok], inp["input_ids"][:, 1:][ok])
            opt.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            log_.losses.append(float(value.detach()))
    finally:
        model.eval()
        for p in frozen:
            p.requires_grad_(True)
    return out, log_


# --- saving --------------------------------------------------------------------------------------
def save_checkpoint(hm: HeadModel, out_dir: str | Path, force: bool = False) -> Path:
    """Write `hm` as a standard transformers checkpoint (weights, config, tokenizer) atomically.

    Written to a temp folder beside `out_dir`, then renamed; an existing `out_dir` is replaced only with
    `force`.
    """
    out = Path(out_dir)
    if out.exists() and not force:
        raise HeadscopeError(f"{str(out)!r} already exists; pass --force to overwrite it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = None
    try:
        hm.model.save_pretrained(tmp)
        if hm.tokenizer is not None:
            hm.tokenizer.save_pretrained(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes the folder private (0700); give it the usual mode
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "x")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "x").exists() and not out.exists():
            os.replace(old / "x", out)  # put the user's folder back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out


# --- calibration-KL search ------------------------------------------------------------------------
def random_balanced_groups(n_kv: int, kv_heads: int, rng: np.random.Generator) -> list[list[int]]:
    """One uniformly random split of KV heads 0..n_kv-1 into `kv_heads` equal groups (sorted)."""
    m = n_kv // kv_heads
    p = [int(h) for h in rng.permutation(n_kv)]
    return sorted(sorted(p[j * m:(j + 1) * m]) for j in range(kv_heads))


def _canonical(groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(int(h) for h in g)) for g in groups))


def _trial_kls(hm: HeadModel, work: HeadModel, todo: list, trials: list[dict[int, dict]],
               current: dict[int, dict], bar: Any) -> list[float]:
    """Mean per-token KL(hm || work with each trial's layers swapped in) over the token batches `todo`.

    `trials[i]` maps layer -> `_layer_params` tensors; the other layers keep `current`'s tensors (what
    `work` holds on entry and on return). Same formula as `compare`, so the numbers are comparable.
    """
    kl = [0.0] * len(trials)
    count = 0
    dirty: set[int] = set()
    try:
        with torch.no_grad():
            for b in todo:
                inp = b.model_inputs(hm.device)
                ok = (inp["attention_mask"][:, 1:] * inp["attention_mask"][:, :-1]).bool()
                r = torch.log_softmax(hm.model(**inp).logits[:, :-1].float(), -1)[ok]
                p_r = r.exp()
                for i, trial in enumerate(trials):
                    for layer in dirty - trial.keys():
                        _write_layer_params(work, layer, current[layer])
                    for layer, params in trial.items():
                        _write_layer_params(work, layer, params)
                    dirty = set(trial)
                    c = torch.log_softmax(work.model(**inp).logits[:, :-1].float(), -1)[ok]
                    kl[i] += float((p_r * (r - c)).sum(-1).clamp_min(0).sum())
                    bar.update(1)
                count += int(ok.sum())
    finally:
        for layer in dirty:
            _write_layer_params(work, layer, current[layer])
    if count == 0:
        raise HeadscopeError("calibration data needs passages of at least 2 tokens; all were shorter")
    return [k / count for k in kl]


def search_groups(hm: HeadModel, kv_heads: int, data: Any, *, candidates: int = 8, seed: int = 0,
                  max_length: int = 64, batch_size: int = 8, limit: int | None = None,
                  progress: bool = False) -> dict[str, Any]:
    """Per layer, the candidate grouping with the lowest KL from `hm` on calibration `data` (greedy, one pass).

    Candidates per layer: adjacent, similarity from `data`, similarity from the weights, and
    `candidates` seeded random balanced groupings (duplicates dropped). The search starts from the
    better of adjacent / similarity (whole model, calibration KL; similarity on ties, as `plan_groups`),
    then visits the layers in order: for layer l it converts with each other candidate for l, the other
    layers fixed at their current choice, and keeps the lowest KL if it is strictly lower. The current
    choice stays among the options, so the calibration KL never increases. Cost: 1-2 + sum over layers
    of (distinct candidates - 1) KL evaluations, each one forward pass over `data`.

    Returns {"groups", "search_start", "calibration_kl_adjacent", "calibration_kl_similarity",
    "calibration_kl_start", "calibration_kl_search", "search_trace" (per layer: chosen candidate, its
    groups, the KL after the layer, every candidate's KL), "kl_evaluations", "search_seconds", ...}.
    `data` is the calibration text; never pass the held-out text.
    """
    check_convertible(hm, kv_heads)
    if data is None:
        raise HeadscopeError(
            "grouping 'search' picks groups by their KL divergence from the original model on calibration text, "
            "so it needs data: pass data= (texts, token-id lists or gqa.load_text('ptb-train', 400)); on the CLI, "
            "--data ptb-train or a .txt/.jsonl/.conllu file; or use --grouping similarity, which works from weights")
    if isinstance(candidates, bool) or not isinstance(candidates, (int, np.integer)) or candidates < 0:
        raise HeadscopeError(f"--search-candidates must be a whole number >= 0, got {candidates!r}")
    n_kv, n_layers = hm.n_kv_heads, hm.n_layers
    adjacent = [adjacent_groups(n_kv, kv_heads) for _ in range(n_layers)]
    settings = {"search_candidates": int(candidates), "search_seed": int(seed)}
    if kv_heads in (1, n_kv):
        # One group of all heads, or every head its own group: nothing to search.
        return {"groups": adjacent, **settings, "search_skipped": "only one grouping possible", "kl_evaluations": 0}
    t0 = time.perf_counter()
    kw = dict(max_length=max_length, batch_size=batch_size, limit=limit)
    d_data = kv_distances(hm, data, progress=progress, **kw)
    d_weights = kv_distances(hm)
    sim = [balanced_partition(d_data[l], kv_heads) for l in range(n_layers)]
    rng = np.random.default_rng(seed)
    options: list[dict[tuple, str]] = []  # per layer: canonical grouping -> first name that proposed it
    for l in range(n_layers):
        named = [("adjacent", adjacent[l]), ("similarity-data", sim[l]),
                 ("similarity-weights", balanced_partition(d_weights[l], kv_heads))]
        named += [(f"random-{i}", random_balanced_groups(n_kv, kv_heads, rng)) for i in range(candidates)]
        opts: dict[tuple, str] = {}
        for name, g in named:
            opts.setdefault(_canonical(g), name)
        options.append(opts)

    todo = _token_batches(hm, data, max_length, batch_size, limit)
    work = convert_to_gqa(hm, kv_heads, groups=adjacent)
    current = {l: _layer_params(hm, l, adjacent[l], kv_heads) for l in range(n_layers)}
    sim_layers = [l for l in range(n_layers) if _canonical(sim[l]) != _canonical(adjacent[l])]
    start_trials: list[dict[int, dict]] = [{}]
    if sim_layers:
        start_trials.append({l: _layer_params(hm, l, sim[l], kv_heads) for l in sim_layers})
    n_evals = len(start_trials) + sum(len(o) - 1 for o in options)
    log.info("search: %d KL evaluations (%d layers, up to %d candidates each) on %d calibration batches",
             n_evals, n_layers, 3 + candidates, len(todo))
    with tqdm(total=n_evals * len(todo), desc=f"search ({n_evals} KL evaluations)", disable=not progress) as bar:
        kls = _trial_kls(hm, work, todo, start_trials, current, bar)
        kl_adj, kl_sim = kls[0], kls[-1]
        start = "similarity" if kl_sim <= kl_adj else "adjacent"
        started = sim if start == "similarity" else adjacent
        chosen = [[list(g) for g in layer_groups] for layer_groups in started]
        if start == "similarity":
            for l in sim_layers:
                current[l] = start_trials[1][l]
                _write_layer_params(work, l, current[l])
        kl_now = min(kl_adj, kl_sim)
        trace = []
        for l in range(n_layers):
            here = _canonical(chosen[l])
            others = [(key, name) for key, name in options[l].items() if key != here]
            trial_params = [_layer_params(hm, l, [list(g) for g in key], kv_heads) for key, _ in others]
            kls = _trial_kls(hm, work, todo, [{l: p} for p in trial_params], current, bar)
            tried = {options[l][here]: kl_now, **{name: k for (_, name), k in zip(others, kls)}}
            best = int(np.argmin(kls)) if kls else -1
            if kls and kls[best] < kl_now:
                chosen[l] = [list(g) for g in others[best][0]]
                current[l] = trial_params[best]
                _write_layer_params(work, l, current[l])
                kl_now = kls[best]
            trace.append({"layer": l, "chosen": options[l][_canonical(chosen[l])], "groups": chosen[l],
                          "calibration_kl": kl_now, "candidate_kl": tried})
    seconds = time.perf_counter() - t0
    log.info("search: calibration KL %.4f (start, %s) -> %.4f after %d KL evaluations in %.1f s",
             min(kl_adj, kl_sim), start, kl_now, n_evals, seconds)
    return {"groups": chosen, **settings, "search_start": start, "calibration_kl_adjacent": kl_adj,
            "calibration_kl_similarity": kl_sim, "calibration_kl_start": min(kl_adj, kl_sim),
            "calibration_kl_search": kl_now, "search_trace": trace,
            "layers_changed_by_search": [l for l in range(n_layers) if _canonical(chosen[l]) != _canonical(started[l])],
            "kl_evaluations": n_evals, "calibration_batches": len(todo), "search_seconds": round(seconds, 2)}


# --- the whole recipe ----------------------------------------------------------------------------
def plan_groups(hm: HeadModel, kv_heads: int, grouping: str = "mean", data: Any = None, *, fallback: bool = True,
                max_length: int = 64, batch_size: int = 8, limit: int | None = None, search_candidates: int = 8,
                seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Choose the KV groups for `grouping`, with what was compared; keys: groups, grouping_used, ...

    For "similarity" with `data` and `fallback`, the similarity groups are kept only if the converted
    model's KL divergence from the original on `data` (the calibration text, not the held-out text) is
    no worse than with adjacent groups; otherwise adjacent groups are used and `grouping_used` says so.
    For "search", `search_groups` (which needs `data`; `fallback` does not apply, it never ends worse
    than the better of adjacent / similarity on `data`) with `search_candidates` random candidates.
    """
    check_convertible(hm, kv_heads)
    if grouping not in GROUPINGS:
        raise HeadscopeError(f"grouping {grouping!r} is not known; choose one of {', '.join(GROUPINGS)}")
    adjacent = [adjacent_groups(hm.n_kv_heads, kv_heads)] * hm.n_layers
    plan: dict[str, Any] = {"grouping": grouping, "grouping_used": "mean", "groups": adjacent}
    if grouping == "mean":
        return plan
    if grouping == "search":
        found = search_groups(hm, kv_heads, data, candidates=search_candidates, seed=seed, max_length=max_length,
                              batch_size=batch_size, limit=limit, progress=progress)
        used = ("search (only one grouping possible: same as mean)" if found.get("search_skipped")
                else "search")
        plan.update(found, grouping_used=used)
        return plan
    if kv_heads in (1, hm.n_kv_heads):
        # One group of all heads, or every head its own group: there is nothing to choose.
        plan.update(grouping_used="similarity (only one grouping possible: same as mean)")
        return plan
    kw = dict(max_length=max_length, batch_size=batch_size, limit=limit)
    dist = kv_distances(hm, data, progress=progress, **kw)
    groups = [balanced_partition(dist[layer], kv_heads) for layer in range(hm.n_layers)]
    plan.update(
        similarity_on="data" if data is not None else "weights",
        pooling_error_adjacent=float(sum(partition_cost(dist[l], adjacent[l]) for l in range(hm.n_layers))),
        pooling_error_similarity=float(sum(partition_cost(dist[l], groups[l]) for l in range(hm.n_layers))),
        layers_regrouped=[l for l in range(hm.n_layers) if groups[l] != adjacent[l]],
    )
    if groups == adjacent:
        plan.update(grouping_used="similarity (same as adjacent)", groups=groups)
        return plan
    if fallback and data is not None:
        kl_sim = kl_divergence(hm, convert_to_gqa(hm, kv_heads, groups=groups), data, progress=progress, **kw)
        kl_adj = kl_divergence(hm, convert_to_gqa(hm, kv_heads, groups=adjacent), data, progress=progress, **kw)
        plan.update(calibration_kl_similarity=kl_sim, calibration_kl_adjacent=kl_adj)
        if kl_sim > kl_adj:
            log.info("similarity groups did worse on calibration data (KL %.4f > %.4f); using adjacent", kl_sim, kl_adj)
            plan.update(grouping_used="mean (similarity fell back: worse on calibration data)")
            return plan
    plan.update(grouping_used="similarity", groups=groups)
    return plan


def kv_report(hm: HeadModel, batch: int = 2, prompt_len: int = 16, new_tokens: int = 4) -> dict[str, Any]:
    """KV-cache bytes measured from a real generation cache beside `headscope.kv.kv_cache_bytes`."""
    from .kv import kv_cache_bytes

    measured, seq_len = measure_kv_bytes(hm, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens)
    dtype = next(hm.model.parameters()).dtype
    calculated = kv_cache_bytes(hm.config, seq_len, batch=batch, dtype=dtype)
    return {"measured": measured, "calculated": calculated, "seq_len": seq_len, "batch": batch,
            "dtype": str(dtype).removeprefix("torch."), "match": measured == calculated}


def convert_and_evaluate(hm: HeadModel, kv_heads: int, grouping: str = "mean", *, data: Any = None,
                         heldout: Any = None, uptrain_steps: int = 0, loss: str = "kd", lr: float = 1e-3,
                         train: str = "attention",
                         max_length: int = 64, batch_size: int = 8, data_limit: int | None = 400,
                         heldout_limit: int | None = 200, fallback: bool = True, seed: int = 0,
                         search_candidates: int = 8, progress: bool = False) -> tuple[HeadModel, dict[str, Any]]:
    """Convert, optionally uptrain, and report perplexity (before/after/uptrained) and KV bytes.

    `data` (default PTB train) is used for similarity grouping, search and uptraining; `heldout`
    (default PTB valid) only for perplexity. Returns the final model and a JSON-ready report.
    """
    check_convertible(hm, kv_heads)
    data_src = data if isinstance(data, (TextSource, list)) else load_text(data, data_limit, default="ptb-train")
    held_src = heldout if isinstance(heldout, (TextSource, list)) else load_text(heldout, heldout_limit)
    ev = dict(max_length=max_length, batch_size=batch_size, progress=progress)
    report: dict[str, Any] = {
        "model": hm.name, "model_type": hm.config.model_type, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
        "n_kv_heads_before": hm.n_kv_heads, "n_kv_heads_after": kv_heads, "grouping": grouping,
        "data": getattr(data_src, "source", "in-memory"), "data_passages": len(data_src),
        "heldout": getattr(held_src, "source", "in-memory"), "heldout_passages": len(held_src),
        "max_length": max_length,
    }
    plan = plan_groups(hm, kv_heads, grouping, data_src, fallback=fallback, search_candidates=search_candidates,
                       seed=seed, **ev)
    report["grouping_used"] = plan.pop("grouping_used")
    report["groups"] = plan.pop("groups")
    report.update({k: v for k, v in plan.items() if k != "grouping"})
    converted = convert_to_gqa(hm, kv_heads, groups=report["groups"])
    final = converted
    if uptrain_steps:
        final, up = uptrain(converted, data_src, uptrain_steps, teacher=hm, loss=loss, lr=lr, train=train,
                            batch_size=batch_size, max_length=max_length, seed=seed, progress=progress)
    candidates = {"converted": converted, **({"uptrained": final} if uptrain_steps else {})}
    scores = compare(hm, candidates, held_src, **ev)
    report["heldout_tokens"] = scores["reference"]["tokens"]
    report["ppl_before"] = scores["reference"]["ppl"]
    report["ppl_after"] = scores["converted"]["ppl"]
    report["kl_after"] = scores["converted"]["kl"]
    report["ppl_uptrained"] = scores["uptrained"]["ppl"] if uptrain_steps else None
    report["kl_uptrained"] = scores["uptrained"]["kl"] if uptrain_steps else None
    if uptrain_steps:
        report["uptrain"] = dict(up.settings, first_loss=up.losses[0], last_loss=up.losses[-1],
                                 mean_last_10=float(np.mean(up.losses[-10:])), losses=up.losses)
    report["kv_bytes_before"] = kv_report(hm)
    report["kv_bytes_after"] = kv_report(final)
    return final, report
