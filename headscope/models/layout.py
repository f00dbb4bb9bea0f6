"""Weight layout of attention projections: Q/K/V per head, resizing projections, slicing heads.

Every function takes a layer block and a spec-like object (attribute paths `q_proj`, `k_proj`,
`v_proj` or fused `qkv_proj`, `out_proj`, `attention`, `conv1d`, `head_count_attrs`) and plain
numbers. Weights are exchanged in Linear layout, `[out_features, in_features]`, whatever the
storage (GPT-2's Conv1D stores `[in, out]`; its fused c_attn holds q, then k, then v rows).

Self-contained on purpose: this module imports only the standard library and torch, because
`headscope.models.checkpoint.save_model` copies its source verbatim into a pruned checkpoint as
the `trust_remote_code` loader (so the loader and headscope's own slicing cannot drift apart).
`HeadModel` (adapter.py) wraps these functions with head bookkeeping and input checks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn


@dataclass
class QKVWeights:
    """One layer's query, key and value projections in Linear layout (out = x @ W.T + b)."""

    q: torch.Tensor  # [n_heads * d_head, d_model]
    k: torch.Tensor  # [n_kv_heads * d_head, d_model]
    v: torch.Tensor  # [n_kv_heads * d_head, d_model]
    q_bias: torch.Tensor | None = None  # [n_heads * d_head]
    k_bias: torch.Tensor | None = None  # [n_kv_heads * d_head]
    v_bias: torch.Tensor | None = None  # [n_kv_heads * d_head]


def get_path(root: nn.Module, path: str) -> nn.Module:
    """Follow a dotted attribute path from `root`."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def set_path(root: nn.Module, path: str, value: nn.Module) -> None:
    """Replace the module at a dotted attribute path."""
    parent, _, last = path.rpartition(".")
    setattr(get_path(root, parent) if parent else root, last, value)


def linear_weight(module: nn.Module, conv1d: bool) -> torch.Tensor:
    """A projection's weight as `[out, in]` (a view of the parameter)."""
    return module.weight.t() if conv1d else module.weight


def head_features(units: Sequence[int], width: int, offset: int = 0) -> torch.Tensor:
    """Feature indices of whole heads: head u covers [offset + u*width, offset + (u+1)*width)."""
    if not units:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(offset + u * width, offset + (u + 1) * width) for u in units])


def reorder_heads(w: torch.Tensor, order: Sequence[int], d_head: int, dim: int = 0) -> torch.Tensor:
    """A copy of `w` whose head blocks of `d_head` features along `dim` come in `order` (old ids)."""
    return w.index_select(dim, head_features(list(order), d_head).to(w.device)).clone()


def kv_heads_for(keep_q: Sequence[int], group_size: int) -> list[int]:
    """KV heads that serve the query heads `keep_q` (original ids): query head h reads h // group_size."""
    return sorted({h // group_size for h in keep_q})


def resized(module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None, conv1d: bool,
            keep_bias: bool = False) -> nn.Module:
    """A copy of a Linear/Conv1D holding `weight` (Linear layout) and `bias`, sizes updated.

    Dtype, device and requires_grad follow the old parameters. `keep_bias` keeps the module's own
    bias (an input-side change leaves the per-output bias alone).
    """
    new = copy.deepcopy(module)
    old = module.weight
    stored = weight.t() if conv1d else weight
    new.weight = nn.Parameter(stored.detach().to(old).clone().contiguous(), requires_grad=old.requires_grad)
    if not keep_bias and bias is not None:
        new.bias = nn.Parameter(bias.detach().to(module.bias).clone(), requires_grad=module.bias.requires_grad)
    n_out, n_in = weight.shape
    if conv1d:
        new.nf, new.nx = n_out, n_in
    else:
        new.out_features, new.in_features = n_out, n_in
    return new


def write_weight(block: nn.Module, path: str, weight: torch.Tensor, bias: torch.Tensor | None, conv1d: bool) -> None:
    """Put `weight` (Linear layout) and `bias` into the projection at `path`.

    In place when the shape is unchanged (the parameters stay the same objects, so optimizers and
    tied references keep working), else the projection is replaced by a resized copy.
    """
    module = get_path(block, path)
    if tuple(linear_weight(module, conv1d).shape) == tuple(weight.shape):
        with torch.no_grad():
            linear_weight(module, conv1d).copy_(weight)
            if bias is not None:
                module.bias.copy_(bias)
        return
    set_path(block, path, resized(module, weight, bias, conv1d))


def read_qkv(block: nn.Module, spec: Any, n_heads: int, n_kv_heads: int, d_head: int) -> QKVWeights:
    """Q, K and V weights of one layer block in Linear layout, split out of a fused projection if needed."""

    def bias_of(module: nn.Module) -> torch.Tensor | None:
        return None if getattr(module, "bias", None) is None else module.bias.detach()

    if spec.qkv_proj:
        fused = get_path(block, spec.qkv_proj)
        sizes = [n_heads * d_head, n_kv_heads * d_head, n_kv_heads * d_head]
        q, k, v = torch.split(linear_weight(fused, spec.conv1d).detach(), sizes, dim=0)
        b = bias_of(fused)
        qb, kb, vb = (None, None, None) if b is None else torch.split(b, sizes)
        return QKVWeights(q, k, v, qb, kb, vb)
    mods = [get_path(block, p) for p in (spec.q_proj, spec.k_proj, spec.v_proj)]
    q, k, v = (linear_weight(m, spec.conv1d).detach() for m in mods)
    return QKVWeights(q, k, v, *(bias_of(m) for m in mods))


def write_qkv(block: nn.Module, spec: Any, w: QKVWeights) -> None:
    """Write Q, K and V (Linear layout) into one layer block, fusing them when the family does."""
    if spec.qkv_proj:
        bias = None if w.q_bias is None else torch.cat([w.q_bias, w.k_bias, w.v_bias])
        write_weight(block, spec.qkv_proj, torch.cat([w.q, w.k, w.v]), bias, spec.conv1d)
        return
    for path, weight, bias in ((spec.q_proj, w.q, w.q_bias), (spec.k_proj, w.k, w.k_bias),
                               (spec.v_proj, w.v, w.v_bias)):
        write_weight(block, path, weight, bias, spec.conv1d)


def set_head_count_attrs(attention: nn.Module, spec: Any, n_heads: int, n_kv_heads: int, d_head: int) -> None:
    """Update the head-count attributes the attention forward reads (after its projections were resized)."""
    values = {"heads": n_heads, "width": n_heads * d_head, "kv_heads": n_kv_heads,
              "groups": n_heads // max(n_kv_heads, 1)}
    for attr, quantity in spec.head_count_attrs:
        if hasattr(attention, attr):
            setattr(attention, attr, values[quantity])


class EmptyAttention(nn.Module):
    """Stands in for the attention module of a layer whose heads were all pruned.

    Returns `(out_proj bias broadcast, None)` when the family's output projection lives inside
    the attention module (GPT-2, LLaMA), else `(zeros[..., 0], None)` for the block's own output
    projection to map (BERT). Either way the layer's attention output is exactly the bias.
    """

    def __init__(self, out_proj_name: str | None = None, out_proj: nn.Module | None = None) -> None:
        super().__init__()
        self.out_proj_name = out_proj_name
        if out_proj_name is not None:
            self.add_module(out_proj_name, out_proj)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        if self.out_proj_name is None:
            return hidden_states.new_zeros(*hidden_states.shape[:-1], 0), None  # [batch, pos, 0 heads * d_head]
        # GPT-2's Conv1D cannot view an empty input, so add the bias by hand: out_proj(0) = bias.
        out = hidden_states.new_zeros(hidden_states.shape)  # [batch, pos, d_model]
        bias = getattr(getattr(self, self.out_proj_name), "bias", None)
        return (out + bias if bias is not None else out), None


def slice_block(block: nn.Module, spec: Any, d_head: int, group_size: int, now: Sequence[int],
                keep: Sequence[int]) -> None:
    """Slice one layer block in place from query heads `now` to `keep` (original ids, already validated).

    Q rows, the K/V rows of KV heads no kept query head reads, and the output projection's input
    columns go; a layer left without heads gets an `EmptyAttention`.
    """
    d, conv1d = d_head, spec.conv1d
    now, keep = list(now), list(keep)
    keep_kv, now_kv = kv_heads_for(keep, group_size), kv_heads_for(now, group_size)
    pos_q = [now.index(h) for h in keep]  # positions in the current (possibly already pruned) layout
    pos_kv = [now_kv.index(k) for k in keep_kv]
    if spec.qkv_proj:
        # Fused [q; k; v] output: the q block is len(now) heads wide, k and v len(now_kv) each.
        wq, wkv = len(now) * d, len(now_kv) * d
        idx = torch.cat([head_features(pos_q, d), head_features(pos_kv, d, wq), head_features(pos_kv, d, wq + wkv)])
        parts = [(spec.qkv_proj, idx)]
    else:
        parts = [(spec.q_proj, head_features(pos_q, d)), (spec.k_proj, head_features(pos_kv, d)),
                 (spec.v_proj, head_features(pos_kv, d))]
    for path, idx in parts:
        module = get_path(block, path)
        idx = idx.to(module.weight.device)
        bias = None if getattr(module, "bias", None) is None else module.bias.detach().index_select(0, idx)
        set_path(block, path, resized(module, linear_weight(module, conv1d).detach().index_select(0, idx), bias, conv1d))
    out = get_path(block, spec.out_proj)
    cols = linear_weight(out, conv1d).detach().index_select(1, head_features(pos_q, d).to(out.weight.device))
    set_path(block, spec.out_proj, resized(out, cols, None, conv1d, keep_bias=True))
    if not keep:
        inner = spec.out_proj[len(spec.attention) + 1:] if spec.out_proj.startswith(spec.attention + ".") else None
        set_path(block, spec.attention, EmptyAttention(inner, get_path(block, spec.out_proj) if inner else None))
        return
    set_head_count_attrs(get_path(block, spec.attention), spec, len(keep), len(keep_kv), d)
