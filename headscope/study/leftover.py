"""Where a study's time left goes: the stage whose intervals came out widest, rerun one size larger.

Each width is relative, so stages compare: for `score` the median over heads and criteria of an importance
interval's width over the criterion's spread across heads; for `prune` the width of the drop's interval
at the largest drop level over that level, or, when that answer cannot be told (its interval reaches past
the level: `headscope.redundancy.curves.claims`), how far the interval must shrink to settle it (at least
1, so more held-out passages come first); for `analyze` the median over statistics and heads of the
interval's width over the statistic's spread. Larger = less settled.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import HEADS_CSV, IMPORTANCE_CSV, PRUNE_JSON
from ..redundancy.curves.claims import drop_claim, level_of
from .records import Records

# the prune width of an answer whose drop sits at its threshold: more passages hardly help
UNSETTLED = 10.0


def _csv_widths(rows: list[dict[str, str]]) -> float | None:
    """Median over columns with _lo/_hi bounds and rows of (hi - lo) / the column's spread (max - min)."""
    if not rows:
        return None
    out = []
    for col in rows[0]:
        if f"{col}_lo" not in rows[0] or f"{col}_hi" not in rows[0]:
            continue
        try:
            v = np.array([float(r[col]) for r in rows if r[col] not in ("", None)])
            lo = np.array([float(r[f"{col}_lo"]) for r in rows if r[col] not in ("", None)])
            hi = np.array([float(r[f"{col}_hi"]) for r in rows if r[col] not in ("", None)])
        except ValueError:
            continue
        spread = float(np.nanmax(v) - np.nanmin(v)) if v.size else 0.0
        if spread > 0 and np.isfinite(hi - lo).any():
            out.append(float(np.nanmedian((hi - lo) / spread)))
    return float(np.median(out)) if out else None


def _prune_width(p: dict[str, Any] | None) -> float | None:
    if p is None:
        return None
    within = p.get("within") or {}
    if not within:
        return None
    level = max(within, key=lambda k: float(k.rstrip("%")))
    w = within[level].get("recovered") or within[level]
    if w.get("drop_lo") is None:
        return None
    claim = drop_claim(level_of(level), w, p.get("heldout_passages"))
    if claim.verdict == "cannot tell" and claim.point_drop is not None and claim.point_hi is not None:
        # the answer cannot be told: how far the interval's upper half must shrink to settle it (> 1), so the time
        # left goes first to more held-out passages (the next size) whenever it fits
        room = claim.level - claim.point_drop
        width = (claim.point_hi - claim.point_drop) / room if room > 1e-12 else UNSETTLED
        return max(width, 1.0)
    width = (w["drop_hi"] - w["drop_lo"]) / (float(level.rstrip("%")) / 100)
    return width if math.isfinite(width) else None


def widths(out: Path | Records) -> dict[str, float]:
    """Stage -> its intervals' relative width, for the stages whose records hold intervals (`out`: the study's folder,
    whose files are read, or its `Records`)."""
    rec = Records.of(out)
    found = {"analyze": _csv_widths(rec.rows(HEADS_CSV.name)), "score": _csv_widths(rec.rows(IMPORTANCE_CSV.name)),
             "prune": _prune_width(rec.json(PRUNE_JSON.name))}
    return {k: v for k, v in found.items() if v is not None}
