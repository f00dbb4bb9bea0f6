"""A loaded model bound to its family's AttentionSpec: head counts and module access."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import HeadscopeError
from .specs import AttentionSpec, get_path, spec_for


@dataclass
class HeadModel:
    """A transformers model plus what headscope needs to reach its heads.

    `model` is used as given (never modified in place by analysis); `tokenizer` may be None for
    models built from configs in tests, in which case callers pass token ids themselves.
    """

    model: nn.Module
    tokenizer: Any = None
    name: str = ""
    source: str = ""
    spec: AttentionSpec = field(init=False)

    def __post_init__(self) -> None:
        self.spec = spec_for(self.config.model_type)
        if not self.name:
            self.name = getattr(self.config, "_name_or_path", "") or self.config.model_type
        impl = getattr(self.config, "_attn_implementation", None)
        if impl not in (None, "eager"):
            # sdpa/flash return no attention weights; statistics need them.
            self.model.set_attn_implementation("eager")

    # --- shape of the attention -------------------------------------------------------------
    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        c = self.config
        return int(getattr(c, "num_attention_heads", None) or c.n_head)

    @property
    def n_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)

    @property
    def d_model(self) -> int:
        c = self.config
        return int(getattr(c, "hidden_size", None) or c.n_embd)

    @property
    def d_head(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.d_model // self.n_heads)

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def causal(self) -> bool:
        return self.spec.causal

    @property
    def max_positions(self) -> int | None:
        c = self.config
        n = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)
        # BERT-family position tables reserve nothing, RoBERTa reserves padding_idx + 1 slots.
        if n is not None and c.model_type in ("roberta", "xlm-roberta", "camembert"):
            n -= int(getattr(c, "pad_token_id", 1) or 1) + 1
        return int(n) if n else None

    def sliding_window(self, layer: int) -> int | None:
        """Keys a query may see in `layer` when the layer uses a sliding window, else None."""
        c = self.config
        window = getattr(c, "sliding_window", None)
        types = getattr(c, "layer_types", None)
        if window is None:
            return None
        if types is not None:
            return int(window) if types[layer] == "sliding_attention" else None
        return int(window)

    # --- modules ---------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return get_path(self.model.base_model, self.spec.layers)

    def attention(self, layer: int) -> nn.Module:
        return get_path(self.layers[layer], self.spec.attention)

    def out_proj(self, layer: int) -> nn.Module:
        return get_path(self.layers[layer], self.spec.out_proj)

    def out_weight(self, layer: int) -> torch.Tensor:
        """Output projection weight as `[d_model, n_heads * d_head]` (Linear layout)."""
        w = self.out_proj(layer).weight
        return w.t() if self.spec.conv1d else w

    def kept_heads(self, layer: int) -> list[int]:
        """Original ids of the query heads present in `layer`: all of them unless physically pruned
        (headscope.prune records the kept heads in `config.headscope_pruning`)."""
        recorded = getattr(self.config, "headscope_pruning", None) or {}
        kept = recorded.get(str(layer), recorded.get(layer))
        return list(range(self.n_heads)) if kept is None else [int(h) for h in kept]

    def heads_in_layer(self, layer: int) -> int:
        """Query heads currently present in `layer` (differs per layer after physical pruning)."""
        return len(self.kept_heads(layer))

    @property
    def pruned(self) -> bool:
        """Whether any layer has lost heads to physical pruning."""
        return any(self.heads_in_layer(layer) != self.n_heads for layer in range(self.n_layers))

    def set_head_counts(self, layer: int, n_heads: int, n_kv_heads: int) -> None:
        """Update the head-count attributes the layer's attention forward reads (after its
        projections were resized by pruning or GQA conversion)."""
        attention = self.attention(layer)
        values = {"heads": n_heads, "width": n_heads * self.d_head, "kv_heads": n_kv_heads,
                  "groups": n_heads // max(n_kv_heads, 1)}
        for attr, quantity in self.spec.head_count_attrs:
            if hasattr(attention, attr):
                setattr(attention, attr, values[quantity])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def check_head(self, layer: int, head: int) -> None:
        """Raise a clear error when (layer, head) does not exist in this model."""
        if not 0 <= layer < self.n_layers:
            raise HeadscopeError(f"layer {layer} does not exist: the model has layers 0..{self.n_layers - 1}")
        if not 0 <= head < self.n_heads:
            raise HeadscopeError(f"head {head} does not exist: layers have heads 0..{self.n_heads - 1}")
