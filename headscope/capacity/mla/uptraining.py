"""Distilling a converted MLA model back towards the original: the shared loop and loss, attention weights only.

The loop is `headscope.train.Trainer`, the loss `headscope.capacity.convert.uptraining.uptrain_loss` ("kd":
`headscope.eval.lm.distillation_loss`, KL(original || converted) per token; "lm": next-token NLL),
batches from `headscope.capacity.convert.evaluate.token_batches`: the same settings and steps as `headscope gqa
--uptrain`, so the two conversions get the same uptraining budget. What trains differs only in name: every
layer's attention module (q, latent down/up, RoPE key and output projections) instead of q/k/v/o.
"""

from __future__ import annotations

import copy
from typing import Any

from ...models.adapter import HeadModel
from ..convert.evaluate import token_batches
from ..convert.uptraining import GRAD_CLIP, UptrainLog, check_uptrain, run_uptraining


def uptrain_mla(student: HeadModel, data: Any, steps: int, *, teacher: HeadModel | None, loss: str = "kd",
                lr: float = 1e-3, batch_size: int = 8, max_length: int = 64, seed: int = 0,
                progress: bool = False) -> tuple[HeadModel, UptrainLog]:
    """A copy of `student` after `steps` AdamW steps on its attention modules (input untouched)."""
    check_uptrain(steps, loss, "attention", teacher)
    settings = dict(steps=steps, loss=loss, lr=lr, train="attention", batch_size=batch_size, max_length=max_length,
                    weight_decay=0.0, seed=seed, optimizer="AdamW", grad_clip=GRAD_CLIP)
    out = HeadModel(model=copy.deepcopy(student.model), tokenizer=student.tokenizer,
                    name=f"{student.name}-uptrained", source=student.source)
    log_ = UptrainLog(settings=settings)
    if steps == 0:
        return out, log_
    todo = token_batches(student, data, max_length, batch_size, None)
    chosen = [p for layer in range(out.n_layers) for p in out.attention(layer).parameters()]
    log_.losses = run_uptraining(out, chosen, todo, steps, loss=loss,
                                 teacher=teacher.model if teacher is not None else None, lr=lr, seed=seed,
                                 desc=f"uptrain MLA ({loss})", progress=progress)
    return out, log_
