"""Clean/corrupt prompt pairs for activation patching: read from JSONL or built in, tokenised as the model's own
tokenizer does by default.

A pairs file holds one JSON object a line: `{"clean": "...", "corrupt": "...", "answer": " Mary", "wrong": " John"}`.
Texts are tokenised exactly as `tokenizer(text)` (whatever special tokens that adds by default, nothing else), so
results match other tools on the same pairs; `answer` and `wrong` as `tokenizer(text, add_special_tokens=False)`,
and each must be one token. A pair's clean and corrupt texts must have the same number of tokens (patching
replaces a head's output position by position). On an encoder the metric is read at the mask token's position
(the same in both texts); on a decoder at the last token.

Built-in sets (`--task`), written by this project and shipped under headscope/resources/patching/:
ioi (indirect-object identification, Wang et al. 2022: the corrupt text repeats the other name), greater-than
(years, Hanna et al. 2023: the corrupt start year is 1701), masked (country of a capital, for encoders, the text
holding `{mask}`), and induction (repeated random tokens drawn with --seed; built from token ids). A built-in pair
the model's tokenizer cannot hold (unequal lengths, an answer of several tokens, answer and wrong one
and the same token) is left out and counted; in a --pairs file it is refused, naming its line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.sources import existing_file, read_lines
from ...errors import HeadscopeError, did_you_mean
from ...options import OptionError

TASKS = ("ioi", "greater-than", "induction", "masked")
_FILES = {"ioi": "ioi.jsonl", "greater-than": "greater_than.jsonl", "masked": "masked.jsonl"}
KEYS = ("clean", "corrupt", "answer", "wrong")


@dataclass(frozen=True)
class Pair:
    """One clean/corrupt pair and the two tokens its metric compares."""

    clean: str
    corrupt: str
    answer: str
    wrong: str


@dataclass
class PairBatch:
    """Tokenised pairs, right-padded: ids `[pairs, pos]`, the metric's position and tokens per pair."""

    clean: torch.Tensor
    corrupt: torch.Tensor
    mask: torch.Tensor
    position: torch.Tensor
    answer: torch.Tensor
    wrong: torch.Tensor
    pairs: list[Pair]
    source: str
    skipped: int = 0
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.clean.shape[0])

    def take(self, rows: slice) -> "PairBatch":
        return PairBatch(clean=self.clean[rows], corrupt=self.corrupt[rows], mask=self.mask[rows],
                         position=self.position[rows], answer=self.answer[rows], wrong=self.wrong[rows],
                         pairs=self.pairs[rows], source=self.source, skipped=self.skipped)

    def record(self) -> dict[str, Any]:
        """What patching.json says about the pairs."""
        return {"source": self.source, "n": len(self), "skipped": self.skipped,
                "tokens": [int(m) for m in self.mask.sum(1)],
                "pairs": [p.__dict__ for p in self.pairs]}


# A pair's texts are prompts: a line longer than this is no prompt any model's positions hold (1,000,000
# characters are ~250,000 tokens), and tokenising it would take the run's time before the refusal.
LINE_MAX = 1_000_000
PAIR_KINDS = ("a .jsonl file of {\"clean\", \"corrupt\", \"answer\", \"wrong\"} objects, one a line, or a built-in "
              "task (" + ", ".join(TASKS) + ")")


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of a JSONL file; one line naming the file (and line) when it is not one: a missing path, a folder, a
    pipe, an unreadable file, bytes that are not UTF-8, a line too long to be a prompt, a line that is not a pair."""
    p = existing_file(path, "pairs", PAIR_KINDS, ())  # a folder or a FIFO named as such, never "does not exist"
    out = []
    for i, line in enumerate(read_lines(p), 1):
        if not line.strip():
            continue
        if len(line) > LINE_MAX:
            raise HeadscopeError(f"{p}, line {i}: {len(line):,} characters, more than the {LINE_MAX:,} a pair's "
                                 f"prompts can need (no model's positions hold them); give short prompt pairs")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HeadscopeError(f"{p}, line {i}: not JSON ({e.msg}); each line is one object "
                                 f"{{\"clean\", \"corrupt\", \"answer\", \"wrong\"}}") from None
        if not isinstance(obj, dict) or any(not isinstance(obj.get(k), str) or not obj.get(k) for k in KEYS):
            missing = [k for k in KEYS if not isinstance(obj, dict) or not isinstance(obj.get(k), str) or not obj[k]]
            raise HeadscopeError(f"{p}, line {i}: needs non-empty strings {', '.join(KEYS)}; "
                                 f"missing or not text: {', '.join(missing)}")
        out.append(Pair(obj["clean"], obj["corrupt"], obj["answer"], obj["wrong"]))
    if not out:
        raise HeadscopeError(f"pairs file '{p}' holds no pairs; give one JSON object a line")
    return out


PYTHON_PAIRS = "pairs given in Python"


def given_pairs(pairs: Any) -> str | Path | PairBatch | list[Pair] | None:
    """The `pairs` argument of `headscope.patch` as one of the forms it reads (a list of dicts becomes `Pair`s),
    or an OptionError naming the parameter and the item that is none of them."""
    if pairs is None or isinstance(pairs, (str, Path, PairBatch)):
        return pairs
    if not isinstance(pairs, (list, tuple)):
        raise OptionError("pairs", f"must be a .jsonl path, a PairBatch or a list of pairs ({{\"clean\", "
                                   f"\"corrupt\", \"answer\", \"wrong\"}} dicts); got {type(pairs).__name__} "
                                   f"{pairs!r}"[:300])
    if not pairs:
        raise OptionError("pairs", "is an empty list; give at least one pair")
    out = []
    for i, p in enumerate(pairs):
        if isinstance(p, Pair):
            p = p.__dict__
        if not isinstance(p, dict) or any(not isinstance(p.get(k), str) or not p.get(k) for k in KEYS) \
                or set(p) - set(KEYS):
            raise OptionError("pairs", f"[{i}] must be a dict of exactly the non-empty strings {', '.join(KEYS)}; "
                                       f"got {p!r}"[:300])
        out.append(Pair(p["clean"], p["corrupt"], p["answer"], p["wrong"]))
    return out


def builtin_pairs(task: str) -> list[Pair]:
    """A shipped pair set (not induction, which is built from token ids)."""
    if task not in _FILES:
        raise HeadscopeError(f"unknown task {task!r}{did_you_mean(task, TASKS)}; choose one of {', '.join(TASKS)}")
    text = resources.files("headscope").joinpath(f"resources/patching/{_FILES[task]}").read_text(encoding="utf-8")
    return [Pair(**json.loads(line)) for line in text.splitlines() if line.strip()]


def _one_token(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else None


def _position(tokenizer: Any, ids: list[int], causal: bool) -> int | None:
    """Where the metric is read: the last token (decoder) or the mask token (encoder; None without one)."""
    if causal:
        return len(ids) - 1
    mask_id = getattr(tokenizer, "mask_token_id", None)
    hits = [i for i, t in enumerate(ids) if t == mask_id]
    return hits[0] if len(hits) == 1 else None


def _unknown(tokenizer: Any, token: int) -> bool:
    """Whether `token` is the tokenizer's unknown token (a word it does not know reads as it)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    return unk is not None and token == unk


def _too_long(n_tokens: int, max_positions: int | None) -> str | None:
    if max_positions is not None and n_tokens > max_positions:
        return (f"the clean text is {n_tokens:,} tokens, more than the model's {max_positions:,} positions; give "
                f"shorter prompts")
    return None


def tokenize_pairs(tokenizer: Any, pairs: list[Pair], causal: bool, source: str, *, strict: bool = True,
                   pad_id: int = 0, max_positions: int | None = None) -> PairBatch:
    """Tokenise pairs; `strict` refuses a bad pair naming its line, else leaves it out (built-in sets)."""
    if tokenizer is None:
        raise HeadscopeError("patching needs the model's tokenizer; load the model with one (a folder or hub id "
                             "that ships tokenizer files)")
    mask_token = getattr(tokenizer, "mask_token", None) or "[MASK]"
    rows: list[tuple[list[int], list[int], int, int, int, Pair]] = []
    skipped = 0
    for i, pair in enumerate(pairs, 1):
        clean_t, corrupt_t = (t.replace("{mask}", mask_token) for t in (pair.clean, pair.corrupt))
        a, c = tokenizer(clean_t)["input_ids"], tokenizer(corrupt_t)["input_ids"]
        answer, wrong = _one_token(tokenizer, pair.answer), _one_token(tokenizer, pair.wrong)
        pos = _position(tokenizer, a, causal)
        problem = None
        if len(a) != len(c):
            problem = (f"clean and corrupt texts have {len(a)} and {len(c)} tokens; patching needs the same number "
                       f"(position by position)")
        elif answer is None or wrong is None:
            bad = pair.answer if answer is None else pair.wrong
            n = len(tokenizer(bad, add_special_tokens=False)["input_ids"])
            problem = f"{bad!r} is {n} tokens, not one; answer and wrong must each be one token"
        elif answer == wrong:  # e.g. two names the tokenizer does not know (<unk>)
            problem = (f"answer {pair.answer!r} and wrong {pair.wrong!r} are the same token ({answer}) for this "
                       f"tokenizer: the metric cannot tell them apart")
        elif _unknown(tokenizer, answer) or _unknown(tokenizer, wrong):
            which, text = ("answer", pair.answer) if _unknown(tokenizer, answer) else ("wrong", pair.wrong)
            problem = (f"{which} {text!r} reads as the tokenizer's unknown token {tokenizer.unk_token!r}: the metric "
                       f"would measure the unknown token, not the word; give a word this tokenizer knows")
        elif _too_long(len(a), max_positions):
            problem = _too_long(len(a), max_positions)
        elif pos is None or (not causal and _position(tokenizer, c, causal) != pos):
            problem = (f"an encoder's metric is read at the mask token ({mask_token!r} or {{mask}}): the clean "
                       f"text needs exactly one, at the same position in the corrupt text")
        if problem:
            if strict:
                raise HeadscopeError(f"{source}, line {i}: {problem}")
            skipped += 1
            continue
        rows.append((a, c, pos, answer, wrong, pair))  # type: ignore[arg-type]
    if not rows:
        raise HeadscopeError(f"{source}: none of its {len(pairs)} pairs fits this model's tokenizer "
                             f"(unequal lengths, answers of several tokens, answer and wrong the same token, an "
                             f"unknown token, or more tokens than the model's positions)")
    return _batch(rows, source, skipped, pad_id)


def _batch(rows: list[tuple[list[int], list[int], int, int, int, Pair]], source: str, skipped: int,
           pad_id: int) -> PairBatch:
    width = max(len(r[0]) for r in rows)
    clean = torch.full((len(rows), width), pad_id, dtype=torch.long)
    corrupt, mask = clean.clone(), torch.zeros_like(clean)
    for i, (a, c, *_rest) in enumerate(rows):
        clean[i, :len(a)], corrupt[i, :len(c)], mask[i, :len(a)] = torch.tensor(a), torch.tensor(c), 1
    col = lambda k: torch.tensor([r[k] for r in rows], dtype=torch.long)  # noqa: E731
    return PairBatch(clean=clean, corrupt=corrupt, mask=mask, position=col(2), answer=col(3), wrong=col(4),
                     pairs=[r[5] for r in rows], source=source, skipped=skipped)


def induction_pairs(tokenizer: Any, vocab_size: int, n: int = 32, length: int = 10, seed: int = 0) -> PairBatch:
    """Repeated random tokens: clean = A A[:-1], answer A's last token; corrupt = A B[:-1] (B fresh random tokens),
    so only the clean text's copy predicts the answer; wrong is B's last token. Drawn with `seed`."""
    rng = np.random.default_rng(seed)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pool = np.array([t for t in range(min(vocab_size, len(tokenizer) if tokenizer is not None else vocab_size))
                     if t not in special])
    rows = []
    for _ in range(n):
        a, b = rng.choice(pool, size=length, replace=False), rng.choice(pool, size=length, replace=False)
        while b[-1] == a[-1]:
            b = rng.choice(pool, size=length, replace=False)
        clean, corrupt = [*a, *a[:-1]], [*a, *b[:-1]]
        text = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else str
        pair = Pair(text(clean), text(corrupt), text([int(a[-1])]), text([int(b[-1])]))
        rows.append(([int(t) for t in clean], [int(t) for t in corrupt], len(clean) - 1, int(a[-1]), int(b[-1]),
                     pair))
    return _batch(rows, f"task induction (seed {seed}, {n} pairs of 2 x {length} random tokens)", 0, 0)


def pad_of(tokenizer: Any) -> int:
    """The id pairs are right-padded with (never read: the metric's position is a real token)."""
    return getattr(tokenizer, "pad_token_id", None) or 0


def load_pairs(tokenizer: Any, causal: bool, vocab_size: int, *, pairs: str | None = None, task: str | None = None,
               seed: int = 0, limit: int | None = None, max_positions: int | None = None) -> PairBatch:
    """The pairs a run asks for: a file (strict) or a built-in task (pairs the tokenizer cannot hold left out)."""
    if task == "induction":
        return induction_pairs(tokenizer, vocab_size, n=limit or 32, seed=seed)
    pad = pad_of(tokenizer)
    if task is not None:
        if task == "masked" and causal:
            raise HeadscopeError("task 'masked' reads a mask token, for encoders; a decoder takes ioi, greater-than "
                                 "or induction")
        if task != "masked" and not causal:
            raise HeadscopeError(f"task {task!r} reads the next token, for decoders; an encoder takes 'masked'")
        got = builtin_pairs(task)[:limit]
        return tokenize_pairs(tokenizer, got, causal, f"task {task}", strict=False, pad_id=pad,
                              max_positions=max_positions)
    if pairs is None:
        raise OptionError("pairs", "or task: patching needs one (a JSONL file of pairs, or a built-in set: "
                                   + ", ".join(TASKS) + ")", also=("task",))
    return tokenize_pairs(tokenizer, read_pairs(pairs)[:limit], causal, str(pairs), pad_id=pad,
                          max_positions=max_positions)


def check_batch(batch: PairBatch, tokenizer: Any, vocab_size: int, max_positions: int | None) -> None:
    """Refuse tokenised pairs (a PairBatch built by hand) the metric cannot measure, as a file's pairs are: token ids
    outside the vocabulary, answer and wrong the same token, the unknown token, more tokens than the positions."""
    for i in range(len(batch)):
        answer, wrong = int(batch.answer[i]), int(batch.wrong[i])
        problem = None
        if not (0 <= answer < vocab_size and 0 <= wrong < vocab_size):
            problem = f"answer {answer} or wrong {wrong} lies outside the vocabulary (ids 0..{vocab_size - 1})"
        elif answer == wrong:
            problem = f"answer and wrong are the same token ({answer}): the metric cannot tell them apart"
        elif _unknown(tokenizer, answer) or _unknown(tokenizer, wrong):
            problem = f"answer {answer} or wrong {wrong} is the tokenizer's unknown token"
        else:
            problem = _too_long(int(batch.mask[i].sum()), max_positions)
        if problem:
            raise HeadscopeError(f"{batch.source}, pair {i + 1}: {problem}")
