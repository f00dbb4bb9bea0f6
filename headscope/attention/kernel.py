"""The statistics kernel: an attention function registered with transformers that computes each
layer's output with sdpa and hands blocks of eager-exact probabilities to headscope's consumers.

transformers 5 looks attention functions up by name (`AttentionInterface`) in every family whose
attention calls `ALL_ATTENTION_FUNCTIONS.get_interface(...)`, passing queries and keys after RoPE,
the 4D mask built for that name (`AttentionMaskInterface`; ours is sdpa's), `scaling` and any
`softcap`. Inside `stats_kernel(hm)` the model runs under that name; outside, nothing changes.
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Iterator

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from ..models.config import attention_implementation
from ..models.specs import supported_model_types
from .blocks import (
    DEFAULT_TILE,
    AttentionBlock,
    BlockRows,
    check_block,
    fused_rows,
    iter_blocks,
    key_range,
    key_side,
    rows_from_block,
    visible_outside,
)

KERNEL_NAME = "headscope_stats"
# Queries per block: probabilities take batch x heads x DEFAULT_BLOCK x T floats at a time.
DEFAULT_BLOCK = 128

BlockFn = Callable[[AttentionBlock], None]
RowsFn = Callable[[BlockRows], None]
# layer -> key columns [batch, T, c] whose weighted sums a RowsFn reads
ColumnsFn = Callable[[int], torch.Tensor]
# Where a layer's output comes from while consumers are attached: "sdpa" (transformers' own sdpa call,
# then the blocks for the statistics) or "blocks" (probs @ V of the very blocks the statistics read:
# eager's output, one attention computed instead of two).
OUTPUTS = ("sdpa", "blocks")


@dataclass(frozen=True)
class _LayerInfo:
    layer: int
    causal: bool
    window: int | None


# id(attention module) -> (the kernel it reports to, its layer). Keyed by identity because BERT's
# self-attention has no usable layer index; entries live exactly as long as their `stats_kernel`.
_ACTIVE: dict[int, tuple["AttentionKernel", _LayerInfo]] = {}


def stats_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function: sdpa's output `[batch, q, head, d_head]`, no weights; while a
    `stats_kernel` with consumers is active, each block of probabilities goes to them as well."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5  # eager's default, so output and probabilities agree
    entry = _ACTIVE.get(id(module))
    if entry is None or not (entry[0].consumers or entry[0].row_consumers):
        if kwargs.get("softcap") is None and kwargs.get("s_aux") is None:  # sdpa has neither (s_aux: a sink)
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        return _blockwise_output(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                 kwargs=kwargs, block=DEFAULT_BLOCK)
    kernel, info = entry
    return kernel.forward(info, module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                          kwargs=kwargs)


def _causal_without_mask(module: nn.Module, query: torch.Tensor, mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether sdpa applies its own causal triangle (it does so only when no mask was built)."""
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return bool(mask is None and query.shape[2] > 1 and is_causal)


def _blockwise_output(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None, scaling: float, dropout: float, kwargs: dict, *, block: int,
                      info: _LayerInfo | None = None, consumers: tuple[BlockFn, ...] = ()) -> tuple[torch.Tensor, None]:
    """Eager attention computed block by block (sdpa has no logit soft-capping and no sink logit), feeding
    consumers too.

    Without `info` the key range is the whole sequence (or the causal triangle sdpa would apply).
    """
    causal = _causal_without_mask(module, query, mask, kwargs)
    b, h, t, _ = query.shape
    kv = key.shape[1]
    out = query.new_empty(b, h, t, value.shape[-1], dtype=value.dtype)  # [batch, head, q, d_head]
    geometry = (info.causal, info.window) if info is not None else (causal, None)
    # Without info there are no consumers, so the blocks' layer number is never read.
    for blk in iter_blocks(query, key, mask, layer=-1 if info is None else info.layer, block=block, scaling=scaling,
                           softcap=kwargs.get("softcap"), causal=geometry[0], window=geometry[1],
                           causal_without_mask=causal, sink=kwargs.get("s_aux")):
        for fn in consumers:
            fn(blk)
        probs = blk.probs
        weights = torch.nn.functional.dropout(probs, p=dropout, training=module.training).to(value.dtype)
        nq, nk = probs.shape[2], probs.shape[3]
        v = value[:, :, blk.k_start:blk.k_end]  # [batch, kv_head, k_block, d_head]
        o = torch.matmul(weights.reshape(b, kv, (h // kv) * nq, nk), v)  # query heads of one KV head together
        out[:, :, blk.q_start:blk.q_end] = o.view(b, h, nq, -1)
    return out.transpose(1, 2).contiguous(), None


def _feed_rows(fn: RowsFn, columns: torch.Tensor, block: AttentionBlock) -> None:
    """A rows consumer as a block callback: `fn` gets the block's rows against `columns`."""
    fn(rows_from_block(block, columns))


class AttentionKernel:
    """The statistics kernel bound to one model while `stats_kernel` is active; consumers attach here."""

    def __init__(self, hm: HeadModel, block: int, output: str = "sdpa", tile: int = DEFAULT_TILE) -> None:
        self.hm, self.block, self.output, self.tile = hm, block, output, tile
        self.consumers: list[BlockFn] = []
        self.row_consumers: list[tuple[RowsFn, ColumnsFn]] = []
        self.layers = [l for l in range(hm.n_layers) if hm.heads_in_layer(l)]  # empty layers compute no attention
        self._seen: set[int] = set()
        self._checked: list[tuple[torch.Tensor, int, int | None]] = []  # masks verified in this forward pass

    @contextmanager
    def consumer(self, fn: BlockFn) -> Iterator[None]:
        """While active, `fn(block)` receives every layer's blocks of probabilities (the last one has `.last`)."""
        self.consumers.append(fn)
        try:
            yield
        finally:
            self.consumers.remove(fn)

    @contextmanager
    def rows_consumer(self, fn: RowsFn, columns: ColumnsFn) -> Iterator[None]:
        """While active, `fn(rows)` receives every layer's per-query values (`BlockRows`) block by block
        (the last one has `.last`); `columns(layer)` gives the key columns `[batch, T, c]` whose
        attention-weighted sums `rows.weighted` holds.

        While only such consumers are attached and no gradient is wanted, the probabilities are never
        built: each block walks its keys in tiles with an online softmax (`fused_rows`), memory
        O(block x tile) whatever T; with `output="blocks"` the same walk gives the layer's output.
        """
        entry = (fn, columns)
        self.row_consumers.append(entry)
        try:
            yield
        finally:
            self.row_consumers.remove(entry)

    def _block_fns(self, layer: int) -> tuple[BlockFn, ...]:
        """Every consumer as a block callback: rows consumers get `rows_from_block` of each block."""
        fns: list[BlockFn] = list(self.consumers)
        for fn, columns in self.row_consumers:
            fns.append(partial(_feed_rows, fn, columns(layer)))
        return tuple(fns)

    def _fused(self, info: _LayerInfo, module: nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, mask: torch.Tensor | None, scaling: float, dropout: float, kwargs: dict,
               causal: bool) -> tuple[torch.Tensor, None]:
        """The rows consumers' values through `fused_rows`, and the layer's output: from the same walk with
        `output="blocks"` or soft-capping (sdpa has none), else transformers' sdpa."""
        softcap, sink = kwargs.get("softcap"), kwargs.get("s_aux")
        own_output = self.output == "blocks" or softcap is not None or sink is not None
        parts = [columns(info.layer) for _, columns in self.row_consumers]
        widths = [p.shape[-1] for p in parts]
        b, h, t, _ = query.shape
        with torch.no_grad():
            side = key_side(value if own_output else None, torch.cat(parts, dim=-1).to(query.device), key.shape[1])
            n_value = value.shape[-1] if own_output else 0
            out = query.new_empty(b, h, t, n_value, dtype=value.dtype) if own_output else None
            for q0 in range(0, t, self.block):
                q1 = min(q0 + self.block, t)
                o, rows = fused_rows(query, key, side, mask, layer=info.layer, q_start=q0, q_end=q1, n_value=n_value,
                                     scaling=scaling, causal=info.causal, window=info.window, softcap=softcap,
                                     causal_without_mask=causal, tile=self.tile, sink=sink)
                if out is not None and o is not None:  # o is None only without values (n_value 0): out too
                    out[:, :, q0:q1] = o
                start = 0
                for (fn, _), width in zip(self.row_consumers, widths, strict=True):
                    fn(replace(rows, weighted=rows.weighted[..., start:start + width]))
                    start += width
        if out is None:
            return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)
        return out.transpose(1, 2).contiguous(), None

    def _check_mask(self, info: _LayerInfo, mask: torch.Tensor | None, causal_without_mask: bool, t: int) -> None:
        """Refuse masks that let queries see keys the causal / window geometry says they cannot (the
        blocks skip those keys), and sdpa causality that disagrees with the model's adapter."""
        if mask is None:
            if t > 1 and causal_without_mask != info.causal:
                how = "causally" if causal_without_mask else "bidirectionally"
                raise HeadscopeError(f"layer {info.layer}: transformers runs this layer {how} but headscope's adapter "
                                     f"for {self.hm.config.model_type!r} says causal={info.causal}")
            if info.window is not None and t > info.window:  # the blocks would see keys the window hides
                raise HeadscopeError(f"layer {info.layer}: transformers built no attention mask for a sliding window "
                                     f"of {info.window} over {t} tokens; statistics would be wrong")
            return
        unbounded = not info.causal and info.window is None  # every key visible: nothing to check
        if unbounded or any(m is mask and w == info.window for m, _, w in self._checked):
            return
        for q0 in range(0, t, self.block):
            q1 = min(q0 + self.block, t)
            k0, k1 = key_range(q0, q1, mask.shape[-1], info.causal, info.window)
            if visible_outside(mask, q0, q1, k0, k1):
                raise HeadscopeError(
                    f"layer {info.layer}: the attention mask lets queries {q0}..{q1 - 1} see keys outside "
                    f"{k0}..{k1 - 1}, which a {'causal' if info.causal else 'bidirectional'} layer with sliding "
                    f"window {info.window} cannot; statistics would be wrong")
        self._checked.append((mask, info.layer, info.window))

    def forward(self, info: _LayerInfo, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, scaling: float, dropout: float, kwargs: dict) -> tuple[torch.Tensor, None]:
        """One layer's attention: output as sdpa computes it, probabilities in blocks to the consumers."""
        t, kv_length = query.shape[2], key.shape[2]
        if t != kv_length:
            raise HeadscopeError(
                f"layer {info.layer}: {t} queries against {kv_length} keys; attention statistics need one full forward "
                f"pass without a KV cache (call the model with use_cache=False and no past key values)")
        causal = _causal_without_mask(module, query, mask, kwargs)
        self._check_mask(info, mask, causal, t)
        self._seen.add(info.layer)
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
        if not self.consumers and not grad and not (dropout > 0 and module.training):
            return self._fused(info, module, query, key, value, mask, scaling=scaling, dropout=dropout, kwargs=kwargs,
                               causal=causal)
        fns = self._block_fns(info.layer)
        if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or self.output == "blocks":
            return _blockwise_output(module, query, key, value, mask, scaling=scaling, dropout=dropout, kwargs=kwargs,
                                     block=self.block, info=info, consumers=fns)
        out = sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)
        with torch.no_grad():  # statistics never take part in a backward pass
            for blk in iter_blocks(query.detach(), key.detach(), mask, layer=info.layer, block=self.block,
                                   scaling=scaling, causal=info.causal, window=info.window,
                                   causal_without_mask=causal):
                for fn in fns:
                    fn(blk)
        return out

    def _start_forward(self, *_: Any) -> None:
        self._seen = set()
        self._checked = []

    def _end_forward(self, *_: Any) -> None:
        missing = [l for l in self.layers if l not in self._seen]
        if (self.consumers or self.row_consumers) and missing:
            raise HeadscopeError(
                f"layers {missing} of {self.hm.name!r} did not run through the statistics kernel: their attention "
                f"does not call transformers' attention interface; use the eager path for this model")
        self._checked = []


def check_kernel_support(hm: HeadModel) -> None:
    """A clear error unless every attention module of `hm` dispatches through transformers' registry."""
    for layer in range(hm.n_layers):
        if not hm.heads_in_layer(layer):
            continue
        cls = type(hm.attention(layer))
        try:
            source = inspect.getsource(cls.forward)
        except (OSError, TypeError):  # no source to read: the per-forward check still catches it
            continue
        if "ALL_ATTENTION_FUNCTIONS" not in source:
            raise HeadscopeError(
                f"{cls.__name__} (layer {layer} of {hm.name!r}, model type {hm.config.model_type!r}) computes "
                f"attention itself instead of calling transformers' AttentionInterface, so the statistics kernel "
                f"cannot serve it; model types checked with transformers 5: {', '.join(supported_model_types())}")


def check_output(output: str) -> str:
    """`output` if it names a way to compute the layer's output (OUTPUTS), else a clear error."""
    if output not in OUTPUTS:
        raise HeadscopeError(f"kernel output {output!r} is not known; choose one of {', '.join(OUTPUTS)} "
                             f"(sdpa: transformers' sdpa computes it; blocks: from the statistics' own blocks)")
    return output


@contextmanager
def stats_kernel(hm: HeadModel, block: int = DEFAULT_BLOCK, output: str = "sdpa",
                 tile: int = DEFAULT_TILE) -> Iterator[AttentionKernel]:
    """Run `hm`'s attention through the statistics kernel while active, then restore its implementation.

    Yields the `AttentionKernel`; attach consumers with `kernel.consumer(fn)`. While consumers are attached,
    each layer's output comes from `output` (see OUTPUTS; without consumers it is always sdpa's). Nested
    use on the same model yields the kernel already active (the block size must agree). `tile` is the
    number of keys per step of the rows consumers' online-softmax walk (`fused_rows`).
    """
    check_block(block)
    check_block(tile, "tile size", "keys", 1024)
    check_output(output)
    active = next((k for k, _ in _ACTIVE.values() if k.hm.model is hm.model), None)
    if active is not None:
        if active.block != block:
            raise HeadscopeError(f"the statistics kernel is already active on {hm.name!r} with block {active.block}; "
                                 f"nested use asked for block {block}: use the same block size")
        yield active
        return
    check_kernel_support(hm)
    kernel = AttentionKernel(hm, block, output, tile)
    handles = []
    stack = ExitStack()
    try:
        stack.enter_context(attention_implementation(hm.model, KERNEL_NAME, stats_attention_forward))
        for layer in kernel.layers:
            _ACTIVE[id(hm.attention(layer))] = (kernel, _LayerInfo(layer, hm.causal, hm.sliding_window(layer)))
        base = hm.base_model
        handles.append(base.register_forward_pre_hook(kernel._start_forward))
        handles.append(base.register_forward_hook(kernel._end_forward))
        yield kernel
    finally:
        for h in handles:
            h.remove()
        for layer in kernel.layers:
            _ACTIVE.pop(id(hm.attention(layer)), None)
        stack.close()  # the model's own attention implementation back
