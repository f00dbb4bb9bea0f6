"""Word-level attention and dependency accuracy (Clark et al. 2019); coreference lives in `coref`.

Clark, Khandelwal, Levy and Manning (2019), "What does BERT look at?": a head's subword attention
is turned into word-level attention by summing over the pieces of the attended word and
averaging over the pieces of the attending word. For each relation, a head's accuracy is the
fraction of dependents whose most-attended word is their syntactic head (dependent -> head), or
of heads whose most-attended word is that dependent (head -> dependent), beside the best
fixed-offset baseline (predict "the head is the word k positions away", best k per relation).

Decisions (docs/roles.md repeats them):
- Special tokens ([CLS], [SEP], BOS, EOS) belong to no word: attention to them is dropped and
  rows are not renormalised (argmax does not change under renormalisation).
- The attending word itself is excluded from the argmax: no word is its own head or dependent.
- Relations: the UD subtype is stripped (nsubj:pass -> nsubj, obl:tmod -> obl, compound:prt ->
  compound, aux:pass -> aux), except nmod:poss, which is reported as `poss` (Clark et al.'s label).
- Words are aligned to tokens through the tokenizer's character offsets on the sentence text as
  the model would see it (SpaceAfter=No honoured). A token that overlaps two words (a merge) is
  given to the first; a word that gets no token is "unaligned" and its arcs are skipped. Both
  are counted. Slow tokenizers without offsets fall back to `is_split_into_words` word ids.
- Sentences longer than the model's max length are skipped (not truncated: a truncated sentence
  loses arcs silently) and counted, with a warning.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data import Sentence
from ..errors import HeadscopeError
from ..heads import Head
from ..hooks import on_attention_blocks
from ..uncertainty import Accumulator, PassageSums, Statistic

log = logging.getLogger(__name__)

# The relations Clark et al. report (UD labels; `poss` is UD's nmod:poss).
# Rows of per-sentence hits kept per relation: more sentences are pooled into fixed groups of consecutive
# sentences (a block bootstrap; headscope.uncertainty.passages), so memory stays 512 x relations x 2 x heads.
SENTENCE_ROWS = 512

RELATIONS: tuple[str, ...] = ("nsubj", "obj", "det", "amod", "case", "advmod", "aux", "compound", "poss")


def relation_of(deprel: str) -> str:
    """The relation an arc is scored under: subtype stripped, except nmod:poss -> poss."""
    if deprel == "nmod:poss":
        return "poss"
    return deprel.split(":", 1)[0]


# --- aligning words to tokens --------------------------------------------------------------------
@dataclass
class Aligned:
    """One model input: token ids and, per token, the index of its word (-1: special / no word)."""

    ids: list[int]
    word_of: list[int]
    n_words: int
    merged: int = 0  # tokens that overlapped more than one word
    unaligned: int = 0  # words that received no token


def text_with_spans(words: Sequence[str],
                    space_after: Sequence[bool] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """Join words into the sentence text (SpaceAfter=No honoured) and return each word's char span."""
    parts, spans, pos = [], [], 0
    space_after = list(space_after) if space_after else [True] * len(words)
    for i, w in enumerate(words):
        spans.append((pos, pos + len(w)))
        parts.append(w)
        pos += len(w)
        if i < len(words) - 1 and space_after[i]:
            parts.append(" ")
            pos += 1
    return "".join(parts), spans


def align_words(tokenizer: Any, words: Sequence[str], space_after: Sequence[bool] | None = None) -> Aligned:
    """Tokenize a sentence given as words and map every token to its word."""
    if not words:
        raise HeadscopeError("cannot align an empty sentence")
    text, spans = text_with_spans(words, space_after)
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, return_offsets_mapping=True, truncation=False)
        char_word = np.full(len(text), -1, dtype=np.int64)
        for w, (s, e) in enumerate(spans):
            char_word[s:e] = w
        special = set(tokenizer.all_special_ids)
        word_of, merged = [], 0
        for tok, (s, e) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
            owners = [int(x) for x in np.unique(char_word[s:e]) if x >= 0] if e > s else []
            if tok in special and e <= s:
                owners = []
            if len(owners) > 1:
                merged += 1
            word_of.append(owners[0] if owners else -1)
        ids = list(enc["input_ids"])
    else:
        enc = tokenizer(list(words), is_split_into_words=True, truncation=False)
        ids = list(enc["input_ids"])
        word_of = [-1 if w is None else int(w) for w in enc.word_ids()]
        merged = 0
    unaligned = len(set(range(len(words))) - set(word_of))
    return Aligned(ids, word_of, len(words), merged, unaligned)


# --- word-level attention ------------------------------------------------------------------------
def _word_onehot(word_of: torch.Tensor, n_words: int, dtype: torch.dtype) -> torch.Tensor:
    """`[batch, pos, word]` one-hot of each token's word (special/padding tokens: all zeros)."""
    return torch.nn.functional.one_hot((word_of + 1).clamp(min=0), n_words + 1)[..., 1:].to(dtype)


def word_attention_sum(probs: torch.Tensor, word_of: torch.Tensor, n_words: int, q_start: int = 0) -> torch.Tensor:
    """Word attention of queries `q_start ..` before averaging: probs `[batch, head, q, k]` (all keys) ->
    `[batch, head, word, word]`, summed over attended and attending pieces. Blocks of queries add up."""
    onehot = _word_onehot(word_of, n_words, probs.dtype)  # [b, t, w]
    summed = torch.einsum("bhqk,bkw->bhqw", probs, onehot)  # attended pieces summed
    rows = onehot[:, q_start:q_start + probs.shape[2]]  # [b, q, w]: the attending pieces of these queries
    return torch.einsum("bqv,bhqw->bhvw", rows, summed)


def word_attention(probs: torch.Tensor, word_of: torch.Tensor, n_words: int) -> torch.Tensor:
    """Token attention `[batch, head, q, k]` -> word attention `[batch, head, word, word]`.

    `word_of` is `[batch, pos]` (word index, -1 for special/padding tokens). Sum over the attended
    word's pieces, mean over the attending word's pieces; rows of words without tokens are NaN.
    """
    return _word_mean(word_attention_sum(probs, word_of, n_words), word_of, n_words)


def _word_mean(per_word: torch.Tensor, word_of: torch.Tensor, n_words: int) -> torch.Tensor:
    """Summed word attention `[batch, head, word, word]` divided by the attending word's piece count."""
    count = _word_onehot(word_of, n_words, per_word.dtype).sum(1)  # [b, w]
    return per_word / count[:, None, :, None]  # 0/0 -> NaN for words without tokens


def _argmax_no_self(w: np.ndarray) -> np.ndarray:
    """argmax over the last axis of `[head, word, word]`, the word itself and NaN excluded."""
    w = np.where(np.isnan(w), -np.inf, w)
    n = w.shape[-1]
    w = w.copy()
    w[:, np.arange(n), np.arange(n)] = -np.inf
    return w.argmax(-1)  # [head, word]


# --- dependency accuracy ------------------------------------------------------------------------
@dataclass
class DependencyCounts:
    """Hits per relation and direction, `[n_layers, n_heads]` each, plus the arcs' offsets."""

    n_layers: int
    n_heads: int
    total: Counter = field(default_factory=Counter)
    dep_to_head: dict[str, np.ndarray] = field(default_factory=dict)
    head_to_dep: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    sentences: int = 0
    skipped_long: int = 0
    merged_tokens: int = 0
    unaligned_words: int = 0
    per_sentence: Accumulator | None = field(default=None, repr=False)

    def track_sentences(self, n_sentences: int) -> "DependencyCounts":
        """Keep each sentence's hits and arcs per relation from now on (`relation_sums`); returns self."""
        self.per_sentence = Accumulator(n_sentences, max_rows=SENTENCE_ROWS)
        return self

    def _arr(self, d: dict[str, np.ndarray], rel: str) -> np.ndarray:
        if rel not in d:
            d[rel] = np.zeros((self.n_layers, self.n_heads))
        return d[rel]

    def add_sentence(self, layer: int, wattn: np.ndarray, heads: Sequence[int], deprels: Sequence[str],
                     aligned_words: np.ndarray, row: int | None = None) -> None:
        """Score one sentence's word attention `[head, word, word]` at `layer`.

        `heads` are 1-based (0 = root); `aligned_words` flags words that have tokens. Offsets and
        totals are counted at layer 0 only, so each arc is counted once. `row` (the sentence's index)
        keeps its hits per sentence too, when tracked.
        """
        pred = _argmax_no_self(wattn)  # [head, word]
        mine: dict[str, list[np.ndarray]] = {}
        for d, (g, rel) in enumerate(zip(heads, deprels, strict=True)):
            g -= 1
            if g < 0 or g == d or not (aligned_words[d] and aligned_words[g]):
                continue
            r = relation_of(rel)
            d2h, h2d = pred[:, d] == g, pred[:, g] == d
            self._arr(self.dep_to_head, r)[layer] += d2h
            self._arr(self.head_to_dep, r)[layer] += h2d
            got = mine.setdefault(r, [np.zeros(self.n_heads), np.zeros(self.n_heads), np.zeros(())])
            got[0] += d2h
            got[1] += h2d
            got[2] += 1
            if layer == 0:
                self.total[r] += 1
                self.offsets[r][g - d] += 1
        if self.per_sentence is not None and row is not None:
            acc, shape = self.per_sentence, (self.n_layers, self.n_heads)
            for r, (d2h_, h2d_, n) in mine.items():
                for key, v in ((f"{r}|dep_to_head", d2h_), (f"{r}|head_to_dep", h2d_)):
                    acc.declare(key, shape)
                    acc.add(key, [row], v[None], (layer,))
                if layer == 0:
                    acc.declare(f"{r}|count", ())
                    acc.add(f"{r}|count", [row], n[None])

    def relation_sums(self, rel: str) -> PassageSums | None:
        """Per-sentence hits of `rel` in both directions and its arcs (`[rows, ...]`), or None when untracked."""
        if self.per_sentence is None or f"{rel}|count" not in self.per_sentence.arrays:
            return None
        acc, shape = self.per_sentence, (self.n_layers, self.n_heads)
        for key in (f"{rel}|dep_to_head", f"{rel}|head_to_dep"):
            acc.declare(key, shape)
        return acc.result().select([f"{rel}|dep_to_head", f"{rel}|head_to_dep", f"{rel}|count"])

    def baseline(self, rel: str) -> tuple[float, int]:
        """Best fixed-offset accuracy for `rel` and its offset (head position - dependent position)."""
        if not self.offsets.get(rel):
            return float("nan"), 0
        k, n = self.offsets[rel].most_common(1)[0]
        return n / self.total[rel], int(k)

    def accuracy(self, rel: str, direction: str) -> np.ndarray:
        """`[n_layers, n_heads]` accuracy for `rel` in `direction` ('dep_to_head' / 'head_to_dep' / 'best')."""
        n = self.total.get(rel, 0)
        if n == 0:
            return np.full((self.n_layers, self.n_heads), np.nan)
        if direction == "best":
            return np.maximum(self.dep_to_head[rel], self.head_to_dep[rel]) / n
        return getattr(self, direction)[rel] / n

    def relations(self, min_count: int = 1) -> list[str]:
        """Relations seen at least `min_count` times: RELATIONS first, then the rest by frequency."""
        seen = [r for r, n in self.total.most_common() if n >= min_count]
        return [r for r in RELATIONS if r in seen] + [r for r in seen if r not in RELATIONS]

    def to_dict(self, min_count: int = 1) -> dict[str, Any]:
        """JSON-able results: per relation the count, baseline, per-head accuracies and best head."""
        out: dict[str, Any] = {}
        for rel in self.relations(min_count):
            base, k = self.baseline(rel)
            best = self.accuracy(rel, "best")
            li, hi = np.unravel_index(int(np.nanargmax(best)), best.shape)
            d2h, h2d = self.accuracy(rel, "dep_to_head"), self.accuracy(rel, "head_to_dep")
            out[rel] = {"count": int(self.total[rel]), "baseline": base, "baseline_offset": k,
                        "best_head": Head(int(li), int(hi)).name, "best_accuracy": float(best[li, hi]),
                        "best_direction": "dep_to_head" if d2h[li, hi] >= h2d[li, hi] else "head_to_dep",
                        "dep_to_head": d2h.tolist(), "head_to_dep": h2d.tolist()}
        return out


def best_accuracy(rel: str) -> Statistic:
    """The better direction's accuracy of `rel` as a statistic of per-sentence sums (`relation_sums`)."""

    def stat(s: Any) -> np.ndarray:
        n = np.asarray(s[f"{rel}|count"], float)[..., None, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, np.maximum(s[f"{rel}|dep_to_head"], s[f"{rel}|head_to_dep"]) /
                            np.where(n > 0, n, 1.0), np.nan)

    return stat


# --- streaming runner ----------------------------------------------------------------------------
def stream_word_attention(hm: Any, inputs: Sequence[Aligned], batch_size: int,
                          fn: Callable[[int, int, np.ndarray], None], pad_id: int = 0,
                          progress: Any = None) -> None:
    """Run `inputs` through `hm` in batches and call `fn(layer, input_index, word_attn[head, w, w])`.

    Each layer's attention arrives in blocks of queries (the statistics kernel: no T x T map), is summed
    to word level and handed over after its last block: memory holds one batch's word maps, never the
    data set.
    """
    order = np.argsort([len(a.ids) for a in inputs], kind="stable")
    state: dict[str, Any] = {}

    def on_attn(layer: int, q_start: int, probs: torch.Tensor) -> None:
        part = word_attention_sum(probs.detach().float(), state["word_of"], state["n_words"], q_start)
        acc = state["acc"]
        acc[layer] = part if q_start == 0 else acc[layer] + part
        if q_start + probs.shape[2] < probs.shape[3]:
            return  # more blocks of this layer's queries to come
        w = _word_mean(acc.pop(layer), state["word_of"], state["n_words"]).cpu().numpy()
        for r, idx in enumerate(state["index"]):
            n = inputs[idx].n_words
            fn(layer, idx, w[r, :, :n, :n])

    with on_attention_blocks(hm, on_attn), torch.inference_mode():
        for start in range(0, len(order), batch_size):
            index = [int(i) for i in order[start:start + batch_size]]
            width = max(len(inputs[i].ids) for i in index)
            ids = torch.full((len(index), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(index), width), dtype=torch.long)
            word_of = torch.full((len(index), width), -1, dtype=torch.long)
            for r, i in enumerate(index):
                n = len(inputs[i].ids)
                ids[r, :n] = torch.tensor(inputs[i].ids)
                mask[r, :n] = 1
                word_of[r, :n] = torch.tensor(inputs[i].word_of)
            state.update(index=index, word_of=word_of.to(hm.device), acc={},
                         n_words=max(inputs[i].n_words for i in index))
            hm.model(input_ids=ids.to(hm.device), attention_mask=mask.to(hm.device), use_cache=False)
            if progress is not None:
                progress.update(len(index))


def dependency_accuracy(hm: Any, sentences: Iterable[Sentence], max_length: int, batch_size: int = 16,
                        pad_id: int = 0, progress: Any = None) -> DependencyCounts:
    """Clark et al.'s per-head dependency accuracy of `hm` on `sentences` (streamed)."""
    if hm.tokenizer is None:
        raise HeadscopeError("dependency accuracy needs the model's tokenizer to align words to tokens")
    counts = DependencyCounts(hm.n_layers, hm.n_heads)
    kept: list[Sentence] = []
    inputs: list[Aligned] = []
    for s in sentences:
        a = align_words(hm.tokenizer, s.words, s.space_after)
        if len(a.ids) > max_length:
            counts.skipped_long += 1
            continue
        counts.merged_tokens += a.merged
        counts.unaligned_words += a.unaligned
        kept.append(s)
        inputs.append(a)
    if counts.skipped_long:
        log.warning("%d sentence(s) longer than %d tokens were skipped for dependency accuracy",
                    counts.skipped_long, max_length)
    if not inputs:
        raise HeadscopeError(f"no treebank sentence fits in {max_length} tokens; raise max_length",
                             fields=("max_length",))
    has_tokens = [np.isin(np.arange(a.n_words), a.word_of) for a in inputs]
    counts.sentences = len(inputs)
    counts.track_sentences(len(inputs))

    def fn(layer: int, idx: int, w: np.ndarray) -> None:
        counts.add_sentence(layer, w, kept[idx].heads, kept[idx].deprels, has_tokens[idx], row=idx)

    stream_word_attention(hm, inputs, batch_size, fn, pad_id, progress)
    return counts
