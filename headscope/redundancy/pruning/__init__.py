"""Units beyond single heads: whole attention sub-layers, whole blocks, FFN neurons.

- `masks`: `UnitMask` and `unit_masks` (hooks that switch units off, exactly as removing them);
- `physical`: `prune_units`, the physically smaller model (blocks really removed, FFN widths per layer);
- `scores`: importance of each unit (Block Influence, exact ablation with prefix reuse, FFN Taylor and
  activation scores);
- `curve`: the metric against the share of parameters removed, with optional distillation recovery.
"""

from __future__ import annotations

from .masks import UNIT_KINDS, UnitMask, check_unit_kind, unit_masks
from .units import drop_blocks, prune_units, unit_parameters

__all__ = ["UNIT_KINDS", "UnitMask", "check_unit_kind", "drop_blocks", "prune_units", "unit_masks",
           "unit_parameters"]
