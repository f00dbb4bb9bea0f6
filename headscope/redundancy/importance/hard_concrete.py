"""Hard-concrete gates (Louizos, Welling and Kingma 2018), the stochastic head gates L0 pruning trains.

A gate with location `log_alpha` and temperature `beta` is drawn as

    u ~ U(0, 1)
    s = sigmoid((log u - log(1 - u) + log_alpha) / beta)      (a binary-concrete sample in (0, 1))
    z = min(1, max(0, s * (zeta - gamma) + gamma))             (stretched to (gamma, zeta), then clipped)

With gamma < 0 < 1 < zeta the clip puts real probability mass on exactly 0 and exactly 1, and the gate
stays differentiable in `log_alpha` elsewhere. The probability that a gate is open (non-zero) has a
closed form, which is the expected L0 norm the penalty uses and the importance `score --method l0` writes:

    P(z != 0) = P(s > -gamma / (zeta - gamma)) = sigmoid(log_alpha - beta * log(-gamma / zeta))

At test time the gate is deterministic: z = min(1, max(0, sigmoid(log_alpha) * (zeta - gamma) + gamma)).
Defaults are Louizos et al.'s (and Voita et al.'s): beta = 2/3, gamma = -0.1, zeta = 1.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import HeadscopeError

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1
# P(open) ~ 0.99 at the start: training begins from the unpruned model
INIT_LOG_ALPHA = 3.0
LAMBDA_SCALE = 0.1
# keeps u away from 0 and 1, where log u / log(1 - u) are infinite
_EPS = 1e-6


@dataclass(frozen=True)
class Stretch:
    """The temperature and stretch interval (gamma, zeta) of a family of hard-concrete gates."""

    beta: float = BETA
    gamma: float = GAMMA
    zeta: float = ZETA

    def __post_init__(self) -> None:
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise HeadscopeError(f"hard-concrete temperature must be a positive number, got {self.beta}; e.g. 0.667")
        if not (self.gamma < 0.0 and self.zeta > 1.0):
            raise HeadscopeError(f"stretch interval needs gamma < 0 < 1 < zeta, got ({self.gamma}, {self.zeta})")

    def open_probability(self, log_alpha: torch.Tensor) -> torch.Tensor:
        """P(z != 0) in closed form (module docstring)."""
        return torch.sigmoid(log_alpha - self.beta * math.log(-self.gamma / self.zeta))

    def sample(self, log_alpha: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Gates from uniform noise `u` (same shape as `log_alpha`, or broadcasting to it)."""
        u = u.clamp(_EPS, 1.0 - _EPS)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / self.beta)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def deterministic(self, log_alpha: torch.Tensor) -> torch.Tensor:
        """The test-time gate (module docstring)."""
        return (torch.sigmoid(log_alpha) * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)


class HardConcreteGates(nn.Module):
    """One hard-concrete gate per unit (`shape`, e.g. `[n_layers, n_heads]` or `[n_layers, n_kv_heads]`),
    and the two Lagrange multipliers a target sparsity is enforced with (Sheared-LLaMA: loss + l1 (s - t) +
    l2 (s - t)^2, the multipliers trained by gradient ascent, i.e. their gradients are reversed)."""

    def __init__(self, shape: tuple[int, ...], stretch: Stretch, init: float = INIT_LOG_ALPHA) -> None:
        super().__init__()
        self.stretch = stretch
        self.log_alpha = nn.Parameter(torch.full(shape, float(init)))
        self.lambdas = nn.Parameter(torch.zeros(2))
        self.lambdas.register_hook(lambda g: -g)  # ascent: the multipliers push the constraint, not the loss

    def open_probability(self) -> torch.Tensor:
        """P(gate != 0) of every unit."""
        return self.stretch.open_probability(self.log_alpha)

    def sample(self, u: torch.Tensor) -> torch.Tensor:
        """Gates `[rows, *shape]` from uniform noise of that shape."""
        return self.stretch.sample(self.log_alpha, u)

    def deterministic(self) -> torch.Tensor:
        """The test-time gates `shape`."""
        return self.stretch.deterministic(self.log_alpha)

    def closed_share(self) -> torch.Tensor:
        """Expected share of closed units: 1 - mean P(open) (the quantity a target fraction constrains)."""
        return 1.0 - self.open_probability().mean()

    def lagrangian(self, target: float) -> torch.Tensor:
        """l1 (s - t) + l2 (s - t)^2 at the expected closed share s. The multipliers are `LAMBDA_SCALE` times
        their parameters: Adam moves a parameter by about its rate per step whatever the gradient's size, so
        the scale makes the multipliers move ten times slower than the gates (they overshoot less)."""
        gap = self.closed_share() - target
        lam = LAMBDA_SCALE * self.lambdas
        return lam[0] * gap + lam[1] * gap * gap


__all__ = ["BETA", "GAMMA", "INIT_LOG_ALPHA", "ZETA", "HardConcreteGates", "Stretch"]
