"""Issue 12: the minibatch CKA (default estimator) within 0.01 of the exact full-data CKA (`--cka exact`)
on real weights, where enough tokens make the exact estimator's small-sample bias small.

Measured gap against tokens (benchmarks/cka_gap.py, table in docs/similarity.md): on MiniLM, PTB valid,
with a pool holding every token the largest |minibatch - exact| over the 2,556 pairs is 0.0100 at
8,246 tokens and 0.0044 at 15,661; with the default pool of 2,048 tokens it is 0.062 at 15,661 (same-
passage tokens share minibatches), so the test sets the pool. SmolLM2 is not within 0.01 on every pair at
any measured size, even with the pool holding every token (0.083 at 14,294 tokens; 99% of pairs within 0.0071:
a few heavy-tailed heads, docs/similarity.md), so no minibatch test claims it; `tests/test_cka_exact.py` shows
`--cka exact` in bounded memory reproducing SmolLM2's old exact CKA instead.
"""

from __future__ import annotations

import numpy as np

from headscope.learned.similarity import SimilaritySettings, similarity


def test_minibatch_cka_within_001_of_exact_on_minilm_ptb(minilm):
    kw = dict(limit=512, weights=False, js_max_tokens=64)
    exact = similarity(minilm, "ptb-valid", SimilaritySettings(cka="exact", **kw))
    mini = similarity(minilm, "ptb-valid", SimilaritySettings(cka="minibatch", cka_pool=32768, **kw))
    assert mini.meta["cka_tokens"] == exact.meta["cka_tokens"] > 15000
    assert mini.meta["cka_minibatches"] > 50
    iu = np.triu_indices(mini.n, 1)
    for name in ("cka", "cka_z"):
        gap = np.abs(mini[name][iu] - exact[name][iu])
        assert np.isfinite(gap).all()
        assert gap.max() < 0.01, f"{name}: max |minibatch - exact| {gap.max():.4f}"
