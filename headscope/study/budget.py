"""The study's time budget: durations as users write them, and the plan that fits the stages into a budget.

A plan picks, for every stage the family supports, one of its sizes (cheapest first), or leaves it out.
Estimates come from `probe.Probe` (passes timed on this machine) times each size's cost in those passes;
after each stage the ratio of the measured to the estimated time so far corrects what is left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..options import OptionError

# The plan fills this share of the budget; the rest absorbs estimates that come out short. A study ends
# within budget + TOLERANCE (the stated tolerance: the share, or TOLERANCE_S, whichever is more).
FILL = 0.85
TOLERANCE = 0.10
TOLERANCE_S = 30.0

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s|min|sec)?", re.IGNORECASE)
_UNIT_S = {"h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0, "sec": 1.0}


def parse_duration(text: str) -> float:
    """'10m' -> 600.0; also '90s', '1h', '1h30m', '2.5m'. A bare number is refused (minutes or seconds?)."""
    t = str(text).strip().lower().replace(" ", "")
    pos, total, units = 0, 0.0, 0
    seen: list[float] = []
    while pos < len(t):
        m = _PART.match(t, pos)
        if m is None or m.end() == pos or m.group(2) is None:
            raise OptionError("budget", f"{text!r} is not a duration; write e.g. 10m, 90s, 1h or 1h30m")
        unit = _UNIT_S[m.group(2)]
        # '1h1h' (two hours?) or '30m1h': each unit once, largest first
        if seen and unit >= seen[-1]:
            what = f"the unit {m.group(2)!r} twice" if unit in seen else "its units out of order"
            raise OptionError("budget", f"{text!r} gives {what}; write each unit once, largest first, e.g. 1h30m")
        seen.append(unit)
        total += float(m.group(1)) * unit
        pos, units = m.end(), units + 1
    if not units or total <= 0:
        raise OptionError("budget", f"{text!r} is not a positive duration; write e.g. 10m, 90s, 1h or 1h30m")
    return total


def fmt_duration(seconds: float) -> str:
    """612.3 -> '10:12'; 3725 -> '1:02:05'."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def tolerance_s(budget: float) -> float:
    """How far past the budget a study may end (the stated tolerance)."""
    return max(TOLERANCE * budget, TOLERANCE_S)


@dataclass
class Choice:
    """One stage's place in a plan: the chosen size's index (None = left out), its estimate, and why."""

    stage: str
    level: int | None
    estimate: float = 0.0
    reason: str = ""


@dataclass
class Plan:
    """The chosen size of every stage, in running order, and what the plan leaves out."""

    choices: list[Choice] = field(default_factory=list)

    def chosen(self) -> list[Choice]:
        return [c for c in self.choices if c.level is not None]

    def total(self) -> float:
        return sum(c.estimate for c in self.chosen())

    def get(self, stage: str) -> Choice:
        return next(c for c in self.choices if c.stage == stage)


def make_plan(names: Sequence[str], costs: Callable[[str, int], float], n_levels: Callable[[str], int],
              required: Callable[[str], bool], priority: Sequence[str], available: float) -> Plan:
    """Sizes for `names` (running order) within `available` seconds.

    Every stage starts at its cheapest size; while that is over, the optional stage last in `priority` goes
    (then required ones, last first); a dropped stage comes back at its cheapest when the later drops left
    room for it. The time left then grows sizes one step at a time, stages in `priority` order, each step
    taken only when the whole plan still fits."""
    level: dict[str, int | None] = {n: 0 for n in names}
    reasons: dict[str, str] = {}

    def total() -> float:
        return sum(costs(n, lv) for n, lv in level.items() if lv is not None)

    order = [p for p in priority if p in level]
    for drop in [n for n in reversed(order) if not required(n)] + [n for n in reversed(order) if required(n)]:
        if total() <= available:
            break
        need = costs(drop, 0)
        level[drop] = None
        reasons[drop] = (f"its cheapest size needs ~{fmt_duration(need)} and the budget left no room "
                         f"for it after the stages before it in priority")
    for back in [n for n in order if level[n] is None]:  # a later drop may have made room for an earlier one
        if total() + costs(back, 0) <= available:
            level[back] = 0
            reasons.pop(back, None)
    grown = True
    while grown:
        grown = False
        for n in order:
            lv = level[n]
            if lv is None or lv + 1 >= n_levels(n):
                continue
            extra = costs(n, lv + 1) - costs(n, lv)
            if total() + extra <= available:
                level[n] = lv + 1
                grown = True
    choices = []
    for n in names:
        lv = level[n]
        choices.append(Choice(n, lv, costs(n, lv) if lv is not None else 0.0, reasons.get(n, "")))
    return Plan(choices)
