"""Direct logit attribution per head: what each head writes straight to logit(answer) - logit(wrong).

Head h of layer l writes `W_O[:, h] z_h` into the residual stream at the metric position. Through the final
norm with its scale frozen at the run's own value (the residual's standard deviation or RMS there), that
vector maps linearly to the logits; its logit difference, averaged over pairs of the clean run, is the head's
DLA. The norm's bias and every other component's write are not attributed to heads. A model without a known
final norm followed by a linear unembedding (an encoder's masked-LM head has a dense layer and a norm), or with a
norm on the attention output (Gemma-2/3/4, OLMo-2/3: their spec says `attn_out_normed`), gets NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ...hooks import capture_head_outputs
from ...models.adapter import HeadModel
from ...uncertainty import Interval, IntervalSettings, PassageSums, bootstrap, mean_of
from .pairs import PairBatch
from .patching import chunks, logits_at

_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm")


def final_norm(hm: HeadModel) -> nn.Module | None:
    """The base model's final norm (before the unembedding) when it has one of the usual names, else None."""
    # sandwich norms: a head's write is not W_O z; DLA is left NaN
    if not hm.causal or hm.spec.attn_out_normed:
        return None
    base = hm.base_model
    for name in _NORMS:
        mod = getattr(base, name, None)
        if isinstance(mod, nn.Module) and hasattr(mod, "weight"):
            return mod
    return None


def _scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The norm's scalar divisor for each vector (standard deviation for LayerNorm, RMS otherwise), eps included."""
    eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
    if isinstance(norm, nn.LayerNorm):
        return torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps)
    return torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def frozen_norm(norm: nn.Module, v: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
    """The norm applied to `v` with the scale of `resid` (broadcast) and no bias: (norm(v) - b) s(v) / s(resid)."""
    bias = getattr(norm, "bias", None)
    out = norm(v)
    if isinstance(bias, torch.Tensor):
        out = out - bias
    return out * _scale(norm, v) / _scale(norm, resid)


def dla_values(hm: HeadModel, b: PairBatch, batch_size: int = 16) -> np.ndarray | None:
    """Per pair and head `[pairs, layers, heads]` (NaN where no head), on the clean run; None without a norm."""
    norm, unembed = final_norm(hm), hm.output_embeddings
    weight = getattr(unembed, "weight", None)
    if norm is None or not isinstance(weight, torch.Tensor):
        return None
    w_u = weight.detach().float()
    out = np.full((len(b), hm.n_layers, hm.n_heads), np.nan)
    resid: dict[str, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple[Any, ...]) -> None:
        resid["x"] = args[0].detach()

    for rows in chunks(len(b), batch_size):
        part = b.take(rows)
        store: dict[int, torch.Tensor] = {}
        handle = norm.register_forward_pre_hook(keep)
        try:
            with torch.no_grad(), capture_head_outputs(hm, store):
                logits_at(hm, part.clean, part.mask, part.position)
        finally:
            handle.remove()
        idx = torch.arange(len(part))
        x = resid["x"][idx, part.position.to(resid["x"].device)].float()  # [pairs, d_model]
        direction = w_u[part.answer] - w_u[part.wrong]  # [pairs, d_model]
        with torch.no_grad():
            for l, z in store.items():
                zp = z[idx, part.position.to(z.device)].float()  # [pairs, kept heads, d_head]
                w_o = hm.out_weight(l).detach().float().view(hm.d_model, -1, hm.d_head)  # [d_model, kept, d_head]
                writes = torch.einsum("phd,mhd->phm", zp, w_o.to(zp.device))  # [pairs, kept heads, d_model]
                normed = frozen_norm(norm, writes.to(x.dtype), x[:, None, :])
                out[rows, l, hm.kept_heads(l)] = (normed * direction[:, None, :]).sum(-1).double().cpu().numpy()
    return out


def dla_interval(values: np.ndarray, settings: IntervalSettings) -> Interval:
    """The mean over pairs with its bootstrap interval."""
    sums = PassageSums({"v": values, "n": np.ones(values.shape[0])})
    stat = mean_of("v", "n")
    return bootstrap(sums, lambda s: stat({"v": s["v"], "n": np.reshape(s["n"], (*np.shape(s["n"]), 1, 1))}),
                     settings)
