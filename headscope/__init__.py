"""headscope: what attention heads learn, whether more heads help, and which heads are redundant.

The foundation (loading, gates, statistics, HeadTable) is imported eagerly; the stages that pull in
heavier dependencies are imported on first use, e.g. `headscope.score`. Each verb is a function of the same
shape, `headscope.<verb>(hm, data, **options) -> result` (analyze, roles, similar, score, tasks, prune; the
report is `headscope.report.report`, `headscope.report` being its package): it writes nothing, and its result
has `save(out)`, `lines()` and `to_pandas()` (docs/api.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from .data import read_conllu, read_texts
from .errors import HeadscopeError, OptionError
from .heads import Head, KVGroup
from .hooks import capture_head_outputs, head_gates, on_attention_weights
from .models import HeadModel, load_model, wrap
from .stats import STATISTICS, HeadStats
from .table import HeadTable, head_name, parse_head
from .version import __version__ as __version__  # re-exported: headscope.__version__

# public name -> module that defines it (imported lazily). `role_census` and `head_similarity` are
# the functions headscope.learned.roles.roles and headscope.learned.similarity.similarity, `export_model` is
# headscope.export.verbs.export (headscope.export is the package): a package attribute named
# like a submodule would be replaced by the module as soon as the submodule is imported.
_RENAMED = {"role_census": ("roles", "roles"), "head_similarity": ("similarity", "similarity"),
            "export_model": ("export", "export")}
_LAZY = {
    # the verbs: one library function each, returning a result (headscope.options.Result)
    "analyze": "learned.verbs", "roles": "learned.verbs", "similar": "learned.verbs",
    "score": "redundancy.verbs", "tasks": "redundancy.verbs", "prune": "redundancy.verbs",
    # Q1: what heads learn
    "role_census": "learned.roles", "head_similarity": "learned.similarity", "Similarity": "learned.similarity",
    # Q2: are more heads better
    "MultiHeadAttention": "capacity.mha", "kv_bytes_per_token": "capacity.kv_bytes",
    "kv_cache_bytes": "capacity.kv_bytes", "kv": "capacity.verbs", "gqa": "capacity.verbs",
    "mla": "capacity.verbs",
    "run_sweep": "capacity.sweep", "convert_to_gqa": "capacity.gqa", "convert_and_evaluate": "capacity.gqa",
    "convert_to_mla": "capacity.mla", "kvcache": "capacity.verbs", "sweep": "capacity.verbs",
    "HeadAwareCache": "capacity.kvcache", "CachePlan": "capacity.kvcache", "head_aware_attention": "capacity.kvcache",
    # Q3: which heads are redundant
    "evaluate": "eval.evaluate", "rank_correlations": "redundancy.importance",
    "prune_heads": "redundancy.pruning.heads", "prune_curve": "redundancy.curves",
    # checkpoints of pruned or converted models
    "save_model": "models.checkpoint", "load_checkpoint": "models.checkpoint", "export_model": "export.verbs",
    # head cards of a roles or kvcache result (what --export-card writes)
    "export_card": "export.card_export", "record_card": "export.card_export",
    # the report, and the live view (`view` is the package itself: it is callable, see headscope/view)
    "render_report": "report", "ViewOptions": "view",
    # what heads do, causally (activation patching)
    "patch": "learned.causal.verb", "PatchOptions": "learned.options",
    # circuits: edge attribution and faithfulness at every size
    "circuit": "learned.circuits.verb", "CircuitOptions": "learned.options",
    # what compression cost: two models side by side (`compare` is the package itself, callable like `view`)
    "CompareOptions": "compare",
}


def __getattr__(name: str) -> Any:
    # the packages headscope.view and headscope.compare, callable as functions
    if name in ("view", "compare"):
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), _RENAMED.get(name, ("", name))[1])
    raise AttributeError(f"module 'headscope' has no attribute {name!r}")


__all__ = [
    "STATISTICS",
    "Head",
    "HeadModel",
    "HeadStats",
    "HeadTable",
    "HeadscopeError",
    "KVGroup",
    "OptionError",
    "capture_head_outputs",
    "head_gates",
    "head_name",
    "load_model",
    "on_attention_weights",
    "parse_head",
    "read_conllu",
    "read_texts",
    "compare",
    "view",
    "wrap",
    *_LAZY,
]
