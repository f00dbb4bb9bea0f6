"""Pruning curves for every unit kind, with optional recovery, and the layer-wise redundancy profile.

- `loop`: `prune_curve`, the one engine (ask the plan for the next units, switch them off, measure, repeat);
- `plans`: what each point removes (`HeadPlan`: re-scored heads, slices or KV groups; `LayerPlan`:
  attention sub-layers, blocks, FFN neurons or a mix, scored once);
- `points`: `CurvePoint`, the one point record;
- `claims`: `DropClaim`, the one rule for "N heads can go within a drop" (on the interval's upper bound);
- `results`: `CurveResult` (points, crossings, redundancy, the rows of its files, the pruned model);
- `recovery`: the fine-tuned copy at each point (through `headscope.train.Trainer`);
- `checkpoint`: the partial checkpoint an interrupted head curve resumes from;
- `latency`: FLOPs and interleaved forward timings of the physically pruned model.

The figure of a curve is `headscope.plots.pruning_curve`.
"""

from __future__ import annotations

from ...eval.wordsim import wordsim_measure
from ..curve_checks import check_args, check_target_drop
from .checkpoint import L0_STATE, PARTIAL_JSON, PARTIAL_STATE, clear_partial
from .claims import DropClaim, drop_claim, summary_claims
from .latency import matmul_flops, time_forward, time_speedup
from .loop import prune_curve, unit_curve
from .plans import HeadPlan, L0Plan, LayerPlan, candidate_units, check_fraction
from .points import CurvePoint, relative_drop
from .recovery import Recovery
from .results import CurveResult, PruneResult, UnitCurve, pruned_model

__all__ = ["L0_STATE", "PARTIAL_JSON", "PARTIAL_STATE", "CurvePoint", "CurveResult", "DropClaim", "HeadPlan",
           "L0Plan", "LayerPlan", "PruneResult", "Recovery", "UnitCurve", "candidate_units", "check_args",
           "check_fraction", "check_target_drop", "clear_partial", "drop_claim", "matmul_flops", "prune_curve",
           "pruned_model", "relative_drop", "summary_claims", "time_forward", "time_speedup", "unit_curve",
           "wordsim_measure"]
