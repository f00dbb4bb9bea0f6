"""Next-token evaluation of language models: NLL, perplexity, KL to a reference, and the distillation loss.

Every stage that scores a causal LM (score and prune's `lm_loss`, pruning recovery, GQA conversion and
uptraining, the comparison of converted models) computes these quantities here, so they agree exactly.

The positions that count: query position t of a passage counts when the token at t + 1 is a real
(non-padding) token, so every passage of n real tokens contributes n - 1 predictions. That holds for
the NLL, for the KL to a reference, and for the distillation loss: the distillation loss is
**the mean over counted positions of KL(teacher || student)** between next-token distributions, in
nats, which is exactly the quantity `kl_sums` reports when a converted model is evaluated. (A real last
token has a next-token distribution too, but nothing on the data side to check it against, and
including it would make the training loss differ from the evaluation.)

Logits are widened to float32 for the softmax; sums are returned in float64.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..errors import HeadscopeError
from ..models.dispatch import input_device


def counted_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """`[batch, pos - 1]` bool: query positions whose next token is real (see the module docstring)."""
    m = attention_mask.bool()
    return m[:, 1:] & m[:, :-1]


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the vocabulary of the predicting positions `[batch, pos - 1, vocab]`, float32+."""
    x = logits[:, :-1]
    return F.log_softmax(x if x.dtype in (torch.float32, torch.float64) else x.float(), dim=-1)


def nll_sums(logits: torch.Tensor, input_ids: torch.Tensor,
             attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row summed next-token NLL `[batch]` and the number of counted positions `[batch]` (float64).

    Differentiable in `logits`.
    """
    keep = counted_positions(attention_mask)  # [batch, pos-1]
    x = logits[:, :-1]
    x = x if x.dtype in (torch.float32, torch.float64) else x.float()
    ce = F.cross_entropy(x.reshape(-1, x.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="none")
    ce = ce.view(keep.shape) * keep
    return ce.sum(-1).double(), keep.sum(-1).double()


def kl_per_position(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(reference || model) of the next-token distributions at every predicting position `[batch, pos - 1]`."""
    r, c = _logprobs(ref_logits), _logprobs(logits)
    # Clamped at 0: the exact KL is never negative, float rounding can make it -1e-9.
    return (r.exp() * (r - c)).sum(-1).clamp_min(0.0)


def kl_sums(ref_logits: torch.Tensor, logits: torch.Tensor,
            attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row summed KL(reference || model) over counted positions `[batch]` and their number (float64)."""
    keep = counted_positions(attention_mask)
    kl = kl_per_position(ref_logits, logits) * keep
    return kl.sum(-1).double(), keep.sum(-1).double()


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      attention_mask: torch.Tensor) -> torch.Tensor:
    """The distillation loss: mean over counted positions of KL(teacher || student), differentiable in
    the student's logits (the teacher's are detached)."""
    keep = counted_positions(attention_mask)
    kl = kl_per_position(teacher_logits.detach(), student_logits)
    return (kl * keep).sum() / keep.sum().clamp_min(1)


def target_nll(logits: torch.Tensor, targets: torch.Tensor,
               ignore_index: int = -100) -> tuple[torch.Tensor, int, int]:
    """Summed NLL, count and correct argmax predictions over positions whose target is not `ignore_index`.

    For models trained on explicit (input, target) windows, such as the sweep's, where targets are
    already shifted and positions without a target carry `ignore_index`.
    """
    keep = targets != ignore_index
    picked, gold = logits[keep], targets[keep]  # [counted, vocab], [counted]
    nll = F.cross_entropy(picked, gold, reduction="sum")
    return nll, int(keep.sum()), int((picked.argmax(-1) == gold).sum())


def perplexity(nll_sum: float, count: float) -> float:
    """exp of the mean NLL; inf when it would overflow, nan without counted positions."""
    if not count:
        return math.nan
    mean = nll_sum / count
    return math.exp(mean) if mean < 700 else math.inf


class _Inputs(Protocol):
    """A batch of right-padded token ids (e.g. `headscope.data.Batch`)."""

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos], 1 = real token


def _device(model: nn.Module) -> torch.device:
    # a dispatched model's main device (its offloaded parameters sit on meta)
    return input_device(model)


def compare_lms(reference: nn.Module, candidates: Mapping[str, nn.Module], batches: Iterable[_Inputs], *,
                progress: bool = False, desc: str = "evaluate") -> dict[str, dict[str, float]]:
    """One pass over prepared batches: perplexity of `reference` and of each candidate, and each
    candidate's mean KL(reference || candidate) over counted positions, in nats (0 = same predictions).

    Returns {"reference": {"ppl", "tokens"}, name: {"ppl", "kl"}, ...}; `tokens` is the number of counted
    positions every figure averages over. Each model sees the batch on its own device.
    """
    nll = {name: 0.0 for name in ["reference", *candidates]}
    kl = {name: 0.0 for name in candidates}
    count = 0.0
    with torch.no_grad():
        for b in tqdm(batches, desc=desc, disable=not progress):
            dev = _device(reference)
            ids, mask = b.input_ids.to(dev), b.attention_mask.to(dev)
            ref = reference(input_ids=ids, attention_mask=mask, use_cache=False).logits
            s, n = nll_sums(ref, ids, mask)
            nll["reference"] += float(s.sum())
            count += float(n.sum())
            for name, cand in candidates.items():
                c_dev = _device(cand)
                logits = cand(input_ids=ids.to(c_dev), attention_mask=mask.to(c_dev), use_cache=False).logits
                logits = logits.to(dev)
                nll[name] += float(nll_sums(logits, ids, mask)[0].sum())
                kl[name] += float(kl_sums(ref, logits, mask)[0].sum())
    if count == 0:
        raise HeadscopeError("evaluation needs passages of at least 2 tokens; all were shorter")
    out: dict[str, dict[str, float]] = {"reference": {"ppl": perplexity(nll["reference"], count),
                                                      "tokens": int(count)}}
    for name in candidates:
        out[name] = {"ppl": perplexity(nll[name], count), "kl": kl[name] / count}
    return out


__all__ = ["compare_lms", "counted_positions", "distillation_loss", "kl_per_position", "kl_sums", "nll_sums",
           "target_nll", "perplexity"]
