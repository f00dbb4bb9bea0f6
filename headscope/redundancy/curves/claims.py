"""The one rule for "N heads can go within a drop": decided on the upper bound of the drop's interval.

A pruning curve gives, per threshold, two readings (prune.json's `within` entry): the largest fraction whose
point estimate stays within (`fraction_removed`, `drop`, `drop_lo`, `drop_hi`) and the largest whose
interval's upper bound stays within (`confident`). `drop_claim` turns them into one `DropClaim`:

- `can go`: the point estimate's interval stays within the threshold; the claim names that fraction.
- `cannot tell`: the point estimate is within but its interval reaches past the threshold; the claim gives the
  range (from what the bound supports to what the point estimate reaches) and how many held-out passages would
  settle it (an interval's width falls as 1 / sqrt(passages)).
- `none`: even the first step's point estimate is past the threshold.
- `no interval`: a curve without per-passage sums (an older file); the point estimate, said as one.

`prune`'s printout, `study`'s answer and the report all print `DropClaim.sentence()`: no "can go" claim
whose interval reaches past its threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

VERDICTS = ("can go", "cannot tell", "none", "no interval")


@dataclass(frozen=True)
class DropClaim:
    """What a pruning curve supports at one threshold: the claimed count and its drop with the interval."""

    level: float  # the threshold, a share: 0.05 for a 5% drop
    verdict: str  # one of VERDICTS
    fraction: float  # the share of heads the claim names (the bound's, or 0)
    count: int  # heads the claim names
    drop: float | None  # the drop at that count, with its interval
    lo: float | None
    hi: float | None
    point_fraction: float  # the largest share by the point estimate
    point_count: int
    point_drop: float | None  # the drop at the point estimate's count, with its interval
    point_lo: float | None
    point_hi: float | None
    passages: int | None  # held-out passages the intervals came from
    # held-out passages that would narrow the point's interval to the threshold (cannot tell)
    needed: int | None

    def record(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def sentence(self, unit: str = "heads", of: str = "", rerun: str = "rerun") -> str:
        """The claim in words; `of` names what drops (e.g. "of perplexity after recovery"), `rerun` the command
        that would settle a 'cannot tell' (with --heldout-limit)."""
        at = f"within a {self.level:.0%} drop" + (f" {of}" if of else "")
        n = f", {self.passages} held-out passages" if self.passages else ""
        if self.verdict == "none":
            return f"no {unit[:-1] if unit.endswith('s') else unit} can go {at} (the curve's first step already " \
                   f"passes it by the point estimate{n})"
        if self.verdict == "no interval":
            d = f"drop {_pct(self.point_drop)}; " if self.point_drop is not None else ""
            return (f"{self.point_fraction:.0%} of {unit} ({self.point_count}) stay {at} by the point estimate "
                    f"({d}no interval: the curve kept no per-passage sums, so no claim on what can be removed)")
        if self.verdict == "can go":
            return (f"{self.fraction:.0%} of {unit} ({self.count}) can go {at}: drop {_pct(self.drop)}"
                    f"{_iv(self.lo, self.hi)}{n}")
        more = (f"{rerun} with --heldout-limit {self.needed}" if self.needed else
                "the drop sits at the threshold, more passages will not settle it")
        return (f"between {self.fraction:.0%} ({self.count}) and {self.point_fraction:.0%} ({self.point_count}) "
                f"of {unit} can go {at}: at {self.point_fraction:.0%} the drop is {_pct(self.point_drop)}"
                f"{_iv(self.point_lo, self.point_hi)}, its interval reaches past {self.level:.0%}; "
                f"{self.passages or 'these'} held-out passages are too few to say; {more}")


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.2%}"


def _iv(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f" [{lo:.2%}, {hi:.2%}]"


def needed_passages(passages: int | None, drop: float, hi: float, level: float) -> int | None:
    """Held-out passages at which the upper bound would come down to `level` if the drop stays where it is
    (the interval's half-width falls as 1 / sqrt(passages)); None when the drop is at the threshold."""
    if not passages or level - drop <= 1e-12 or hi <= level:
        return None
    return int(math.ceil(passages * ((hi - drop) / (level - drop)) ** 2))


def drop_claim(level: float, within: dict[str, Any], passages: int | None = None) -> DropClaim:
    """The claim at `level` from one entry of prune.json's `within` (or its `recovered` twin): "can go" only when
    the interval's upper bound stays within the threshold."""
    count, frac = int(within["n_removed"]), float(within["fraction_removed"])
    drop, lo, hi = within.get("drop"), within.get("drop_lo"), within.get("drop_hi")

    def claim(verdict: str, c: dict[str, Any] | None, needed: int | None = None) -> DropClaim:
        c = c or {}
        return DropClaim(level=level, verdict=verdict, fraction=float(c.get("fraction_removed", 0.0)),
                         count=int(c.get("n_removed", 0)), drop=c.get("drop"), lo=c.get("drop_lo"),
                         hi=c.get("drop_hi"), point_fraction=frac, point_count=count, point_drop=drop, point_lo=lo,
                         point_hi=hi, passages=passages, needed=needed)

    if count == 0:
        return claim("none", None)
    if hi is None or lo is None or drop is None:
        return claim("no interval", None)
    if hi <= level + 1e-12:
        return claim("can go", within)
    c = within.get("confident") or {}
    sure = min(int(c.get("n_removed", 0)), count) > 0 and c.get("drop_hi") is not None \
        and c["drop_hi"] <= level + 1e-12
    return claim("cannot tell", c if sure else None, needed_passages(passages, drop, hi, level))


def level_of(key: str) -> float:
    """prune.json's `within` key ("5%") as a share (0.05)."""
    return float(key.rstrip("%")) / 100.0


def summary_claims(summary: dict[str, Any], recovered: bool | None = None) -> dict[str, DropClaim]:
    """prune.json's claims, one per threshold ("5%" -> DropClaim); `recovered` None: after recovery when it
    ran."""
    out = {}
    for key, w in (summary.get("within") or {}).items():
        use = w.get("recovered") if (recovered or recovered is None) and w.get("recovered") else w
        out[key] = drop_claim(level_of(key), use, summary.get("heldout_passages"))
    return out


__all__ = ["VERDICTS", "DropClaim", "drop_claim", "level_of", "needed_passages", "summary_claims"]
