"""The sweep's tasks and their data: PTB next-token windows, and the synthetic xor and pair tasks.

Every function that draws data takes a `torch.Generator`, so the batches depend only on the seed:
every head count of a sweep sees exactly the same training data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...errors import HeadscopeError
from .corpora import Corpus, eval_windows, random_windows

__all__ = [
    "PAIR_OFFSETS", "PAIR_VOCAB", "SYNTHETIC_TASKS", "TASKS", "XOR_EXHAUSTIVE_BITS", "XOR_POSITIONS", "XOR_QUERY",
    "batch_fn", "eval_batches", "pair_batch", "synthetic_fingerprint", "xor_all_inputs", "xor_batch",
]

TASKS = ("ptb", "xor", "pair")
# scored by accuracy, trained on generated data with attention-only models
SYNTHETIC_TASKS = ("xor", "pair")
# input tokens of the pair task; targets are the 16*16 ordered pairs
PAIR_VOCAB = 16
# target at i: the pair (x[i-1], x[i-7]) as one class x[i-1] + 16 * x[i-7]
PAIR_OFFSETS = (1, 7)
# the xor task's target is bit[3] XOR bit[11], read at the final query token
XOR_POSITIONS = (3, 11)
# token id of the query token "=" (the bits are tokens 0 and 1)
XOR_QUERY = 2
# up to this many bits, the xor task is scored on every possible input
XOR_EXHAUSTIVE_BITS = 20
# held-out synthetic data comes from a generator training never uses
EVAL_SEED_OFFSET = 10_000

# inputs [batch, seq], targets [batch, seq] (-100: no target)
Batch = tuple[torch.Tensor, torch.Tensor]


def synthetic_fingerprint(task: str) -> str:
    """Names a synthetic task's data (vocabulary, offsets, positions), so results of another variant are not reused."""
    if task == "xor":
        return f"xor-p{','.join(map(str, XOR_POSITIONS))}-q{XOR_QUERY}"
    return f"pair-v{PAIR_VOCAB}-o{','.join(map(str, PAIR_OFFSETS))}"


def xor_batch(batch: int, seq: int, generator: torch.Generator) -> Batch:
    """`batch` strings of seq-1 uniform random bits then the query token; target bit[p] XOR bit[q] at the query.

    x [batch, seq] (tokens 0/1, last one XOR_QUERY); y [batch, seq], -100 (no target) except the last column.
    """
    x = torch.randint(0, 2, (batch, seq), generator=generator)
    return _xor_targets(x)


def xor_all_inputs(seq: int) -> Batch:
    """Every input of the xor task with seq-1 bits (2**(seq-1) rows, in binary counting order) and its targets."""
    bits = seq - 1
    if bits > XOR_EXHAUSTIVE_BITS:
        raise HeadscopeError(f"2**{bits} inputs are too many to enumerate (at most 2**{XOR_EXHAUSTIVE_BITS})")
    codes = torch.arange(2 ** bits).unsqueeze(1)  # [2**bits, 1]
    x = torch.zeros(2 ** bits, seq, dtype=torch.long)
    x[:, :bits] = (codes >> torch.arange(bits)) & 1  # bit j of the row number at position j
    return _xor_targets(x)


def _xor_targets(x: torch.Tensor) -> Batch:
    x[:, -1] = XOR_QUERY
    y = torch.full_like(x, -100)
    p, q = XOR_POSITIONS
    y[:, -1] = x[:, p] ^ x[:, q]
    return x, y


def pair_batch(batch: int, seq: int, generator: torch.Generator, vocab: int | None = None,
               offsets: Sequence[int] | None = None) -> Batch:
    """Uniform random tokens x [batch, seq] and targets y = sum_j x[i - offsets[j]] * vocab**j (the ordered tuple,
    one class).

    Positions i < max(offsets) have no target (-100, ignored by the loss and the accuracy).
    """
    vocab = PAIR_VOCAB if vocab is None else vocab
    offsets = PAIR_OFFSETS if offsets is None else offsets
    x = torch.randint(0, vocab, (batch, seq), generator=generator)
    y = torch.full((batch, seq), -100, dtype=torch.long)
    start = max(offsets)
    code = torch.zeros(batch, seq - start, dtype=torch.long)
    for j, o in enumerate(offsets):
        code += x[:, start - o: seq - o] * vocab ** j
    y[:, start:] = code
    return x, y


def batch_fn(task: str, batch: int, seq: int, corpus: Corpus | None) -> Callable[[torch.Generator], Batch]:
    """The training batches of a task: `fn(generator) -> (x, y)`, each [batch, seq]."""
    if task == "xor":
        return lambda g: xor_batch(batch, seq, g)
    if task == "pair":
        return lambda g: pair_batch(batch, seq, g)
    if corpus is None:
        raise HeadscopeError(
            f"the {task} task trains on a corpus; load one with headscope.capacity.sweep.corpora.load_corpus"
        )
    return lambda g: random_windows(corpus.train, seq, batch, g)


def eval_batches(task: str, batch: int, seq: int, seed: int, eval_tokens: int, corpus: Corpus | None) -> list[Batch]:
    """The held-out batches a task is scored on: xor on every input (when few enough), pair on fresh
    random sequences, ptb on evenly spread validation windows."""
    if task == "xor" and seq - 1 <= XOR_EXHAUSTIVE_BITS:
        # Every possible input once: the accuracy is exact, so the one-head bound (75 %) can be checked as is.
        x_all, y_all = xor_all_inputs(seq)
        return list(zip(x_all.split(4096), y_all.split(4096), strict=True))
    if task == "xor":
        g = torch.Generator().manual_seed(EVAL_SEED_OFFSET + seed)
        return [xor_batch(min(4096, eval_tokens), seq, g) for _ in range(max(1, eval_tokens // 4096))]
    if task == "pair":
        g = torch.Generator().manual_seed(EVAL_SEED_OFFSET + seed)
        return [pair_batch(batch, seq, g) for _ in range(max(1, eval_tokens // (batch * seq)))]
    if corpus is None:
        raise HeadscopeError(
            f"the {task} task is scored on a corpus; load one with headscope.capacity.sweep.corpora.load_corpus"
        )
    xs, ys = eval_windows(corpus.valid, seq, eval_tokens)
    return list(zip(xs.split(256), ys.split(256), strict=True))
