"""headscope: what attention heads learn, whether more heads help, and which heads are redundant."""

__version__ = "0.1.0"

from .analyze import analyze  # noqa: E402
from .data import read_conllu, read_texts  # noqa: E402
from .errors import HeadscopeError  # noqa: E402
from .hooks import capture_head_outputs, head_gates, on_attention_weights  # noqa: E402
from .models import HeadModel, load_model, wrap  # noqa: E402
from .stats import STATISTICS, HeadStats  # noqa: E402
from .table import HeadTable, head_name, parse_head  # noqa: E402

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
    "wrap",
]
