"""Recovery: a copy of the model fine-tuned between curve points, with the removed units switched off
(head gates at 0, or a `UnitMask` for attention sub-layers, blocks and FFN neurons).

It trains through the one training loop (`headscope.train.Trainer`: AdamW at a constant rate, no
weight decay, a seeded batch generator) on the loss the metric's registry entry names
(`recovery_loss`): distillation from the unpruned model for causal LMs (`eval.lm.distillation_loss`,
the mean over positions with a real next token of KL(teacher || student)), distillation to its hidden
states for encoders (token MSE + (1 - cosine) of the pooled output), cross-entropy for classifiers.

Causal LMs are distilled rather than trained on the data's own next tokens: plain LM fine-tuning also
adapts the model to the data's domain, which can push perplexity below the unpruned model's and so
measures adaptation, not recovery from pruning. Distillation can at best give back what pruning took.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch

from ...data import Batch, Tokens, batches, pad_id
from ...eval.evaluate import Reference, batch_targets
from ...eval.metrics import METRICS
from ...hooks import head_gates
from ...models.adapter import HeadModel
from ...train import Trainer
from ..pruning.masks import UnitMask, unit_masks


class Recovery:
    """The recovered copy of `hm`, its trainer, and the curve point its weights belong to."""

    def __init__(self, hm: HeadModel, prep: Tokens, metric: str, reference: Reference | None, *, lr: float,
                 batch_size: int, seed: int, steps: int, progress: bool = False) -> None:
        self.teacher = hm  # the unpruned model, never trained
        self.hm = HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
        self.prep, self.metric = prep, metric
        self.entry = METRICS.get(metric)
        self.reference = reference if self.entry.needs_reference else None
        self.batch_size = batch_size
        self.progress = progress
        # `steps` is per curve point; at a constant rate the schedule's length changes nothing.
        self.trainer = Trainer(self.hm.model, [p for p in self.hm.model.parameters() if p.requires_grad],
                               lr=lr, steps=steps, weight_decay=0.0, seed=seed, desc="recovery")
        self.n_removed = 0  # the curve point the current weights belong to

    def _batch(self, generator: torch.Generator) -> tuple[Batch, list[int]]:
        """`batch_size` passages drawn without replacement (one draw of the trainer's generator)."""
        idx = torch.randperm(len(self.prep.ids), generator=generator)[: self.batch_size].tolist()
        b = next(batches([self.prep.ids[i] for i in idx], len(idx), pad_id=pad_id(self.hm), sort=False))
        return b, idx

    def _loss(self, batch: tuple[Batch, list[int]]) -> torch.Tensor:
        b, idx = batch
        ids, mask = b.input_ids.to(self.hm.device), b.attention_mask.to(self.hm.device)
        targets = batch_targets(self.prep, self.reference, idx, ids.shape[1], self.hm.device)
        return self.entry.recovery_loss(self.hm, self.teacher, ids, mask, targets)

    def train(self, off: torch.Tensor | UnitMask, steps: int) -> float:
        """Run `steps` optimizer steps with `off` applied (head gates `[L, H]` or a UnitMask); returns the mean
        training loss."""
        ctx = head_gates(self.hm, off.to(self.hm.device)) if isinstance(off, torch.Tensor) else \
            unit_masks(self.hm, off)
        with ctx:
            losses = self.trainer.run(steps, self._batch, self._loss, progress=self.progress)
        return float(np.mean(losses)) if losses else math.nan

    def snapshot(self) -> dict[str, Any]:
        """A copy of the whole training state: weights, optimizer, generator, step (to step back when a
        point overshoots the target)."""
        return self.trainer.state_dict()

    def restore(self, snapshot: dict[str, Any], n_removed: int) -> None:
        """Return to a `snapshot`, whose weights belong to the curve point with `n_removed` heads removed."""
        self.trainer.load_state_dict(snapshot)
        self.n_removed = n_removed


__all__ = ["Recovery"]
