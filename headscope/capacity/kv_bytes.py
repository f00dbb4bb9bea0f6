"""KV-cache calculator: bytes per token and per sequence for MHA, GQA and MQA layouts of any HF config.

During generation a decoder keeps, for every attention layer, the key and the value vector of every
KV head for every token seen so far. Per token that is

    2 (K and V) * n_layers * n_kv_heads * d_head * bytes(dtype)

which is why fewer KV heads (GQA, MQA) shrink the cache by n_heads / n_kv_heads at the same d_head
(`headscope.capacity.kv_formula.kv_bytes`, the one formula; this module reads the shapes it needs from configs).
A sliding-window layer reads at most `window` keys, so it never holds more than `window` tokens:
`kv_cache_bytes` counts min(seq_len, window) tokens for such layers (what a static cache allocates;
transformers' DynamicCache keeps window - 1 between steps and adds the current token when it runs).

`config` may be a transformers config object, a dict shaped like config.json, a path to a config.json
or a model directory, or a dict in headscope's own names (n_layers, n_heads, n_kv_heads, d_head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import HeadscopeError, OptionError, did_you_mean
from ..models.config import attention_counts, language_config
from ..models.loading import BUILTINS, builtin_config_dict
from .kv_formula import DTYPE_BITS, cached_tokens, dtype_bits, kv_bytes, normalize_dtype

__all__ = [
    "CLASSIC_CONFIGS",
    "DTYPE_BITS",
    "AttentionShape",
    "attention_shape",
    "classic_rows",
    "dtype_bits",
    "human_bytes",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "layouts",
    "load_config",
    "normalize_dtype",
]

@dataclass(frozen=True)
class AttentionShape:
    """What the KV cache of a model depends on, read from its config."""

    name: str
    model_type: str
    # layers that keep a self-attention cache (decoder layers of an encoder-decoder)
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int | None
    # per cached layer: None = full attention, else at most this many tokens
    windows: tuple[int | None, ...]
    note: str = ""
    # Multi-head latent attention (DeepSeek): numbers cached per token and layer (kv_lora_rank + qk_rope_head_dim)
    # instead of 2 x n_kv_heads x d_head, and what caching every head's K and V would take (n_heads x
    # (qk_head_dim + v_head_dim)); None for MHA / GQA / MQA.
    latent: int | None = None
    expanded: int | None = None
    # head_dim per cached layer where the layers differ (Gemma-4's global layers: global_head_dim), else None;
    # d_head is then the largest
    d_heads: tuple[int, ...] | None = None

    @property
    def layout(self) -> str:
        """'MHA', 'GQA', 'MQA' or 'MLA'."""
        if self.latent is not None:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def n_sliding_layers(self) -> int:
        """How many layers use a sliding window."""
        return sum(w is not None for w in self.windows)


# ---------------------------------------------------------------------------------------------------
# The classic configs, written like config.json so they go through the same reader as any model.
# For an encoder-decoder (Transformer base) only the 6 DECODER layers are counted: the encoder reads
# the whole source at once and keeps no cache; each decoder layer caches its self-attention K/V per
# generated token. The decoder's cross-attention K/V (computed once from the encoder output) cost the
# same again per SOURCE token; they do not grow with generation and are not included.
# ---------------------------------------------------------------------------------------------------
CLASSIC_CONFIGS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, "Attention Is All You Need", Table 3 row "base": N=6, d_model=512, h=8, d_k=d_v=64.
    "transformer-base": {
        "_name": "Transformer base (2017)", "model_type": "transformer", "is_encoder_decoder": True,
        "encoder_layers": 6, "decoder_layers": 6, "num_attention_heads": 8, "hidden_size": 512, "head_dim": 64,
        "_note": "encoder-decoder: 6 decoder layers counted; cross-attention adds the same per source token",
    },
    # Devlin et al. 2018, BERT paper section 3: BERT-BASE L=12, H=768, A=12 (bert-base-uncased config.json).
    "bert-base": {
        "_name": "BERT-base", "model_type": "bert", "num_hidden_layers": 12, "num_attention_heads": 12,
        "hidden_size": 768,
        "_note": "encoder: keeps no cache in use; figure = caching K/V of every layer",
    },
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: GPT-3 175B n_layers=96,
    # d_model=12288, n_heads=96, d_head=128.
    "gpt3-175b": {
        "_name": "GPT-3 175B", "model_type": "gpt2", "n_layer": 96, "n_head": 96, "n_embd": 12288,
    },
    # Touvron et al. 2023, "Llama 2"; meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads (MHA).
    "llama2-7b": {
        "_name": "LLaMA-2-7B", "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "hidden_size": 4096,
    },
    # Touvron et al. 2023, "Llama 2" (GQA for 34B/70B); meta-llama/Llama-2-70b-hf config.json: 80 layers,
    # hidden 8192, 64 heads, 8 KV heads.
    "llama2-70b": {
        "_name": "LLaMA-2-70B", "model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "hidden_size": 8192,
    },
    # Jiang et al. 2023, "Mistral 7B", Table 1: dim 4096, n_layers 32, head_dim 128, n_heads 32, n_kv_heads 8,
    # window_size 4096 (mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096; v0.2+ dropped the window).
    "mistral-7b": {
        "_name": "Mistral-7B (v0.1)", "model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 128, "sliding_window": 4096,
    },
    # HuggingFaceTB/SmolLM2-135M model card / config.json: 30 layers, hidden 576, 9 heads, 3 KV heads, head_dim 64.
    "smollm2-135m": {
        "_name": "SmolLM2-135M", "model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "hidden_size": 576, "head_dim": 64,
    },
    # google/gemma-3-270m config.json (Gemma 3 technical report, 5 local : 1 global layers): 18 layers, hidden 640,
    # 4 heads, 1 KV head (MQA), head_dim 256, sliding_window 512, every 6th layer global.
    "gemma3-270m": {
        "_name": "Gemma-3-270M", "model_type": "gemma3_text", "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "hidden_size": 640, "head_dim": 256, "sliding_window": 512,
        "sliding_window_pattern": 6,
    },
}

def _as_dict(config: Any) -> dict[str, Any]:
    """A plain dict from a config object, dict, or path to config.json / a model directory."""
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, Path)):
        return load_config(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise HeadscopeError(
        f"cannot read a config from a {type(config).__name__}; give a transformers config, a dict like "
        f"config.json, a path to config.json or a model directory, or a built-in name"
    )


# Layer types that keep no per-token K/V (a fixed-size recurrent state instead: Qwen3.5's Gated DeltaNet).
NO_KV_LAYER_TYPES = ("linear_attention",)


def _windows(d: Mapping[str, Any], n_layers: int) -> tuple[int | None, ...]:
    """Per layer that keeps a K/V cache: None for full attention, else the sliding window (or attention chunk)
    in tokens. Linear-attention layers (NO_KV_LAYER_TYPES) keep none and are left out."""
    window = d.get("sliding_window")
    layer_types = d.get("layer_types")
    if layer_types:
        if len(layer_types) != n_layers:
            raise HeadscopeError(f"config has {len(layer_types)} layer_types for {n_layers} layers")
        out: list[int | None] = []
        for t in layer_types:
            if t in NO_KV_LAYER_TYPES:
                continue
            if t == "full_attention":
                out.append(None)
            elif t == "sliding_attention":
                out.append(window)
            elif t == "chunked_attention":
                out.append(d.get("attention_chunk_size"))
            else:
                raise HeadscopeError(
                    f"layer type {t!r} is not modelled by the KV calculator (it handles full_attention, "
                    f"sliding_attention and chunked_attention layers, and linear_attention layers keep no K/V)"
                )
        return tuple(out)
    if window is None or d.get("use_sliding_window") is False:  # Qwen2 ships a window it does not use
        return (None,) * n_layers
    if d.get("use_sliding_window") and d.get("max_window_layers") is not None:  # Qwen2: top layers slide
        return tuple(window if i >= d["max_window_layers"] else None for i in range(n_layers))
    model_type = str(d.get("model_type", ""))
    if model_type.startswith("gemma3") or "sliding_window_pattern" in d:  # every pattern-th layer is global
        pattern = int(d.get("sliding_window_pattern") or 6)
        return tuple(window if (i + 1) % pattern else None for i in range(n_layers))
    if model_type.startswith("gemma2"):  # alternating local / global
        return tuple(window if (i + 1) % 2 else None for i in range(n_layers))
    return (window,) * n_layers  # Mistral: every layer slides


def attention_shape(config: Any, name: str | None = None) -> AttentionShape:
    """Read layers, heads, KV heads, d_head and sliding windows from any supported config."""
    if isinstance(config, AttentionShape):
        return config
    d = language_config(_as_dict(config))
    model_type = str(d.get("model_type") or "unknown")
    if d.get("kv_lora_rank") is not None:
        return _mla_shape(d, model_type, name)
    counts = attention_counts(d)
    note = str(d.get("_note", ""))
    if d.get("is_encoder_decoder"):
        note = note or "encoder-decoder: decoder self-attention layers counted"
    if model_type == "bert" and not note:
        note = "encoder: keeps no cache in use; figure = caching K/V of every layer"
    label = name or d.get("_name") or d.get("_name_or_path") or model_type
    windows = _windows(d, counts.n_layers)
    d_heads = counts.d_heads
    if d_heads is not None and len(windows) < counts.n_layers:  # keep the cached layers' widths
        types = d.get("layer_types") or []
        d_heads = tuple(w for w, t in zip(d_heads, types, strict=True) if t not in NO_KV_LAYER_TYPES)
    shared = int(d.get("num_kv_shared_layers") or 0)
    # Gemma-4: the last layers reuse an earlier layer's K/V and cache none
    if 0 < shared < len(windows):
        windows = windows[:-shared]
        d_heads = d_heads[:-shared] if d_heads is not None else None
        note = note or (f"the last {shared} of {counts.n_layers} layers reuse an earlier layer's keys and values "
                        f"(num_kv_shared_layers): no cache of their own (not counted)")
    if len(windows) < counts.n_layers and not note:
        note = (f"{counts.n_layers - len(windows)} of {counts.n_layers} layers are linear attention: a fixed-size "
                f"recurrent state each, no K/V cache (not counted)")
    return AttentionShape(
        name=str(label), model_type=model_type, n_layers=len(windows), n_heads=counts.n_heads,
        n_kv_heads=counts.n_kv_heads, d_head=counts.d_head, d_model=counts.d_model, windows=windows, note=note,
        d_heads=d_heads,
    )


def _mla_shape(d: Mapping[str, Any], model_type: str, name: str | None) -> AttentionShape:
    """The cache of a multi-head latent attention config: per token and layer, the normed latent (kv_lora_rank)
    and the rotary key shared by all heads (qk_rope_head_dim), what transformers' cache holds for DeepSeek-V3."""
    missing = [k for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim") if d.get(k) is None]
    if missing:
        raise HeadscopeError(f"model type {model_type!r} has kv_lora_rank (multi-head latent attention) but no "
                             f"{', '.join(missing)}; the latent cache needs kv_lora_rank and qk_rope_head_dim")
    counts = attention_counts({**d, "head_dim": d["v_head_dim"]})
    latent = int(d["kv_lora_rank"]) + int(d["qk_rope_head_dim"])
    expanded = counts.n_heads * (int(d["qk_nope_head_dim"]) + int(d["qk_rope_head_dim"]) + int(d["v_head_dim"]))
    note = (f"multi-head latent attention: caches kv_lora_rank + qk_rope_head_dim = {latent} numbers per token and "
            f"layer (the latent and the rotary key all heads share), not K and V per head; the MHA row is what "
            f"caching every head's K and V would take ({expanded} numbers)")
    return AttentionShape(
        name=str(name or d.get("_name") or d.get("_name_or_path") or model_type), model_type=model_type,
        n_layers=counts.n_layers, n_heads=counts.n_heads, n_kv_heads=1, d_head=counts.d_head, d_model=counts.d_model,
        windows=(None,) * counts.n_layers, note=note, latent=latent, expanded=expanded)


def kv_bytes_per_token(config: Any, dtype: Any = "bf16") -> int:
    """Cache bytes one more token costs: 2 * n_layers * n_kv_heads * d_head * bytes(dtype).

    Sliding-window layers are counted too: this is the cost per token until their windows fill
    (use `kv_cache_bytes` for a given length).
    """
    s = attention_shape(config)
    # multi-head latent attention: one latent (and rotary key) per layer and token
    if s.latent is not None:
        return s.n_layers * s.latent * dtype_bits(dtype) // 8
    if s.d_heads is not None:  # head_dim per layer
        return sum(kv_bytes(s.n_kv_heads, d, dtype_bits(dtype)) for d in s.d_heads)
    return kv_bytes(s.n_layers * s.n_kv_heads, s.d_head, dtype_bits(dtype))


def kv_cache_bytes(config: Any, seq_len: int, batch: int = 1, dtype: Any = "bf16") -> int:
    """Cache bytes for `batch` sequences of `seq_len` tokens; a sliding layer holds min(seq_len, window) tokens."""
    if int(seq_len) != seq_len or int(batch) != batch or seq_len < 0 or batch < 1:
        raise HeadscopeError(f"seq_len must be >= 0 and batch >= 1 (integers); got seq_len={seq_len}, batch={batch}")
    s = attention_shape(config)
    tokens = cached_tokens(s.windows, seq_len)  # token slots over layers
    if s.latent is not None:
        return tokens * batch * s.latent * dtype_bits(dtype) // 8
    if s.d_heads is not None:  # head_dim per layer: each layer's tokens at its own width
        return sum(kv_bytes(cached_tokens((w,), seq_len) * s.n_kv_heads, d, dtype_bits(dtype), batch)
                   for w, d in zip(s.windows, s.d_heads, strict=True))
    return kv_bytes(tokens * s.n_kv_heads, s.d_head, dtype_bits(dtype), batch)


def layouts(
    config: Any,
    seq_len: int | None = None,
    batch: int = 1,
    dtype: Any = "bf16",
    kv_heads: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Rows comparing MHA (n_kv = n_heads), the model's own layout and MQA (n_kv = 1) at the same d_head.

    Each row: name, layout, is_model, n_layers, n_heads, n_kv_heads, group_size, d_head, dtype,
    bytes_per_token, vs_mha (fraction of the MHA figure), and with `seq_len`: seq_len, batch,
    bytes_per_sequence, cache_bytes (whole batch). `kv_heads` adds more KV-head counts to compare.
    """
    s = attention_shape(config)
    dt = normalize_dtype(dtype)
    if s.latent is not None:
        return _mla_layouts(s, seq_len, batch, dt, kv_heads)
    counts = sorted({s.n_heads, s.n_kv_heads, 1, *(kv_heads or ())}, reverse=True)
    bad = [g for g in counts if g < 1 or s.n_heads % g]
    if bad:
        divisors = [g for g in range(1, s.n_heads + 1) if s.n_heads % g == 0]
        raise HeadscopeError(f"KV-head counts {bad} do not divide n_heads={s.n_heads}; choose from {divisors}")
    mha = kv_bytes_per_token(replace(s, n_kv_heads=s.n_heads), dt)
    rows = []
    for g in counts:
        v = replace(s, n_kv_heads=g)
        row: dict[str, Any] = {
            "name": s.name, "layout": v.layout, "is_model": g == s.n_kv_heads, "n_layers": s.n_layers,
            "n_heads": s.n_heads, "n_kv_heads": g, "group_size": s.n_heads // g,
            "d_head": list(s.d_heads) if s.d_heads else s.d_head, "n_sliding_layers": s.n_sliding_layers, "dtype": dt,
            "bytes_per_token": kv_bytes_per_token(v, dt),
        }
        row["vs_mha"] = row["bytes_per_token"] / mha
        if seq_len is not None:
            row.update(seq_len=seq_len, batch=batch, bytes_per_sequence=kv_cache_bytes(v, seq_len, 1, dt),
                       cache_bytes=kv_cache_bytes(v, seq_len, batch, dt))
        rows.append(row)
    return rows


def _mla_layouts(s: AttentionShape, seq_len: int | None, batch: int, dt: str,
                 kv_heads: Sequence[int] | None) -> list[dict[str, Any]]:
    """An MLA model's own row and the MHA row of its expanded per-head K and V (same fields as `layouts`)."""
    if kv_heads:
        raise OptionError("kv_heads", f"{list(kv_heads)} (KV-head counts to compare) does not apply: {s.name} uses "
                                      f"multi-head latent attention, which caches one latent per token")
    rows = []
    assert s.latent is not None and s.expanded is not None, "called for MLA shapes only"
    latent, expanded = s.latent, s.expanded
    for layout, numbers in (("MLA", latent), ("MHA", expanded)):
        n_kv = 1 if layout == "MLA" else s.n_heads
        per_token = s.n_layers * int(numbers) * dtype_bits(dt) // 8
        row: dict[str, Any] = {
            "name": s.name, "layout": layout, "is_model": layout == "MLA", "n_layers": s.n_layers,
            "n_heads": s.n_heads, "n_kv_heads": n_kv, "group_size": s.n_heads // n_kv, "d_head": s.d_head,
            "n_sliding_layers": 0, "dtype": dt, "bytes_per_token": per_token,
            "vs_mha": int(numbers) / int(expanded)}
        if seq_len is not None:
            row.update(seq_len=seq_len, batch=batch, bytes_per_sequence=per_token * seq_len,
                       cache_bytes=per_token * seq_len * batch)
        rows.append(row)
    return rows


def classic_rows(seq_len: int | None = None, batch: int = 1, dtype: Any = "bf16") -> list[dict[str, Any]]:
    """One row per classic config (its own layout), with the same fields as `layouts`."""
    rows = []
    for key, cfg in CLASSIC_CONFIGS.items():
        row = next(r for r in layouts(cfg, seq_len, batch, dtype) if r["is_model"])
        rows.append({"key": key, **row, "note": cfg.get("_note", "")})
    return rows


def human_bytes(n: float) -> str:
    """Binary units: 1 KiB = 1024 B, 1 MiB = 1024 KiB, ... ('512 KiB', '1.50 GiB')."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.0f} {unit}" if float(n).is_integer() else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _builtin_config(name: str) -> dict[str, Any]:
    """The config of a built-in model without loading weights (a GGUF built-in: its float copy's config.json)."""
    name_text = BUILTINS[name].description.split(" (")[0]
    return {**builtin_config_dict(name), "_name": name_text}


def _classic_key(name: str) -> str | None:
    norm = name.lower().replace("_", "-").replace(" ", "-")
    for key, cfg in CLASSIC_CONFIGS.items():
        if norm in (key, key.replace("-", ""), cfg["_name"].lower().replace(" ", "-")):
            return key
    return None


def load_config(name_or_path: str | Path) -> dict[str, Any]:
    """A config dict from a built-in model name, a classic config name, a config.json, or a model directory."""
    text = str(name_or_path)
    if text in BUILTINS:
        return _builtin_config(text)
    key = _classic_key(text)
    if key is not None:
        return dict(CLASSIC_CONFIGS[key])
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise HeadscopeError(
                f"model directory {text!r} has no config.json; give its config.json or another directory"
            )
        path = path / "config.json"
    if path.is_file():
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HeadscopeError(
                f"{text!r} is not a JSON config ({e}); give a config.json or a model directory"
            ) from None
        if not isinstance(d, dict):
            raise HeadscopeError(f"{text!r} holds JSON but not an object; a config.json is a JSON object")
        d.setdefault("_name", path.parent.name if path.name == "config.json" else path.stem)
        return d
    choices = list(BUILTINS) + list(CLASSIC_CONFIGS)
    raise HeadscopeError(
        f"no such model or config {text!r}{did_you_mean(text, choices)}: give a config.json, a model directory, "
        f"a built-in model ({', '.join(BUILTINS)}) or a classic config ({', '.join(CLASSIC_CONFIGS)})"
    )
