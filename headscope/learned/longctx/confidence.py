"""Long-range role scores with their intervals and their rankings' split-half stability.

Every long-range score is a ratio of sums over independent units: a haystack for the retrieval score (hits
per answered haystack), a window of long text for streaming, echo and induction at long range (masses summed
over the window's counted queries, over the number of such queries). The passes keep each unit's sums
(`headscope.uncertainty.PassageSums`, one row per haystack or window), so

- `<score>_lo`, `<score>_hi`: the bootstrap interval resampling haystacks (windows) with replacement
  (`headscope.uncertainty`, BCa by default), beside its baseline's; NaN with fewer than 2 units;
- `stability[<score>]`: split-half stability of the ranking of the heads by the score (random halves of the
  units; NaN with fewer than 4: a ranking from so few haystacks cannot be judged, and is called unstable);
- `--until-stable R`: a pass reads its units one at a time, from 8 on, and stops when its ranking's
  Spearman-Brown reaches R (or its cap, --haystacks / --long-windows, is spent).

Queries inside one window are not independent (they share the text), so the window, not the query, is the unit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import OptionError
from ...stats import COUNT
from ...uncertainty import MIN_STABLE_PASSAGES, IntervalSettings, PassageSums, Stability, ratio, split_half
from ..roles.confidence import role_intervals
from ..roles.registry import LongThresholds

#: Below this split-half Spearman-Brown a card's ranking is called unstable (a warning, and `stable: false`).
STABLE_AT = 0.8


def needle_sums(per_haystack: np.ndarray, chance: list[float], answered: list[int]) -> PassageSums | None:
    """One row per answered haystack: its retrieval hits `[L, H]`, its chance level, and a count of one."""
    if not answered:
        return None
    hits = np.asarray(per_haystack, float)[answered]
    ones = np.ones_like(hits)
    base = np.asarray([chance[i] for i in answered], float)[:, None, None] * ones
    return PassageSums({"retrieval_score": hits, "retrieval_score" + COUNT: ones,
                        "retrieval_score_uniform": base, "retrieval_score_uniform" + COUNT: ones})


def window_sums(rows: list[dict[str, np.ndarray]], names: tuple[str, ...], n_heads: int) -> PassageSums | None:
    """One row per window: each pattern's summed mass `[L, H]`, its uniform baseline and its counted queries."""
    if not rows:
        return None
    out: dict[str, np.ndarray] = {}
    for name in names:
        count = np.stack([np.repeat(r[name + COUNT][:, None], n_heads, 1) for r in rows])
        out[name] = np.stack([r[name] for r in rows])
        out[name + COUNT] = count
        out[name + "_uniform"] = np.stack([np.repeat(r[name + "_uniform"][:, None], n_heads, 1) for r in rows])
        out[name + "_uniform" + COUNT] = count
    return PassageSums(out)


def stability_of(sums: PassageSums | None, score: str, seed: int) -> Stability | None:
    """Split-half stability of the heads' ranking by `score` over the units of `sums` (None: no such score)."""
    if sums is None or score not in sums:
        return None
    return split_half(sums, ratio(score, score + COUNT), seed=seed)


def is_stable(stab: dict[str, Any] | None, target: float = STABLE_AT) -> bool:
    """Whether a recorded stability reaches `target` (a NaN one, from fewer than 4 units, does not)."""
    if not stab:
        return False
    sb = stab.get("spearman_brown")
    return isinstance(sb, float) and math.isfinite(sb) and sb >= target


def reached(sums: PassageSums | None, scores: tuple[str, ...], target: float, seed: int) -> bool:
    """--until-stable's test after a unit: at least 8 units and every score's ranking at `target`."""
    if sums is None or sums.rows < MIN_STABLE_PASSAGES:
        return False
    stabs = [stability_of(sums, s, seed) for s in scores if s in sums]
    return bool(stabs) and all(st is not None and is_stable(st.record(), target) for st in stabs)


def check_until_stable_long(until_stable: float | None, haystacks: int, windows: int) -> None:
    """--until-stable with --long: every long pass that runs needs a cap of at least 8 units to split."""
    if until_stable is None:
        return
    for name, cap in (("haystacks", haystacks), ("long_windows", windows)):
        if 0 < cap < MIN_STABLE_PASSAGES:
            raise OptionError(name, f"is {cap}, but until_stable with long reads up to {name} units until the "
                                    f"ranking is stable and needs at least {MIN_STABLE_PASSAGES} to split in halves "
                                    f"(give {name}={MIN_STABLE_PASSAGES} or more, or 0 to skip that pass)",
                              also=(name, "until_stable", "long"))


def long_intervals(groups: list[PassageSums | None], th: LongThresholds, settings: IntervalSettings,
                   seed: int) -> dict[str, Any]:
    """roles.json's `long_context` uncertainty: bounds of every score and baseline, held shares, units, stability."""
    have = [g for g in groups if g is not None]
    iv = role_intervals(have, th, settings, scope="long")
    stability: dict[str, Any] = {}
    for g in have:
        for name in g.names():
            if not name.endswith(COUNT) and not name.endswith("_uniform"):
                st = stability_of(g, name, seed)
                if st is not None:
                    stability[name] = st.record()
    bounds = {n: {"lo": lo, "hi": hi} for n, (lo, hi) in iv.bounds.items()}
    return {"bounds": bounds, "held_share": iv.held_share, "rows": iv.rows, "stability": stability,
            "settings": settings.record()}


def card_record(lc: dict[str, Any], score_key: str) -> dict[str, Any]:
    """What an exported card's config says of its ranking: stability, haystacks, windows, and whether stable."""
    stab = (lc.get("uncertainty") or {}).get("stability", {}).get(score_key)
    if stab is not None:  # NaN (too few units to split) is written as null
        stab = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in stab.items()}
    needles, text = lc.get("needles") or {}, lc.get("text") or {}
    return {"score": score_key, "ranking_stability": stab, "stable": is_stable(stab), "stable_at": STABLE_AT,
            "haystacks": len(needles.get("haystacks", [])), "answered_haystacks": needles.get("succeeded", 0),
            "windows": text.get("windows", 0), "length": lc.get("length")}


def card_warning(record: dict[str, Any]) -> str | None:
    """One line when the card's ranking is not stable (None when it is)."""
    if record["stable"]:
        return None
    stab, units = record["ranking_stability"], ("haystacks" if record["score"] == "retrieval_score" else "windows")
    n = record["answered_haystacks"] if units == "haystacks" else record["windows"]
    sb = stab.get("spearman_brown") if stab else None
    how = (f"split-half Spearman-Brown {sb:.2f} < {STABLE_AT}" if isinstance(sb, float) and math.isfinite(sb)
           else "too few to split in halves (4 needed)")
    return (f"warning: the card's {record['score']} ranking is not stable ({n} {units}, {how}); raise "
            f"--{'haystacks' if units == 'haystacks' else 'long-windows'} or use --until-stable")
