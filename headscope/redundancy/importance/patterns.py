"""Pattern criteria: cheap baselines read from the foundation statistics (one `analyze` pass)."""

from __future__ import annotations

import numpy as np
import torch

from ...learned.analyze import analyze
from ...data import Tokens
from ...hooks import head_gates
from ...models.adapter import HeadModel
from .criteria import CRITERIA, ScoreContext, base_gates


def pattern_scores(hm: HeadModel, prep: Tokens, *, gates: torch.Tensor | None = None,
                   batch_size: int = 16) -> dict[str, np.ndarray]:
    """Negated mean attention entropy and mean output norm of every head, under the current mask."""
    base = base_gates(hm, gates)
    with head_gates(hm, base):
        t = analyze(hm, prep.ids, max_length=prep.max_length, batch_size=batch_size)
    return {"entropy": -np.asarray(t["entropy"], float), "output_norm": np.asarray(t["output_norm"], float)}


def _patterns(ctx: ScoreContext) -> dict[str, np.ndarray]:
    return ctx.shared("analyze", lambda: pattern_scores(ctx.hm, ctx.prep, gates=ctx.gates, batch_size=ctx.batch_size))


@CRITERIA.register("entropy", help="negated attention entropy, nats (focused heads rank high)",
                   needs_gradient=False, cost="one analyze pass (a forward per batch)", shares="analyze")
def entropy(ctx: ScoreContext) -> np.ndarray:
    """NEGATED mean attention entropy (nats): focused heads (low entropy) rank high."""
    return _patterns(ctx)["entropy"]


@CRITERIA.register("output_norm", help="norm of the head's contribution to the residual stream",
                   needs_gradient=False, cost="one analyze pass (a forward per batch)", shares="analyze")
def output_norm(ctx: ScoreContext) -> np.ndarray:
    """Mean L2 norm of the head's contribution to the residual stream."""
    return _patterns(ctx)["output_norm"]


__all__ = ["entropy", "output_norm", "pattern_scores"]
