"""Norm-based attention weights (Kobayashi et al. 2020, "Attention is not only a weight"): each probability
scaled by the size of what its key position sends through the head.

    norm weight[i, j] = || alpha_ij f(x_j) || = alpha_ij || f(x_j) ||,   f(x_j) = (x_j W_V + b_V) W_O^h

x_j is what the layer's value projection reads (the attention block's input after its norm), W_V, b_V the
value rows of the head's KV head, W_O^h the head's columns of the output projection (its bias, shared by all
heads, is left out as in the paper). The projection's output is read with a forward hook, so the value rows
are the model's own (fused QKV, GQA's shared value heads and biases included); which channels belong to a
head comes from the adapter (`HeadModel.head_channels`, `HeadModel.out_channels`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import HeadscopeError
from ..models.adapter import HeadModel

__all__ = ["WEIGHTINGS", "norm_weights", "value_norms"]

# what the view's maps show: the probabilities, or Kobayashi's norms
WEIGHTINGS = ("attention", "norm")


class _Stop(Exception):
    """Raised once the last asked layer's values are read: the layers above it need not run."""


def _check(hm: HeadModel, layer: int) -> None:
    if getattr(hm.attention(layer), "v_norm", None) is not None:
        raise HeadscopeError(f"layer {layer} of {hm.name} normalises each head's values (v_norm) before attention; "
                             f"norm-based weights are not defined for it here: use weighting=attention")


def value_norms(hm: HeadModel, ids: list[int], layers: Iterable[int]) -> dict[int, np.ndarray]:
    """`|| f(x_j) ||` for every head of each of `layers` and every position j: layer -> `[head, key]` float32
    (heads in the order the layer keeps them). One forward pass, stopped after the last layer's values."""
    wanted = sorted(set(layers))
    for layer in wanted:
        if hm.heads_in_layer(layer):
            _check(hm, layer)
    # layer -> (the module whose output holds the values, each head's value channels in it)
    sources: dict[int, tuple[nn.Module, list[torch.Tensor]]] = {}
    for layer in wanted:
        places = [hm.head_channels(layer, "v", h) for h in hm.kept_heads(layer)]
        sources[layer] = (places[0][0], [ch for _, ch in places]) if places else (hm.out_proj(layer), [])
    got: dict[int, torch.Tensor] = {}
    last = wanted[-1] if wanted else None

    def hook_for(layer: int) -> Any:
        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            got.setdefault(layer, out[0].detach().float())  # [T, channels] of this text (batch of one)
            if layer == last and len(got) == len(wanted):
                raise _Stop
        return hook

    handles = [sources[l][0].register_forward_hook(hook_for(l)) for l in wanted if sources[l][1]]
    x = torch.tensor([ids], dtype=torch.long, device=hm.device)
    try:
        with torch.inference_mode():
            hm.model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    out: dict[int, np.ndarray] = {}
    for layer in wanted:
        channels = sources[layer][1]
        if not channels:
            out[layer] = np.zeros((0, len(ids)), np.float32)
            continue
        w_o = hm.out_weight(layer).detach().float()  # [d_model, heads * d_head]
        rows = []
        for h, ch in zip(hm.kept_heads(layer), channels, strict=True):
            v = got[layer][:, ch.to(got[layer].device)]  # [T, d_head]: x_j W_V + b_V for the head's KV head
            f = v @ w_o[:, hm.out_channels(layer, h).to(w_o.device)].T.to(v.device)  # [T, d_model]
            rows.append(f.norm(dim=-1))
        out[layer] = torch.stack(rows).cpu().numpy()
    return out


def norm_weights(probs: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """`alpha_ij || f(x_j) ||` from one head's probabilities `[query, key]` and its value norms `[key]` (or a
    layer's: `[head, query, key]` and `[head, key]`)."""
    return (probs.astype(np.float32) * norms[..., None, :].astype(np.float32)).astype(np.float32)
