"""Attention sizes read from any config: one reader for loaded models and for bare config dicts.

Families spell the same quantity differently (`num_attention_heads`, `n_head`, `num_heads`, ...),
so each quantity has a tuple of keys tried in order. `attention_counts` accepts a transformers
config object or a dict shaped like config.json, so `HeadModel` (a loaded model) and the KV-cache
calculator (configs of families headscope cannot load, never loading weights) read them alike.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..errors import HeadscopeError

# transformers >= 5.2x: configs whose layers differ refuse global reads of per-layer attributes
try:
    from transformers.integrations.heterogeneity.configuration_utils import (
        AmbiguousGlobalPerLayerAttributeError as AmbiguousPerLayerAttribute,
    )
except ImportError:
    # older releases have no per-layer configs, so nothing raises it
    class AmbiguousPerLayerAttribute(Exception):  # type: ignore[no-redef]
        """Stands in for transformers' error where it does not exist."""

# transformers >= 5.2x validates configs as strict dataclasses (huggingface_hub's validators)
try:
    from huggingface_hub.errors import StrictDataclassError as ConfigValidationError
except ImportError:  # older releases validate in __init__ with ValueError only
    class ConfigValidationError(Exception):  # type: ignore[no-redef]
        """Stands in for huggingface_hub's error where it does not exist."""

log = logging.getLogger(__name__)

LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
DECODER_LAYER_KEYS = ("decoder_layers", "num_decoder_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads")
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "n_kv_heads")
DMODEL_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
DHEAD_KEYS = ("head_dim", "d_head", "d_kv")

# The attention kernel every loader asks transformers for (one place to change it). Statistics do not
# need eager's weights: the statistics kernel recomputes them blockwise beside sdpa, and the full-map
# reference path (`hooks.on_attention_weights`, `run_stats(..., eager=True)`) switches to eager while active.
ATTN_IMPLEMENTATION = "sdpa"
# What a family without sdpa in transformers loads with instead (e.g. gemma2: sdpa has no soft-capping).
FALLBACK_ATTN_IMPLEMENTATION = "eager"


@contextmanager
def attention_implementation(model: Any, name: str, fn: Callable[..., Any] | None = None) -> Iterator[None]:
    """Run `model` (a transformers model) with attention implementation `name` while active, then restore the
    one it had, also after an error. With `fn`, `name` is first registered with transformers' attention
    registry (`AttentionInterface`; masks built as for sdpa, `AttentionMaskInterface`) unless it already is.
    A model that keeps another implementation (its attention does not dispatch by name) is a clear error.

    The one switch for headscope's own attention functions (the statistics kernel, the head-aware cache and
    its training masks) and for eager's full maps."""
    if fn is not None:
        from transformers import AttentionInterface  # the registries: only code that registers needs them
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, fn)
        if name not in AttentionMaskInterface._global_mapping:
            AttentionMaskInterface.register(name, sdpa_mask)
    previous = model.config._attn_implementation
    try:
        if previous != name:
            model.set_attn_implementation(name)
            if model.config._attn_implementation != name:
                raise HeadscopeError(f"{type(model).__name__} refused attention implementation {name!r} (it stays "
                                     f"{model.config._attn_implementation!r})")
        yield
    finally:
        if model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)


def attn_implementation_for(auto_cls: Any, config: Any) -> str:
    """The attention implementation to load `config` with through `auto_cls` (a transformers Auto class):
    ATTN_IMPLEMENTATION where the model class supports it, else eager (logged, so the fallback is visible)."""
    mapping = getattr(auto_cls, "_model_mapping", None)
    try:
        cls = mapping[type(config)] if mapping is not None else auto_cls
    except KeyError:
        return ATTN_IMPLEMENTATION  # transformers itself says what is wrong with this config
    if ATTN_IMPLEMENTATION == "sdpa" and not getattr(cls, "_supports_sdpa", False):
        log.info("%s has no sdpa attention in transformers; loading it with %s attention",
                 getattr(cls, "__name__", cls), FALLBACK_ATTN_IMPLEMENTATION)
        return FALLBACK_ATTN_IMPLEMENTATION
    return ATTN_IMPLEMENTATION


@dataclass(frozen=True)
class AttentionCounts:
    """Layer and head counts of a config (decoder self-attention layers of an encoder-decoder)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int  # the largest where layers differ (d_heads)
    d_model: int | None
    # head_dim per layer where the config sets it per layer and the layers differ (Gemma-4's global layers with
    # global_head_dim), else None
    d_heads: tuple[int, ...] | None = None


def config_value(config: Any, keys: Sequence[str]) -> Any:
    """The first of `keys` set (not None) in a config dict or object, else None.

    A config whose layers differ in one of them (transformers' per-layer configs, e.g. Gemma-4's global layers
    with their own head_dim) refuses the global read; that is a clear error here, since headscope holds one
    value per model."""
    for k in keys:
        try:
            v = config.get(k) if isinstance(config, Mapping) else getattr(config, k, None)
        except AmbiguousPerLayerAttribute:
            raise HeadscopeError(
                f"config of model type {getattr(config, 'model_type', '?')!r} sets {k} per layer and its layers "
                f"differ (per_layer_config); headscope needs one {k} for every attention layer") from None
        if v is not None:
            return v
    return None


def config_refusal(config: Any) -> str | None:
    """Why transformers refuses `config` when a checkpoint holding it is loaded, or None when it accepts it.

    The check `from_pretrained` runs: the config class is built from the config's dict, which runs its
    validators (transformers 5.2x: e.g. "The hidden size (32) is not a multiple of the number of attention heads
    (3)"). Setting attributes on a config object runs none of them, so a changed config must pass this before
    it is written as a plain one."""
    try:
        type(config).from_dict(config.to_dict())
    except (ConfigValidationError, ValueError, TypeError) as e:
        return " ".join(str(e).split())
    return None


def layer_values(config: Any, key: str) -> list[Any] | None:
    """The per-layer values of `key` where the config sets it per layer (transformers' per_layer_config: Gemma-4),
    else None. A config object holds one config per layer; a config.json dict holds `per_layer_config` as sparse
    overrides ({"1": {"head_dim": 512}}) or, in the released format, `global_head_dim` for its full-attention
    layers (layer_types)."""
    if isinstance(config, Mapping):
        base, n = config.get(key), config_value(config, LAYER_KEYS)
        overrides, types = config.get("per_layer_config"), config.get("layer_types")
        if isinstance(overrides, Mapping) and overrides and n is not None:
            return [dict(overrides.get(str(i)) or {}).get(key, base) for i in range(int(n))]
        if key == "head_dim" and config.get("global_head_dim") and types and base is not None:
            return [config["global_head_dim"] if t == "full_attention" else base for t in types]
        return None
    try:
        layers = getattr(config, "per_layer_config", None)
    except AmbiguousPerLayerAttribute:
        return None
    return [getattr(layer, key, None) for layer in layers] if layers else None


def _d_heads(config: Any) -> tuple[int, ...] | None:
    """head_dim per layer where the layers differ, else None."""
    values = layer_values(config, "head_dim")
    if not values or None in values or len(set(values)) == 1:
        return None
    return tuple(int(v) for v in values)


def config_refused(name: Any, error: Exception) -> HeadscopeError:
    """The one-line error for a saved config that transformers' validation refuses (e.g. a checkpoint an older
    headscope prune wrote as plain with a head count the family's config rejects)."""
    # the version, for the message: only this error path needs it
    import transformers

    detail = " ".join(str(error).split())[:300]
    return HeadscopeError(f"transformers {transformers.__version__} refuses the config of {str(name)!r}: {detail}. "
                          f"If headscope prune wrote it (older headscope), prune again: the checkpoint then gets "
                          f"headscope's own model_type, which loads")


def language_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's part of a config dict: multimodal wrappers (Gemma 3, LLaVA...) keep it in
    `text_config`; other configs are returned as they are (a copy)."""
    d = dict(config)
    if config_value(d, LAYER_KEYS + DECODER_LAYER_KEYS) is None and isinstance(d.get("text_config"), Mapping):
        return {**d["text_config"], "_name": d.get("_name") or d.get("_name_or_path")}
    return d


def _keys_found(config: Any) -> str:
    d = config if isinstance(config, Mapping) else config.to_dict()
    return ", ".join(sorted(k for k in d if not k.startswith("_"))[:30]) or "nothing"


def attention_counts(config: Any) -> AttentionCounts:
    """Layers, query heads, KV heads, d_head and d_model of a config object or config.json dict, checked."""
    if config_value(config, ("is_encoder_decoder",)):
        n_layers = config_value(config, DECODER_LAYER_KEYS) or config_value(config, LAYER_KEYS)
    else:
        n_layers = config_value(config, LAYER_KEYS)
    n_heads = config_value(config, HEAD_KEYS)
    if n_layers is None or n_heads is None:
        raise HeadscopeError(
            f"config has no {'layer count' if n_layers is None else 'attention head count'}; headscope needs "
            f"a layer count ({' / '.join(LAYER_KEYS)}) and a head count ({' / '.join(HEAD_KEYS)}), plus "
            f"head_dim or a hidden size ({' / '.join(DMODEL_KEYS)}). Keys found: {_keys_found(config)}"
        )
    n_kv_heads = config_value(config, KV_KEYS)
    if n_kv_heads is None:
        # Falcon-style flag; otherwise plain MHA
        n_kv_heads = 1 if config_value(config, ("multi_query",)) else n_heads
    d_model = config_value(config, DMODEL_KEYS)
    d_heads = _d_heads(config)
    d_head = max(d_heads) if d_heads else config_value(config, DHEAD_KEYS)
    if d_head is None:
        if d_model is None:
            raise HeadscopeError(
                f"config has neither head_dim nor a hidden size ({' / '.join(DMODEL_KEYS)}), so d_head is "
                f"unknown; add head_dim (or hidden_size) to it"
            )
        if d_model % n_heads:
            raise HeadscopeError(
                f"hidden size {d_model} is not divisible by {n_heads} heads and the config has no head_dim; "
                f"add head_dim"
            )
        d_head = d_model // n_heads
    n_layers, n_heads, n_kv_heads, d_head = int(n_layers), int(n_heads), int(n_kv_heads), int(d_head)
    if min(n_layers, n_heads, n_kv_heads, d_head) < 1 or n_heads % n_kv_heads:
        raise HeadscopeError(
            f"inconsistent config: n_layers={n_layers}, n_heads={n_heads}, n_kv_heads={n_kv_heads}, "
            f"d_head={d_head} (all must be positive and n_kv_heads must divide n_heads)"
        )
    return AttentionCounts(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head,
                           d_model=None if d_model is None else int(d_model), d_heads=d_heads)
