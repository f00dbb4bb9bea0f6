"""Full attention maps of every head on a few short example sentences, stored compactly.

Only these few maps go into the page (everything else is per-head summaries), so a 30 x 9 model
still opens fast: probabilities are quantised to uint8 (p * 255, rounded; enough for a heat map)
and, for causal models, only the lower triangle is kept.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import HeadscopeError, OptionError
from ..hooks import on_attention_blocks
from ..models.adapter import HeadModel

log = logging.getLogger(__name__)

MAX_TOKENS = 24
MAX_SENTENCES = 3


def token_labels(hm: HeadModel, ids: Sequence[int]) -> list[str]:
    """Readable token strings (BPE/SentencePiece space markers turned into a visible space)."""
    if hm.tokenizer is None:
        return [f"#{i}" for i in ids]
    pieces = hm.tokenizer.convert_ids_to_tokens(list(ids))
    out = []
    for p in pieces:
        p = str(p if p is not None else "?")
        p = p.replace("Ġ", "·").replace("▁", "·").replace("Ċ", "\\n")
        out.append(p)
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def select_sentences(hm: HeadModel, texts: Sequence[str], n: int = MAX_SENTENCES,
                     max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Pick up to `n` short passages (<= max_tokens tokens): one with a repeated word first (shows
    duplicate-token and induction heads), then the ones closest to 16 tokens, in data order."""
    if hm.tokenizer is None:
        raise HeadscopeError("this model has no tokenizer: pass token-id sentences instead of text")
    cands = []
    for i, t in enumerate(texts):
        ids = list(hm.tokenizer(t, truncation=False)["input_ids"])
        if 4 <= len(ids) <= max_tokens:
            words = _words(t)
            repeated = len(words) != len(set(words))
            cands.append((i, ids, repeated))
    picked: list[tuple[int, list[int]]] = []
    rep = [c for c in cands if c[2]]
    if rep:
        picked.append((rep[0][0], rep[0][1]))
    for i, ids, _ in sorted(cands, key=lambda c: (abs(len(c[1]) - 16), c[0])):
        if len(picked) >= n:
            break
        if all(i != j for j, _ in picked):
            picked.append((i, ids))
    return [ids for _, ids in sorted(picked)]


def default_token_ids(hm: HeadModel, n: int = MAX_SENTENCES, length: int = 12, seed: int = 0) -> list[list[int]]:
    """Token-id sentences for models without a tokenizer (config-built models): fixed random ids,
    each with its first half repeated so induction-like patterns have something to show."""
    vocab = hm.vocab_size
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        half = torch.randint(3, vocab, (length // 2,), generator=g).tolist()
        out.append(half + half)
    return out


def attention_maps(hm: HeadModel, ids: Sequence[int]) -> np.ndarray:
    """Attention probabilities of every head for one sentence: [layer, head, query, key] float32."""
    n = len(ids)
    if n > MAX_TOKENS * 4:
        raise HeadscopeError(f"example sentence has {n} tokens; keep examples short (<= {MAX_TOKENS})")
    maps = np.zeros((hm.n_layers, hm.n_heads, n, n), dtype=np.float32)

    def keep(layer: int, q_start: int, probs: torch.Tensor) -> None:  # probs [1, head, q_block, key]
        maps[layer, : probs.shape[1], q_start:q_start + probs.shape[2]] = probs[0].detach().float().cpu().numpy()

    x = torch.tensor([list(ids)], dtype=torch.long, device=hm.device)
    # Rows arrive in blocks from the statistics kernel; only this short example is ever held whole.
    with on_attention_blocks(hm, keep), torch.inference_mode():
        hm.model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False)
    return maps


def encode_maps(maps: np.ndarray, causal: bool) -> str:
    """uint8-quantised maps as base64, row-major over (layer, head, query, key); causal maps keep
    only keys <= query (row q holds q + 1 values)."""
    q = np.clip(np.rint(maps * 255.0), 0, 255).astype(np.uint8)
    if causal:
        n = maps.shape[-1]
        rows, cols = np.tril_indices(n)
        q = q[..., rows, cols]
    return base64.b64encode(np.ascontiguousarray(q).tobytes()).decode("ascii")


def decode_maps(text: str, n_layers: int, n_heads: int, n_tokens: int, causal: bool) -> np.ndarray:
    """Inverse of `encode_maps` (values in [0, 1], steps of 1/255): [layer, head, query, key]."""
    raw = np.frombuffer(base64.b64decode(text), dtype=np.uint8).astype(np.float32) / 255.0
    if not causal:
        return raw.reshape(n_layers, n_heads, n_tokens, n_tokens)
    tri = raw.reshape(n_layers, n_heads, -1)
    out = np.zeros((n_layers, n_heads, n_tokens, n_tokens), dtype=np.float32)
    rows, cols = np.tril_indices(n_tokens)
    out[..., rows, cols] = tri
    return out


def example_maps(hm: HeadModel, texts: Sequence[str] | None = None, n: int = MAX_SENTENCES,
                 token_ids: Sequence[Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """The report's example sentences: tokens and encoded maps of every head for each."""
    if n < 0:
        raise OptionError("sentences", f"must be 0 or more, got {n}")
    if n == 0:
        return []
    if token_ids is not None:
        sents = [list(map(int, t))[:MAX_TOKENS] for t in token_ids][:n]
    elif hm.tokenizer is None:
        sents = default_token_ids(hm, n)
    else:
        sents = select_sentences(hm, texts or [], n)
        if not sents:
            log.warning("no passage of 4..%d tokens in the data; the report shows no attention maps", MAX_TOKENS)
    out = []
    for ids in sents:
        maps = attention_maps(hm, ids)
        out.append({"tokens": token_labels(hm, ids), "causal": bool(hm.causal),
                    "maps": encode_maps(maps, hm.causal)})
    return out
