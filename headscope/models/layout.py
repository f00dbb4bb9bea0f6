"""Weight layout of attention projections: Q/K/V per head, resizing projections, slicing heads.

Every function takes a layer block and a spec-like object (attribute paths `q_proj`, `k_proj`,
`v_proj` or fused `qkv_proj`, `out_proj`, `attention`, `conv1d`, `qkv_layout`, `head_count_attrs`,
`config_head_attrs`) and plain numbers. Weights are exchanged in Linear layout,
`[out_features, in_features]`, whatever the storage. Fused projections come in two layouts:
"stacked" holds all q rows, then k, then v (GPT-2's Conv1D c_attn, stored `[in, out]`; Phi-3's
qkv_proj, whose k and v blocks are n_kv_heads wide); "per_head" holds each head's q, k and v rows
together, head after head (GPT-NeoX's query_key_value: [h0 q, h0 k, h0 v, h1 q, ...]).

Self-contained on purpose: this module imports only the standard library and torch, because
`headscope.models.checkpoint.save_model` copies its source verbatim into a pruned checkpoint as
the `trust_remote_code` loader (so the loader and headscope's own slicing cannot drift apart).
`HeadModel` (adapter.py) wraps these functions with head bookkeeping and input checks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence, cast

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
    # Output-gate rows of a gated query projection (spec.q_gate, Qwen3.5), head after head; None elsewhere, and
    # when writing: keep the gate rows the layer has.
    q_gate: torch.Tensor | None = None  # [n_heads * d_head, d_model]
    q_gate_bias: torch.Tensor | None = None  # [n_heads * d_head]


def get_path(root: nn.Module, path: str) -> nn.Module:
    """Follow a dotted attribute path from `root`."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def get_param_path(root: nn.Module, path: str) -> torch.Tensor:
    """The parameter (or buffer) at a dotted attribute path from `root`."""
    parent, _, last = path.rpartition(".")
    value = getattr(get_path(root, parent) if parent else root, last)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{path} is a {type(value).__name__}, not a parameter")
    return value


def set_path(root: nn.Module, path: str, value: nn.Module | torch.Tensor) -> None:
    """Replace the module (or parameter) at a dotted attribute path."""
    parent, _, last = path.rpartition(".")
    setattr(get_path(root, parent) if parent else root, last, value)


def weight_param(module: nn.Module) -> torch.Tensor:
    """A projection's weight parameter as stored (Conv1D: `[in, out]`)."""
    return cast(torch.Tensor, module.weight)  # nn.Module's hints type every attribute Tensor | Module


def bias_param(module: nn.Module) -> torch.Tensor | None:
    """A projection's bias parameter, or None when it has none."""
    return getattr(module, "bias", None)


def linear_weight(module: nn.Module, conv1d: bool) -> torch.Tensor:
    """A projection's weight as `[out, in]` (a view of the parameter)."""
    weight = weight_param(module)
    return weight.t() if conv1d else weight


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
    new: Any = copy.deepcopy(module)  # a Linear or a Conv1D: their size attributes differ
    old, old_bias = weight_param(module), bias_param(module)
    stored = weight.t() if conv1d else weight
    new.weight = nn.Parameter(stored.detach().to(old).clone().contiguous(), requires_grad=old.requires_grad)
    if not keep_bias and bias is not None:
        if old_bias is None:
            raise ValueError(f"cannot give a bias to a {type(module).__name__} built without one")
        new.bias = nn.Parameter(bias.detach().to(old_bias).clone(), requires_grad=old_bias.requires_grad)
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
    own_bias = bias_param(module)
    if tuple(linear_weight(module, conv1d).shape) == tuple(weight.shape):
        with torch.no_grad():
            linear_weight(module, conv1d).copy_(weight)
            if bias is not None:
                if own_bias is None:
                    raise ValueError(f"the projection at {path!r} has no bias to write into")
                own_bias.copy_(bias)
        return
    set_path(block, path, resized(module, weight, bias, conv1d))


def read_qkv(block: nn.Module, spec: Any, n_heads: int, n_kv_heads: int, d_head: int) -> QKVWeights:
    """Q, K and V weights of one layer block in Linear layout, split out of a fused projection if needed."""

    def bias_of(module: nn.Module) -> torch.Tensor | None:
        bias = bias_param(module)
        return None if bias is None else bias.detach()

    if spec.qkv_proj and spec.qkv_layout == "per_head":
        fused = get_path(block, spec.qkv_proj)
        rows = linear_weight(fused, spec.conv1d).detach()
        check_per_head(n_heads, n_kv_heads)
        # [heads * 3 * d_head, in] -> [heads, (q, k, v), d_head, in]: one part across all heads.
        parts = rows.reshape(n_heads, 3, d_head, -1)
        q, k, v = (parts[:, i].reshape(n_heads * d_head, -1) for i in range(3))
        b = bias_of(fused)
        qb, kb, vb = (None, None, None) if b is None else (b.reshape(n_heads, 3, d_head)[:, i].reshape(-1)
                                                          for i in range(3))
        return QKVWeights(q, k, v, qb, kb, vb)
    if spec.qkv_proj:
        fused = get_path(block, spec.qkv_proj)
        rows = linear_weight(fused, spec.conv1d).detach()
        # K and V take what the q rows leave: the module's own width, which GQA conversion may change
        # before the config's KV head count follows (or the other way round).
        kv_rows = (rows.shape[0] - n_heads * d_head) // 2
        sizes = [n_heads * d_head, kv_rows, kv_rows]
        q, k, v = torch.split(rows, sizes, dim=0)
        b = bias_of(fused)
        qb, kb, vb = (None, None, None) if b is None else torch.split(b, sizes)
        return QKVWeights(q, k, v, qb, kb, vb)
    mods = [get_path(block, p) for p in (spec.q_proj, spec.k_proj, spec.v_proj)]
    q, k, v = (linear_weight(m, spec.conv1d).detach() for m in mods)
    w = QKVWeights(q, k, v, *(bias_of(m) for m in mods))
    if getattr(spec, "q_gate", False):  # rows [h0 query, h0 gate, h1 query, ...]: split them
        (w.q, w.q_gate), qb = split_gated(q, d_head), bias_of(mods[0])
        if qb is not None:
            w.q_bias, w.q_gate_bias = split_gated(qb, d_head)
    return w


def head_channels(spec: Any, kind: str, index: int, n_heads: int, n_kv_heads: int,
                  d_head: int) -> tuple[str, torch.Tensor]:
    """Where one head's query (kind "q": query head `index`) or keys / values ("k", "v": KV head `index`) leave the
    layer's projections: the projection's name ("q", "k", "v" or "qkv", as `HeadModel.projections` names it) and
    the indices of those `d_head` channels in its output. `index` counts the heads present in the layer;
    `n_heads` and `n_kv_heads` are how many are present."""
    if kind not in ("q", "k", "v"):
        raise ValueError(f"head channel kind {kind!r} is not known; choose q, k or v")
    part = "qkv".index(kind)
    if spec.qkv_proj and spec.qkv_layout == "per_head":  # [h0 q, h0 k, h0 v, h1 q, ...]
        return "qkv", torch.arange(d_head) + (3 * index + part) * d_head
    if spec.qkv_proj:  # [all q; all k; all v]
        start = (0, n_heads * d_head, (n_heads + n_kv_heads) * d_head)[part]
        return "qkv", torch.arange(d_head) + start + index * d_head
    if kind == "q" and getattr(spec, "q_gate", False):  # [h0 query, h0 gate, h1 query, ...]
        return "q", torch.arange(d_head) + 2 * index * d_head
    return kind, torch.arange(d_head) + index * d_head


def extras_problem(now: QKVWeights, given: QKVWeights, family: str) -> str | None:
    """What is wrong with `given`'s biases and query gate for a layer whose own are `now`, or None: biases must be
    given exactly where the layer has them, with one value per row; a gate only where the family has one."""
    for name, rows in (("q", given.q.shape[0]), ("k", given.k.shape[0]), ("v", given.v.shape[0])):
        bias, present = getattr(given, f"{name}_bias"), getattr(now, f"{name}_bias")
        if (bias is None) != (present is None):
            want = f"as a tensor of {rows} values" if present is not None else "as None"
            return f"the {name} projection {'has' if present is not None else 'has no'} bias; give {name}_bias {want}"
        if bias is not None and tuple(bias.shape) != (rows,):
            return f"{name}_bias has shape {tuple(bias.shape)}; expected ({rows},)"
    for name in ("q_gate", "q_gate_bias"):
        gate, present = getattr(given, name), getattr(now, name)
        if gate is not None and present is None:
            return f"the {family} family has no output gate in its query projection; give {name} as None"
        if gate is not None and tuple(gate.shape) != tuple(present.shape):
            return f"{name} has shape {tuple(gate.shape)}; expected {tuple(present.shape)} (None keeps the layer's own)"
    return None


def split_gated(rows: torch.Tensor, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query rows and gate rows (each `[heads * d_head, ...]`) of a gated query projection's rows (or bias)."""
    parts = rows.reshape(-1, 2, d_head, *rows.shape[1:])  # [heads, (query, gate), d_head, ...]
    return parts[:, 0].reshape(-1, *rows.shape[1:]), parts[:, 1].reshape(-1, *rows.shape[1:])


def join_gated(query: torch.Tensor, gate: torch.Tensor, d_head: int) -> torch.Tensor:
    """The rows (or bias) of a gated query projection from its query and gate rows: [h0 query, h0 gate, h1 ...]."""
    rest = query.shape[1:]
    return torch.stack([query.reshape(-1, d_head, *rest), gate.reshape(-1, d_head, *rest)], 1).reshape(-1, *rest)


def check_per_head(n_heads: int, n_kv_heads: int) -> None:
    """Refuse a per-head fused layout with shared K/V: each head's q, k and v rows sit together there."""
    if n_heads != n_kv_heads:
        raise ValueError(f"a per-head fused QKV projection gives every query head its own K/V; got {n_heads} query "
                         f"heads and {n_kv_heads} KV heads")


def interleave_per_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_head: int) -> torch.Tensor:
    """Rows (or bias values) of q, k and v, each `[heads * d_head, ...]`, as [h0 q, h0 k, h0 v, h1 q, ...]."""
    rest = q.shape[1:]
    parts = [t.reshape(-1, d_head, *rest) for t in (q, k, v)]  # [heads, d_head, ...] each
    return torch.stack(parts, 1).reshape(-1, *rest)  # [heads * 3 * d_head, ...]


def fused_biases(w: QKVWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The q, k and v biases for one fused projection (one bias vector): all three, or None without q's."""
    if w.q_bias is None:
        return None
    if w.k_bias is None or w.v_bias is None:
        raise ValueError("a fused QKV projection has one bias for q, k and v: give k_bias and v_bias with q_bias")
    return w.q_bias, w.k_bias, w.v_bias


def write_qkv(block: nn.Module, spec: Any, w: QKVWeights, d_head: int) -> None:
    """Write Q, K and V (Linear layout) into one layer block, fusing them when the family does."""
    if spec.qkv_proj and spec.qkv_layout == "per_head":
        check_per_head(w.q.shape[0] // d_head, w.k.shape[0] // d_head)
        biases = fused_biases(w)
        bias = None if biases is None else interleave_per_head(*biases, d_head)
        write_weight(block, spec.qkv_proj, interleave_per_head(w.q, w.k, w.v, d_head), bias, spec.conv1d)
        return
    if spec.qkv_proj:
        biases = fused_biases(w)
        bias = None if biases is None else torch.cat(biases)
        write_weight(block, spec.qkv_proj, torch.cat([w.q, w.k, w.v]), bias, spec.conv1d)
        return
    q, q_bias = w.q, w.q_bias
    if getattr(spec, "q_gate", False):  # the gate rows given, else the layer's own
        now = read_qkv(block, spec, w.q.shape[0] // d_head, w.k.shape[0] // d_head, d_head)
        gate = now.q_gate if w.q_gate is None else w.q_gate
        gate_bias = now.q_gate_bias if w.q_gate_bias is None else w.q_gate_bias
        assert gate is not None, "a gated query's gate rows are read with its query rows"
        q = join_gated(w.q, gate, d_head)
        if w.q_bias is not None:
            assert gate_bias is not None, "a gated query's bias holds its gate's bias too"
            q_bias = join_gated(w.q_bias, gate_bias, d_head)
    for path, weight, bias in ((spec.q_proj, q, q_bias), (spec.k_proj, w.k, w.k_bias),
                               (spec.v_proj, w.v, w.v_bias)):
        write_weight(block, path, weight, bias, spec.conv1d)


class LayerConfig:
    """One layer's view of the model config shared by all layers, with its own head counts.

    Some attention forwards read a head count from that shared config (Phi-3 splits its fused
    projection at `config.num_attention_heads * head_dim`), which a layer pruned to fewer heads must
    not see. This view answers the overridden names itself and everything else (the attention
    implementation included) from the shared config, so later changes to it are still seen.
    """

    def __init__(self, base: Any, overrides: dict[str, Any]) -> None:
        self.__dict__["_base"] = base
        self.__dict__["_overrides"] = dict(overrides)

    def __getattr__(self, name: str) -> Any:
        # Dunders must not reach the shared config: copy.deepcopy would copy the config, not this view.
        if name.startswith("__") or "_base" not in self.__dict__:
            raise AttributeError(name)
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_base"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._overrides:
            self._overrides[name] = value
        else:
            setattr(self._base, name, value)

    def __repr__(self) -> str:
        return f"LayerConfig({type(self._base).__name__}, overrides={self._overrides})"


def set_head_count_attrs(attention: nn.Module, spec: Any, n_heads: int, n_kv_heads: int, d_head: int) -> None:
    """Update the head-count attributes the attention forward reads (after its projections were resized)."""
    values = {"heads": n_heads, "width": n_heads * d_head, "kv_heads": n_kv_heads,
              "groups": n_heads // max(n_kv_heads, 1), "d_head": d_head}
    for attr, quantity in spec.head_count_attrs:
        if hasattr(attention, attr):
            setattr(attention, attr, values[quantity])
    config_attrs = spec.config_head_attrs
    # its `config` is a plain attribute (a config object), not a submodule
    module: Any = attention
    if config_attrs and hasattr(module, "config"):
        base = module.config._base if isinstance(module.config, LayerConfig) else module.config
        # Only counts that differ from the shared config need the layer's own view.
        overrides = {attr: values[q] for attr, q in config_attrs if getattr(base, attr, None) != values[q]}
        module.config = LayerConfig(base, overrides) if overrides else base


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


def head_param_index(kind: str, q_heads: Sequence[int], kv_heads: Sequence[int], d_head: int) -> torch.Tensor:
    """Indices into a per-head parameter (`spec.head_params` kind "q", "kv" or "q1") of the heads given, in order."""
    if kind not in ("q", "kv", "q1"):
        raise ValueError(f"head parameter kind {kind!r} is not known; choose q, kv or q1")
    return head_features(list(kv_heads if kind == "kv" else q_heads), 1 if kind == "q1" else d_head)


def select_head_params(block: nn.Module, spec: Any, q_heads: Sequence[int], kv_heads: Sequence[int], d_head: int,
                       in_place: bool) -> None:
    """Keep (or reorder) the per-head parameters `spec.head_params` of one layer block: query heads `q_heads` and
    KV heads `kv_heads` (positions in the layer as it is now). `in_place` copies into the same tensors (a
    permutation: same size), else each becomes a new, smaller parameter."""
    for path, kind in getattr(spec, "head_params", ()):
        old = get_param_path(block, path)
        idx = head_param_index(kind, q_heads, kv_heads, d_head).to(old.device)
        new = old.detach().index_select(0, idx).clone()
        if in_place:
            with torch.no_grad():
                old.copy_(new)
        else:
            set_path(block, path, nn.Parameter(new, requires_grad=old.requires_grad))


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
    if getattr(spec, "head_row_projs", ()):
        # MLA: each projection holds equal row blocks per query head (its width / the heads now present).
        parts = []
        for path in spec.head_row_projs:
            try:
                rows = linear_weight(get_path(block, path), conv1d).shape[0] // len(now)
            except AttributeError:  # q_proj or q_b_proj: the layer has one of them
                continue
            parts.append((path, head_features(pos_q, rows)))
    elif spec.qkv_proj and spec.qkv_layout == "per_head":
        # Fused [h0 q, h0 k, h0 v, h1 q, ...]: a head's 3 * d_head rows go or stay together.
        parts = [(spec.qkv_proj, head_features(pos_q, 3 * d))]
    elif spec.qkv_proj:
        # Fused [q; k; v] output: the q block is len(now) heads wide, k and v len(now_kv) each.
        wq, wkv = len(now) * d, len(now_kv) * d
        idx = torch.cat([head_features(pos_q, d), head_features(pos_kv, d, wq), head_features(pos_kv, d, wq + wkv)])
        parts = [(spec.qkv_proj, idx)]
    else:
        # a gated query projection holds 2 * d_head rows per head (query, gate)
        q_rows = 2 * d if getattr(spec, "q_gate", False) else d
        parts = [(spec.q_proj, head_features(pos_q, q_rows)), (spec.k_proj, head_features(pos_kv, d)),
                 (spec.v_proj, head_features(pos_kv, d))]
    for path, idx in parts:
        module = get_path(block, path)
        idx = idx.to(weight_param(module).device)
        own_bias = bias_param(module)
        bias = None if own_bias is None else own_bias.detach().index_select(0, idx)
        weight = linear_weight(module, conv1d).detach().index_select(0, idx)
        set_path(block, path, resized(module, weight, bias, conv1d))
    out = get_path(block, spec.out_proj)
    cols = linear_weight(out, conv1d).detach().index_select(1, head_features(pos_q, d).to(weight_param(out).device))
    set_path(block, spec.out_proj, resized(out, cols, None, conv1d, keep_bias=True))
    if keep:
        select_head_params(block, spec, pos_q, pos_kv, d, in_place=False)
    if not keep:
        inner = spec.out_proj[len(spec.attention) + 1:] if spec.out_proj.startswith(spec.attention + ".") else None
        set_path(block, spec.attention, EmptyAttention(inner, get_path(block, spec.out_proj) if inner else None))
        return
    set_head_count_attrs(get_path(block, spec.attention), spec, len(keep), len(keep_kv), d)


def slice_ffn(block: nn.Module, spec: Any, keep: Sequence[int]) -> None:
    """Keep only the FFN neurons at positions `keep` (in the layer as it is now) of one layer block, in place.

    Each input-side projection (`spec.ffn_in`; `spec.ffn_in_parts` stacked blocks of neurons each, e.g.
    Phi-3's [gate; up]) keeps those output rows and their bias; the output projection (`spec.ffn_out`)
    keeps those input columns and its own bias. A layer may keep no neuron: its FFN then adds the bias only.
    """
    keep = [int(i) for i in keep]
    out = get_path(block, spec.ffn_out)
    width = linear_weight(out, spec.conv1d).shape[1]
    for path in spec.ffn_in:
        module = get_path(block, path)
        idx = torch.tensor([p * width + i for p in range(spec.ffn_in_parts) for i in keep], dtype=torch.long,
                           device=weight_param(module).device)
        own_bias = bias_param(module)
        bias = None if own_bias is None else own_bias.detach().index_select(0, idx)
        set_path(block, path, resized(module, linear_weight(module, spec.conv1d).detach().index_select(0, idx), bias,
                                      spec.conv1d))
    cols = torch.tensor(keep, dtype=torch.long, device=weight_param(out).device)
    set_path(block, spec.ffn_out, resized(out, linear_weight(out, spec.conv1d).detach().index_select(1, cols), None,
                                          spec.conv1d, keep_bias=True))
