"""Model loading and per-family adapters."""

from .adapter import HeadModel
from .loading import BUILTINS, builtin_status, load_model, wrap
from .specs import SPECS, AttentionSpec, spec_for, supported_model_types

__all__ = [
    "BUILTINS",
    "SPECS",
    "AttentionSpec",
    "HeadModel",
    "builtin_status",
    "load_model",
    "spec_for",
    "supported_model_types",
    "wrap",
]
