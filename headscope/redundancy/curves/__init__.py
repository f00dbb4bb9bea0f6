"""Iterative pruning curves with optional recovery, and the layer-wise redundancy profile.

- `loop`: `prune_curve`, the curve itself (score, remove the weakest units, measure, repeat);
- `units`: what goes at once (a head, one query head of every KV group, a whole KV group);
- `recovery`: the fine-tuned copy between points (through `headscope.train.Trainer`);
- `checkpoint`: the partial checkpoint an interrupted run resumes from;
- `results`: `PruneResult` (points, crossings, redundancy, summary) and `pruned_model`.
"""

from __future__ import annotations

from ...eval.wordsim import wordsim_measure
from .checkpoint import PARTIAL_JSON, PARTIAL_STATE, clear_partial
from .loop import check_args, check_target_drop, prune_curve
from .recovery import Recovery
from .results import CurveRow, PruneResult, pruned_model, relative_drop
from .head_units import UNITS, candidate_units, check_unit, default_unit

__all__ = ["PARTIAL_JSON", "PARTIAL_STATE", "UNITS", "CurveRow", "PruneResult", "Recovery", "candidate_units",
           "check_args", "check_target_drop", "check_unit", "clear_partial", "default_unit", "prune_curve", "pruned_model",
           "relative_drop", "wordsim_measure"]
