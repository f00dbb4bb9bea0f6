"""Word similarity: Spearman correlation of an encoder's word embeddings with human ratings.

wordsim353 (relatedness) and simlex999 (strict similarity) ship inside the PyPI `gensim` wheel
(`gensim/test/test_data/`). A word's embedding is the mean-pooled final hidden state of its tokens,
as sentence-transformers pools MiniLM. Pruning curves record it as an extra measure per point.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import numpy as np
import torch

from ..data import batches, pad_id
from ..data.sources import gensim_test_file
from ..errors import HeadscopeError, did_you_mean
from ..hooks import head_gates
from ..models.adapter import HeadModel
from .metrics import cosine64, final_hidden, mean_pool

WORDSIM = {"wordsim353": "wordsim353.tsv", "simlex999": "simlex999.txt"}


def read_word_pairs(which: str = "wordsim353") -> list[tuple[str, str, float]]:
    """(word1, word2, human rating) pairs of wordsim353 or simlex999 from gensim's wheel."""
    if which not in WORDSIM:
        raise HeadscopeError(f"unknown word-similarity set {which!r}{did_you_mean(which, WORDSIM)}; "
                             f"choose one of {', '.join(WORDSIM)}")
    path = gensim_test_file(WORDSIM[which])
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        a, b, score = line.split("\t")[:3]
        pairs.append((a.strip(), b.strip(), float(score)))
    return pairs


def wordsim_spearman(hm: HeadModel, which: str = "wordsim353", gates: torch.Tensor | None = None,
                     batch_size: int = 64) -> float:
    """Spearman correlation between human similarity ratings and the cosine of mean-pooled word embeddings."""
    # scipy.stats takes ~1 s to import; only this measure needs it
    from scipy.stats import spearmanr

    if hm.tokenizer is None:
        raise HeadscopeError("word similarity needs a model with a tokenizer")
    pairs = read_word_pairs(which)
    words = sorted({w for a, b, _ in pairs for w in (a, b)})
    ids = [list(hm.tokenizer(w)["input_ids"]) for w in words]
    emb = torch.zeros(len(words), hm.d_model)
    gate_ctx = head_gates(hm, gates.to(hm.device)) if gates is not None else nullcontext()
    with torch.inference_mode(), gate_ctx:
        for b in batches(ids, batch_size, pad_id=pad_id(hm)):
            x, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            emb[b.index] = mean_pool(final_hidden(hm, x, mask), mask).float().cpu()
    pos = {w: i for i, w in enumerate(words)}
    first = emb[[pos[p[0]] for p in pairs]]
    second = emb[[pos[p[1]] for p in pairs]]
    cos = cosine64(first, second).numpy()
    rho = spearmanr(cos, np.array([p[2] for p in pairs])).statistic
    return float(rho)


def wordsim_measure(which: str = "wordsim353") -> Callable[[HeadModel, torch.Tensor], float]:
    """An `extra` measure for `prune_curve`: Spearman of human word-similarity ratings (wordsim353, simlex999)."""
    read_word_pairs(which)  # fail now, not after the first pruning step, on a bad name

    def measure(model: HeadModel, gates: torch.Tensor) -> float:
        return wordsim_spearman(model, which, gates=gates)

    return measure


__all__ = ["WORDSIM", "read_word_pairs", "wordsim_measure", "wordsim_spearman"]
