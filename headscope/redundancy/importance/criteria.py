"""The registry of importance criteria, and what every criterion is given.

A criterion is one function `fn(ctx: ScoreContext) -> scores` (HIGHER = MORE IMPORTANT), registered
beside its definition with one line of help, the unit scope(s) it scores and its metadata. Scopes:
`head` (the default: `[L, H]`), `attention` and `block` (`[L]`: whole attention sub-layers, whole blocks)
and `ffn` (`{layer: [neurons]}`); one name may mean a criterion in several scopes (`ablation` of a head,
of an attention sub-layer, of a block). Metadata:

- `needs_gradient`: whether it backpropagates to the head gates (costlier, and needs a
  differentiable metric loss);
- `cost`: what it costs, in words;
- `shares` (optional): the name of a computation it shares with other criteria (e.g. the gate
  gradients behind `gradient`, `gradient_raw` and `taylor`); criteria sharing one are computed by one
  pass (`ScoreContext.shared`) and timed together.

Adding a criterion is one decorated function and its test; `score`, `prune`, the CLI's `--method` and
its help read the registry:

    @CRITERIA.register("my_score", help="what it measures", needs_gradient=False, cost="one forward pass")
    def my_score(ctx: ScoreContext) -> np.ndarray:
        ...

    @CRITERIA.register("my_layer_score", scope=("attention", "block"), help=..., needs_gradient=False, cost=...)
    def my_layer_score(ctx: ScoreContext) -> np.ndarray:  # [L]; ctx.unit says which scope is asked
        ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...data import Tokens
from ...errors import HeadscopeError, did_you_mean
from ...eval.evaluate import MetricResult, Reference, batch_targets
from ...eval.metrics import METRICS
from ...models.adapter import HeadModel
from ...registry import Entry, ScopedRegistry
from ...uncertainty import PassageSums, Statistic
from ..unit_kinds import unit_kind

CriterionFn = Callable[["ScoreContext"], Any]
# The unit scopes criteria are registered for, and what a criterion returns in each.
SCOPES = {"head": "[n_layers, n_heads]", "attention": "[n_layers]", "block": "[n_layers]",
          "ffn": "{layer: [neurons]}"}
CRITERIA: ScopedRegistry[CriterionFn] = ScopedRegistry("importance criterion", default_scope="head",
                                                       scopes=tuple(SCOPES))

# Rows per forward pass when several ablations (or IG steps) share one pass via per-row gates.
ROWS_PER_PASS = 64


@dataclass
class ScoreContext:
    """Everything a criterion reads: the model, the prepared data, the metric and the current mask."""

    hm: HeadModel
    prep: Tokens
    metric: str
    # [L, H] current mask on the model's device; 0 = already pruned
    gates: torch.Tensor
    reference: Reference | None = None  # the unpruned model's outputs, for metrics that need one
    batch_size: int = 16
    ig_steps: int = 16
    seed: int = 0
    progress: bool = False
    base_result: MetricResult | None = None  # the metric under `gates`, when a criterion measured it
    # the scope being scored (a criterion registered for several reads it here)
    unit: str = "head"
    # criterion-specific settings and what such a criterion reports back (e.g. "l0": gate training settings)
    options: dict[str, Any] = field(default_factory=dict)
    # criterion -> (its per-passage contributions, the statistic that turns their sums into its scores)
    contributions: dict[str, tuple[PassageSums, Statistic]] = field(default_factory=dict, repr=False)
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)

    def contribute(self, method: str, sums: PassageSums, statistic: Statistic) -> np.ndarray:
        """Record a criterion's per-passage contributions and return its scores, `statistic(total sums)`: the
        scores, their intervals and their stability all come from the same sums."""
        self.contributions[method] = (sums, statistic)
        return np.asarray(statistic(sums.total()), dtype=float)

    @property
    def sign(self) -> float:
        """+1 when a larger metric is worse (a loss), -1 when larger is better: importance = sign * change."""
        return -1.0 if METRICS.get(self.metric).higher_is_better else 1.0

    def shared(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()` once per scoring run, for every criterion that shares the computation `key`."""
        if key not in self._shared:
            self._shared[key] = compute()
        return self._shared[key]


def shares(entry: Entry[CriterionFn]) -> str:
    """The computation a criterion shares with others (its own name when none)."""
    return entry.meta.get("shares", entry.name)


def targets(prep: Tokens, metric: str, reference: Reference | None, index: list[int], width: int,
            device: torch.device) -> dict[str, torch.Tensor | None]:
    """`batch_targets`, with the reference only for metrics that compare against one."""
    ref = reference if METRICS.get(metric).needs_reference else None
    return batch_targets(prep, ref, index, width, device)


def parse_methods(methods: str | Sequence[str]) -> list[str]:
    """Criterion names from a comma-separated string or a list; 'all' means every registered criterion."""
    items = methods.split(",") if isinstance(methods, str) else list(methods)
    out: list[str] = []
    for m in (s.strip() for s in items):
        if not m:
            continue
        if m == "all":
            out.extend(x for x in CRITERIA if x not in out)
            continue
        if m not in CRITERIA:
            raise HeadscopeError(f"unknown importance method {m!r}{did_you_mean(m, CRITERIA)}; "
                                 f"choose from {', '.join(CRITERIA)} (or 'all')")
        if m not in out:
            out.append(m)
    if not out:
        raise HeadscopeError(f"no importance method given; choose from {', '.join(CRITERIA)} (or 'all')")
    return out


def base_gates(hm: HeadModel, gates: torch.Tensor | None) -> torch.Tensor:
    """The current mask as a float `[L, H]` tensor on the model's device (ones when None)."""
    want = (hm.n_layers, hm.n_heads)
    # float64 models (finite-difference tests) get float64 gates; everything else float32.
    dtype = torch.float64 if next(hm.model.parameters()).dtype == torch.float64 else torch.float32
    if gates is None:
        return torch.ones(want, device=hm.device, dtype=dtype)
    g = torch.as_tensor(gates).to(dtype)
    if tuple(g.shape) != want:
        raise HeadscopeError(f"gates have shape {tuple(g.shape)}; expected [n_layers, n_heads] = {list(want)}")
    return g.detach().to(hm.device)


def unit_methods(unit: str) -> tuple[str, ...]:
    """The criteria that can order `unit` (a name in `unit_kinds.UNITS`; mix: every attention + FFN pair)."""
    scopes = unit_kind(unit).criteria
    if len(scopes) == 1:
        return CRITERIA.names(scopes[0])
    first, second = (CRITERIA.names(s) for s in scopes)
    return tuple(f"{a}+{b}" for a in first for b in second)


def check_method(unit: str, method: str) -> None:
    """Refuse a criterion that cannot order `unit`, naming those that can."""
    allowed = unit_methods(unit)
    if method not in allowed:
        raise HeadscopeError(f"unit {unit!r} is scored by {', '.join(allowed)}, not {method!r}"
                             f"{did_you_mean(method, allowed)}")


__all__ = [
    "CRITERIA",
    "SCOPES",
    "check_method",
    "unit_methods",
    "ROWS_PER_PASS",
    "ScoreContext",
    "base_gates",
    "parse_methods",
    "shares",
    "targets",
]
