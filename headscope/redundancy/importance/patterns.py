"""Pattern criteria: cheap baselines read from the foundation statistics (one statistics pass)."""

from __future__ import annotations

import numpy as np
import torch

from ...data import Tokens
from ...hooks import head_gates
from ...learned.analyze import run_stats
from ...models.adapter import HeadModel
from ...stats import COUNT, statistic_of
from ...uncertainty import PassageSums, Statistic, Sums
from .criteria import CRITERIA, ScoreContext, base_gates


def _negated(name: str) -> Statistic:
    mean = statistic_of(name)

    def stat(s: Sums) -> np.ndarray:
        return -mean(s)

    return stat


def pattern_contributions(hm: HeadModel, prep: Tokens, *, gates: torch.Tensor | None = None,
                          batch_size: int = 16) -> dict[str, tuple[PassageSums, Statistic]]:
    """Per-passage sums of attention entropy and output norm under the current mask, with each criterion's
    statistic: negated mean entropy, mean output norm."""
    base = base_gates(hm, gates)
    with head_gates(hm, base):
        stats = run_stats(hm, prep.ids, batch_size)
    sums = stats.passage_sums()
    assert sums is not None, "run_stats tracks per-passage sums"
    return {"entropy": (sums.select(["entropy", f"entropy{COUNT}"]), _negated("entropy")),
            "output_norm": (sums.select(["output_norm", f"output_norm{COUNT}"]), statistic_of("output_norm"))}


def pattern_scores(hm: HeadModel, prep: Tokens, *, gates: torch.Tensor | None = None,
                   batch_size: int = 16) -> dict[str, np.ndarray]:
    """Negated mean attention entropy and mean output norm of every head, under the current mask."""
    return {k: np.asarray(stat(sums.total()), float) for k, (sums, stat) in
            pattern_contributions(hm, prep, gates=gates, batch_size=batch_size).items()}


def _patterns(ctx: ScoreContext) -> dict[str, tuple[PassageSums, Statistic]]:
    return ctx.shared("analyze", lambda: pattern_contributions(ctx.hm, ctx.prep, gates=ctx.gates,
                                                               batch_size=ctx.batch_size))


@CRITERIA.register("entropy", help="negated attention entropy, nats (focused heads rank high)",
                   needs_gradient=False, cost="one analyze pass (a forward per batch)", shares="analyze")
def entropy(ctx: ScoreContext) -> np.ndarray:
    """NEGATED mean attention entropy (nats): focused heads (low entropy) rank high."""
    return ctx.contribute("entropy", *_patterns(ctx)["entropy"])


@CRITERIA.register("output_norm", help="norm of the head's contribution to the residual stream",
                   needs_gradient=False, cost="one analyze pass (a forward per batch)", shares="analyze")
def output_norm(ctx: ScoreContext) -> np.ndarray:
    """Mean L2 norm of the head's contribution to the residual stream."""
    return ctx.contribute("output_norm", *_patterns(ctx)["output_norm"])


__all__ = ["entropy", "output_norm", "pattern_contributions", "pattern_scores"]
