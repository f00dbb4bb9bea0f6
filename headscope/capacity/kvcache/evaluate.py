"""Evaluate a head-aware cache: perplexity on long text, greedy generation, needle retrieval, KV bytes.

Every prediction runs through the cache itself: a passage is fed in chunks of `chunk` tokens (chunked
prefill, exact: windowed heads attend through the band mask, see cache.py), and its last token is
one decoding step at `context` tokens, where the bytes the cache hands to attention are measured and
compared with `CachePlan.bytes_read`. Perplexity counts every next-token prediction of the passage
(`eval.lm.target_nll`, the one NLL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from ...errors import HeadscopeError
from ...eval.lm import perplexity, target_nll
from ...models.adapter import HeadModel
from .cache import CachePlan, HeadAwareCache, head_aware_attention

# tokens per prefill forward: logits of chunk x vocab floats at a time
DEFAULT_CHUNK = 512


def _forward(hm: HeadModel, cache: HeadAwareCache, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
    """Logits `[q, vocab]` of `ids [1, q]` fed through `cache` (only the last position's when `last_only`)."""
    kwargs: dict[str, Any] = {"logits_to_keep": 1} if last_only else {}
    return hm.model(input_ids=ids, cache=cache, use_cache=True, **kwargs).logits[0]


def prefill(hm: HeadModel, cache: HeadAwareCache, ids: torch.Tensor, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Feed `ids [1, T]` through `cache` in chunks; the logits of the last position `[vocab]`."""
    logits = None
    for s in range(0, ids.shape[1], chunk):
        logits = _forward(hm, cache, ids[:, s:s + chunk], last_only=True)
    if logits is None:
        raise HeadscopeError("prefill needs at least one token")
    return logits[-1]


def greedy(hm: HeadModel, plan: CachePlan, prompt: Sequence[int], new_tokens: int,
           chunk: int = DEFAULT_CHUNK) -> list[int]:
    """Greedy continuation of `prompt` through a fresh head-aware cache (call inside `head_aware_attention`)."""
    cache = HeadAwareCache(plan)
    ids = torch.tensor([list(prompt)], device=hm.device)
    logits = prefill(hm, cache, ids, chunk)
    out: list[int] = []
    for i in range(new_tokens):
        nxt = int(logits.argmax())
        out.append(nxt)
        if i + 1 < new_tokens:
            logits = _forward(hm, cache, torch.tensor([[nxt]], device=hm.device), last_only=True)[-1]
    return out


@dataclass
class PassageResult:
    nll: float
    count: int
    # at the last token's decoding step (context = passage length)
    bytes_read: int
    bytes_stored: int


def passage_nll(hm: HeadModel, plan: CachePlan, ids: torch.Tensor, chunk: int = DEFAULT_CHUNK) -> PassageResult:
    """Summed next-token NLL of `ids [1, T]` predicted through a fresh cache; the last token is a decoding step."""
    t = ids.shape[1]
    if t < 2:
        raise HeadscopeError("a passage needs at least 2 tokens")
    cache = HeadAwareCache(plan)
    nll, count = 0.0, 0
    for s in range(0, t - 1, chunk):
        e = min(s + chunk, t - 1)
        logits = _forward(hm, cache, ids[:, s:e], last_only=False)  # [e - s, vocab]: predicts ids[s+1 : e+1]
        n, c, _ = target_nll(logits.float(), ids[0, s + 1:e + 1])
        nll, count = nll + float(n), count + c
    _forward(hm, cache, ids[:, t - 1:], last_only=True)  # the decoding step at context t
    return PassageResult(nll, count, cache.bytes_read, cache.bytes_stored)


def evaluate_perplexity(hm: HeadModel, plan: CachePlan, passages: Sequence[Sequence[int]], chunk: int = DEFAULT_CHUNK,
                        progress: bool = False, desc: str = "perplexity") -> dict[str, Any]:
    """Perplexity over `passages` (token ids) through the cache, and the bytes read at each last step."""
    nll, count, reads, stored, per_nll, per_count = 0.0, 0, [], [], [], []
    with head_aware_attention(hm), torch.inference_mode():
        for p in tqdm(passages, desc=desc, disable=not progress, leave=False):
            r = passage_nll(hm, plan, torch.tensor([list(p)], device=hm.device), chunk)
            nll, count = nll + r.nll, count + r.count
            # per passage: the paired comparison with the random control resamples them
            per_nll.append(r.nll)
            per_count.append(r.count)
            reads.append(r.bytes_read)
            stored.append(r.bytes_stored)
    return {"perplexity": perplexity(nll, count), "ppl_tokens": count, "bytes_read": reads, "bytes_stored": stored,
            "passage_nll": per_nll, "passage_tokens": per_count}


def long_passages_ids(tokenizer: Any, texts: Sequence[str], context: int, passages: int) -> list[list[int]]:
    """The first `context` tokens of each of the first `passages` texts that hold at least that many."""
    return long_passages(tokenizer, texts, context, passages)[0]


def long_passages(tokenizer: Any, texts: Sequence[str], context: int,
                  passages: int) -> tuple[list[list[int]], int]:
    """`long_passages_ids`, and how many texts they used up (up to the last one a passage came from): what
    follows is text the evaluation never saw (kvcache's default uptraining text)."""
    out, used = [], 0
    for i, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        if len(ids) >= context:
            out.append(list(ids[:context]))
            used = i + 1
        if len(out) == passages:
            break
    if not out:
        longest = max((len(tokenizer(t)["input_ids"]) for t in texts), default=0)
        raise HeadscopeError(f"no passage holds {context} tokens (the longest has {longest}); lower context or give "
                             f"longer text (data='gum-long' or data='ptb-long')", fields=("context", "data"))
    return out, used


def needle_answered(tokenizer: Any, generated: Sequence[int], answer_text: str) -> bool:
    """Whether the generated text holds the needle's answer (its digits)."""
    return answer_text.strip() in tokenizer.decode(list(generated))


def evaluate_needles(hm: HeadModel, plan: CachePlan, haystacks: Sequence[Any], chunk: int = DEFAULT_CHUNK,
                     progress: bool = False, desc: str = "needles") -> dict[str, Any]:
    """Greedy answers to needle prompts (`Haystack`s: `ids`, `answer` span, `answer_text`) through the cache."""
    answers = []
    with head_aware_attention(hm), torch.inference_mode():
        for hay in tqdm(haystacks, desc=desc, disable=not progress, leave=False):
            a0, a1 = hay.answer
            gen = greedy(hm, plan, hay.ids[:a0], (a1 - a0) + 2, chunk)
            text = hm.tokenizer.decode(gen)
            answers.append({"depth": hay.depth, "expected": hay.answer_text.strip(), "generated": text,
                            "correct": needle_answered(hm.tokenizer, gen, hay.answer_text)})
    acc = sum(a["correct"] for a in answers) / len(answers) if answers else math.nan
    return {"needle_accuracy": acc, "needles": len(answers), "answers": answers}


__all__ = ["DEFAULT_CHUNK", "PassageResult", "evaluate_needles", "evaluate_perplexity", "greedy",
           "long_passages", "long_passages_ids", "needle_answered", "passage_nll", "prefill"]
