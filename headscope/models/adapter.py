"""A loaded model bound to its family's AttentionSpec: head counts, module access and weight layout.

Stages read and change attention weights only through `HeadModel`'s layout methods
(`qkv_weights`, `set_qkv_weights`, `out_weight`, `set_out_weight`, `permute_heads`,
`slice_heads`): none of them reads a fused matrix or a Conv1D's storage order itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, cast

import torch
from torch import nn

from ..errors import HeadscopeError
from ..heads import Head
from . import dispatch, layout
from .config import attention_counts
from .geometry import check_layers, module_at
from .layout import QKVWeights
from .specs import AttentionSpec, get_path, spec_for

# Config attribute recording the kept heads of a physically pruned model, {"layer": [original ids]},
# so the record travels in config.json.
PRUNING_CONFIG_KEY = "headscope_pruning"
# The same for FFN neurons: {"layer": [original neuron ids kept]} (per-layer FFN widths).
FFN_CONFIG_KEY = "headscope_ffn"


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
        # The model keeps the attention kernel it was loaded with (sdpa by default): statistics come from
        # the statistics kernel beside it, and full-map consumers switch to eager only while they run
        # (`hooks.on_attention_weights`), so no kernel is forced here.
        check_layers(self)

    # --- shape of the attention -------------------------------------------------------------
    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        """Query heads per layer as the config declares them (before any physical pruning)."""
        return attention_counts(self.config).n_heads

    @property
    def n_kv_heads(self) -> int:
        """KV heads per layer (n_heads for MHA, 1 for MQA)."""
        return attention_counts(self.config).n_kv_heads

    @property
    def d_model(self) -> int:
        """Width of the residual stream."""
        d_model = attention_counts(self.config).d_model
        if d_model is None:  # guards hand-made configs
            raise HeadscopeError(f"config of {self.name!r} has no hidden size (hidden_size / n_embd)")
        return d_model

    @property
    def d_head(self) -> int:
        """Width of one head's query, key and value (MLA: of its value and output, `spec.d_head_attr`), one for every
        layer: where layers differ (Gemma-4) it refuses, naming the widths; per-layer code reads `d_head_at`."""
        if self.spec.d_head_attr:
            return int(getattr(self.config, self.spec.d_head_attr))
        counts = attention_counts(self.config)
        if counts.d_heads:
            raise HeadscopeError(
                f"{self.name!r} ({self.spec.family} family) has head_dim per layer ({self.d_head_record}); this step "
                f"needs one head_dim in every layer (analyze, roles, score, prune and kv handle per-layer head_dim)")
        return counts.d_head

    def d_head_at(self, layer: int) -> int:
        """Width of one head's query, key and value in `layer` (Gemma-4: its global layers' global_head_dim)."""
        if self.spec.d_head_attr:
            return int(getattr(self.config, self.spec.d_head_attr))
        counts = attention_counts(self.config)
        return counts.d_heads[layer] if counts.d_heads else counts.d_head

    @property
    def d_head_record(self) -> int | list[int]:
        """head_dim for records (JSON): one number, or one per layer where the layers differ."""
        counts = None if self.spec.d_head_attr else attention_counts(self.config)
        return list(counts.d_heads) if counts is not None and counts.d_heads else self.d_head_at(0)

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def causal(self) -> bool:
        return self.spec.causal

    @property
    def has_sinks(self) -> bool:
        """Whether each head's softmax has a learned sink logit (GPT-OSS): its rows sum to less than one."""
        return self.spec.sink_logits is not None

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the position table allows, or None when positions are unbounded."""
        c = self.config
        n = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)
        if n is not None and self.spec.position_offset_from_pad:
            n -= int(getattr(c, "pad_token_id", 1) or 1) + 1
        return int(n) if n else None

    def sliding_window(self, layer: int) -> int | None:
        """The sliding window of `layer`, else None: a query sees key k when q - k < window (causal layers) or
        |q - k| < window (bidirectional ones)."""
        c = self.config
        window = getattr(c, "sliding_window", None)
        types = getattr(c, "layer_types", None)
        if window is None:
            return None
        if types is not None and types[layer] != "sliding_attention":
            return None
        return int(window) + self.spec.window_offset

    # --- modules ---------------------------------------------------------------------------
    @property
    def _transformers_api(self) -> Any:
        # `model` as transformers' model API (base_model, get_input_embeddings, ...), reached untyped here only:
        # nn.Module's hints type every attribute it does not declare as Tensor | Module.
        return self.model

    @property
    def hf_model(self) -> Any:
        """`model` as transformers' model API (generate, save_pretrained, get_input_embeddings, ...): untyped,
        since nn.Module's hints type every attribute it does not declare as Tensor | Module."""
        return self.model

    @property
    def base_model(self) -> nn.Module:
        """The transformers base model: it holds the layer blocks (`spec.layers` is relative to it)."""
        return cast(nn.Module, self._transformers_api.base_model)

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding table: token ids from 0 to vocab_size - 1 are valid."""
        return int(self._transformers_api.get_input_embeddings().num_embeddings)

    @property
    def output_embeddings(self) -> nn.Module | None:
        """The LM head (hidden states -> vocabulary logits), or None for encoders and classifiers."""
        return cast("nn.Module | None", self._transformers_api.get_output_embeddings())

    @property
    def layers(self) -> nn.ModuleList:
        return cast(nn.ModuleList, get_path(self.base_model, self.spec.layers))

    def attention(self, layer: int) -> nn.Module:
        return get_path(self.layers[layer], self.spec.attention)

    def out_proj(self, layer: int) -> nn.Module:
        return get_path(self.layers[layer], self.spec.out_proj)

    def has_heads(self, layer: int) -> bool:
        """Whether `layer` has softmax attention heads (Qwen3.5's linear-attention layers have none:
        `spec.headless_layer_types`)."""
        types = getattr(self.config, "layer_types", None) if self.spec.headless_layer_types else None
        return types is None or types[layer] not in self.spec.headless_layer_types

    @property
    def headless_layers(self) -> list[int]:
        """Layers without softmax heads, which every verb skips (empty for most families)."""
        return [layer for layer in range(self.n_layers) if not self.has_heads(layer)]

    def kept_heads(self, layer: int) -> list[int]:
        """Original ids of the query heads present in `layer`: all of them unless physically pruned
        (`slice_heads` records the kept heads in `config.headscope_pruning`); none in a layer without heads."""
        if not self.has_heads(layer):
            return []
        recorded = getattr(self.config, PRUNING_CONFIG_KEY, None) or {}
        kept = recorded.get(str(layer), recorded.get(layer))
        return list(range(self.n_heads)) if kept is None else [int(h) for h in kept]

    def heads_in_layer(self, layer: int) -> int:
        """Query heads currently present in `layer` (differs per layer after physical pruning)."""
        return len(self.kept_heads(layer))

    @property
    def pruned(self) -> bool:
        """Whether any layer has lost heads to physical pruning."""
        return any(self.has_heads(layer) and self.heads_in_layer(layer) != self.n_heads
                   for layer in range(self.n_layers))

    def set_head_counts(self, layer: int, n_heads: int, n_kv_heads: int) -> None:
        """Update the head-count attributes the layer's attention forward reads (after its
        projections were resized by pruning or GQA conversion)."""
        layout.set_head_count_attrs(self.attention(layer), self.spec, n_heads, n_kv_heads, self.d_head_at(layer))

    # --- feed-forward neurons ---------------------------------------------------------------
    @property
    def has_ffn(self) -> bool:
        """Whether the family's spec says where its FFN neurons live (so they can be scored and pruned)."""
        return bool(self.spec.ffn_in and self.spec.ffn_out)

    def ffn_out(self, layer: int) -> nn.Module:
        """The FFN output projection of `layer`; its input is the neurons' activations `[batch, pos, n_neurons]`."""
        path = self.spec.ffn_out
        if not self.has_ffn or path is None:
            raise HeadscopeError(f"the {self.spec.family} family declares no FFN modules (ffn_in / ffn_out in "
                                 f"headscope/models/specs.py); FFN neurons cannot be reached")
        return get_path(self.layers[layer], path)

    def ffn_in(self, layer: int) -> list[nn.Module]:
        """The FFN input-side projections of `layer` (up / gate / fc1), whose output rows are the neurons."""
        self.ffn_out(layer)  # the same check
        return [get_path(self.layers[layer], p) for p in self.spec.ffn_in]

    def ffn_size(self, layer: int) -> int:
        """FFN neurons currently present in `layer` (differs per layer after physical pruning)."""
        return int(layout.linear_weight(self.ffn_out(layer), self.spec.conv1d).shape[1])

    def kept_neurons(self, layer: int) -> list[int]:
        """Original ids of the FFN neurons present in `layer` (recorded in `config.headscope_ffn` by `slice_ffn`)."""
        recorded = getattr(self.config, FFN_CONFIG_KEY, None) or {}
        kept = recorded.get(str(layer), recorded.get(layer))
        return list(range(self.ffn_size(layer))) if kept is None else [int(i) for i in kept]

    @property
    def ffn_pruned(self) -> bool:
        """Whether any layer has lost FFN neurons to physical pruning."""
        return bool(getattr(self.config, FFN_CONFIG_KEY, None))

    def slice_ffn(self, layer: int, keep: Sequence[int]) -> None:
        """Physically keep only FFN neurons `keep` (original ids) in `layer`, in place; recorded in
        `config.headscope_ffn` so checkpoints reload with per-layer widths."""
        keep = sorted(int(i) for i in set(keep))
        now = self.kept_neurons(layer)
        gone = [i for i in keep if i not in now]
        if gone:
            raise HeadscopeError(f"layer {layer}: FFN neuron(s) {gone[:5]} are not in the layer; neurons can be "
                                 f"removed, not added back")
        if not keep:
            raise HeadscopeError(f"layer {layer}: keep at least one FFN neuron (to remove the whole layer, drop "
                                 f"its block)")
        if keep == now:
            return
        record = {str(l): self.kept_neurons(l) for l in range(self.n_layers)}
        layout.slice_ffn(self.layers[layer], self.spec, [now.index(i) for i in keep])
        record[str(layer)] = keep
        setattr(self.config, FFN_CONFIG_KEY, record)

    # --- weight layout ---------------------------------------------------------------------
    def kv_heads_in_layer(self, layer: int) -> list[int]:
        """Original ids of the KV heads present in `layer` (those its kept query heads read)."""
        return layout.kv_heads_for(self.kept_heads(layer), self.group_size)

    def projections(self, layer: int) -> dict[str, nn.Module]:
        """The layer's attention projection modules: {"q", "k", "v", "o"}, or {"qkv", "o"} when fused.

        Only "o" when every head of the layer was pruned (its attention module is an EmptyAttention).
        """
        spec, block = self.spec, self.layers[layer]
        if spec.head_row_projs:  # MLA: named by their own attribute (those the layer has)
            paths = {p.rpartition(".")[2]: p for p in spec.head_row_projs if module_at(block, p) is not None}
        else:
            named = (("qkv", spec.qkv_proj),) if spec.qkv_proj else (("q", spec.q_proj), ("k", spec.k_proj),
                                                                    ("v", spec.v_proj))
            paths = {name: p for name, p in named if p is not None}
        out = {} if self.heads_in_layer(layer) == 0 else {name: get_path(block, p) for name, p in paths.items()}
        out["o"] = get_path(block, spec.out_proj)
        return out

    def head_channels(self, layer: int, kind: str, head: int) -> tuple[nn.Module, torch.Tensor]:
        """Where query head `head` (original id) reads its query (kind "q") or its KV group its keys or values
        ("k", "v") in `layer`: the projection module and the indices of those channels in its output."""
        self._check_qkv()
        kept, kv = self.kept_heads(layer), self.kv_heads_in_layer(layer)
        if head not in kept:
            raise HeadscopeError(f"layer {layer} has no head {head}: its heads are {kept}")
        index = kept.index(head) if kind == "q" else kv.index(head // self.group_size)
        name, channels = layout.head_channels(self.spec, kind, index, len(kept), len(kv), self.d_head_at(layer))
        return self.projections(layer)[name], channels

    def out_channels(self, layer: int, head: int) -> torch.Tensor:
        """The `d_head` input channels of `layer`'s output projection carrying query head `head` (an id it keeps)."""
        d = self.d_head_at(layer)
        return torch.arange(d) + self.kept_heads(layer).index(head) * d

    def _check_qkv(self) -> None:
        why = self.spec.refusal("qkv")
        if why:
            raise HeadscopeError(f"{self.name!r} ({self.spec.family} family): {why}; per-head Q/K/V weights cannot be "
                                 f"read or written")

    def qkv_weights(self, layer: int) -> QKVWeights:
        """Q, K, V weights and biases of `layer` in Linear layout, whatever the storage.

        q is `[heads * d_head, d_model]` and k, v are `[kv_heads * d_head, d_model]` for the heads
        present in the layer (`kept_heads`, `kv_heads_in_layer`), in that order. The tensors are
        detached views of the parameters: clone them before changing them in place.
        """
        self._check_qkv()
        h, g, d = self.heads_in_layer(layer), len(self.kv_heads_in_layer(layer)), self.d_head_at(layer)
        if h == 0:
            empty = self.out_weight(layer).detach().new_zeros(0, self.d_model)
            return QKVWeights(empty, empty, empty)
        if dispatch.is_dispatched(self.model):  # offloaded weights: read a copy, loaded for the moment
            with dispatch.loaded(list(self.projections(layer).values())):
                w = layout.read_qkv(self.layers[layer], self.spec, h, g, d)
                return QKVWeights(w.q.clone(), w.k.clone(), w.v.clone(),
                                  *(None if b is None else b.clone() for b in (w.q_bias, w.k_bias, w.v_bias)))
        return layout.read_qkv(self.layers[layer], self.spec, h, g, d)

    def set_qkv_weights(self, layer: int, weights: QKVWeights) -> None:
        """Write Q, K, V (Linear layout, as `qkv_weights` returns them) into `layer`, in place.

        The query head count cannot change here (use `slice_heads`); the KV head count may (GQA
        conversion), and the attention module's head-count attributes follow. Parameters are
        copied in place when their shape is unchanged, else the projections are replaced by
        resized modules of the same class. Biases must be given exactly where the layer has them.
        """
        now = self.qkv_weights(layer)
        h, d, d_model = self.heads_in_layer(layer), self.d_head_at(layer), self.d_model
        w = weights
        if h == 0:
            raise HeadscopeError(f"layer {layer} has no heads left (all pruned); there are no Q/K/V weights to set")
        if tuple(w.q.shape) != (h * d, d_model):
            raise HeadscopeError(
                f"layer {layer}: q has shape {tuple(w.q.shape)}; expected {(h * d, d_model)} ({h} query heads x "
                f"d_head {d}, d_model {d_model}). Change the number of query heads with slice_heads"
            )
        if w.k.shape != w.v.shape or w.k.dim() != 2 or w.k.shape[1] != d_model or w.k.shape[0] % d:
            raise HeadscopeError(
                f"layer {layer}: k and v have shapes {tuple(w.k.shape)} and {tuple(w.v.shape)}; expected equal "
                f"shapes (n_kv_heads * {d}, {d_model})"
            )
        g = w.k.shape[0] // d
        if g < 1 or h % g:
            raise HeadscopeError(f"layer {layer}: {g} KV heads do not divide {h} query heads; choose a divisor of {h}")
        if g != len(self.kv_heads_in_layer(layer)) and not self.spec.kv_heads_in_config:
            raise HeadscopeError(
                f"layer {layer}: the {self.spec.family} family gives every query head its own K/V (its config has "
                f"no num_key_value_heads), so k and v need {len(self.kv_heads_in_layer(layer)) * d} rows, not {g * d}"
            )
        if g != len(self.kv_heads_in_layer(layer)) and self.pruned:
            raise HeadscopeError(f"layer {layer}: changing the number of KV heads of a physically pruned model is "
                                 f"not supported; convert before pruning")
        problem = layout.extras_problem(now, w, self.spec.family)
        if problem:
            raise HeadscopeError(f"layer {layer}: {problem}")
        if dispatch.is_dispatched(self.model):  # in memory: offload would reload the old
            dispatch.materialize(list(self.projections(layer).values()))
        layout.write_qkv(self.layers[layer], self.spec, w, d)
        self.set_head_counts(layer, h, g)

    def out_weight(self, layer: int) -> torch.Tensor:
        """Output projection weight as `[d_model, n_heads * d_head]` (Linear layout)."""
        if dispatch.is_dispatched(self.model) and dispatch.offloaded(self.out_proj(layer)):
            with dispatch.loaded([self.out_proj(layer)]):  # a copy, loaded for the moment
                return layout.linear_weight(self.out_proj(layer), self.spec.conv1d).detach().clone()
        return layout.linear_weight(self.out_proj(layer), self.spec.conv1d)

    def set_out_weight(self, layer: int, weight: torch.Tensor) -> None:
        """Copy `weight` (`[d_model, heads * d_head]`, Linear layout) into the output projection, in place."""
        if dispatch.is_dispatched(self.model):  # in memory: offload would reload the old
            dispatch.materialize([self.out_proj(layer)])
        now = self.out_weight(layer)
        if tuple(weight.shape) != tuple(now.shape):
            raise HeadscopeError(f"layer {layer}: output weight has shape {tuple(weight.shape)}; expected "
                                 f"{tuple(now.shape)} (d_model x heads * d_head)")
        with torch.no_grad():
            now.copy_(weight)

    def permute_heads(self, layer: int, query_order: Sequence[int]) -> None:
        """Reorder `layer`'s query heads, in place; the layer computes the same function afterwards.

        `query_order[p]` is the position (in the layer as it is now) of the query head placed at
        position p. Q rows move with the output projection's columns, and the KV heads (K/V rows)
        move with their query heads, so the query heads sharing a KV head must stay together.
        """
        if self.pruned:  # positions would not match the kept original ids
            raise HeadscopeError("permuting the heads of a physically pruned model is not supported; "
                                 "permute before pruning")
        w, d = self.qkv_weights(layer), self.d_head_at(layer)
        n_q, n_kv = w.q.shape[0] // d, w.k.shape[0] // d
        order = [int(i) for i in query_order]
        if sorted(order) != list(range(n_q)):
            raise HeadscopeError(f"layer {layer}: {list(query_order)} is not a permutation of the {n_q} query heads "
                                 f"0..{n_q - 1}")
        g = n_q // n_kv
        kv_order = []
        for j in range(n_kv):
            owners = sorted({p // g for p in order[j * g:(j + 1) * g]})
            if len(owners) != 1:
                raise HeadscopeError(
                    f"layer {layer}: query heads {order[j * g:(j + 1) * g]} would share KV slot {j} but read "
                    f"different KV heads {owners}; keep the {g} query heads of each KV head together"
                )
            kv_order.append(owners[0])

        def move(t: torch.Tensor | None, order: Sequence[int]) -> torch.Tensor | None:
            return None if t is None else layout.reorder_heads(t, order, d)

        self.set_qkv_weights(layer, QKVWeights(
            q=layout.reorder_heads(w.q, order, d), k=layout.reorder_heads(w.k, kv_order, d),
            v=layout.reorder_heads(w.v, kv_order, d),
            q_bias=move(w.q_bias, order), k_bias=move(w.k_bias, kv_order), v_bias=move(w.v_bias, kv_order),
            q_gate=move(w.q_gate, order), q_gate_bias=move(w.q_gate_bias, order)))
        # The output projection's bias is per output feature: unchanged.
        self.set_out_weight(layer, layout.reorder_heads(self.out_weight(layer).detach(), order, d, dim=1))
        # Per-head parameters beside the projections (OLMo-2's norm weights, GPT-OSS's sinks) move with their heads.
        layout.select_head_params(self.layers[layer], self.spec, order, kv_order, d, in_place=True)

    def check_slice(self, layer: int, keep: Sequence[int]) -> list[int]:
        """The KV heads `layer` keeps for query heads `keep` (original ids), or an error saying why not.

        `keep` must be a subset of the heads present. With GQA, transformers' repeat_kv needs every
        kept KV head to serve the same number of query heads.
        """
        now = self.kept_heads(layer)
        if not self.has_heads(layer):
            if keep:
                raise HeadscopeError(
                    f"layer {layer} of the {self.spec.family} family is a "
                    f"{self.config.layer_types[layer]} layer: it has no softmax heads to keep or prune"
                )
            return []
        gone = [h for h in keep if h not in now]
        if gone:
            raise HeadscopeError(f"layer {layer}: head(s) {', '.join(Head(layer, h).name for h in gone)} are not "
                                 f"in the layer (present: {now}); heads can be removed, not added back")
        why = self.spec.refusal("prune")
        if why and 0 < len(set(keep)) < len(now):  # a whole sub-layer may go (output: bias)
            raise HeadscopeError(f"layer {layer}: heads of the {self.spec.family} family cannot be pruned one by one: "
                                 f"{why}")
        g = self.group_size
        per_group: dict[int, int] = {}
        for h in keep:
            per_group[h // g] = per_group.get(h // g, 0) + 1
        counts = set(per_group.values())
        if len(counts) > 1:
            # Suggest the nearest prunable set: keep the smallest surviving count in every group.
            raise HeadscopeError(
                f"layer {layer}: the kept query heads {[Head(layer, h).name for h in keep]} leave KV groups with "
                f"{dict(sorted(per_group.items()))} query heads each; transformers' repeat_kv needs the same number "
                f"in every KV head that stays (group size {g}). Prune whole KV groups, or the same number of query "
                f"heads from every group (e.g. keep {min(counts)} per surviving group)"
            )
        return sorted(per_group)

    def slice_heads(self, layer: int, keep: Sequence[int]) -> None:
        """Physically keep only query heads `keep` (original ids) in `layer`, in place.

        Q rows, unused K/V rows and the output projection's input columns go; a layer with no
        heads left gets an EmptyAttention whose output is the projection's bias. The kept heads
        are recorded in `config.headscope_pruning`. Callers that must not change `self` slice a copy.
        """
        keep = sorted(int(h) for h in set(keep))
        now = self.kept_heads(layer)
        self.check_slice(layer, keep)
        if keep == now:
            return
        if dispatch.is_dispatched(self.model):  # offloaded weights are read into memory to be sliced
            dispatch.materialize(list(self.projections(layer).values()))
        layout.slice_block(self.layers[layer], self.spec, self.d_head_at(layer), self.group_size, now, keep)
        record = {str(l): self.kept_heads(l) for l in range(self.n_layers) if self.has_heads(l)}
        record[str(layer)] = keep
        setattr(self.config, PRUNING_CONFIG_KEY, record)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the parameters' device, or a dispatched model's main device (`device_map`)."""
        return dispatch.input_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype the weights compute in (statistics still accumulate in float64)."""
        return next(p.dtype for p in self.model.parameters() if p.is_floating_point())

    def check_head(self, layer: int, head: int) -> None:
        """Raise a clear error when (layer, head) does not exist in this model."""
        if not 0 <= layer < self.n_layers:
            raise HeadscopeError(f"layer {layer} does not exist: the model has layers 0..{self.n_layers - 1}")
        if not 0 <= head < self.n_heads:
            raise HeadscopeError(f"head {head} does not exist: layers have heads 0..{self.n_heads - 1}")
