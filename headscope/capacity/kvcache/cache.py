"""A head-aware KV cache: full KV for chosen KV heads, sink + recent window for the others.

DuoAttention (Xiao et al. 2024) keeps the whole KV cache only for "retrieval" heads; "streaming"
heads keep the first `sink` tokens (the attention sink) and the `window` most recent ones. This is
that cache for transformers 5, as a cache layer (`HeadAwareLayer`) inside a `DynamicCache`
(`HeadAwareCache`), plus the attention function that reads it (`kvcache_attention`).

The rule a windowed KV head follows: the query at position i sees key j iff j <= i and
(j < sink or j > i - window), i.e. the sink tokens and the `window` most recent tokens, itself
included (transformers' own sliding-window convention). Between steps a windowed head therefore
stores at most sink + window - 1 tokens, and a decoding step reads at most sink + window.

GQA: the cache stores KV heads, so a KV head can be windowed only when every query head of its
group is; `CachePlan` is per KV head. With one KV head per layer (MQA) windowing is all or nothing
per layer, which is a layer choice, not a head choice: `check_supported` refuses it.

Prefill is exact too: the prompt's keys all arrive at once and windowed heads attend through the
band mask above, so one forward over T tokens gives the same logits as T decoding steps (tested).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, cast

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ...errors import HeadscopeError, OptionError
from ...models.adapter import HeadModel
from ...models.capabilities import supported_model_types_for, why_not
from ...models.config import attention_implementation
from ...models.specs import spec_for
from ..kv_formula import kv_bytes

ATTENTION_NAME = "headscope_kvcache"
# Model types the cache serves: decoders whose attention hands the cache's output straight to transformers'
# attention interface and whose layers can all be full attention, as their specs say (capabilities.why_not).
SUPPORTED = supported_model_types_for("kvcache")


@dataclass(frozen=True)
class CachePlan:
    """Which KV heads of each layer keep their full KV; every other KV head keeps sink + window."""

    full: tuple[tuple[int, ...], ...]  # per layer, the KV heads kept in full, sorted
    n_kv_heads: int
    group_size: int  # query heads per KV head
    sink: int
    window: int

    def __post_init__(self) -> None:
        check_window(self.sink, self.window)
        for layer, heads in enumerate(self.full):
            if list(heads) != sorted(set(heads)) or any(not 0 <= h < self.n_kv_heads for h in heads):
                raise HeadscopeError(f"layer {layer}: full KV heads {list(heads)} must be distinct, sorted and in "
                                     f"0..{self.n_kv_heads - 1}")

    @classmethod
    def all_full(cls, n_layers: int, n_kv_heads: int, group_size: int, sink: int = 4, window: int = 256) -> "CachePlan":
        """The plan of an ordinary cache: every KV head full."""
        return cls(tuple(tuple(range(n_kv_heads)) for _ in range(n_layers)), n_kv_heads, group_size, sink, window)

    @property
    def n_layers(self) -> int:
        return len(self.full)

    def windowed(self, layer: int) -> tuple[int, ...]:
        """The KV heads of `layer` that keep only sink + window."""
        return tuple(h for h in range(self.n_kv_heads) if h not in self.full[layer])

    @property
    def n_full(self) -> int:
        """KV heads kept in full, over all layers."""
        return sum(len(f) for f in self.full)

    @property
    def n_windowed(self) -> int:
        """KV heads freed (windowed), over all layers."""
        return self.n_layers * self.n_kv_heads - self.n_full

    @property
    def fraction_full(self) -> float:
        """Share of all KV heads kept in full: the cache's bytes per token relative to a full cache."""
        return self.n_full / (self.n_layers * self.n_kv_heads)

    def full_query_heads(self, layer: int) -> list[int]:
        """Query heads of `layer` that read a full KV head."""
        return [kv * self.group_size + g for kv in self.full[layer] for g in range(self.group_size)]

    def tokens_read(self, context: int) -> int:
        """KV-head token slots one decoding step reads at `context` tokens (the new one included), all layers."""
        return self.n_full * context + self.n_windowed * min(context, self.sink + self.window)

    def tokens_stored(self, context: int) -> int:
        """KV-head token slots held between steps after `context` tokens, all layers."""
        return self.n_full * context + self.n_windowed * min(context, self.sink + self.window - 1)

    # Bytes through `kv_formula.kv_bytes`, the one KV-bytes formula, with (KV head, token) slots counted here.
    def bytes_read(self, context: int, d_head: int, bytes_per_number: int, batch: int = 1) -> int:
        """K and V bytes a decoding step reads at `context` tokens: the formula the cache is tested against."""
        return kv_bytes(self.tokens_read(context), d_head, 8 * bytes_per_number, batch)

    def bytes_stored(self, context: int, d_head: int, bytes_per_number: int, batch: int = 1) -> int:
        """K and V bytes the cache holds after `context` tokens."""
        return kv_bytes(self.tokens_stored(context), d_head, 8 * bytes_per_number, batch)

    def bytes_per_token(self, d_head: int, bytes_per_number: int) -> int:
        """Bytes one more token costs once every window is full: only full KV heads grow."""
        return kv_bytes(self.n_full, d_head, 8 * bytes_per_number)


def check_window(sink: int, window: int) -> None:
    """Refuse a negative sink or a window below 1 (a query always sees itself)."""
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise OptionError("sink", f"must be 0 or more tokens (the attention-sink tokens every windowed head keeps); "
                                  f"got {sink}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise OptionError("window", f"must be at least 1 token (the recent tokens a windowed head keeps, the "
                                    f"current one included); got {window}")


def _check_family(model_type: str, name: str) -> None:
    spec = spec_for(model_type)
    why = why_not(spec, "kvcache", model_type)
    if why:
        raise HeadscopeError(f"model type {model_type!r} ({name}, {spec.family} family) is not supported by the "
                             f"head-aware KV cache: {why}")


def _check_not_mqa(name: str, n_heads: int, n_kv_heads: int) -> None:
    if n_kv_heads == 1:
        raise HeadscopeError(
            f"{name!r} is MQA (1 KV head per layer, shared by all {n_heads} query heads): a KV head can be "
            f"windowed only when all its query heads are, so windowing here drops a whole layer's long-range "
            f"attention, a layer choice rather than a head choice; use a model with 2 or more KV heads per layer")


def check_supported_config(name: str, model_type: str, n_heads: int, n_kv_heads: int) -> None:
    """What `check_supported` can tell from a config alone (family, MQA): a verb refuses it before weights load."""
    _check_family(model_type, name)
    _check_not_mqa(name, n_heads, n_kv_heads)


def check_supported(hm: HeadModel) -> None:
    """A clear error unless `hm` is a decoder family the head-aware cache serves with 2+ KV heads per layer."""
    _check_family(hm.config.model_type, hm.name)
    if hm.pruned:
        raise HeadscopeError(f"{hm.name!r} is physically pruned (per-layer head counts); the head-aware KV cache "
                             f"needs the same heads in every layer")
    sliding = [layer for layer in range(hm.n_layers) if hm.sliding_window(layer) is not None]
    if sliding and getattr(hm.config, "use_sliding_window", True) is not False:
        raise HeadscopeError(f"{hm.name!r} has sliding-window layers ({len(sliding)} of {hm.n_layers}: every head "
                             f"there is already windowed); the head-aware KV cache needs full-attention layers")
    _check_not_mqa(hm.name, hm.n_heads, hm.n_kv_heads)


class HeadSplitKV:
    """What a head-aware layer hands the attention function instead of one key (or value) tensor:
    the full KV heads over every position, and the windowed KV heads over the positions they keep."""

    __slots__ = ("full", "windowed", "positions", "full_heads", "windowed_heads", "query_start", "sink", "window")

    def __init__(self, full: torch.Tensor, windowed: torch.Tensor, positions: torch.Tensor,
                 full_heads: tuple[int, ...], windowed_heads: tuple[int, ...], query_start: int, sink: int,
                 window: int) -> None:
        self.full = full  # [batch, n_full, T, d_head]
        self.windowed = windowed  # [batch, n_windowed, S, d_head]
        self.positions = positions  # [S] position of each windowed key
        self.full_heads, self.windowed_heads = full_heads, windowed_heads
        self.query_start = query_start  # position of the first query of this forward
        self.sink, self.window = sink, window

    @property
    def nbytes(self) -> int:
        return self.full.nbytes + self.windowed.nbytes


class HeadAwareLayer(DynamicLayer):
    """One layer's cache: full KV for `full` KV heads, sink + window for `windowed` ones.

    `keys`/`values` hold the full heads `[batch, n_full, T, d_head]`; `windowed_keys`/`windowed_values`
    the windowed heads `[batch, n_windowed, S, d_head]` with their positions in `positions` `[S]`.
    `bytes_read` is what the last `update` handed to attention (K and V, every head).
    """

    def __init__(self, full: Sequence[int], windowed: Sequence[int], sink: int, window: int) -> None:
        super().__init__()
        self.full_heads, self.windowed_heads = tuple(full), tuple(windowed)
        self.sink, self.window = sink, window
        self.cumulative_length = 0
        self.windowed_keys: torch.Tensor | None = None
        self.windowed_values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.bytes_read = 0

    def _held(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The full heads' K and V, the windowed heads' K and V and their positions (lazy_initialization sets them)."""
        held = (self.keys, self.values, self.windowed_keys, self.windowed_values, self.positions)
        assert all(t is not None for t in held), "the head-aware layer is used before its first update"
        return held  # type: ignore[return-value]  # every item checked not None just above

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        b, _, _, d = key_states.shape
        dev = key_states.device
        self._full_idx = torch.tensor(self.full_heads, dtype=torch.long, device=dev)
        self._win_idx = torch.tensor(self.windowed_heads, dtype=torch.long, device=dev)
        self.keys = key_states.new_empty(b, len(self.full_heads), 0, d)
        self.values = value_states.new_empty(b, len(self.full_heads), 0, value_states.shape[-1])
        self.windowed_keys = key_states.new_empty(b, len(self.windowed_heads), 0, d)
        self.windowed_values = value_states.new_empty(b, len(self.windowed_heads), 0, value_states.shape[-1])
        self.positions = torch.empty(0, dtype=torch.long, device=dev)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[Any, Any]:
        """Append this forward's K/V `[batch, kv_head, q, d_head]`; return what attention reads."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.cumulative_length
        self.cumulative_length += key_states.shape[-2]
        keys, values, w_keys, w_values, positions = self._held()
        if not self.windowed_heads:  # an ordinary layer: exactly DynamicLayer's tensors
            self.keys = keys = torch.cat([keys, key_states], dim=-2)
            self.values = values = torch.cat([values, value_states], dim=-2)
            self.bytes_read = keys.nbytes + values.nbytes
            return keys, values
        self.keys = keys = torch.cat([keys, key_states.index_select(1, self._full_idx)], dim=-2)
        self.values = values = torch.cat([values, value_states.index_select(1, self._full_idx)], dim=-2)
        new_pos = torch.arange(start, self.cumulative_length, device=positions.device)
        wk = torch.cat([w_keys, key_states.index_select(1, self._win_idx)], dim=-2)
        wv = torch.cat([w_values, value_states.index_select(1, self._win_idx)], dim=-2)
        pos = torch.cat([positions, new_pos])
        # Keep what the next query (at position cumulative_length) may still see.
        keep = (pos < self.sink) | (pos > self.cumulative_length - self.window)
        if not bool(keep.all()):
            self.windowed_keys, self.windowed_values, self.positions = wk[:, :, keep], wv[:, :, keep], pos[keep]
        else:
            self.windowed_keys, self.windowed_values, self.positions = wk, wv, pos
        meta = (pos, self.full_heads, self.windowed_heads, start, self.sink, self.window)
        k, v = HeadSplitKV(keys, wk, *meta), HeadSplitKV(values, wv, *meta)
        self.bytes_read = k.nbytes + v.nbytes
        return k, v

    def get_seq_length(self) -> int:
        return self.cumulative_length

    @property
    def bytes_stored(self) -> int:
        """K and V bytes this layer holds now."""
        if not self.is_initialized:
            return 0
        keys, values, w_keys, w_values, _ = self._held()
        held = keys.nbytes + values.nbytes
        if self.windowed_heads:
            held += w_keys.nbytes + w_values.nbytes
        return held

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0
        self.windowed_keys = self.windowed_values = self.positions = None
        self.bytes_read = 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the head-aware cache cannot be cropped (windowed heads have dropped tokens)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("the head-aware cache does not support beam search")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("the head-aware cache does not support batch expansion")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("the head-aware cache does not support batch selection")


class HeadAwareCache(DynamicCache):
    """A DynamicCache whose layers follow a `CachePlan` (use inside `head_aware_attention(hm)`)."""

    def __init__(self, plan: CachePlan) -> None:
        layers = [HeadAwareLayer(plan.full[layer], plan.windowed(layer), plan.sink, plan.window)
                  for layer in range(plan.n_layers)]
        super().__init__()
        self.layers = list(layers)
        self.head_layers = layers  # the same layers, typed as what they are
        self.layer_class_to_replicate = None
        self.plan = plan

    @property
    def bytes_read(self) -> int:
        """K and V bytes the last forward's attention read, all layers."""
        return sum(layer.bytes_read for layer in self.head_layers)

    @property
    def bytes_stored(self) -> int:
        """K and V bytes held now, all layers."""
        return sum(layer.bytes_stored for layer in self.head_layers)


def _gather_heads(kv_heads: Sequence[int], group_size: int, device: torch.device) -> torch.Tensor:
    """Indices of the query heads reading `kv_heads` (each KV head's group, in order)."""
    return torch.tensor([kv * group_size + g for kv in kv_heads for g in range(group_size)], dtype=torch.long,
                        device=device)


def windowed_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """`[q, k]` bool: query at position i sees key j iff j <= i and (j < sink or j > i - window)."""
    qp, kp = query_pos[:, None], key_pos[None, :]
    return (kp <= qp) & ((kp < sink) | (kp > qp - window))


def training_band(q_len: int, k_len: int, attention_mask: torch.Tensor | None, sink: int, window: int,
                  device: torch.device, what: str) -> torch.Tensor:
    """`[1|batch, 1, q, k]` bool: the sink + window band of a forward without a cache (the queries are the last
    `q_len` of `k_len` positions), within sdpa's boolean `attention_mask` when given (`what` names the caller
    in the error for any other mask)."""
    query_pos = torch.arange(k_len - q_len, k_len, device=device)
    band = windowed_mask(query_pos, torch.arange(k_len, device=device), sink, window)[None, None]
    if attention_mask is None:
        return band
    if attention_mask.dtype != torch.bool:
        raise HeadscopeError(f"{what} expects sdpa's boolean masks; got {attention_mask.dtype}")
    return band & attention_mask[..., :k_len]


def kvcache_attention(module: nn.Module, query: torch.Tensor, key: Any, value: Any, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function: sdpa for plain tensors; for a head-aware layer, sdpa over the
    full heads (with the model's mask) and over the windowed heads (its mask restricted to their keys,
    and the band). Returns `[batch, q, head, d_head]` and no weights."""
    if not isinstance(key, HeadSplitKV):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    b, n_heads, q_len, _ = query.shape  # [batch, head, q, d_head]
    group = cast(int, module.num_key_value_groups)  # transformers' attention modules set it
    out = query.new_empty(b, q_len, n_heads, value.full.shape[-1])  # [batch, q, head, d_head]
    if key.full_heads:
        idx = _gather_heads(key.full_heads, group, query.device)
        o, _ = sdpa_attention_forward(module, query.index_select(1, idx), key.full, value.full, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
        out[:, :, idx] = o
    idx = _gather_heads(key.windowed_heads, group, query.device)
    query_pos = torch.arange(key.query_start, key.query_start + q_len, device=query.device)
    mask = windowed_mask(query_pos, key.positions, key.sink, key.window)[None, None]  # [1, 1, q, S]
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise HeadscopeError(f"the head-aware cache expects sdpa's boolean masks; got {attention_mask.dtype}")
        mask = mask & attention_mask.index_select(-1, key.positions)  # the model's own padding and causality
    o, _ = sdpa_attention_forward(module, query.index_select(1, idx), key.windowed, value.windowed, mask,
                                  scaling=scaling, dropout=dropout, **kwargs)
    out[:, :, idx] = o
    return out, None


@contextmanager
def head_aware_attention(hm: HeadModel) -> Iterator[HeadModel]:
    """Run `hm` with the head-aware attention function while active (a plain cache or none then runs
    exactly as sdpa), and restore its attention implementation after."""
    with attention_implementation(hm.model, ATTENTION_NAME, kvcache_attention):
        yield hm


__all__ = ["ATTENTION_NAME", "SUPPORTED", "HeadAwareCache", "HeadAwareLayer", "CachePlan", "HeadSplitKV",
           "check_supported", "check_window", "head_aware_attention", "kvcache_attention", "windowed_mask"]
