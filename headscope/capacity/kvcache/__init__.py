"""Head-aware KV caches: full KV for chosen heads, sink + recent window for the rest (see cache.py)."""

from .cache import (
                    ATTENTION_NAME,
                    SUPPORTED,
                    CachePlan,
                    HeadAwareCache,
                    HeadAwareLayer,
                    HeadSplitKV,
                    check_supported,
                    check_supported_config,
                    check_window,
                    head_aware_attention,
                    kvcache_attention,
                    windowed_mask,
)

__all__ = ["ATTENTION_NAME", "SUPPORTED", "HeadAwareCache", "HeadAwareLayer", "CachePlan", "HeadSplitKV",
           "check_supported", "check_supported_config", "check_window", "head_aware_attention", "kvcache_attention",
           "windowed_mask"]
