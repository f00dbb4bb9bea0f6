"""Switching units off and removing them physically.

- `masks`: `UnitMask` and `unit_masks` (hooks that switch heads, attention sub-layers, blocks and FFN
  neurons off, exactly as removing them);
- `heads`: `prune_heads`, the physically smaller model without the chosen heads (GQA-aware);
- `units`: `prune_units`, the physically smaller model without the chosen sub-layers, blocks and FFN
  neurons (blocks really removed, FFN widths per layer).

What can be removed at all is the unit vocabulary, `headscope.redundancy.unit_kinds`.
"""

from __future__ import annotations

from .heads import check_prunable, kept_heads, n_parameters, normalize_heads, prune_heads, pruned_gates
from .masks import MASKABLE, UnitMask, check_unit_kind, unit_masks
from .units import drop_blocks, prune_units, unit_parameters

__all__ = ["MASKABLE", "UnitMask", "check_prunable", "check_unit_kind", "drop_blocks", "kept_heads",
           "n_parameters", "normalize_heads", "prune_heads", "prune_units", "pruned_gates", "unit_masks",
           "unit_parameters"]
