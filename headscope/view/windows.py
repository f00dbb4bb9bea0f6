"""What the live view sends of a long text's head: a window of its map, and an overview of the whole.

One head over thousands of tokens is millions of weights (4,096 tokens: 16.8 million), too many for one JSON
answer. The page asks for a window of rows and columns around the position it focuses on, and gets with it
an overview of the whole map, max-pooled to at most `OVERVIEW` cells a side (a strong weight stays visible).
Token ids sent in place of a text (a generated continuation, whose decoded text may tokenise differently)
are read here too.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from .attention import Encoded, TooLong

__all__ = ["MAX_WINDOW", "OVERVIEW", "encode_ids", "overview", "parse_window", "window"]

MAX_WINDOW = 512  # rows (and columns) one windowed answer may hold
OVERVIEW = 256  # cells a side of the whole map's overview
_IDS = re.compile(r"[0-9]{1,9}(,[0-9]{1,9})*")


def parse_window(raw: str) -> tuple[int, int, int]:
    """`window=Q0,K0,SIZE`: the first query row, the first key column, and the window's size in tokens."""
    parts = raw.split(",")
    if len(parts) != 3 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise HeadscopeError(f"parameter window={raw[:40]!r} is not Q0,K0,SIZE (three whole numbers from 0)")
    q0, k0, size = (int(p) for p in parts)
    if not 1 <= size <= MAX_WINDOW:
        raise HeadscopeError(f"parameter window: size {size} must be from 1 to {MAX_WINDOW} tokens")
    return q0, k0, size


def window(weights: np.ndarray, q0: int, k0: int, size: int) -> tuple[np.ndarray, int, int]:
    """The `size` x `size` block of `weights` from (q0, k0), moved inside the map when it overhangs an edge;
    returns the block and where it starts."""
    T = weights.shape[0]
    q0, k0 = max(0, min(q0, T - size)), max(0, min(k0, T - size))
    return weights[q0:q0 + size, k0:k0 + size], q0, k0


def overview(weights: np.ndarray, cells: int = OVERVIEW) -> np.ndarray:
    """The whole map max-pooled to at most `cells` x `cells`: cell (a, b) is the largest weight of its block."""
    T = weights.shape[0]
    n = min(T, cells)
    edges = np.linspace(0, T, n + 1).astype(int)  # block a covers rows edges[a]:edges[a+1]
    rows = np.maximum.reduceat(weights, edges[:-1], axis=0)
    return np.maximum.reduceat(rows, edges[:-1], axis=1)


def encode_ids(hm: HeadModel, raw: str, max_tokens: int) -> Encoded:
    """Token ids given as `ids=1,2,3` (a generated continuation): checked against the vocabulary and the limit."""
    if not _IDS.fullmatch(raw):
        raise HeadscopeError(f"parameter ids={raw[:40]!r} is not a comma-separated list of token ids")
    ids = [int(i) for i in raw.split(",")]
    if len(ids) > max_tokens:
        raise TooLong(f"ids has {len(ids)} tokens; the limit is {max_tokens} tokens")
    bad = [i for i in ids if i >= hm.vocab_size]
    if bad:
        raise HeadscopeError(f"parameter ids: token id {bad[0]} is not in the vocabulary (0..{hm.vocab_size - 1})")
    if hm.tokenizer is None:
        raise HeadscopeError(f"{hm.name} has no tokenizer, so its tokens cannot be named")
    tokens = [str(t) for t in hm.tokenizer.convert_ids_to_tokens(ids)]
    return Encoded(str(hm.tokenizer.decode(ids)), ids, tokens)
