"""headscope: what attention heads learn, whether more heads help, and which heads are redundant.

The foundation (loading, gates, statistics, HeadTable) is imported eagerly; the stages that pull in
heavier dependencies are imported on first use, e.g. `headscope.score`.
"""

from __future__ import annotations

import importlib
from typing import Any

from .data import read_conllu, read_texts
from .errors import HeadscopeError
from .hooks import capture_head_outputs, head_gates, on_attention_weights
from .learned.analyze import analyze
from .models import HeadModel, load_model, wrap
from .stats import STATISTICS, HeadStats
from .table import HeadTable, head_name, parse_head
from .version import __version__ as __version__  # re-exported: headscope.__version__

# public name -> module that defines it (imported lazily). `role_census` and `head_similarity` are
# the functions headscope.learned.roles.roles and headscope.learned.similarity.similarity: a package attribute named
# like a submodule would be replaced by the module as soon as the submodule is imported.
_RENAMED = {"role_census": ("roles", "roles"), "head_similarity": ("similarity", "similarity")}
_LAZY = {
    # Q1: what heads learn
    "role_census": "learned.roles", "head_similarity": "learned.similarity", "Similarity": "learned.similarity",
    # Q2: are more heads better
    "MultiHeadAttention": "capacity.mha", "kv_bytes_per_token": "capacity.kv_bytes",
    "kv_cache_bytes": "capacity.kv_bytes",
    "run_sweep": "capacity.sweep", "convert_to_gqa": "capacity.gqa", "convert_and_evaluate": "capacity.gqa",
    "convert_to_mla": "capacity.mla",
    "HeadAwareCache": "capacity.kvcache", "HeadPlan": "capacity.kvcache", "head_aware_attention": "capacity.kvcache",
    # Q3: which heads are redundant
    "evaluate": "eval.evaluate", "score": "redundancy.importance", "rank_correlations": "redundancy.importance",
    "prune_heads": "redundancy.pruning.heads", "prune_curve": "redundancy.curves",
    # checkpoints of pruned or converted models
    "save_model": "models.checkpoint", "load_checkpoint": "models.checkpoint",
    # the report, and the live view (`view` is the package itself: it is callable, see headscope/view)
    "render_report": "report", "ViewOptions": "view",
    # what heads do, causally (activation patching)
    "patch": "learned.verbs", "PatchOptions": "learned.options",
}


def __getattr__(name: str) -> Any:
    if name == "view":  # the package headscope.view, callable as view(hm, text)
        return importlib.import_module(".view", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), _RENAMED.get(name, ("", name))[1])
    raise AttributeError(f"module 'headscope' has no attribute {name!r}")


__all__ = [
    "STATISTICS",
    "HeadModel",
    "HeadStats",
    "HeadTable",
    "HeadscopeError",
    "analyze",
    "capture_head_outputs",
    "head_gates",
    "head_name",
    "load_model",
    "on_attention_weights",
    "parse_head",
    "read_conllu",
    "read_texts",
    "view",
    "wrap",
    *_LAZY,
]
