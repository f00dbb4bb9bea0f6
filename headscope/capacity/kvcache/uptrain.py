"""Uptraining for the head-aware cache: distil the model towards itself while its windowed heads see only
sink + recent window.

Training runs whole passages through one forward, without a cache; the windowed KV heads' restriction is
then a per-head attention mask: the query heads of a windowed KV head attend through the band of
`cache.windowed_mask` (sink tokens and the `window` most recent, causal), every other head through the
model's own mask. That is the attention `HeadAwareCache` gives while decoding (tested equal token by
token), so what is trained is what is evaluated. The mask lives on each attention module while
`windowed_training(hm, plan)` is active, read by a registered attention function.

The loop is `headscope.train.Trainer`, the loss `headscope.capacity.convert.uptraining.uptrain_loss` ("kd":
`eval.lm.distillation_loss`, KL(teacher || student) per token, the teacher being the original model with
its full attention; "lm": next-token NLL), gradients clipped as for GQA and MLA; only the attention
modules train, as `headscope gqa --uptrain` and `headscope mla --uptrain` do.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Iterator, Sequence, cast

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ...data import Batch
from ...errors import HeadscopeError
from ...eval.lm import distillation_loss
from ...models.adapter import HeadModel
from ...models.config import attention_implementation
from ..convert.uptraining import GRAD_CLIP, UptrainLog, check_uptrain, run_uptraining, uptrain_loss
from .cache import CachePlan, _gather_heads, check_supported, training_band

MASKED_NAME = "headscope_kvcache_masked"
# (full KV heads, windowed KV heads, sink, window) on an attention module
_PLAN_ATTR = "_headscope_kv_plan"


def masked_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function of training: sdpa with the model's mask for full heads, and the
    sink + window band (and the model's mask) for windowed heads. Returns `[batch, q, head, d_head]`."""
    plan = getattr(module, _PLAN_ATTR, None)
    if plan is None or not plan[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    full, windowed, sink, window = plan
    b, n_heads, q_len, _ = query.shape  # [batch, head, q, d_head]
    k_len = key.shape[-2]
    group = cast(int, module.num_key_value_groups)  # transformers' attention modules set it
    out = query.new_zeros(b, q_len, n_heads, value.shape[-1])  # [batch, q, head, d_head]
    if full:
        idx = _gather_heads(full, group, query.device)
        kv = torch.tensor(full, dtype=torch.long, device=query.device)
        o, _ = sdpa_attention_forward(module, query.index_select(1, idx), key.index_select(1, kv),
                                      value.index_select(1, kv), attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
        out = out.index_copy(2, idx, o)
    idx = _gather_heads(windowed, group, query.device)
    kv = torch.tensor(windowed, dtype=torch.long, device=query.device)
    mask = training_band(q_len, k_len, attention_mask, sink, window, query.device, "head-aware training")
    o, _ = sdpa_attention_forward(module, query.index_select(1, idx), key.index_select(1, kv),
                                  value.index_select(1, kv), mask, scaling=scaling, dropout=dropout, **kwargs)
    return out.index_copy(2, idx, o), None


@contextmanager
def windowed_training(hm: HeadModel, plan: CachePlan) -> Iterator[HeadModel]:
    """While active, `hm`'s forward without a cache attends as `HeadAwareCache(plan)` would: windowed heads see
    sink + window. Restores the attention implementation and removes the per-module plans after."""
    check_supported(hm)
    if plan.n_layers != hm.n_layers or plan.n_kv_heads != hm.n_kv_heads or plan.group_size != hm.group_size:
        raise HeadscopeError(f"the plan ({plan.n_layers} layers x {plan.n_kv_heads} KV heads, groups of "
                             f"{plan.group_size}) does not fit {hm.name} ({hm.n_layers} x {hm.n_kv_heads}, "
                             f"groups of {hm.group_size})")
    modules = [hm.attention(layer) for layer in range(hm.n_layers)]
    try:
        for layer, m in enumerate(modules):
            setattr(m, _PLAN_ATTR, (plan.full[layer], plan.windowed(layer), plan.sink, plan.window))
        with attention_implementation(hm.model, MASKED_NAME, masked_attention):
            yield hm
    finally:
        for m in modules:
            if hasattr(m, _PLAN_ATTR):
                delattr(m, _PLAN_ATTR)


def training_batches(tokenizer: Any, texts: Sequence[str], length: int, batch_size: int = 1) -> list[Batch]:
    """`texts` cut into consecutive pieces of `length` tokens (a shorter tail is dropped), `batch_size` a batch."""
    return cut_batches([tokenizer(text, add_special_tokens=True)["input_ids"] for text in texts], length,
                       batch_size)


def cut_batches(token_ids: Sequence[Sequence[int]], length: int, batch_size: int = 1) -> list[Batch]:
    """Token-id lists cut into consecutive pieces of `length` (a shorter tail is dropped), `batch_size` a batch."""
    if length < 2 or batch_size < 1:
        raise HeadscopeError(f"training passages need at least 2 tokens and batches 1 passage; got {length}, "
                             f"{batch_size}")
    pieces = []
    for ids in token_ids:
        ids = list(ids)
        pieces += [ids[s:s + length] for s in range(0, len(ids) - length + 1, length)]
    if not pieces:
        raise HeadscopeError(f"no training text holds {length} tokens; lower train_length or give longer "
                             f"train_data", fields=("train_length", "train_data"))
    out = []
    for s in range(0, len(pieces), batch_size):
        rows = torch.tensor(pieces[s:s + batch_size], dtype=torch.long)
        out.append(Batch(input_ids=rows, attention_mask=torch.ones_like(rows), index=list(range(s, s + len(rows)))))
    return out


def uptrain_head_aware(hm: HeadModel, plan: CachePlan, batches: Sequence[Batch], steps: int, *, loss: str = "kd",
                       lr: float = 1e-3, seed: int = 0, progress: bool = False) -> tuple[HeadModel, UptrainLog]:
    """A copy of `hm` after `steps` AdamW steps on its attention modules, trained under `plan`'s per-head masks
    (teacher: `hm` itself with full attention); `hm` is untouched."""
    check_uptrain(steps, loss, "attention", hm)
    if not batches and steps:
        raise HeadscopeError("uptraining needs at least one training batch")
    settings = dict(steps=steps, loss=loss, lr=lr, train="attention", batches=len(batches),
                    passage_tokens=int(batches[0].input_ids.shape[1]) if batches else 0,
                    batch_size=int(batches[0].input_ids.shape[0]) if batches else 0, weight_decay=0.0, seed=seed,
                    optimizer="AdamW", grad_clip=GRAD_CLIP, sink=plan.sink, window=plan.window,
                    kv_fraction=plan.fraction_full)
    out = HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=f"{hm.name}-uptrained",
                    source=hm.source)
    log_ = UptrainLog(settings=settings)
    if steps == 0:
        return out, log_
    chosen = [p for layer in range(out.n_layers) for p in out.attention(layer).parameters()]
    log_.losses = run_uptraining(out, chosen, batches, steps, loss=loss, teacher=hm.model, lr=lr, seed=seed,
                                 desc=f"uptrain head-aware {plan.fraction_full:.1%} ({loss})",
                                 during=windowed_training(out, plan), progress=progress)
    return out, log_


def masked_loss(student: HeadModel, teacher: HeadModel, plan: CachePlan, batches: Sequence[Batch],
                loss: str = "kd") -> float:
    """Mean uptraining loss of `student` under `plan`'s masks over `batches` (no gradients): what training lowers.
    The teacher runs with its full attention, even when it is the student's own model."""
    check_uptrain(0, loss, "attention", teacher)
    total = 0.0
    with torch.no_grad():
        for b in batches:
            if loss == "kd":
                t_logits = teacher.model(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False).logits
                with windowed_training(student, plan):
                    logits = student.model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                                           use_cache=False).logits
                total += float(distillation_loss(logits, t_logits, b.attention_mask))
            else:
                with windowed_training(student, plan):
                    total += float(uptrain_loss(student.model, b, loss))
    return total / max(1, len(batches))


__all__ = ["MASKED_NAME", "cut_batches", "masked_attention", "masked_loss", "training_batches", "uptrain_head_aware",
           "windowed_training"]
