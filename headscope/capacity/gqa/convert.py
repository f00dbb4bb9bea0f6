"""Conversion itself: input checks, mean-pooling K/V heads in given groups, query-head permutation, MHA expansion.

Every weight goes through the adapter's layout methods (`qkv_weights`, `set_qkv_weights`,
`out_weight`, `set_out_weight`, `permute_heads`), in Linear layout; nothing here reads a family's
projection modules. Every function returns a new model; its input is never modified.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence, overload

import numpy as np
import torch

from ...errors import HeadscopeError, OptionError
from ...models.adapter import HeadModel
from ...models.capabilities import supported_model_types_for, why_not
from ...models.layout import QKVWeights, reorder_heads

#: config.model_type values whose checkpoints carry `num_key_value_heads` and whose attention
#: reads it (LLaMA-like decoders), as their specs say. Encoders (BERT) and GPT-2 have no such field.
SUPPORTED_MODEL_TYPES = supported_model_types_for("gqa")

Groups = Sequence[Sequence[int]]  # one layer: groups[new_kv_head] = [old kv heads]


def check_convertible(hm: HeadModel, kv_heads: int, *, merge: bool = True) -> None:
    """Raise a clear error unless `hm` can be converted to `kv_heads` KV heads (`merge=False`: only
    permuted or expanded, which an MQA model allows too)."""
    mt = hm.config.model_type
    why = why_not(hm.spec, "gqa", mt)
    if why:
        raise HeadscopeError(f"changing the KV heads cannot serve the {hm.spec.family} family (model type {mt!r}): "
                             f"{why}; GQA conversion supports {', '.join(SUPPORTED_MODEL_TYPES)}")
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, (int, np.integer)):
        raise OptionError("kv_heads", f"must be a whole number, got {kv_heads!r}")
    n_kv, n_heads = hm.n_kv_heads, hm.n_heads
    divisors = [g for g in range(1, n_kv + 1) if n_kv % g == 0]
    if merge and n_kv == 1:
        raise OptionError(
            "kv_heads", f"{kv_heads} cannot change {hm.name!r}: it has a single KV head already (MQA: all {n_heads} "
                        f"query heads share it), so there are no KV heads to merge; an MQA model cannot lose KV heads "
                        f"(headscope.capacity.gqa.expand_kv_heads goes the other way: one KV head per query head)")
    if kv_heads < 1:
        raise OptionError("kv_heads", f"must be at least 1 (1 = MQA), got {kv_heads}; choose one of {divisors}")
    if kv_heads > n_kv:
        raise OptionError("kv_heads", f"{kv_heads} is larger than the model's current {n_kv} KV heads; conversion only "
                                      f"merges KV heads (it cannot invent new ones); choose one of {divisors}")
    if n_kv % kv_heads:
        raise OptionError("kv_heads", f"{kv_heads} does not divide the model's {n_kv} KV heads ({n_heads} query "
                                      f"heads): groups must be equal; choose one of {divisors}")
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


def check_groups(groups: Groups, n_kv: int, kv_heads: int, layer: int) -> list[list[int]]:
    """`groups` as lists of ints, or an error unless they split KV heads 0..n_kv-1 into `kv_heads` equal groups."""
    flat = sorted(int(h) for g in groups for h in g)
    m = n_kv // kv_heads
    if len(groups) != kv_heads or any(len(g) != m for g in groups) or flat != list(range(n_kv)):
        raise HeadscopeError(
            f"layer {layer}: groups {[list(g) for g in groups]} are not a split of KV heads 0..{n_kv - 1} into "
            f"{kv_heads} groups of {m}"
        )
    return [[int(h) for h in g] for g in groups]


def _copy(hm: HeadModel, name: str, source: str) -> HeadModel:
    """A HeadModel around a deep copy of `hm`'s model (the tokenizer is shared: it is never changed)."""
    return HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=name, source=source)


# --- pooling -------------------------------------------------------------------------------------
@overload
def _pool(w: torch.Tensor, order: Sequence[int], kv_heads: int, d_head: int) -> torch.Tensor: ...
@overload
def _pool(w: None, order: Sequence[int], kv_heads: int, d_head: int) -> None: ...
def _pool(w: torch.Tensor | None, order: Sequence[int], kv_heads: int, d_head: int) -> torch.Tensor | None:
    """Reorder KV head blocks (dim 0) and mean-pool consecutive groups: [n_kv*d, ...] -> [G*d, ...]."""
    if w is None:
        return None
    blocks = w.reshape(-1, d_head, *w.shape[1:])[list(order)]  # [n_kv, d_head, ...]
    m = blocks.shape[0] // kv_heads
    return blocks.reshape(kv_heads, m, d_head, *w.shape[1:]).mean(1).reshape(kv_heads * d_head, *w.shape[1:])


@dataclass
class LayerWeights:
    """One converted layer's attention weights (Linear layout): Q/K/V and the output projection."""

    qkv: QKVWeights
    out: torch.Tensor  # [d_model, n_heads * d_head]


def layer_weights(hm: HeadModel, layer: int, layer_groups: Groups, kv_heads: int) -> LayerWeights:
    """The converted attention weights of `layer` of `hm` for `layer_groups` (`hm` is not modified).

    Query heads (q rows and bias, output-projection columns) are reordered so each group's query heads
    are contiguous, because transformers' `repeat_kv` maps query head h to KV head h // (n_heads / G);
    K/V rows are reordered and mean-pooled per group.
    """
    d, g_old = hm.d_head_at(layer), hm.n_heads // hm.n_kv_heads
    kv_order = [h for g in layer_groups for h in g]
    query_order = [kv * g_old + i for kv in kv_order for i in range(g_old)]
    w = hm.qkv_weights(layer)
    with torch.no_grad():
        qkv = QKVWeights(
            q=reorder_heads(w.q, query_order, d),
            k=_pool(w.k, kv_order, kv_heads, d), v=_pool(w.v, kv_order, kv_heads, d),
            q_bias=None if w.q_bias is None else reorder_heads(w.q_bias, query_order, d),
            k_bias=_pool(w.k_bias, kv_order, kv_heads, d), v_bias=_pool(w.v_bias, kv_order, kv_heads, d))
        # The output projection's bias is per output feature: unchanged.
        out = reorder_heads(hm.out_weight(layer).detach(), query_order, d, dim=1)
    return LayerWeights(qkv, out)


def write_layer_weights(hm: HeadModel, layer: int, weights: LayerWeights) -> None:
    """Put `layer_weights` output into `layer` of `hm`, in place (resizing K/V when G changes)."""
    hm.set_qkv_weights(layer, weights.qkv)
    hm.set_out_weight(layer, weights.out)


def pool_kv_heads(hm: HeadModel, kv_heads: int, groups: Sequence[Groups]) -> HeadModel:
    """A new model with `kv_heads` KV heads: per layer, the K/V heads of each group of `groups` mean-pooled.

    `groups[layer][new] = [old KV heads]`. Query heads are permuted so each new group's query heads are
    contiguous, which leaves their function unchanged. Use `convert_to_gqa` to pick groups by name.
    """
    check_convertible(hm, kv_heads)
    if len(groups) != hm.n_layers:
        raise HeadscopeError(f"groups has {len(groups)} layers; the model has {hm.n_layers}")
    checked = [check_groups(g, hm.n_kv_heads, kv_heads, layer) for layer, g in enumerate(groups)]
    new = [layer_weights(hm, layer, g, kv_heads) for layer, g in enumerate(checked)]
    out = _copy(hm, f"{hm.name}-kv{kv_heads}", f"gqa({hm.source or hm.name})")
    # A freshly loaded checkpoint reads the KV head count from the config; the layers' own cached
    # counts follow in set_qkv_weights.
    out.config.num_key_value_heads = kv_heads
    for layer, weights in enumerate(new):
        write_layer_weights(out, layer, weights)
    return out


# --- permutation and expansion -------------------------------------------------------------------
def permute_query_heads(hm: HeadModel, orders: dict[int, Sequence[int]] | Sequence[Sequence[int]]) -> HeadModel:
    """A copy of `hm` whose query heads are reordered per layer (the function is unchanged).

    `orders[layer][p]` is the old query head placed at position p. The rows of q_proj and the matching
    columns of o_proj move together; for GQA the query heads of each KV head must stay together and the
    KV heads (k_proj/v_proj rows) move with them, since query head h reads KV head h // group_size.
    """
    check_convertible(hm, hm.n_kv_heads, merge=False)
    items = orders.items() if isinstance(orders, dict) else enumerate(orders)
    out = _copy(hm, hm.name, hm.source)
    for layer, order in items:
        hm.check_head(int(layer), 0)
        out.permute_heads(int(layer), [int(h) for h in order])
    return out


def expand_kv_heads(hm: HeadModel) -> HeadModel:
    """The inverse direction, exactly: a copy where every query head has its own KV head (MHA).

    Each KV head's K/V rows are repeated for the query heads that read it, which is what `repeat_kv`
    does at run time, so outputs are unchanged; the cache grows by the group size. Useful to study
    regrouping from an MHA starting point.
    """
    check_convertible(hm, hm.n_kv_heads, merge=False)
    g, n_kv = hm.group_size, hm.n_kv_heads

    @overload
    def repeat(t: torch.Tensor) -> torch.Tensor: ...
    @overload
    def repeat(t: None) -> None: ...
    def repeat(t: torch.Tensor | None) -> torch.Tensor | None:
        # query head h reads KV head h // g: block h of the new projection is old block h // g
        if t is None:
            return None
        return t.reshape(n_kv, -1, *t.shape[1:]).repeat_interleave(g, 0).reshape(-1, *t.shape[1:])  # any d_head

    new = [hm.qkv_weights(layer) for layer in range(hm.n_layers)]
    out = _copy(hm, f"{hm.name}-mha", hm.source)
    out.config.num_key_value_heads = hm.n_heads  # see pool_kv_heads
    with torch.no_grad():
        for layer, w in enumerate(new):
            out.set_qkv_weights(layer, QKVWeights(w.q, repeat(w.k), repeat(w.v), w.q_bias, repeat(w.k_bias),
                                                  repeat(w.v_bias)))
    return out
