"""Head gates and capture on the input of each layer's attention output projection.

That input is the concatenation of head outputs, `[batch, pos, n_heads * d_head]`, in every
family and under every attention kernel. Scaling head h's slice there is exactly the head mask
of Michel et al. (2019). Every hook installed here is removed in `finally`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .attention.kernel import DEFAULT_BLOCK, stats_kernel
from .errors import HeadscopeError
from .models.adapter import HeadModel
from .models.config import attention_implementation

# Called with (layer, head_outputs [batch, pos, n_heads, d_head]); may return a replacement.
HeadOutputFn = Callable[[int, torch.Tensor], "torch.Tensor | None"]
# Called with (layer, q_start, probs [batch, head, q_block, key]) for each block of queries.
AttentionBlockFn = Callable[[int, int, torch.Tensor], None]


@contextmanager
def on_head_outputs(hm: HeadModel, fn: HeadOutputFn, layers: list[int] | None = None) -> Iterator[None]:
    """Call `fn(layer, z)` on every layer's per-head outputs; a returned tensor replaces them.

    On a physically pruned model `head` runs over `hm.kept_heads(layer)`; empty layers are skipped.
    """
    handles = []

    def make_hook(layer: int) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            x = args[0]
            z = x.view(*x.shape[:-1], -1, hm.d_head_at(layer))  # [batch, pos, head, d_head]
            new = fn(layer, z)
            if new is None:
                return None
            return (new.reshape(x.shape), *args[1:])

        return hook

    try:
        for layer in range(hm.n_layers) if layers is None else layers:
            if hm.heads_in_layer(layer):  # a layer pruned to no heads has no head outputs
                handles.append(hm.out_proj(layer).register_forward_pre_hook(make_hook(layer)))
        yield
    finally:
        for h in handles:
            h.remove()


def _check_gates(hm: HeadModel, gates: torch.Tensor) -> None:
    shape = tuple(gates.shape)
    want = (hm.n_layers, hm.n_heads)
    if shape[-2:] != want or gates.dim() not in (2, 3):
        raise HeadscopeError(
            f"gates have shape {shape}; expected [n_layers, n_heads] = {list(want)} "
            f"or [batch, n_layers, n_heads] = [B, {want[0]}, {want[1]}]"
        )


@contextmanager
def head_gates(hm: HeadModel, gates: torch.Tensor) -> Iterator[None]:
    """Scale each head's output by a gate: `[n_layers, n_heads]`, or `[batch, n_layers, n_heads]`.

    Gates may require grad (gradient importance flows through them). Layers whose gates are all
    ones are left untouched, so a gate of ones changes nothing, bit for bit. Heads are numbered as
    in the unpruned model; on a physically pruned model the gates of removed heads are ignored.
    """
    _check_gates(hm, gates)
    per_row = gates.dim() == 3
    active = [l for l in range(hm.n_layers) if gates.requires_grad or not bool((gates[..., l, :] == 1).all())]
    kept = {l: torch.tensor(hm.kept_heads(l)) for l in active if hm.heads_in_layer(l) != hm.n_heads}

    def apply(layer: int, z: torch.Tensor) -> torch.Tensor:
        g = gates[:, layer] if per_row else gates[layer].expand(z.shape[0], -1)  # [batch, head]
        if layer in kept:
            g = g[:, kept[layer]]
        if g.shape[0] != z.shape[0]:
            raise HeadscopeError(f"per-row gates have {g.shape[0]} rows but the batch has {z.shape[0]}")
        return z * g[:, None, :, None].to(device=z.device, dtype=z.dtype)  # a dispatched layer may run elsewhere

    with on_head_outputs(hm, apply, layers=active):
        yield


@contextmanager
def capture_head_outputs(hm: HeadModel, store: dict[int, torch.Tensor]) -> Iterator[None]:
    """Record each layer's per-head outputs `[batch, pos, head, d_head]` into `store` (detached)."""

    def keep(layer: int, z: torch.Tensor) -> None:
        store[layer] = z.detach()

    with on_head_outputs(hm, keep):
        yield


@contextmanager
def eager_attention(hm: HeadModel) -> Iterator[None]:
    """Run `hm` with eager attention while active (it returns full weights), then restore its kernel.

    Models load with sdpa (faster, no weights); the reference path and full-map consumers switch here.
    Nested use, or a model already eager, changes nothing.
    """
    with attention_implementation(hm.model, "eager"):
        yield


@contextmanager
def on_attention_weights(hm: HeadModel, fn: Callable[[int, torch.Tensor], None]) -> Iterator[None]:
    """Call `fn(layer, probs [batch, head, query, key])` as each layer computes its attention.

    The full-map reference path: the model runs with eager attention while active (sdpa and flash
    return no weights), so every layer holds a T x T map; `on_attention_blocks` gives the same rows
    without it. On a physically pruned model `head` runs over `hm.kept_heads(layer)`.
    """
    handles = []

    def make_hook(layer: int) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise HeadscopeError(
                    f"layer {layer} returned no attention weights under {hm.config._attn_implementation!r}; "
                    f"its attention module ({type(module).__name__}) gives weights only under eager attention"
                )
            fn(layer, weights)

        return hook

    with eager_attention(hm):
        try:
            for layer in range(hm.n_layers):
                if hm.heads_in_layer(layer):  # a layer pruned to no heads computes no attention
                    handles.append(hm.attention(layer).register_forward_hook(make_hook(layer)))
            yield
        finally:
            for h in handles:
                h.remove()


@contextmanager
def on_attention_blocks(hm: HeadModel, fn: AttentionBlockFn, block: int = DEFAULT_BLOCK) -> Iterator[None]:
    """Call `fn(layer, q_start, probs [batch, head, q_block, key])` for each block of `block` queries.

    The model runs under the statistics kernel (sdpa computes its output), so no layer holds a
    T x T map: rows `q_start .. q_start + q_block - 1` of eager attention's probabilities arrive one
    block at a time, over all keys. On a physically pruned model `head` runs over `hm.kept_heads(layer)`.
    """
    with stats_kernel(hm, block) as kernel, kernel.consumer(lambda b: fn(b.layer, b.q_start, b.full_probs())):
        yield
