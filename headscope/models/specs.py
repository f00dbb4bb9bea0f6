"""Declarative adapters: where each model family keeps its attention pieces.

One small `AttentionSpec` per family; every family-specific attribute name lives here and
nowhere else. Paths are dotted attribute paths relative to `model.base_model` (the layer list)
or to one layer block (the rest).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import HeadscopeError, did_you_mean
from .layout import get_path, set_path

__all__ = ["SPECS", "AttentionSpec", "get_path", "set_path", "spec_for", "supported_model_types"]


@dataclass(frozen=True)
class AttentionSpec:
    """Where a family keeps its attention pieces, and how they are laid out."""

    family: str
    model_types: tuple[str, ...]
    layers: str  # ModuleList of blocks, relative to model.base_model
    attention: str  # module whose forward returns (output, attention_weights) under eager
    out_proj: str  # output projection; its input is the concatenation of head outputs
    q_proj: str | None = None  # separate projections (BERT, LLaMA)
    k_proj: str | None = None
    v_proj: str | None = None
    qkv_proj: str | None = None  # fused [q; k; v] projection (GPT-2)
    conv1d: bool = False  # GPT-2's Conv1D stores weights as [in, out]
    causal: bool = False
    # Attributes of the attention module that its forward reads and physical pruning must update,
    # with the quantity each holds: "heads" (query heads kept), "width" (heads * d_head) or
    # "groups" (query heads per kept KV head). Attributes a module lacks are skipped.
    head_count_attrs: tuple[tuple[str, str], ...] = ()
    # Whether the family's config stores the number of KV heads (`num_key_value_heads`), so a
    # checkpoint with fewer KV heads than query heads (GQA/MQA) loads in plain transformers.
    kv_heads_in_config: bool = False
    # Whether the position table reserves `pad_token_id + 1` leading slots (RoBERTa counts positions
    # from padding_idx + 1), so usable positions are max_position_embeddings minus that.
    position_offset_from_pad: bool = False

    def describe(self) -> str:
        """One line for listings: family and the model types it covers."""
        return f"{self.family}: {', '.join(self.model_types)}"


BERT = AttentionSpec(
    family="bert",
    model_types=("bert", "electra"),
    layers="encoder.layer",
    attention="attention.self",
    out_proj="attention.output.dense",
    q_proj="attention.self.query",
    k_proj="attention.self.key",
    v_proj="attention.self.value",
    head_count_attrs=(("num_attention_heads", "heads"), ("all_head_size", "width")),
)

# The BERT layout with RoBERTa's position numbering.
ROBERTA = replace(BERT, family="roberta", model_types=("roberta", "xlm-roberta", "camembert"),
                  position_offset_from_pad=True)

GPT2 = AttentionSpec(
    family="gpt2",
    model_types=("gpt2",),
    layers="h",
    attention="attn",
    out_proj="attn.c_proj",
    qkv_proj="attn.c_attn",
    conv1d=True,
    causal=True,
    head_count_attrs=(("num_heads", "heads"), ("split_size", "width")),
)

LLAMA = AttentionSpec(
    family="llama",
    model_types=("llama", "mistral", "qwen2"),
    layers="layers",
    attention="self_attn",
    out_proj="self_attn.o_proj",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
    causal=True,
    head_count_attrs=(("num_key_value_groups", "groups"), ("num_heads", "heads"), ("num_key_value_heads", "kv_heads")),
    kv_heads_in_config=True,
)

SPECS: tuple[AttentionSpec, ...] = (BERT, ROBERTA, GPT2, LLAMA)
_BY_TYPE = {t: s for s in SPECS for t in s.model_types}


def supported_model_types() -> list[str]:
    """All `config.model_type` values headscope has an adapter for."""
    return sorted(_BY_TYPE)


def spec_for(model_type: str) -> AttentionSpec:
    """The adapter for a `config.model_type`, or a clear error naming the supported ones."""
    try:
        return _BY_TYPE[model_type]
    except KeyError:
        raise HeadscopeError(
            f"model type {model_type!r} is not supported{did_you_mean(model_type, _BY_TYPE)}; "
            f"supported: {', '.join(supported_model_types())}"
        ) from None
