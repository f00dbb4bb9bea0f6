"""The attention geometry a HeadModel holds, checked against the model's layers when it is bound.

`HeadModel` holds one KV-head count for every layer with heads and one head_dim per layer (Gemma-4's global
layers have their own, global_head_dim: `HeadModel.d_head_at`); some configs build layers it cannot hold (KV
heads per layer, shared KV layers without K/V projections, keys reused as values). Those are refused here, when
the model is bound, naming the family and the feature (or the layer and what differs), so no verb meets them
half way.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import HeadscopeError
from .config import AmbiguousPerLayerAttribute, attention_counts, layer_values
from .layout import get_path


def module_at(block: nn.Module, path: str) -> nn.Module | None:
    """The module at a dotted path in `block`, or None where the path is missing or holds None."""
    try:
        return get_path(block, path)
    except AttributeError:
        return None


def projection_paths(spec: Any) -> list[str]:
    """The paths of a layer's Q/K/V projections for `spec` (relative to one layer block), whichever exist:
    the fused one, separate q/k/v, or an MLA family's per-head row projections (only one of which may exist)."""
    if spec.head_row_projs:
        return list(spec.head_row_projs)
    return [spec.qkv_proj] if spec.qkv_proj else [spec.q_proj, spec.k_proj, spec.v_proj]


def _problem(hm: Any, layer: int) -> str | None:
    """What in `layer`'s attention differs from the geometry `hm` holds, or None."""
    block, att = hm.layers[layer], hm.attention(layer)
    paths = projection_paths(hm.spec)
    present = [p for p in paths if module_at(block, p) is not None]
    if hm.spec.head_row_projs:  # MLA: q_proj or q_b_proj (a low-rank query), and kv_b_proj
        return None if present else f"none of {', '.join(paths)}"
    missing = [p for p in paths if p not in present]
    if missing:
        return f"no {' or '.join(missing)} (its keys or values come from elsewhere)"
    head_dim, groups = getattr(att, "head_dim", None), getattr(att, "num_key_value_groups", None)
    if isinstance(head_dim, int) and head_dim != hm.d_head_at(layer):
        return f"head_dim {head_dim}, not the config's {hm.d_head_at(layer)}"
    unchanged = hm.heads_in_layer(layer) == hm.n_heads and len(hm.kv_heads_in_layer(layer)) == hm.n_kv_heads
    if isinstance(groups, int) and groups and unchanged and groups != hm.group_size:
        return f"{hm.n_heads // groups} KV heads, not the config's {hm.n_kv_heads}"
    return None


def _config_attr(config: Any, name: str) -> Any:
    """`config.name` read without tripping transformers' per-layer checks (None where absent or ambiguous)."""
    try:
        return getattr(config, name, None)
    except AmbiguousPerLayerAttribute:
        # the per-layer configs refuse global reads of what their layers differ in
        return None


def feature_refusal(config: Any) -> str | None:
    """The attention feature of `config` that headscope refuses, in one clause naming it, or None.

    Gemma-4's: K/V shared across layers (num_kv_shared_layers: the last layers have no K/V projections and reuse
    an earlier layer's keys and values), keys as values (attention_k_eq_v: full-attention layers have no
    v_proj), and a KV-head count per layer (per_layer_config: num_global_key_value_heads) where the layers differ.
    A head_dim per layer (global_head_dim) is held (`HeadModel.d_head_at`)."""
    shared = _config_attr(config, "num_kv_shared_layers")
    if shared:
        return (f"KV shared across layers (num_kv_shared_layers={shared}: its last {shared} layers have no K/V "
                f"projections and reuse an earlier layer's keys and values)")
    if _config_attr(config, "attention_k_eq_v"):
        return "keys as values (attention_k_eq_v: its full-attention layers have no v_proj)"
    values = layer_values(config, "num_key_value_heads")
    if values and len(set(values)) > 1:
        per = ", ".join(f"{v} in layer {i}" for i, v in enumerate(values))
        return f"num_key_value_heads per layer (num_global_key_value_heads / per_layer_config: {per})"
    return None


def check_layers(hm: Any) -> None:
    """Refuse a model whose layers differ in attention geometry from the one its config declares (see the module
    docstring); a config whose per-layer attributes differ, or that shares K/V across layers or uses keys as
    values, is refused naming that feature."""
    feature = feature_refusal(hm.config)
    if feature:
        raise HeadscopeError(f"{hm.name!r} ({hm.spec.family} family) uses {feature}; headscope does not support "
                             f"this yet: it needs every attention layer to hold its own Q, K and V projections "
                             f"with one KV-head count")
    try:
        attention_counts(hm.config)
    except HeadscopeError as e:
        raise HeadscopeError(f"{hm.name!r} ({hm.spec.family} family): {e}") from None
    for layer in range(hm.n_layers):
        # Only transformers' own attention modules are checked: one a stage put in its place (MLA conversion's
        # latent attention) has a layout that stage owns.
        own = type(hm.attention(layer)).__module__.startswith("transformers.") if hm.heads_in_layer(layer) else False
        problem = _problem(hm, layer) if own else None
        if problem:
            raise HeadscopeError(
                f"{hm.name!r} ({hm.spec.family} family): layer {layer}'s attention has {problem}; headscope needs "
                f"every attention layer to hold its own Q, K and V projections with its config's head_dim and one "
                f"KV-head count")
