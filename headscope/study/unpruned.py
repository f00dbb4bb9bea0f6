"""When the study's "pruned" model is the original: even the pruning curve's first step passed the target drop.

The prune stage saves the last point of its curve within the target (by the upper bound of the drop's interval,
claims.py's rule). On a fragile model the first point already passes it, so the model it saves has every head: the
third answer says so in plain words, and the compare stage does not compare that model with the original it equals.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..artifacts import MODEL_DIR, PRUNE_CURVE_CSV, PRUNE_JSON
from .records import Records


@dataclass(frozen=True)
class KeptOriginal:
    """The curve's first pruned point, which already passed the target: how many heads it removed and its drop."""

    # the heads the first step removed (the least important ones)
    heads: int
    total: int  # every head of the model (all kept)
    target: float
    metric: str  # what drops, in words: perplexity, fidelity, ...
    # the first point's drop (after recovery when the curve trained it)
    drop: float
    lo: float | None  # its 95% interval, when the curve kept per-passage sums
    hi: float | None
    recovered: bool

    def cost(self) -> str:
        """The first step's cost in words, with its drop and interval: "even removing the 6 least important heads
        costs more than 5% of perplexity (...)"; "may cost" when only the interval's upper bound passes the
        target."""
        verb = "costs" if self.drop > self.target else "may cost"
        interval = f" [{self.lo:.1%}, {self.hi:.1%}]" if self.lo is not None and self.hi is not None else ""
        when = "after recovery" if self.recovered else "without recovery"
        heads = "least important head" if self.heads == 1 else f"{self.heads} least important heads"
        return (f"even removing the {heads} {verb} more than {self.target:.0%} of "
                f"{self.metric} (a drop of {self.drop:.1%}{interval} {when})")

    def sentence(self) -> str:
        """The third answer's clause on the saved model."""
        return (f"{self.cost()}: the study kept the original ({MODEL_DIR.name}/ holds all {self.total} heads) and did "
                f"not compare it with itself")

    def reason(self) -> str:
        """Why the compare stage leaves the pruned model out (after the stage's name)."""
        return f"kept the original model: {self.cost()}"


def _number(row: dict[str, str], key: str) -> float | None:
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        return None


def kept_original(rec: Records) -> KeptOriginal | None:
    """What the prune stage's curve says when the model it saved has every head (prune.json's saved_model and the
    curve's first pruned point, prune_curve.csv); None when it removed some, saved none, or measured no pruned
    point."""
    p = rec.json(PRUNE_JSON.name)
    saved = (p or {}).get("saved_model")
    if p is None or not saved or p.get("target_drop") is None:
        return None
    total = int(p.get("n_layers", 0)) * int(p.get("n_heads", 0))
    if int(saved["heads_kept"]) < total:
        return None
    first = next((r for r in rec.rows(PRUNE_CURVE_CSV.name) if (_number(r, "n_removed") or 0) > 0), None)
    if first is None:
        return None
    recovered = _number(first, "drop_recovered") is not None
    key = "drop_recovered" if recovered else "drop"
    drop = _number(first, key)
    if drop is None:
        return None
    metric = "perplexity" if p.get("baseline_perplexity") else str(p.get("metric"))
    return KeptOriginal(heads=int(float(first["n_removed"])), total=total, target=float(p["target_drop"]),
                        metric=metric, drop=drop, lo=_number(first, f"{key}_lo"), hi=_number(first, f"{key}_hi"),
                        recovered=recovered)


__all__ = ["KeptOriginal", "kept_original"]
