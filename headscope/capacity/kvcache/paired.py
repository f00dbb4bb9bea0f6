"""Does the chosen cache beat the random one beyond noise? A paired interval over the evaluation passages.

The score's choice and its random control at equal bytes are evaluated on the same passages, so their
perplexities are compared passage by passage: the difference exp(sum nll_chosen / n) - exp(sum nll_random / n)
(n: the predictions, the same for both) is a statistic of per-passage sums, and resampling the passages
(headscope.uncertainty, BCa) gives its interval. Below 0 = the chosen heads predict better. With the default
two passages the interval is wide by construction (the expanded bootstrap's t quantile has one degree of
freedom): raise --limit for a verdict. Needle counts get the exact (Clopper-Pearson) interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...uncertainty import IntervalSettings, PassageSums, binomial_interval, bootstrap


def perplexity_difference(chosen: dict[str, Any], control: dict[str, Any],
                          settings: IntervalSettings) -> dict[str, Any]:
    """The chosen row's perplexity minus the control's, with its paired interval over passages (rows hold
    `passage_nll` and `passage_tokens`, the same passages in the same order)."""
    nc, nr = (np.asarray(r["passage_nll"], float) for r in (chosen, control))
    tokens = np.asarray(chosen["passage_tokens"], float)
    if nc.shape != nr.shape or not np.array_equal(tokens, np.asarray(control["passage_tokens"], float)):
        raise ValueError("the chosen and the random cache were not evaluated on the same passages")
    sums = PassageSums({"chosen": nc, "random": nr, "n": tokens})

    def stat(s: Any) -> np.ndarray:
        return np.exp(s["chosen"] / s["n"]) - np.exp(s["random"] / s["n"])

    iv = bootstrap(sums, stat, settings)
    lo, hi = float(iv.lo), float(iv.hi)
    return {"difference": float(iv.value), "lo": lo, "hi": hi, "passages": int(len(nc)), **settings.record(),
            "verdict": verdict(float(iv.value), lo, hi, len(nc))}


def verdict(value: float, lo: float, hi: float, passages: int) -> str:
    """One line: whether the chosen heads beat the random ones beyond noise."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"no interval from {passages} passage(s): give --limit 2 or more"
    if hi < 0:
        return f"the chosen heads beat random heads beyond noise (perplexity {value:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    if lo > 0:
        return f"random heads beat the chosen ones beyond noise (perplexity {value:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    return (f"not distinguishable from random heads at {passages} passages (perplexity {value:+.3f} "
            f"[{lo:+.3f}, {hi:+.3f}] holds 0); raise --limit")


def needle_interval(answers: list[dict[str, Any]], level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of the share of needles answered."""
    return binomial_interval(sum(bool(a["correct"]) for a in answers), len(answers), level)


def add_paired(rows: list[dict[str, Any]], settings: IntervalSettings) -> None:
    """Each score row followed by its random control (same budget, no uptraining) gets `ppl_vs_random` and its
    interval, and `vs_random` (the record, the verdict) for the JSON; every row its needle interval."""
    for r in rows:
        r["needle_accuracy_lo"], r["needle_accuracy_hi"] = needle_interval(r["answers"], settings.level) \
            if r["needles"] else (float("nan"), float("nan"))
    for i, r in enumerate(rows):
        if r["method"] != "random":
            continue
        chosen = next((c for c in reversed(rows[:i]) if c["method"] == "score" and c["budget"] == r["budget"]
                       and not c.get("uptrain_steps")), None)
        if chosen is None:
            continue
        d = perplexity_difference(chosen, r, settings)
        chosen["vs_random"] = d
        chosen["ppl_vs_random"], chosen["ppl_vs_random_lo"], chosen["ppl_vs_random_hi"] = d["difference"], d["lo"], \
            d["hi"]


__all__ = ["add_paired", "needle_interval", "perplexity_difference", "verdict"]
