"""One forward pass wired to the graph: every receiver reads its own copy of the residual stream, and every
sender's output is reported as it is computed.

At layer l's attention norm the hook sees the residual x entering it; each q/k/v receiver of the layer gets
`norm(x + delta_r)` (delta_r from the caller, e.g. a circuit's corrupt-minus-current differences, or a zero
tensor whose gradient is the gradient of the receiver's input), and the projection's output channels that
receiver owns (`HeadModel.head_channels`: a head's query channels, a KV group's key or value channels) are
recomputed from it. The MLP norm and the final norm are rewritten the same way for the MLP and logits receivers.
Senders are read where they join the residual: the embeddings at layer 0's input, each head's W_O z_h at the
output projection's input (its bias, the same in every run, belongs to no head) and the MLP's output.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ...models.adapter import HeadModel
from ...models.layout import bias_param, linear_weight
from ...models.residual import final_norm_module, residual_modules
from .graph import Graph

# deltas(receiver indices, residual x [batch, pos, d_model]) -> [receivers, batch, pos, d_model] or None (no change)
Deltas = Callable[[list[int], torch.Tensor], "torch.Tensor | None"]
# sent(sender indices, outputs [senders, batch, pos, d_model])
Sent = Callable[[list[int], torch.Tensor], None]


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def wired(hm: HeadModel, graph: Graph, deltas: Deltas, sent: Sent,
          embeddings: torch.Tensor | None = None) -> Iterator[None]:
    """Inside, a forward of `hm.model` gives each receiver its own input and reports every sender's output;
    `embeddings` `[batch, pos, d_model]` replaces layer 0's input (EAP-IG's interpolated inputs)."""
    handles: list[Any] = []
    normed: dict[int, tuple[list[int], torch.Tensor] | None] = {}

    def on_input(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = _hidden(args, kwargs)
        if embeddings is not None:
            x = embeddings.to(x.device, x.dtype)
            args, kwargs = ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
        sent([0], x[None])
        return args, kwargs

    handles.append(hm.layers[0].register_forward_pre_hook(on_input, with_kwargs=True))
    for l in range(hm.n_layers):
        attn_norm, mlp_norm, mlp = residual_modules(hm, l)
        handles += _attention_hooks(hm, graph, l, attn_norm, deltas, normed)
        heads = [graph.head_sender[(l, h)] for h in range(hm.n_heads)]
        handles.append(hm.out_proj(l).register_forward_pre_hook(_head_writes(hm, l, heads, sent)))
        handles.append(mlp_norm.register_forward_hook(_rewrite(mlp_norm, graph.receivers_at(l, ("mlp",)), deltas)))
        handles.append(mlp.register_forward_hook(_mlp_write(graph.mlp_sender[l], sent)))
    final = final_norm_module(hm)
    handles.append(final.register_forward_hook(_rewrite(final, [len(graph.receivers) - 1], deltas)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _rewrite(norm: nn.Module, receiver: list[int], deltas: Deltas) -> Callable[..., Any]:
    """A norm whose output becomes norm(x + delta) for its one receiver."""

    def hook(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor | None:
        d = deltas(receiver, args[0])
        return None if d is None else norm.forward(args[0] + d[0])

    return hook


def _attention_hooks(hm: HeadModel, graph: Graph, layer: int, norm: nn.Module, deltas: Deltas,
                     normed: dict[int, tuple[list[int], torch.Tensor] | None]) -> list[Any]:
    """The attention norm's hook (each q/k/v receiver's normed input) and one hook per projection module."""
    rs = graph.receivers_at(layer, ("q", "k", "v"))

    def on_norm(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        d = deltas(rs, args[0])
        normed[layer] = None if d is None else (rs, norm.forward(args[0][None] + d))  # [receivers, b, t, d_model]

    owned: dict[nn.Module, list[tuple[int, torch.Tensor]]] = {}
    for i, r in enumerate(rs):
        module, channels = graph.channels[r]
        owned.setdefault(module, []).append((i, channels))

    def make(module: nn.Module, parts: list[tuple[int, torch.Tensor]]) -> Callable[..., Any]:
        def on_proj(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor | None:
            got = normed.get(layer)
            if got is None:
                return None
            x = got[1]
            weight, bias = linear_weight(module, hm.spec.conv1d), bias_param(module)
            for i, channels in parts:
                ch = channels.to(out.device)
                new = F.linear(x[i], weight[ch], None if bias is None else bias[ch])
                out = out.index_copy(out.dim() - 1, ch, new.to(out.dtype))
            return out

        return on_proj

    handles = [norm.register_forward_hook(on_norm)]
    handles += [m.register_forward_hook(make(m, parts)) for m, parts in owned.items()]
    return handles


def _head_writes(hm: HeadModel, layer: int, senders: list[int], sent: Sent) -> Callable[..., None]:
    """Each head's write into the residual, W_O[:, h] z_h `[heads, batch, pos, d_model]`, from the output
    projection's input."""

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        z = args[0].view(*args[0].shape[:-1], hm.n_heads, -1)  # [batch, pos, head, d_head]
        w = hm.out_weight(layer).to(z.dtype)
        w = w.view(w.shape[0], hm.n_heads, z.shape[-1])  # [d_model, head, d_head]
        sent(senders, torch.einsum("bthe,dhe->hbtd", z, w))

    return hook


def _mlp_write(sender: int, sent: Sent) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        sent([sender], (out[0] if isinstance(out, tuple) else out)[None])

    return hook
