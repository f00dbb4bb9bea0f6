"""Model loading, per-family adapters, weight layout, and checkpoints."""

from .adapter import HeadModel
from .checkpoint import load_checkpoint, save_model
from .config import AttentionCounts, attention_counts
from .layout import QKVWeights
from .loading import BUILTINS, builtin_status, load_gguf, load_model, wrap
from .specs import SPECS, AttentionSpec, families_table, spec_for, supported_model_types

__all__ = [
    "BUILTINS",
    "SPECS",
    "AttentionCounts",
    "AttentionSpec",
    "HeadModel",
    "QKVWeights",
    "attention_counts",
    "builtin_status",
    "families_table",
    "load_checkpoint",
    "load_gguf",
    "load_model",
    "save_model",
    "spec_for",
    "supported_model_types",
    "wrap",
]
