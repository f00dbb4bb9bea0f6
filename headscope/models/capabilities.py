"""What a family supports, and why not: read from its `AttentionSpec`.

Each capability is derived from the spec's layout facts where they decide it (an encoder has no generation
cache; a fused Q/K/V projection has no per-head `k_proj` to factor; an attention module without
`num_key_value_groups` cannot feed the head-aware cache's attention function), and otherwise from what the
spec declares (`AttentionSpec.refuses`, `refuses_types`, `gguf_arch`). Every verb asks `why_not` before its
work, `headscope models` prints `capability_table()`, and docs/families.md holds a copy of it. A new LLaMA-like
family therefore gets every capability its layout allows without being listed anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .specs import SPECS, AttentionSpec

__all__ = ["CAPABILITIES", "Capability", "capability_table", "supported_model_types_for", "supports", "why_not"]

# Why a derivation fails, for the layouts that rule out several capabilities at once.
ENCODER = "an encoder: there is no generation cache to compress"
LATENT = "multi-head latent attention already: its cache is one shared latent, not KV heads"
LINEAR_LAYERS = "its linear-attention layers (headless_layer_types) keep a recurrent state, not KV heads"
SINKS = "a learned sink logit per head (sink_logits) joins the softmax, which {} does not add"


@dataclass(frozen=True)
class Capability:
    """One thing a family may support: its name, what it is, the spec key a family declares a refusal under
    (None: nothing to declare), and what the layout alone rules out."""

    name: str
    what: str
    declared: str | None
    derive: Callable[[AttentionSpec], str | None]


def _no_heads(spec: AttentionSpec) -> str | None:
    if not spec.head_count_attrs:
        return "its spec names no head-count attributes of the attention module (head_count_attrs)"
    return None


def _ffn(spec: AttentionSpec) -> str | None:
    if not (spec.ffn_in and spec.ffn_out):
        return "its spec declares no FFN projections (ffn_in / ffn_out in headscope/models/specs.py)"
    return None


def _gqa(spec: AttentionSpec) -> str | None:
    if not spec.kv_heads_in_config:
        return ("its config has no num_key_value_heads, so every query head has its own K/V by construction and "
                "plain transformers could not load a checkpoint with fewer KV heads")
    return None


def _mla(spec: AttentionSpec) -> str | None:
    """MLA conversion factors each layer's separate K and V projections and keeps the rest of the attention."""
    if not spec.causal:
        return ENCODER
    if spec.head_row_projs:
        return LATENT
    if spec.qkv_proj:
        return "its Q/K/V projection is fused (qkv_proj); MLA conversion factors separate k_proj / v_proj"
    if spec.headless_layer_types:
        return LINEAR_LAYERS
    if spec.q_gate:
        return "q_proj holds an output gate per head (q_gate), which MLA's attention does not apply"
    if spec.sink_logits:
        return SINKS.format("MLA's attention")
    if spec.head_params:
        return (f"parameters laid out per head ({', '.join(p for p, _ in spec.head_params)}) that MLA's attention "
                f"does not apply")
    return None


def _kvcache(spec: AttentionSpec) -> str | None:
    """The cache's attention function splits each layer's KV heads and reads the module's num_key_value_groups."""
    if not spec.causal:
        return ENCODER
    if spec.head_row_projs:
        return LATENT
    if spec.headless_layer_types:
        return LINEAR_LAYERS
    if spec.sink_logits:
        return SINKS.format("the cache's attention function (sdpa)")
    if not any(kind == "groups" for _, kind in spec.head_count_attrs):
        return ("its attention module keeps no num_key_value_groups (head_count_attrs), which the cache's attention "
                "function reads to map query heads to KV heads")
    return None


def _gguf(spec: AttentionSpec) -> str | None:
    if spec.gguf_arch is None:
        return ("its spec maps its layers to no llama.cpp graph (gguf_arch); the GGUF writer writes plain LLaMA "
                "layers")
    return None


def _nothing(spec: AttentionSpec) -> str | None:
    """Every spec names its output projection, where patching replaces a head's output."""
    return None


CAPABILITIES: tuple[Capability, ...] = (
    Capability("heads", "prune query heads physically (prune, prune_heads)", "prune", _no_heads),
    Capability("attention", "prune whole attention sub-layers (unit attention)", None, _no_heads),
    Capability("block", "drop whole layers (unit block)", "block", lambda spec: None),
    Capability("ffn", "prune FFN neurons (unit ffn)", "ffn", _ffn),
    Capability("gqa", "GQA conversion: merge KV heads (gqa, expand_kv_heads)", "convert", _gqa),
    Capability("mla", "MLA conversion (mla)", "mla", _mla),
    Capability("kvcache", "the head-aware KV cache (kvcache)", "kvcache", _kvcache),
    Capability("gguf", "GGUF export for llama.cpp (export --to gguf)", "gguf", _gguf),
    Capability("patch", "activation and attribution patching of heads (patch)", "patch", _nothing),
    Capability("paths", "path patching into heads' Q/K/V (patch paths)", "qkv", lambda spec: None),
)
_BY_NAME = {c.name: c for c in CAPABILITIES}


def why_not(spec: AttentionSpec, capability: str, model_type: str | None = None) -> str | None:
    """Why the family (its `model_type`, where that matters) cannot serve `capability`; None when it can.

    A refusal the spec declares comes first (it names the family's own reason), then what the layout rules out.
    """
    try:
        cap = _BY_NAME[capability]
    except KeyError:
        raise ValueError(f"unknown capability {capability!r}; choose one of {', '.join(_BY_NAME)}") from None
    declared = spec.refusal(cap.declared, model_type) if cap.declared else None
    return declared or cap.derive(spec)


def supports(spec: AttentionSpec, capability: str, model_type: str | None = None) -> bool:
    """Whether the family (its `model_type`) serves `capability`."""
    return why_not(spec, capability, model_type) is None


def supported_model_types_for(capability: str) -> tuple[str, ...]:
    """Every model type whose family serves `capability`, in SPECS order."""
    return tuple(t for spec in SPECS for t in spec.model_types if supports(spec, capability, t))


def _cell(spec: AttentionSpec, capability: str) -> str:
    ok = [t for t in spec.model_types if supports(spec, capability, t)]
    if len(ok) == len(spec.model_types):
        return "yes"
    return ", ".join(f"`{t}`" for t in ok) + " only" if ok else "no"


def capability_table() -> str:
    """What every family supports, as a Markdown table generated from the specs, then each refusal and its reason
    (`headscope models` prints it; docs/families.md holds a copy)."""
    rows = ["| family | " + " | ".join(c.name for c in CAPABILITIES) + " |",
            "|---|" + "---|" * len(CAPABILITIES)]
    rows += [f"| {s.family} | " + " | ".join(_cell(s, c.name) for c in CAPABILITIES) + " |" for s in SPECS]
    rows += ["", "The columns: " + "; ".join(f"**{c.name}**: {c.what}" for c in CAPABILITIES) + ".", "",
             "Why not (a verb asked for it refuses in one line naming the family and this reason):", ""]
    for s in SPECS:
        for c in CAPABILITIES:
            reasons: dict[str, list[str]] = {}
            for t in s.model_types:
                why = why_not(s, c.name, t)
                if why:
                    reasons.setdefault(why, []).append(t)
            for why, types in reasons.items():
                who = s.family if len(types) == len(s.model_types) else f"{s.family} (`{'`, `'.join(types)}`)"
                rows.append(f"- {who}, {c.name}: {why}.")
    return "\n".join(rows) + "\n"
