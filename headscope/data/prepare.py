"""From passages to model inputs: tokenisation, truncation, padding into batches, token classes.

`prepare_tokens` turns every accepted data form (a name or path, a TextSource, a list of strings or
of token-id lists) into one `Tokens` record, the one shape of prepared data every stage uses.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..errors import HeadscopeError, OptionError
from ..models.adapter import HeadModel
from .shared import remembered
from .sources import TextSource, keep_text, read_texts

log = logging.getLogger(__name__)


# --- token classes ------------------------------------------------------------------------------
def _is_punct(piece: str) -> bool:
    piece = piece.lstrip("Ġ▁").removeprefix("##").strip()
    return bool(piece) and all(unicodedata.category(c).startswith("P") for c in piece)


@dataclass
class TokenClasses:
    """Per-vocabulary-id flags: special tokens and punctuation pieces."""

    special: torch.Tensor  # [vocab] bool
    punct: torch.Tensor  # [vocab] bool

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int) -> "TokenClasses":
        size = max(vocab_size, len(tokenizer))
        special = torch.zeros(size, dtype=torch.bool)
        ids = [i for i in tokenizer.all_special_ids if i is not None and 0 <= i < size]
        special[ids] = True
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        punct = torch.zeros(size, dtype=torch.bool)
        punct[: len(pieces)] = torch.tensor([_is_punct(p or "") for p in pieces])
        return cls(special, punct & ~special)

    @classmethod
    def none(cls, vocab_size: int) -> "TokenClasses":
        z = torch.zeros(vocab_size, dtype=torch.bool)
        return cls(z, z.clone())


@dataclass
class Batch:
    """Right-padded token ids plus per-token flags; `index` says which passages the rows are."""

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos] 1 = real token
    index: list[int]
    word_ids: list[list[int | None]] | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(-1)

    def model_inputs(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids.to(device), "attention_mask": self.attention_mask.to(device)}


def tokenize(
    tokenizer: Any,
    source: TextSource | Sequence[str],
    max_length: int,
    by_words: bool = False,
) -> tuple[list[list[int]], list[list[int | None]] | None, int]:
    """Token ids per passage (truncated to `max_length`), word ids when `by_words`, and how many
    passages were truncated."""
    texts = source.texts if isinstance(source, TextSource) else list(source)
    sentences = source.sentences if isinstance(source, TextSource) else None
    if by_words and sentences is None:
        raise HeadscopeError("word alignment needs CoNLL-U data (words come from its word column)")
    ids: list[list[int]] = []
    word_ids: list[list[int | None]] | None = [] if by_words else None
    truncated = 0
    for i, text in enumerate(texts):
        if sentences is not None and by_words:  # (by_words without sentences was refused above)
            enc = tokenizer(sentences[i].words, is_split_into_words=True, truncation=False)
            wid = enc.word_ids()
        else:
            enc = tokenizer(text, truncation=False)
            wid = None
        toks = list(enc["input_ids"])
        if len(toks) > max_length:
            truncated += 1
            # Keep the closing special token (e.g. [SEP]) when the tokenizer added one.
            last = toks[-1] if toks[-1] in tokenizer.all_special_ids else None
            toks = toks[: max_length - 1] + [last] if last is not None else toks[:max_length]
            if wid is not None:
                wid = wid[: max_length - 1] + [None] if last is not None else wid[:max_length]
        ids.append(toks)
        if word_ids is not None:
            word_ids.append(wid)
    if truncated:
        log.warning("%d passage(s) were longer than %d tokens and were truncated (their later tokens are not "
                    "analysed; windows over whole passages: headscope.data.prepare_windows)", truncated, max_length)
    return ids, word_ids, truncated


def batches(
    token_ids: Sequence[Sequence[int]],
    batch_size: int,
    pad_id: int = 0,
    word_ids: list[list[int | None]] | None = None,
    sort: bool = True,
) -> Iterator[Batch]:
    """Right-padded batches; with `sort`, passages of similar length share a batch (less padding)."""
    if batch_size < 1:
        raise OptionError("batch_size", f"must be at least 1, got {batch_size}")
    order = np.argsort([len(t) for t in token_ids], kind="stable") if sort else np.arange(len(token_ids))
    for start in range(0, len(order), batch_size):
        idx = [int(i) for i in order[start : start + batch_size]]
        width = max(len(token_ids[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(token_ids[i])] = torch.tensor(token_ids[i], dtype=torch.long)
            mask[r, : len(token_ids[i])] = 1
        yield Batch(ids, mask, idx, [word_ids[i] for i in idx] if word_ids is not None else None)


# --- from any data form to token ids ------------------------------------------------------------
DEFAULT_MAX_LENGTH = 128


@dataclass
class Tokens:
    """Prepared data: token ids per passage, where they came from, and what tokenising did to them.

    `texts` keeps the passages (and CoNLL-U trees) when the data was text; `word_ids` maps tokens to
    words when asked for; `labels` holds class ids for labelled (classification) data.
    """

    ids: list[list[int]]
    source: str
    max_length: int = DEFAULT_MAX_LENGTH
    truncated: int = 0
    texts: TextSource | None = None
    word_ids: list[list[int | None]] | None = None
    labels: list[int] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def n_tokens(self) -> int:
        """Real tokens over all passages."""
        return sum(len(t) for t in self.ids)


# --- windows over long passages ------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One window of a long passage: tokens `[start, start + len(ids))` of passage `passage` (its
    content, without the tokenizer's special tokens), framed by those tokens again.

    Only queries at window positions `[count_from, count_to)` are counted, so that every position of
    the passage (its frame included) is counted exactly once over all its windows.
    """

    passage: int
    start: int
    ids: list[int]
    count_from: int
    count_to: int


def window_starts(n: int, length: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows `(start, end, count_from)` over `n` tokens: starts 0, stride, 2 * stride, ... each
    `length` long (the last cut at `n`), until one reaches the end. A window counts only the tokens past
    the end of the window before it, so each token is counted once, and every counted token of a
    later window has at least `length - stride` tokens of context before it."""
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= length:
        raise OptionError("stride", f"must be between 1 and the window length {length}; got {stride!r} "
                                    f"(a stride of the window length: windows side by side, no overlap)")
    out, prev_end, start = [], 0, 0
    while True:
        end = min(start + length, n)
        out.append((start, end, prev_end - start))
        if end >= n:
            return out
        prev_end, start = end, start + stride


def prepare_windows(hm: HeadModel, data: Any, length: int, stride: int | None = None,
                    limit: int | None = None) -> tuple[list[Window], TextSource]:
    """Every passage of `data` cut into windows of `length` tokens (never truncated): a passage that
    fits is one window; a longer one gets windows every `stride` tokens (default: `length`, no
    overlap), each framed by the tokenizer's special tokens (e.g. [CLS] ... [SEP]) like a passage.
    `data`: a built-in name or path (as `read_texts`), a TextSource, or a list of strings."""
    if hm.tokenizer is None:
        raise HeadscopeError("windows over text need the model's tokenizer")
    limit_positions = hm.max_positions
    if limit_positions is not None and length > limit_positions:
        raise HeadscopeError(f"window length {length} exceeds {hm.name}'s {limit_positions} positions; "
                             f"use at most {limit_positions}")
    if isinstance(data, TextSource):
        source = data
    elif data is None or isinstance(data, (str, Path)):
        source = read_texts(data, limit)
    else:
        source = TextSource(keep_text([t for t in data if t.strip()], "in-memory")[:limit], "in-memory")
    prefix, suffix = passage_frame(hm.tokenizer)
    inner = length - len(prefix) - len(suffix)
    if inner < 1:
        raise HeadscopeError(f"window length {length} leaves no room for text beside the tokenizer's "
                             f"{len(prefix) + len(suffix)} special tokens")
    stride = inner if stride is None else stride
    if isinstance(stride, int) and not isinstance(stride, bool) and stride > inner and stride <= length:
        stride = inner  # the frame's tokens take part of the window
    out: list[Window] = []
    for i, text in enumerate(source.texts):
        content = list(hm.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not content:
            continue
        spans = window_starts(len(content), inner, stride)
        for w, (s, e, c) in enumerate(spans):
            first, last = w == 0, w == len(spans) - 1
            ids = prefix + content[s:e] + suffix
            count_from = 0 if first else len(prefix) + c
            count_to = len(ids) if last else len(prefix) + (e - s)
            out.append(Window(i, s, ids, count_from, count_to))
    if not out:
        raise HeadscopeError(f"no text left in {source.source!r} after tokenisation")
    n_long = sum(1 for w in out if w.start > 0)
    if n_long:
        log.info("%s: %d window(s) of %d tokens (stride %d) over %d passage(s)", source.source, len(out), length,
                 stride, len(source.texts))
    return out, source


def passage_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a passage (e.g. [CLS] ... [SEP]; none for SmolLM2)."""
    full = list(tokenizer("a")["input_ids"])
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    return [], []


def resolve_max_length(hm: HeadModel, max_length: int | None) -> int:
    """The user's max length capped at the model's positions (default: 128, or fewer if the model has fewer)."""
    limit = hm.max_positions
    if max_length is not None and max_length < 2:
        raise OptionError("max_length", f"must be at least 2 tokens, got {max_length}")
    want = max_length or DEFAULT_MAX_LENGTH
    if limit is not None and want > limit:
        if max_length is not None:
            log.warning("--max-length %d exceeds the model's %d positions; using %d", want, limit, limit)
        want = limit
    return want


def prepare_tokens(hm: HeadModel, data: Any, max_length: int, limit: int | None = None,
                   by_words: bool = False, labels: list[int] | None = None) -> Tokens:
    """Turn any accepted data form (name, path, TextSource, strings, token-id lists) into `Tokens`.

    `labels` (one class id per passage of a TextSource) travel with their passages: a passage skipped for
    holding no text takes its label with it.
    """
    if labels is not None and not (isinstance(data, TextSource) and len(labels) == len(data) and limit is None):
        raise HeadscopeError("labels go with a TextSource of as many passages (and no limit)")
    if data is not None and not isinstance(data, (str, Path, TextSource)) and len(data) and \
            not isinstance(data[0], str):
        ids = [list(map(int, t)) for t in data][:limit]
        if not ids or any(len(t) == 0 for t in ids):
            raise HeadscopeError("token-id data must hold at least one non-empty sequence")
        _check_vocab(hm, ids)
        long = [len(t) for t in ids if len(t) > max_length]
        if long:
            log.warning("%d sequence(s) were longer than %d tokens and were truncated", len(long), max_length)
        return Tokens([t[:max_length] for t in ids], "token-ids", max_length, len(long))
    if isinstance(data, (str, Path)) or data is None:
        source = read_texts(data, limit)
    elif isinstance(data, TextSource):
        source = data if limit is None else TextSource(data.texts[:limit], data.source,
                                                       data.sentences[:limit] if data.sentences else None)
    else:
        source = TextSource(keep_text([t for t in data if t.strip()], "in-memory")[:limit], "in-memory")
    if hm.tokenizer is None:
        raise HeadscopeError(f"model {hm.name!r} has no tokenizer (its folder holds no tokenizer.json or "
                             f"tokenizer_config.json): copy the tokenizer files of the model it came from into "
                             f"that folder, or (Python API) pass token ids, a list of lists of ints, instead of text")
    key = ("tokens", id(hm.tokenizer), source.source, tuple(source.texts), max_length, by_words)
    tokenizer = hm.tokenizer
    ids, word_ids, truncated = remembered(key, lambda: tokenize(tokenizer, source, max_length, by_words=by_words))
    # each caller gets its own lists: a shared result is never changed through them
    ids = [list(t) for t in ids]
    word_ids = [list(w) for w in word_ids] if word_ids is not None else None
    ids, word_ids, source, keep = _drop_tokenless(hm, ids, word_ids, source)
    return Tokens(ids, source.source, max_length, truncated, source, word_ids,
                  [labels[i] for i in keep] if labels is not None else None)


def _check_vocab(hm: HeadModel, ids: list[list[int]]) -> None:
    """Refuse token ids outside the model's embedding table (they would fail deep inside a forward pass)."""
    vocab = hm.vocab_size
    for i, seq in enumerate(ids):
        bad = [t for t in seq if not 0 <= t < vocab]
        if bad:
            raise HeadscopeError(f"token-id sequence {i} holds id {bad[0]}, outside the vocabulary of {hm.name} "
                                 f"({vocab} ids: 0..{vocab - 1}); give ids from the model's tokenizer")


def _drop_tokenless(hm: HeadModel, ids: list[list[int]], word_ids: list[list[int | None]] | None,
                    source: TextSource) -> tuple[list[list[int]], list[list[int | None]] | None, TextSource, list[int]]:
    """Skip passages that tokenise to special tokens only (nothing the tokenizer knows as text): they
    would be scored as [CLS]/[SEP] alone. Refuse when none is left. Also returns the kept indices."""
    # [UNK] stands for real text the vocabulary lacks, so it counts as text; [CLS]/[SEP]/BOS/EOS do not.
    special = set(hm.tokenizer.all_special_ids) - {getattr(hm.tokenizer, "unk_token_id", None)}
    keep = [i for i, t in enumerate(ids) if any(x not in special for x in t)]
    if len(keep) == len(ids):
        return ids, word_ids, source, keep
    if not keep:
        raise HeadscopeError(f"no text left in {source.source!r} after tokenisation: all {len(ids)} passage(s) "
                             f"become special tokens only for {hm.name}'s tokenizer; give real text")
    log.warning("skipped %d passage(s) of %s that tokenise to special tokens only",
                len(ids) - len(keep), source.source)
    sents = [source.sentences[i] for i in keep] if source.sentences is not None else None
    return ([ids[i] for i in keep], [word_ids[i] for i in keep] if word_ids is not None else None,
            TextSource([source.texts[i] for i in keep], source.source, sents), keep)


def pad_id(hm: HeadModel) -> int:
    """A padding id (any id works: padded positions are masked out)."""
    tok = hm.tokenizer
    for cand in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None),
                 getattr(hm.config, "pad_token_id", None)):
        if isinstance(cand, int):
            return cand
    return 0


def token_classes(hm: HeadModel) -> TokenClasses:
    """Special/punctuation flags for the model's vocabulary (all False without a tokenizer)."""
    vocab = hm.vocab_size
    if hm.tokenizer is None:
        return TokenClasses.none(vocab)
    return TokenClasses.from_tokenizer(hm.tokenizer, vocab)
