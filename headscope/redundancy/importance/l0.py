"""L0 head pruning (Voita et al. 2019): hard-concrete gates trained by distillation, the weights frozen.

Every head (or every KV group, `per="group"`) gets a hard-concrete gate (`hard_concrete`). The gates are
trained with the shared `Trainer` to keep the gated model's outputs close to the unpruned model's, the
metric's recovery loss (for causal LMs `eval.lm.distillation_loss`, KL(teacher || student) from the model
with every gate open; for encoders the distillation to its hidden states; for classifiers cross-entropy on
the labels), plus either

- a penalty: `penalty * mean P(open)` (the expected L0 norm as a share of the units), or
- a target share of closed units, enforced with Lagrange multipliers as Sheared-LLaMA does:
  `l1 (s - t) + l2 (s - t)^2` on the expected closed share s = 1 - mean P(open), l1 and l2 by ascent, the
  target t raised linearly from 0 over the first half of the steps.

Only the gates train: the model's parameters are frozen (requires_grad off) while it runs, so no weight
gradient is even computed, and they are restored afterwards bit for bit. Each step draws a batch of
passages and one gate sample per passage from the trainer's seeded generator, so with a checkpoint file
(written every `save_every` steps and at the end) an interrupted run resumes to the very same gates.

The importance is each unit's probability of staying open, P(z != 0). It is learned jointly over all
passages, so no per-passage bootstrap interval applies to it; `score` writes its bounds as NaN and says so
in its metadata.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ...data import Batch, Tokens, batches, pad_id
from ...errors import HeadscopeError, OptionError
from ...eval.evaluate import Reference, ids_fingerprint
from ...eval.lm import distillation_loss
from ...eval.metrics import METRICS
from ...hooks import head_gates
from ...models.adapter import HeadModel
from ...train import Trainer, frozen_weights
from .criteria import CRITERIA, ScoreContext, targets
from .hard_concrete import BETA, HardConcreteGates, Stretch

# share of the steps over which a target share is raised from 0 to its value
RAMP = 0.5
LEARNED_NOTE = ("learned jointly over all passages by gate training: no per-passage bootstrap interval applies; "
                "bounds are NaN")


@dataclass(frozen=True)
class L0Settings:
    """How the gates train: steps, Adam rate on log_alpha, temperature, and a penalty or a target share."""

    steps: int = 200
    lr: float = 0.1
    temperature: float = BETA
    penalty: float | None = None
    # share of units closed, in [0, 1); default when neither is given: 0.5
    target: float | None = None
    save_every: int = 20

    def __post_init__(self) -> None:
        check_l0(self.steps, self.lr, self.temperature, self.penalty, self.target)

    @property
    def mode(self) -> str:
        return "penalty" if self.penalty is not None else "target"

    @property
    def target_share(self) -> float:
        return 0.5 if self.target is None else float(self.target)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "mode": self.mode, "target": None if self.penalty is not None else self.target_share}


def check_l0(steps: int, lr: float, temperature: float, penalty: float | None, target: float | None) -> None:
    """Refuse gate-training settings no run could use (before anything loads)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise OptionError("l0_steps", f"(steps of L0 gate training) must be at least 1, got {steps!r}; e.g. 200")
    if not (lr > 0 and math.isfinite(lr)):
        raise OptionError("l0_lr", f"(the L0 gates' learning rate) must be a positive number, got {lr}; e.g. 0.1")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise OptionError("l0_temperature", f"(the hard-concrete temperature) must be a positive number, got "
                                            f"{temperature}; e.g. 0.667")
    if penalty is not None and not (penalty > 0 and math.isfinite(penalty)):
        raise OptionError("l0_penalty", f"(the L0 penalty) must be a positive number, got {penalty}; e.g. 0.05")
    if target is not None and not (math.isfinite(target) and 0.0 <= target < 1.0):
        raise OptionError("l0_target", f"(the L0 gates' target share of heads closed) must be in [0, 1), got "
                                       f"{target}; e.g. 0.3")
    if penalty is not None and target is not None:
        raise HeadscopeError("give an L0 penalty or a target fraction, not both")


def expand_gates(hm: HeadModel, z: torch.Tensor, per: str) -> torch.Tensor:
    """Unit gates `[..., L, units]` as head gates `[..., L, H]` (a KV group's gate on each of its query heads)."""
    return z.repeat_interleave(hm.group_size, dim=-1) if per == "group" else z


def gate_shape(hm: HeadModel, per: str) -> tuple[int, int]:
    if per not in ("head", "group"):
        raise HeadscopeError(f"L0 gates are per 'head' or per 'group' (KV group), not {per!r}")
    return (hm.n_layers, hm.n_kv_heads if per == "group" else hm.n_heads)


class GateTraining:
    """The gates, their trainer, and the loss of one step (module docstring)."""

    def __init__(self, hm: HeadModel, prep: Tokens, metric: str, reference: Reference | None, settings: L0Settings,
                 *, base: torch.Tensor | None = None, per: str = "head", batch_size: int = 16, seed: int = 0,
                 progress: bool = False) -> None:
        self.hm, self.prep, self.metric, self.settings, self.per = hm, prep, metric, settings, per
        self.entry = METRICS.get(metric)
        self.reference = reference if self.entry.needs_reference else None
        self.base = base.to(hm.device) if base is not None else torch.ones(hm.n_layers, hm.n_heads, device=hm.device)
        self.batch_size, self.progress = min(batch_size, len(prep.ids)), progress
        self.gates = HardConcreteGates(gate_shape(hm, per), Stretch(settings.temperature)).to(hm.device)
        self.trainer = Trainer(self.gates, [self.gates.log_alpha, self.gates.lambdas], lr=settings.lr,
                               steps=settings.steps, seed=seed, desc="L0 gates")
        self.history: list[dict[str, float]] = []

    def _batch(self, generator: torch.Generator) -> tuple[Batch, list[int], torch.Tensor]:
        idx = torch.randperm(len(self.prep.ids), generator=generator)[: self.batch_size].tolist()
        b = next(batches([self.prep.ids[i] for i in idx], len(idx), pad_id=pad_id(self.hm), sort=False))
        u = torch.rand((len(idx), *self.gates.log_alpha.shape), generator=generator)
        return b, idx, u

    def _loss(self, batch: tuple[Batch, list[int], torch.Tensor]) -> torch.Tensor:
        b, idx, u = batch
        hm = self.hm
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        z = self.base * expand_gates(hm, self.gates.sample(u.to(hm.device)), self.per)  # [rows, L, H]
        # the teacher is the model with every gate open (the current mask)
        if self.metric == "lm_loss":
            with torch.no_grad(), head_gates(hm, self.base):
                teacher = hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            with head_gates(hm, z):
                student = hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            task = distillation_loss(student, teacher, mask)
        else:
            # these losses read the unpruned model through the reference (or the labels) in `targets`
            t = targets(self.prep, self.metric, self.reference, idx, ids.shape[1], hm.device)
            with head_gates(hm, z):
                task = self.entry.recovery_loss(hm, hm, ids, mask, t)
        s = self.settings
        penalty = s.penalty * self.gates.open_probability().mean() if s.penalty is not None else \
            self.gates.lagrangian(self.target_now())
        self.history.append({"task": float(task.detach()), "closed_share": float(self.gates.closed_share().detach())})
        return task + penalty

    def target_now(self) -> float:
        """The target share at the current step: raised linearly from 0 over the first `RAMP` of the steps (as
        Sheared-LLaMA), so units close one at a time, the cheapest first, instead of all at once."""
        ramp = max(1.0, RAMP * self.settings.steps)
        return self.settings.target_share * min(1.0, (self.trainer.step + 1) / ramp)

    def run(self, checkpoint: Path | None = None, on_step: Callable[[int, float], None] | None = None) -> None:
        """Train to `settings.steps` (resuming from `checkpoint` when it holds this run's state)."""
        s = self.settings
        if checkpoint is not None and checkpoint.exists():
            self._resume(checkpoint)
        with frozen_weights(self.hm):
            while self.trainer.step < s.steps:
                n = min(s.save_every, s.steps - self.trainer.step)
                self.trainer.run(n, self._batch, self._loss, progress=self.progress, on_step=on_step)
                if checkpoint is not None:
                    self.trainer.save(checkpoint, l0_settings=self._fingerprint(), history=self.history)

    def _fingerprint(self) -> dict[str, Any]:
        return {**self.settings.record(), "per": self.per, "metric": self.metric, "batch_size": self.batch_size,
                "passages": len(self.prep.ids), "ids": ids_fingerprint(self.prep.ids),
                "base": self.base.cpu().tolist()}

    def _resume(self, checkpoint: Path) -> None:
        try:
            blob = Trainer.read(checkpoint)  # weights_only: a crafted file is refused, never run
        except HeadscopeError as e:
            raise HeadscopeError(f"{e}; pass force=True (or delete the file) to start over",
                                 fields=("force",)) from None
        if blob.get("l0_settings") != self._fingerprint():
            raise HeadscopeError(f"{checkpoint} holds L0 gates trained with other settings or data; rerun with the "
                                 f"same settings to resume, or pass force=True (or delete the file) to start over",
                                 fields=("force",))
        self.trainer.load_state_dict(blob)
        self.history = list(blob.get("history", []))

    def open_probability(self) -> np.ndarray:
        """P(open) per head `[L, H]` (a group's on each of its query heads); 0 where the base mask is 0."""
        with torch.no_grad():
            p = expand_gates(self.hm, self.gates.open_probability(), self.per) * self.base
        return p.detach().cpu().double().numpy()

    def record(self) -> dict[str, Any]:
        """What the run did: its settings, steps, final closed share, the task loss at start and end."""
        p = self.gates.open_probability().detach()
        return {**self.settings.record(), "per": self.per, "steps_done": self.trainer.step,
                "closed_share_expected": float(1.0 - p.mean()), "closed_units": int((p < 0.5).sum()),
                "units": int(p.numel()), "task_loss_first": self.history[0]["task"] if self.history else None,
                "task_loss_last": self.history[-1]["task"] if self.history else None,
                "train_seconds": self.trainer.train_s, "interval": LEARNED_NOTE}


@CRITERIA.register("l0", help="learned: P(open) of hard-concrete head gates trained by distillation with an L0 "
                   "penalty or target share (Voita et al. 2019); settings via --l0-*",
                   needs_gradient=True, learned=True, interval=LEARNED_NOTE, per_batch=True,
                   cost="--l0-steps x (teacher forward + gated forward + backward to the gates)")
def l0_scores(ctx: ScoreContext) -> np.ndarray:
    """Each head's probability of staying open after gate training (higher = more important)."""
    opts = ctx.options.get("l0", {})
    run = GateTraining(ctx.hm, ctx.prep, ctx.metric, ctx.reference, opts.get("settings") or L0Settings(),
                       base=ctx.gates, per="head", batch_size=ctx.batch_size, seed=ctx.seed, progress=ctx.progress)
    run.run(opts.get("checkpoint"))
    ctx.options.setdefault("l0_record", run.record())
    return run.open_probability()


__all__ = ["LEARNED_NOTE", "GateTraining", "L0Settings", "check_l0", "expand_gates", "gate_shape",
           "l0_scores"]
