"""Needle in a haystack from built-in text, and Wu et al. (2024)'s retrieval score, teacher-forced.

A haystack is GUM test sentences in document order (`gum-long`'s text), starting at a different
document for each haystack, cut to the requested length. The needle is one sentence with a random
fact, "The secret code of the <colour> <thing> is <6 digits>.", inserted between two sentences at a
depth (fraction of the haystack before it). The prompt ends with the question and the start of the
answer, and the answer (" <6 digits>") follows, so one forward pass sees the whole exchange:

    <haystack ... needle ... haystack>\\n\\nQuestion: What is the secret code of the red door?\\n
    Answer: The secret code of the red door is 481736    (one line in the prompt)

Retrieval score (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality",
code: nightdessert/Retrieval_Head `retrieval_calculate`): at each step that produces answer token t,
a head scores 1 / (needle length in tokens) when its largest attention weight (top-1) lies on a needle
token equal to t. Wu counts during greedy generation; here the answer is fed (teacher forcing) and the
step producing answer token a is the query at position a - 1. Where the model's own argmax at every
answer step is the answer token, greedy generation would have produced exactly these steps, so the two
agree; `token_accuracy` says how often that holds. Like Wu (who keeps a test only when the answer's
ROUGE recall exceeds 50), a haystack counts towards the score only when greedy decoding would produce
more than half of the answer (`greedy_prefix`: answer tokens right before the first wrong one); the score
over all haystacks is reported too.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...data.prepare import passage_frame
from ...data.sources import read_conllu, treebank_path
from ...errors import HeadscopeError
from ...models.adapter import HeadModel

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "silver", "golden", "black", "white")
THINGS = ("door", "box", "car", "lamp", "chair", "boat", "key", "book", "clock", "garden")
NEEDLE = "The secret code of the {colour} {thing} is {number}."
QUESTION = (
    "\n\nQuestion: What is the secret code of the {colour} {thing}?\nAnswer: The secret code of the {colour} {thing} is"
)
DEPTHS = (0.1, 0.35, 0.6, 0.85)


@dataclass(frozen=True)
class Haystack:
    """One needle-in-a-haystack sequence: token ids, the needle's and the answer's token spans `[start, end)`."""

    ids: list[int]
    needle: tuple[int, int]
    answer: tuple[int, int]
    depth: float
    fact: str
    answer_text: str


def gum_sentences() -> list[tuple[str, str]]:
    """(document id, sentence) of the GUM test split, in order."""
    return [(s.doc_id, s.text) for s in read_conllu(treebank_path("gum-test"))]


def _spans(offsets: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int]:
    """Token span `[start, end)` of the tokens overlapping characters `[lo, hi)`."""
    hit = [i for i, (s, e) in enumerate(offsets) if e > s and s < hi and e > lo]
    if not hit:
        raise HeadscopeError("the needle or answer got no tokens of its own; the tokenizer lost its text")
    return hit[0], hit[-1] + 1


def build_haystack(tokenizer: Any, n_tokens: int, depth: float, index: int, seed: int = 0,
                   sentences: list[tuple[str, str]] | None = None) -> Haystack:
    """Haystack `index` (it starts at document `index` and gets its own random fact) of at most `n_tokens` tokens."""
    if not getattr(tokenizer, "is_fast", False):
        raise HeadscopeError("needle haystacks need a fast tokenizer (offsets locate the needle and the answer)")
    sents = sentences if sentences is not None else gum_sentences()
    docs = list(dict.fromkeys(d for d, _ in sents))
    first = next(i for i, (d, _) in enumerate(sents) if d == docs[index % len(docs)])
    rng = random.Random(f"{seed}-{index}")
    colour, thing = rng.choice(COLOURS), rng.choice(THINGS)
    number = str(rng.randrange(100000, 1000000))
    needle = NEEDLE.format(colour=colour, thing=thing, number=number)
    tail = QUESTION.format(colour=colour, thing=thing)
    answer = " " + number
    prefix, suffix = passage_frame(tokenizer)
    fixed = len(tokenizer(needle + tail + answer, add_special_tokens=False)["input_ids"]) + len(prefix) + len(suffix)
    budget = n_tokens - fixed
    if budget < 16:
        raise HeadscopeError(
            f"a haystack of {n_tokens} tokens leaves no room for text around the needle; use at least {fixed + 16}"
        )
    chosen, total, i = [], 0, first
    while total < budget:  # whole sentences, wrapping round the corpus; trimmed below
        text = sents[i % len(sents)][1]
        chosen.append(text)
        total += len(tokenizer(" " + text, add_special_tokens=False)["input_ids"])
        i += 1
    while True:
        at = round(depth * len(chosen))
        parts = chosen[:at] + [needle] + chosen[at:]
        body = " ".join(parts)
        n_lo = len(" ".join(chosen[:at])) + (1 if at else 0)
        prompt = body + tail
        enc = tokenizer(prompt + answer, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        if len(ids) <= n_tokens or len(chosen) <= 1:
            break
        over = len(ids) - n_tokens
        drop = 1
        while drop < len(chosen) - 1 and sum(len(tokenizer(" " + c, add_special_tokens=False)["input_ids"])
                                              for c in chosen[-drop:]) < over:
            drop += 1
        chosen = chosen[:-drop]
    if len(ids) > n_tokens:
        raise HeadscopeError(f"could not fit a haystack into {n_tokens} tokens")
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    n_span = _spans(offsets, n_lo, n_lo + len(needle))
    a_span = _spans(offsets, len(prompt), len(prompt) + len(answer))
    return Haystack(ids, n_span, a_span, depth, needle, answer)


class RetrievalCounter:
    """Wu et al.'s retrieval hits of one haystack, from blocks of attention: per layer and head, the
    needle-normalised count of answer steps whose top-1 key is a needle token equal to the answer token."""

    def __init__(self, hm: HeadModel, hay: Haystack) -> None:
        self.hm, self.hay = hm, hay
        a0, a1 = hay.answer
        self.steps = torch.arange(a0 - 1, a1 - 1)  # queries that produce the answer tokens
        self.targets = torch.tensor(hay.ids[a0:a1])
        self.hits = np.zeros((hm.n_layers, hm.n_heads))
        self.ids = torch.tensor(hay.ids)

    def __call__(self, layer: int, q_start: int, probs: torch.Tensor) -> None:
        """One block `probs [1, head, q_block, key]`."""
        q_end = q_start + probs.shape[2]
        sel = (self.steps >= q_start) & (self.steps < q_end)
        if not bool(sel.any()):
            return
        rows = (self.steps[sel] - q_start).to(probs.device)
        top = probs[0, :, rows].argmax(-1).cpu()  # [head, step]: each step's top-1 key
        n0, n1 = self.hay.needle
        in_needle = (top >= n0) & (top < n1)
        same = self.ids[top] == self.targets[sel][None, :]
        self.hits[layer] += (in_needle & same).sum(-1).numpy() / (n1 - n0)

    def chance(self) -> float:
        """The score of a head whose top-1 key were uniformly random over the keys each step sees."""
        n0, n1 = self.hay.needle
        needle_ids = self.ids[n0:n1]
        p = [(needle_ids == t).sum().item() / (int(s) + 1) for s, t in zip(self.steps, self.targets, strict=True)]
        return float(sum(p)) / (n1 - n0)


def answer_logits(hm: HeadModel, ids: torch.Tensor, first_step: int) -> tuple[Any, torch.Tensor]:
    """Run the model on `ids [1, T]` keeping only the logits of positions `first_step ..` (a 8k x vocab
    float map would take 1.6 GB for SmolLM2): (model output, logits `[T - first_step, vocab]`)."""
    kwargs: dict[str, Any] = {"use_cache": False}
    keep = ids.shape[1] - first_step
    if "logits_to_keep" in inspect.signature(hm.model.forward).parameters:
        kwargs["logits_to_keep"] = keep
    out = hm.model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    logits = getattr(out, "logits", None)
    if logits is None:
        raise HeadscopeError(f"{hm.name} has no language-model head: the retrieval score needs a causal LM")
    return out, logits[0, -keep:]
