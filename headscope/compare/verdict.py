"""A capability's paired change between two models, with its interval and its verdict.

Both models are measured on the same items (passages, pairs, haystacks), so the change OTHER - BASE is one statistic
of per-item sums, and its bootstrap interval resamples the items together (`uncertainty.bootstrap`, BCa): the
items' own spread cancels, and only how differently the two models treat each item remains.

The verdict follows the claims rule of `redundancy.curves.claims` (a claim is decided on its interval, not on its
point estimate), with the tolerance taken against BASE's value (`tolerance x |base|`):

- `lost`: the whole interval lies beyond the tolerance on the harmful side (lower for a score, higher for a loss);
- `gained`: the whole interval lies beyond it on the good side;
- `kept`: the whole interval lies within it;
- `cannot tell`: the interval straddles a bound. `needed` is how many items would decide it if the change stayed
  where it is and the interval's half-width fell as 1 / sqrt(items) (`claims.needed_passages`); None when the change
  sits on the bound, where more items would not decide it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..redundancy.curves.claims import needed_passages
from ..uncertainty import IntervalSettings, PassageSums, Statistic, bootstrap

VERDICTS = ("lost", "kept", "gained", "cannot tell")


@dataclass(frozen=True)
class Change:
    """One row of compare.csv: a capability's value in both models, the paired change and its verdict."""

    capability: str
    metric: str
    higher_is_better: bool
    base: float
    other: float
    delta: float
    delta_lo: float
    delta_hi: float
    relative: float
    verdict: str
    n: int
    needed: int | None

    def row(self) -> dict[str, Any]:
        """compare.csv's columns."""
        return {k: v for k, v in asdict(self).items() if k not in ("higher_is_better", "needed")}

    def sentence(self) -> str:
        """The row in words, for the terminal."""
        iv = f"[{self.delta_lo:+.4g}, {self.delta_hi:+.4g}]"
        rel = "" if not math.isfinite(self.relative) else f" ({self.relative:+.1%})"
        more = ""
        if self.verdict == "cannot tell":
            more = (f"; about {self.needed} items would decide it" if self.needed else
                    "; the change sits at the tolerance, more items will not decide it")
        return (f"{self.capability}: {self.metric} {self.base:.4g} -> {self.other:.4g}, change {self.delta:+.4g}{rel} "
                f"{iv}, n {self.n}: {self.verdict}{more}")


def decide(delta: float, lo: float, hi: float, base: float, tolerance: float, higher_is_better: bool,
           n: int) -> tuple[str, int | None]:
    """The verdict of a change and its interval, and (cannot tell) the items that would decide it."""
    if not all(math.isfinite(x) for x in (delta, lo, hi, base)):
        return "cannot tell", None
    tol = tolerance * abs(base)
    sign = -1.0 if higher_is_better else 1.0  # harm-oriented: positive = worse
    h, (h_lo, h_hi) = sign * delta, sorted((sign * lo, sign * hi))
    if h_lo > tol:
        return "lost", None
    if h_hi < -tol:
        return "gained", None
    if h_lo >= -tol and h_hi <= tol:
        return "kept", None
    if abs(h) < tol:  # to be kept, both bounds must come inside
        wants = [needed_passages(n, h, h_hi, tol), needed_passages(n, -h, -h_lo, tol)]
        got = [w for w in wants if w is not None]
        return "cannot tell", max(got) if got else None
    if h > tol:  # to be lost, the lower bound must pass the tolerance
        return "cannot tell", needed_passages(n, -h, -h_lo, -tol)
    return "cannot tell", needed_passages(n, h, h_hi, -tol)  # to be gained


def paired_change(capability: str, metric: str, higher_is_better: bool, base: dict[str, np.ndarray],
                  other: dict[str, np.ndarray], statistic: Statistic, settings: IntervalSettings,
                  tolerance: float) -> Change:
    """The change `statistic(other) - statistic(base)` over per-item sums (`{name: [items]}` for each model, the
    same names), with its bootstrap interval resampling the items of both models together."""
    sums = PassageSums({**{"base:" + k: v for k, v in base.items()}, **{"other:" + k: v for k, v in other.items()}})

    def of(prefix: str, s: Any) -> np.ndarray:
        return np.asarray(statistic({k[len(prefix):]: v for k, v in s.items() if k.startswith(prefix)}))

    iv = bootstrap(sums, lambda s: of("other:", s) - of("base:", s), settings)
    total = sums.total()
    b, o = float(of("base:", total)), float(of("other:", total))
    delta, lo, hi = float(iv.value), float(iv.lo), float(iv.hi)
    verdict, needed = decide(delta, lo, hi, b, tolerance, higher_is_better, sums.rows)
    relative = delta / abs(b) if b != 0 and math.isfinite(b) else math.nan
    return Change(capability=capability, metric=metric, higher_is_better=higher_is_better, base=b, other=o, delta=delta,
                  delta_lo=lo, delta_hi=hi, relative=relative, verdict=verdict, n=sums.rows, needed=needed)


__all__ = ["VERDICTS", "Change", "decide", "paired_change"]
