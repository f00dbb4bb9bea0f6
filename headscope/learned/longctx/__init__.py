"""Long-context roles: retrieval (Wu et al. 2024), streaming (DuoAttention), echo and induction at long
range (RazorAttention), measured block by block through the statistics kernel. The roles themselves are
registered with the short-range ones (`headscope.learned.roles.catalogue`); head cards for KV tools
are written by `headscope.export.cards`."""

from ..roles.registry import LongThresholds
from .long_roles import LONG_SCORES, check_long_args, check_long_model, decide_long, long_roles
from .needle import Haystack, RetrievalCounter, build_haystack
from .patterns import PATTERNS, PatternReducer, PatternSettings

__all__ = ["LONG_SCORES", "PATTERNS", "Haystack", "LongThresholds", "PatternReducer", "PatternSettings",
           "RetrievalCounter", "build_haystack", "check_long_args", "check_long_model", "decide_long", "long_roles"]
