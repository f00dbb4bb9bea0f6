"""Importance: which heads (and units beyond heads) matter for the task metric, by several criteria.

Every criterion is a HeadTable column ``importance_<method>``; convention: HIGHER = MORE IMPORTANT.
Heads already pruned by the current mask (``gates`` entry 0) get NaN in every column.

The criteria are the entries of `CRITERIA` (`criteria`), each registered beside its function with its
help and metadata: exact ablations (`ablation`), gate gradients and integrated gradients
(`gradients`), and pattern baselines (`patterns`); `score` (`scoring`) runs the chosen ones. Their
definitions are the docstrings of those functions; `CRITERIA.help_lines()` lists them.
"""

from __future__ import annotations

# Importing the criterion modules registers their criteria, in this order (the order of 'all').
from .ablation import ablation_scan, capture_layer_outputs, head_means, skip_prefix
from .criteria import (
                       CRITERIA,
                       ROWS_PER_PASS,
                       SCOPES,
                       ScoreContext,
                       base_gates,
                       check_method,
                       parse_methods,
                       unit_methods,
)
from .gradients import gradient_scores, ig_scores, loss_rows
from .l0 import GateTraining, L0Settings, l0_scores
from .patterns import pattern_scores
from .scoring import ScoreSettings, layer_norms, rank_correlations, score

# the criteria of attention sub-layers, blocks and FFN neurons
from .units import score_units, unit_scores

__all__ = [
    "CRITERIA",
    "ROWS_PER_PASS",
    "SCOPES",
    "GateTraining",
    "L0Settings",
    "ScoreContext",
    "ScoreSettings",
    "ablation_scan",
    "base_gates",
    "capture_layer_outputs",
    "check_method",
    "gradient_scores",
    "head_means",
    "ig_scores",
    "l0_scores",
    "layer_norms",
    "loss_rows",
    "parse_methods",
    "pattern_scores",
    "rank_correlations",
    "score",
    "score_units",
    "skip_prefix",
    "unit_methods",
    "unit_scores",
]
