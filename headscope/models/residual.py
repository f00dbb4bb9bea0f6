"""Where each family keeps the pieces around its residual stream: the norm before attention, the norm before the
MLP, the MLP itself and the final norm, for families whose layers are "residual in, residual out"
(x + attn(norm(x)), then + mlp(norm(.)), in that order). Edge-level circuits (learned/circuits) read and rewrite
the inputs of those norms.

Families whose layers do something else are named with the reason, so a verb refuses them in one line: a norm on
the attention or MLP output before it joins the residual (Gemma-2/3/4, OLMo-2/3: a head's write is not W_O z),
attention and MLP reading the same input in parallel (GPT-NeoX with use_parallel_residual), post-norm encoders
(BERT family: the norm comes after the residual sum), or no MLP module to hook (OPT keeps fc1/fc2 on the layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import HeadscopeError
from .layout import get_path


@dataclass(frozen=True)
class ResidualLayout:
    """Paths of the norms and the MLP: relative to one layer block, the final norm relative to the base model."""

    attn_norm: str
    mlp_norm: str
    mlp: str
    final_norm: str


_LLAMA = ResidualLayout("input_layernorm", "post_attention_layernorm", "mlp", "norm")
_GPT2 = ResidualLayout("ln_1", "ln_2", "mlp", "ln_f")
_NEOX = ResidualLayout("input_layernorm", "post_attention_layernorm", "mlp", "final_layer_norm")
LAYOUTS: dict[str, ResidualLayout] = {"llama": _LLAMA, "qwen3": _LLAMA, "smollm3": _LLAMA, "starcoder2": _LLAMA,
                                      "phi3": _LLAMA, "gpt2": _GPT2, "gpt_neox": _NEOX}
_POST_NORMED = ("its attention and MLP outputs pass a norm before they join the residual stream (sandwich norms), "
                "so a head's write is not linear in its output and edges cannot be patched by adding differences")
REFUSED: dict[str, str] = {
    "gemma2": _POST_NORMED, "gemma3": _POST_NORMED, "gemma4": _POST_NORMED, "olmo2": _POST_NORMED,
    "bert": "an encoder with post-norm layers (the norm follows the residual sum), not residual in, residual out",
    "roberta": "an encoder with post-norm layers (the norm follows the residual sum), not residual in, residual out",
    "opt": "its MLP is two projections on the layer block with no module of its own to read the output of",
}


def residual_layout(hm: Any) -> ResidualLayout:
    """The family's residual layout, or a one-line refusal naming why the family has none."""
    family = hm.spec.family
    if family == "gpt_neox" and getattr(hm.config, "use_parallel_residual", True):
        raise HeadscopeError(f"{hm.name} ({family}): attention and MLP read the same layer input in parallel "
                             f"(use_parallel_residual), a graph headscope's circuits do not map; supported: "
                             f"{', '.join(sorted(LAYOUTS))}")
    if family not in LAYOUTS:
        why = REFUSED.get(family, "its residual layout is not mapped in headscope/models/residual.py")
        raise HeadscopeError(f"{hm.name} ({family} family): {why}; circuits support {', '.join(sorted(LAYOUTS))}")
    return LAYOUTS[family]


def residual_modules(hm: Any, layer: int) -> tuple[nn.Module, nn.Module, nn.Module]:
    """`layer`'s attention norm, MLP norm and MLP."""
    lay, block = residual_layout(hm), hm.layers[layer]
    return get_path(block, lay.attn_norm), get_path(block, lay.mlp_norm), get_path(block, lay.mlp)


def final_norm_module(hm: Any) -> nn.Module:
    """The norm before the unembedding."""
    return get_path(hm.base_model, residual_layout(hm).final_norm)
