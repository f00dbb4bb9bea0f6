"""The one KV-cache bytes formula, and cache dtypes: standard library only, so any module can use it.

A decoder caches, per attention layer and token, the key and the value vector of every KV head:

    bytes = 2 (K and V) * slots * batch * d_head * bits(dtype) / 8

where `slots` counts (KV head, token) pairs held over all layers. A sliding-window layer holds at most
`window` tokens (`cached_tokens`). `headscope.capacity.kv_bytes` (configs), the reference attention module
(`MultiHeadAttention.kv_bytes_per_token`) and the head-aware cache (`CachePlan`) all count through `kv_bytes`.
Kept apart from `kv_bytes`, which reads model configs through transformers, so the reference module stays light.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import HeadscopeError, did_you_mean

__all__ = ["DTYPE_BITS", "cached_tokens", "dtype_bits", "kv_bytes", "normalize_dtype"]

# Bits per cached number. fp8 and int8 are 1 byte, int4 half a byte; the per-group scales and zero
# points that real quantised caches (quanto, HQQ) also store are not counted.
DTYPE_BITS: dict[str, int] = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}

_DTYPE_ALIASES = {
    "float32": "fp32", "f32": "fp32", "float": "fp32",
    "float16": "fp16", "f16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "i8": "int8", "q8": "int8", "uint8": "int8",
    "i4": "int4", "q4": "int4", "uint4": "int4",
}


def normalize_dtype(dtype: Any) -> str:
    """The canonical name (fp32, fp16, bf16, fp8, int8, int4) of a dtype name or torch.dtype."""
    name = str(dtype).lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BITS:
        raise HeadscopeError(
            f"unknown cache dtype {str(dtype)!r}{did_you_mean(name, list(DTYPE_BITS) + list(_DTYPE_ALIASES))}; "
            f"choose one of {', '.join(DTYPE_BITS)} (aliases like float32, float16, bfloat16 also work)"
        )
    return name


def dtype_bits(dtype: Any) -> int:
    """Bits per cached number for a dtype name (fp32 32, fp16/bf16 16, fp8/int8 8, int4 4)."""
    return DTYPE_BITS[normalize_dtype(dtype)]


def kv_bytes(slots: int, d_head: int, bits: int, batch: int = 1) -> int:
    """K and V bytes of `slots` cached (KV head, token) pairs per sequence: 2 * slots * batch * d_head * bits / 8."""
    return 2 * slots * batch * d_head * bits // 8


def cached_tokens(windows: Sequence[int | None], seq_len: int) -> int:
    """Tokens held over all layers after `seq_len` tokens: a layer with a window (not None) holds at most that many."""
    return sum(seq_len if w is None else min(seq_len, w) for w in windows)
