"""DuoAttention's optimised KV heads (Xiao et al. 2024): a learned mixing weight per (layer, KV head).

Each KV head's query heads output `alpha * full + (1 - alpha) * windowed`, where `full` is ordinary causal
attention and `windowed` is the attention of the head-aware cache's windowed heads (the sink tokens and the
`window` most recent ones, `cache.windowed_mask`). At alpha = 1 a head is exactly full attention, at alpha = 0
exactly what `HeadAwareCache` gives a windowed head (both tested token by token). The alphas start at 1 and
are trained with the shared `Trainer`, the model's weights frozen, by distillation from the model itself
(`eval.lm.distillation_loss`, KL(full model || mixed model) on the answer tokens) on synthetic passkey
prompts, plus an L1 penalty `l1 * mean(alpha)` that pushes heads towards the window; after every step the
alphas are clipped into [0, 1], as DuoAttention does. The KV heads kept full at a budget are those with the
largest alphas.

Passkey prompts are `learned.longctx.needle.build_haystack` haystacks (a random 6-digit code in a sentence,
the question, the answer) built from the sentences of the long text the caller gives (`kvcache --data`
after the passages perplexity is measured on), with their own seed, so they are other facts than the
evaluation needles.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Sequence, cast

import numpy as np
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ...errors import HeadscopeError, OptionError
from ...eval.lm import distillation_loss
from ...learned.longctx.needle import DEPTHS, Haystack, build_haystack
from ...models.adapter import HeadModel
from ...models.config import attention_implementation
from ...train import Trainer, frozen_weights
from .cache import check_supported, check_window, training_band
from .compare import Settings, compare

MIXED_NAME = "headscope_kvcache_mixed"
_ALPHA_ATTR = "_headscope_kv_alpha"  # (alpha [n_kv_heads], sink, window) on an attention module
# training prompts: other facts than the evaluation needles and the scoring haystacks
PROMPT_SEED_OFFSET = 2000


@dataclass(frozen=True)
class LearnedSettings:
    """How the mixing weights train."""

    steps: int = 20
    lr: float = 0.02
    l1: float = 0.05
    prompts: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise OptionError("learn_steps", f"must be at least 1; got {self.steps!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise OptionError("learn_lr", f"must be a positive number; got {self.lr}")
        if not (self.l1 > 0 and math.isfinite(self.l1)):
            raise OptionError("learn_l1", f"must be a positive number; got {self.l1}")
        if isinstance(self.prompts, bool) or not isinstance(self.prompts, int) or self.prompts < 1:
            raise OptionError("learn_prompts", f"must be at least 1; got {self.prompts!r}")


def mixed_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function: per query head alpha * full + (1 - alpha) * sink+window attention
    (alpha of its KV head). Returns `[batch, q, head, d_head]`."""
    alpha, sink, window = getattr(module, _ALPHA_ATTR)
    q_len, k_len = query.shape[-2], key.shape[-2]  # query [batch, head, q, d_head]
    full, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                     **kwargs)
    band = training_band(q_len, k_len, attention_mask, sink, window, query.device, "mixed KV attention")
    win, _ = sdpa_attention_forward(module, query, key, value, band, scaling=scaling, dropout=dropout, **kwargs)
    a = alpha.to(full.dtype).repeat_interleave(module.num_key_value_groups)[None, None, :, None]  # [1, 1, head, 1]
    return a * full + (1 - a) * win, None


@contextmanager
def mixed_kv(hm: HeadModel, alpha: torch.Tensor, sink: int, window: int) -> Iterator[HeadModel]:
    """While active, `hm`'s forward without a cache mixes full and sink + window attention by `alpha`
    `[n_layers, n_kv_heads]` (it may require grad). Restores the attention implementation after."""
    check_supported(hm)
    check_window(sink, window)
    if tuple(alpha.shape) != (hm.n_layers, hm.n_kv_heads):
        raise HeadscopeError(f"alpha has shape {tuple(alpha.shape)}; expected [n_layers, n_kv_heads] = "
                             f"[{hm.n_layers}, {hm.n_kv_heads}]")
    modules = [hm.attention(layer) for layer in range(hm.n_layers)]
    try:
        for layer, m in enumerate(modules):
            setattr(m, _ALPHA_ATTR, (alpha[layer], sink, window))
        with attention_implementation(hm.model, MIXED_NAME, mixed_attention):
            yield hm
    finally:
        for m in modules:
            if hasattr(m, _ALPHA_ATTR):
                delattr(m, _ALPHA_ATTR)


def text_sentences(texts: Sequence[str], max_words: int = 24) -> list[tuple[str, str]]:
    """(passage index, sentence) of long texts, split after '.', '!' or '?' and into pieces of at most `max_words`
    words (haystack material: the haystack builder trims whole sentences)."""
    out = []
    for i, text in enumerate(texts):
        for sent in re.split(r"(?<=[.!?])\s+", text):
            words = sent.split()
            out += [(str(i), " ".join(words[k:k + max_words])) for k in range(0, len(words), max_words)]
    return out


def passkey_prompts(tokenizer: Any, texts: Sequence[str], context: int, n: int, seed: int) -> list[Haystack]:
    """`n` passkey prompts of at most `context` tokens from the sentences of `texts` (module docstring); refuses
    text too short for one prompt (the haystack builder would repeat it)."""
    sents = text_sentences(texts)
    tokens = sum(len(tokenizer(" " + s, add_special_tokens=False)["input_ids"]) for _, s in sents)
    if tokens < context:
        raise HeadscopeError(f"choose='learned' needs long text for one passkey prompt of context={context} tokens; "
                             f"the text left for training holds {tokens}: give longer data or a shorter context",
                             fields=("choose", "context", "data"))
    return [build_haystack(tokenizer, context, DEPTHS[i % len(DEPTHS)], i, seed + PROMPT_SEED_OFFSET, sents)
            for i in range(n)]


class MixTraining:
    """The alphas `[n_layers, n_kv_heads]`, their trainer, and the loss of one step."""

    def __init__(self, hm: HeadModel, prompts: Sequence[Haystack], sink: int, window: int, settings: LearnedSettings,
                 seed: int = 0) -> None:
        self.hm, self.prompts, self.sink, self.window, self.settings = hm, list(prompts), sink, window, settings
        self.holder = nn.Module()
        self.holder.alpha = nn.Parameter(torch.ones(hm.n_layers, hm.n_kv_heads, device=hm.device))
        self.trainer = Trainer(self.holder, [self.holder.alpha], lr=settings.lr, steps=settings.steps, seed=seed,
                               desc="KV alphas")
        self.history: list[dict[str, float]] = []

    @property
    def alpha(self) -> nn.Parameter:
        return cast(nn.Parameter, self.holder.alpha)  # nn.Module attributes are typed Tensor | Module

    def _batch(self, generator: torch.Generator) -> Haystack:
        return self.prompts[int(torch.randint(len(self.prompts), (1,), generator=generator))]

    def _loss(self, hay: Haystack) -> torch.Tensor:
        hm = self.hm
        ids = torch.tensor([hay.ids], device=hm.device)
        keep = torch.zeros_like(ids)
        a0, a1 = hay.answer
        # counted positions: the queries that predict the answer tokens
        keep[0, a0 - 1:a1] = 1
        with torch.no_grad():
            teacher = hm.model(input_ids=ids, use_cache=False).logits
        with mixed_kv(hm, self.alpha, self.sink, self.window):
            student = hm.model(input_ids=ids, use_cache=False).logits
        task = distillation_loss(student, teacher, keep)
        self.history.append({"task": float(task.detach()), "alpha_mean": float(self.alpha.detach().mean())})
        return task + self.settings.l1 * self.alpha.abs().mean()

    def _clip(self, step: int, loss: float) -> None:
        with torch.no_grad():
            self.alpha.clamp_(0.0, 1.0)

    def run(self, progress: bool = False) -> np.ndarray:
        """Train; the alphas `[n_layers, n_kv_heads]`."""
        with frozen_weights(self.hm):
            self.trainer.run(self.settings.steps, self._batch, self._loss, progress=progress, on_step=self._clip)
        return self.alpha.detach().cpu().double().numpy()

    def record(self) -> dict[str, Any]:
        return {**asdict(self.settings), "prompts_built": len(self.prompts), "sink": self.sink, "window": self.window,
                "train_seconds": self.trainer.train_s, "task_loss_first": self.history[0]["task"],
                "task_loss_last": self.history[-1]["task"], "alpha": self.alpha.detach().cpu().tolist()}


def learned_rows(hm: HeadModel, passages: Sequence[Sequence[int]], prompts: Sequence[Haystack], s: Settings,
                 learned: LearnedSettings, progress: bool = False,
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train the alphas on `prompts`, then the caches keeping the largest-alpha KV heads full at each budget of `s`,
    measured as `compare` measures every cache (rows with method 'learned'); and the training record.

    `compare` measures the full cache first (each row's kv_ratio is against it); that row was measured already
    beside the score's choices and is dropped here."""
    run = MixTraining(hm, prompts, s.sink, s.window, learned, seed=s.seed)
    alpha = run.run(progress)
    per_query = np.repeat(alpha, hm.group_size, axis=1)
    only = replace(s, threshold=None, random_control=False, uptrain=0)
    rows = compare(hm, passages, per_query, "duo_alpha", only, progress=progress)[1:]
    for r in rows:
        r["method"] = "learned"
        if on_row is not None:
            on_row(r)
    return rows, run.record()


__all__ = ["MIXED_NAME", "LearnedSettings", "MixTraining", "mixed_attention", "mixed_kv",
           "learned_rows", "passkey_prompts", "text_sentences"]
