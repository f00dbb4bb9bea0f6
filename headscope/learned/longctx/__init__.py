"""Long-context roles: retrieval (Wu et al. 2024), streaming (DuoAttention), echo and induction at long
range (RazorAttention), measured block by block through the statistics kernel; head cards for KV tools."""

from .needle import Haystack, RetrievalCounter, build_haystack
from .patterns import PATTERNS, PatternReducer, PatternSettings
from .long_roles import CARD_SCORES, LONG_SCORES, LongThresholds, check_long_args, decide_long, head_card, long_roles, write_card

__all__ = ["CARD_SCORES", "LONG_SCORES", "PATTERNS", "Haystack", "LongThresholds", "PatternReducer", "PatternSettings",
           "RetrievalCounter", "build_haystack", "check_long_args", "decide_long", "head_card", "long_roles",
           "write_card"]
