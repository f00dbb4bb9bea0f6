"""Partial RoPE: which rotary frequencies each KV head keeps (MHA2MLA's 2-norm criterion, or the highest).

Ji et al. 2025 bound each frequency's share of a query-key logit by |<q_f, k_f>| <= ||q_f|| ||k_f||,
where q_f, k_f are the two dimensions frequency f rotates (f and f + d_head/2 in transformers'
rotate_half layout). They rank a head's frequencies by the mean 2-norms ||q_f|| * ||k_f|| over
calibration text and keep the top ones; with GQA the query heads of a KV head share its keys, so the
products are summed over the group and one set is kept per KV head.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import HeadscopeError, OptionError
from ...models.adapter import HeadModel
from ..convert.evaluate import token_batches

#: How the kept frequencies are chosen: MHA2MLA's default, or the highest frequencies (no data needed).
SELECTIONS = ("2-norm", "high")


def subspace_norms(x: torch.Tensor, d_head: int) -> torch.Tensor:
    """||x_f|| of each frequency's 2-D subspace: [..., heads * d_head] -> [..., heads, d_head // 2]."""
    x = x.view(*x.shape[:-1], -1, 2, d_head // 2)  # [..., head, half, freq]: half 0 = dim f, half 1 = f + d/2
    return x.norm(dim=-2)


@torch.no_grad()
def norm_scores(hm: HeadModel, data: Any, *, max_length: int = 64, batch_size: int = 8, limit: int | None = None,
                progress: bool = False) -> torch.Tensor:
    """Per layer and KV head, each frequency's score sum_{q heads of the group} E||q_f|| * E||k_f||: [layer, kv, freq].

    Queries and keys before RoPE (rotation keeps 2-norms), means over the real tokens of `data`.
    """
    d, g = hm.d_head, hm.n_kv_heads
    inputs: dict[int, torch.Tensor] = {}
    hooks = []
    for layer in range(hm.n_layers):
        def grab(module: Any, args: Any, kwargs: Any, layer: int = layer) -> None:
            inputs[layer] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        hooks.append(hm.attention(layer).register_forward_pre_hook(grab, with_kwargs=True))
    q_sum = torch.zeros(hm.n_layers, hm.n_heads, d // 2, dtype=torch.float64)
    k_sum = torch.zeros(hm.n_layers, g, d // 2, dtype=torch.float64)
    count = 0
    weights = [hm.qkv_weights(layer) for layer in range(hm.n_layers)]
    try:
        for batch in token_batches(hm, data, max_length, batch_size, limit):
            mask = batch.attention_mask.to(hm.device).bool()
            hm.model(input_ids=batch.input_ids.to(hm.device), attention_mask=mask.long(), use_cache=False)
            real = mask.reshape(-1)
            count += int(real.sum())
            for layer, w in enumerate(weights):
                x = inputs[layer].reshape(-1, inputs[layer].shape[-1])[real]  # [tokens, d_model]
                q = torch.nn.functional.linear(x, w.q, w.q_bias)
                k = torch.nn.functional.linear(x, w.k, w.k_bias)
                q_sum[layer] += subspace_norms(q, d).sum(0).double()
                k_sum[layer] += subspace_norms(k, d).sum(0).double()
    finally:
        for h in hooks:
            h.remove()
    if count == 0:
        raise OptionError("data", "holds no tokens for calibration; give text")
    q_mean, k_mean = q_sum / count, k_sum / count
    group = hm.n_heads // g
    return (q_mean.view(hm.n_layers, g, group, d // 2) * k_mean[:, :, None, :]).sum(2)  # [layer, kv, freq]


def select_frequencies(hm: HeadModel, rope_dims: int, selection: str = "2-norm", data: Any = None,
                       **kw: Any) -> dict[str, list[list[int]]]:
    """Kept frequencies {layer: [[f, ...] per KV head]} (sorted), `rope_dims // 2` per KV head."""
    if selection not in SELECTIONS:
        raise HeadscopeError(f"frequency selection {selection!r} is not known; choose one of {', '.join(SELECTIONS)}")
    n = rope_dims // 2
    if selection == "high":  # frequency index 0 rotates fastest
        return {str(layer): [list(range(n))] * hm.n_kv_heads for layer in range(hm.n_layers)}
    if data is None:
        raise HeadscopeError("the 2-norm frequency selection needs calibration data (data=...)")
    scores = norm_scores(hm, data, **kw)
    # Ties (e.g. all-zero scores) go to the higher frequency: a stable sort over descending scores.
    top = torch.sort(-scores, dim=-1, stable=True).indices[..., :n]
    return {str(layer): [sorted(int(f) for f in top[layer, kv]) for kv in range(hm.n_kv_heads)]
            for layer in range(hm.n_layers)}
