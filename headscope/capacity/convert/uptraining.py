"""Uptraining a converted model: a few AdamW steps through the one training loop (`headscope.train.Trainer`).

The `kd` loss is `headscope.eval.lm.distillation_loss` (the mean over counted positions of
KL(teacher || student), the quantity gqa.json reports as `kl_after`), the same loss pruning recovery
trains with; the `lm` loss is the mean next-token NLL from `headscope.eval.lm.nll_sums`.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ContextManager, Sequence

import torch

from ...data import Batch
from ...errors import HeadscopeError
from ...eval.lm import distillation_loss, nll_sums
from ...models.adapter import HeadModel
from ...models.dispatch import input_device
from ...train import Trainer
from .evaluate import token_batches

LOSSES = ("kd", "lm")
#: What uptraining updates: the attention projections (q/k/v/o) of every layer, or every parameter.
TRAINABLE = ("attention", "all")
# guards the first steps after conversion, when the student is far from the teacher
GRAD_CLIP = 1.0


@dataclass
class UptrainLog:
    """Loss per step of an uptraining run and the settings used."""

    losses: list[float] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def check_uptrain(steps: int, loss: str, train: str, teacher: HeadModel | None) -> None:
    """Raise a clear error on uptraining settings no run could use."""
    if steps < 0:
        raise HeadscopeError(f"uptraining steps must be 0 or more, got {steps}")
    if loss not in LOSSES:
        raise HeadscopeError(f"uptraining loss {loss!r} is not known; choose one of {', '.join(LOSSES)}")
    if loss == "kd" and teacher is None:
        raise HeadscopeError("loss='kd' distils from a teacher: pass teacher= (the original model) or use loss='lm'")
    if train not in TRAINABLE:
        raise HeadscopeError(f"train={train!r} is not known; choose one of {', '.join(TRAINABLE)}")


def uptrain_loss(
    model: torch.nn.Module, batch: Batch, loss: str, teacher: torch.nn.Module | None = None
) -> torch.Tensor:
    """The uptraining loss of `model` on one batch: `distillation_loss` to `teacher` ("kd") or mean NLL ("lm")."""
    device = input_device(model)
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    if loss == "kd":
        if teacher is None:
            raise HeadscopeError("loss 'kd' distils from a teacher: pass the unconverted model as teacher")
        t_dev = input_device(teacher)
        with torch.no_grad():
            t_logits = teacher(input_ids=ids.to(t_dev), attention_mask=mask.to(t_dev), use_cache=False).logits
        return distillation_loss(logits, t_logits.to(device), mask)
    nll, count = nll_sums(logits, ids, mask)
    return nll.sum() / count.sum().clamp_min(1)


def run_uptraining(out: HeadModel, chosen: Sequence[torch.nn.Parameter], batches: Sequence[Batch], steps: int, *,
                   loss: str, teacher: torch.nn.Module | None, lr: float, seed: int, desc: str,
                   weight_decay: float = 0.0, during: ContextManager[Any] | None = None,
                   progress: bool = False) -> list[float]:
    """`steps` AdamW steps of `out` (a private copy) on its `chosen` parameters through `train.Trainer`, every
    other parameter frozen meanwhile and restored after; `uptrain_loss` per batch, gradients clipped to
    `GRAD_CLIP`; batches visited in an order shuffled with `seed` (the trainer's generator), reshuffled when
    exhausted; `during` (e.g. the head-aware cache's training masks) is entered around the run. The losses.

    The one uptraining loop of `gqa`, `mla` and `kvcache --uptrain`."""
    # Dropout, where a model has any, draws from torch's global generator: seed it for repeatable runs.
    torch.manual_seed(seed)
    chosen_ids = {id(p) for p in chosen}
    # Frozen on the private copy only (no weight gradients computed for them), restored below.
    frozen = [p for p in out.model.parameters() if id(p) not in chosen_ids and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    order: list[int] = []

    def next_batch(generator: torch.Generator) -> Batch:
        if not order:  # a new pass over the data, in a new order
            order.extend(torch.randperm(len(batches), generator=generator).tolist())
        return batches[order.pop()]

    def loss_fn(batch: Batch) -> torch.Tensor:
        return uptrain_loss(out.model, batch, loss, teacher)

    try:
        with during if during is not None else nullcontext():
            trainer = Trainer(out.model, [p for p in chosen if p.requires_grad], lr=lr, steps=steps,
                              weight_decay=weight_decay, grad_clip=GRAD_CLIP, seed=seed, desc=desc)
            return trainer.run(steps, next_batch, loss_fn, progress=progress)
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _trainable(hm: HeadModel, train: str) -> list[torch.nn.Parameter]:
    """The parameters `train` selects: every layer's q/k/v/o projections, or all of them."""
    if train == "all":
        return list(hm.model.parameters())
    return [p for layer in range(hm.n_layers) for module in hm.projections(layer).values()
            for p in module.parameters()]


def uptrain(student: HeadModel, data: Any, steps: int, *, teacher: HeadModel | None = None, loss: str = "kd",
            lr: float = 1e-3, train: str = "attention", batch_size: int = 8, max_length: int = 64,
            limit: int | None = None, weight_decay: float = 0.0, seed: int = 0,
            progress: bool = False) -> tuple[HeadModel, UptrainLog]:
    """A copy of `student` trained for `steps` AdamW steps on `data` (input untouched).

    `loss="kd"`: `distillation_loss`, KL(teacher || student) on next-token distributions (teacher = the
    original model); `loss="lm"`: plain next-token cross-entropy. `train="attention"` updates only the
    q/k/v/o projections (what conversion changed, and about a fifth of the weight-gradient work on
    SmolLM2), `"all"` every parameter (as Ainslie et al. do, with far more data). Gradients are clipped
    to norm 1. Batches are the passages of `data` in batches of similar length, visited in an order
    shuffled with `seed` (the trainer's generator) and reshuffled when exhausted.
    """
    check_uptrain(steps, loss, train, teacher)
    settings = dict(steps=steps, loss=loss, lr=lr, train=train, batch_size=batch_size, max_length=max_length,
                    weight_decay=weight_decay, seed=seed, optimizer="AdamW", grad_clip=GRAD_CLIP)
    out = HeadModel(model=copy.deepcopy(student.model), tokenizer=student.tokenizer, name=f"{student.name}-uptrained",
                    source=student.source)
    log_ = UptrainLog(settings=settings)
    if steps == 0:
        return out, log_
    todo = token_batches(student, data, max_length, batch_size, limit)
    log_.losses = run_uptraining(out, _trainable(out, train), todo, steps, loss=loss,
                                 teacher=teacher.model if teacher is not None else None, lr=lr, seed=seed,
                                 desc=f"uptrain ({loss})", weight_decay=weight_decay, progress=progress)
    return out, log_
