"""The exact CKA in bounded memory (`SpilledExactCKA`, `similar --cka exact`): the same numbers as the in-memory
scatter (`StreamingCKA`) whatever the block size, on random data, through `similarity()`, and on SmolLM2's
270 heads (whose in-memory scatter is 2.4 GB) with a 56 MiB budget; the spill file goes away; bad budgets."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from headscope.data import prepare_tokens, resolve_max_length
from headscope.errors import HeadscopeError
from headscope.hooks import capture_head_outputs
from headscope.learned.cka import SpilledExactCKA, StreamingCKA, check_cka_memory
from headscope.learned.similarity import SimilaritySettings, layer_weights, similarity
from tests.families import model


def maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    both = np.isfinite(a) & np.isfinite(b)
    assert (np.isnan(a) == np.isnan(b)).all(), "NaN patterns differ"
    return float(np.abs(a[both] - b[both]).max())


def _data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n, d, t = 7, 5, 300
    x = torch.randn(t, n, d, generator=g, dtype=torch.float64) * 2 + torch.randn(n, d, generator=g,
                                                                                   dtype=torch.float64) * 10
    x[:, 3] = x[:, 0] @ torch.randn(d, d, generator=g, dtype=torch.float64) + 0.2 * x[:, 3]  # a similar pair
    x[:, 6] = 1.5  # a constant group: no variance, NaN CKA
    r = torch.linalg.qr(torch.randn(n, 9, d, generator=g, dtype=torch.float64))[1]  # per-group maps ("W_O")
    return x.to(dtype), r


@pytest.mark.parametrize("heads_per_block", [1, 2, 3, 7])
def test_spilled_exact_equals_in_memory_scatter(heads_per_block, tmp_path):
    """Blocks of 1, 2, 3 and all 7 groups, uneven batches (one of a single sample), chunks of few tokens:
    the CKA with and without the per-group maps equals StreamingCKA's to 1e-10 (float64 samples)."""
    x, r = _data(torch.float64)
    n, d = x.shape[1], x.shape[2]
    ref = StreamingCKA(n, d)
    per_group = d * n * d * 12
    memory = (per_group * heads_per_block) * 4 // 3 + 8
    spill = SpilledExactCKA(n, d, memory, spill_dir=str(tmp_path))
    assert spill.block == heads_per_block and spill.chunk < 300  # several chunks read back per block
    for a, b in ((0, 7), (7, 60), (60, 61), (61, 300)):
        ref.update(x[a:b])
        spill.update(x[a:b])
    got = spill.ckas({"cka": r, "cka_z": None})
    assert maxdiff(got["cka_z"], ref.cka()) < 1e-10, maxdiff(got["cka_z"], ref.cka())
    assert maxdiff(got["cka"], ref.cka(r)) < 1e-10, maxdiff(got["cka"], ref.cka(r))
    assert np.isnan(got["cka_z"][6]).all() and abs(got["cka_z"][0, 0] - 1) < 1e-12
    assert spill.cka() == pytest.approx(got["cka_z"], nan_ok=True)  # read back again: the same
    assert len(os.listdir(tmp_path)) == 1  # the spill folder
    spill.close()
    assert os.listdir(tmp_path) == []  # gone


def test_spilled_exact_float32_within_1e6():
    x, r = _data(torch.float64)
    n, d = x.shape[1], x.shape[2]
    ref = StreamingCKA(n, d)
    ref.update(x)
    spill = SpilledExactCKA(n, d, d * n * d * 12 * 2)
    for a in range(0, 300, 64):
        spill.update(x[a:a + 64].float())
    assert maxdiff(spill.cka(r), ref.cka(r)) < 1e-6
    spill.close()


def test_memory_budget_checks():
    with pytest.raises(HeadscopeError, match="positive number of bytes"):
        check_cka_memory(0, 10, 4)
    with pytest.raises(HeadscopeError, match="one head's rows need 12.7 MiB.*give at least 17 MiB"):
        check_cka_memory(2**20, 270, 64)  # one SmolLM2 head's rows: 270 x 64^2 x 12 B = 12.7 MiB
    assert check_cka_memory(192 * 2**20, 270, 64) == 11  # SmolLM2 at the default: 11 heads a block, 25 reads
    spill = SpilledExactCKA(3, 2, 2**20)
    with pytest.raises(HeadscopeError, match="none were added"):
        spill.ckas({"cka": None})
    with pytest.raises(HeadscopeError, match="width 5"):
        spill.update(torch.zeros(4, 5))
    spill.close()


def test_similarity_exact_is_the_in_memory_cka_whatever_the_budget():
    """Through `similarity()` on a tiny GQA model: a budget of one head a block and one holding all heads give
    the same CKA, equal to StreamingCKA on the head outputs captured passage by passage."""
    hm = model("llama")
    ids = [[5, 17, 33, 8, 90, 41, 12, 7, 66, 3], [9, 3, 71, 28, 54, 19], [44, 10, 101, 6, 23, 88, 15, 2]]
    n, d = hm.n_layers * hm.n_heads, hm.d_head
    one_head = d * n * d * 12 * 4 // 3 + 8
    one = similarity(hm, ids, SimilaritySettings(weights=False, cka="exact", cka_memory=one_head, batch_size=2))
    all_ = similarity(hm, ids, SimilaritySettings(weights=False, cka="exact", cka_memory=2**28, batch_size=2))
    assert one.meta["cka_blocks"] == n and all_.meta["cka_blocks"] == 1
    ref = StreamingCKA(n, d)
    for seq in ids:
        store: dict = {}
        with torch.no_grad(), capture_head_outputs(hm, store):
            hm.model(input_ids=torch.tensor([seq]), use_cache=False)
        ref.update(torch.cat([store[l][0] for l in range(hm.n_layers)], dim=1))
    r = torch.cat([torch.linalg.qr(layer_weights(hm, l).o.double())[1] for l in range(hm.n_layers)])
    for name, want in (("cka", ref.cka(r)), ("cka_z", ref.cka())):
        assert maxdiff(one[name], all_[name]) < 1e-6, (name, maxdiff(one[name], all_[name]))
        assert maxdiff(one[name], want) < 1e-5, (name, maxdiff(one[name], want))


@pytest.mark.real
def test_smollm2_exact_cka_in_56_mib_equals_the_2_4_gb_scatter(smollm2):
    """SmolLM2's 270 heads: the exact CKA computed in 56 MiB blocks (3 heads each, 90 reads of the spill) is
    today's exact CKA, the full (270 x 64)^2 float64 scatter (2.4 GB) held in memory, on 8 built-in passages."""
    settings = SimilaritySettings(limit=8, weights=False, cka="exact", cka_memory=56 * 2**20, js_max_tokens=8)
    sim = similarity(smollm2, None, settings)
    assert sim.meta["cka_blocks"] == 90
    n, d = smollm2.n_layers * smollm2.n_heads, smollm2.d_head
    ref = StreamingCKA(n, d)
    tokens = prepare_tokens(smollm2, None, resolve_max_length(smollm2, None), 8)
    for seq in tokens.ids:
        store: dict = {}
        with torch.no_grad(), capture_head_outputs(smollm2, store):
            smollm2.model(input_ids=torch.tensor([seq]), use_cache=False)
        ref.update(torch.cat([store[l][0] for l in range(smollm2.n_layers)], dim=1))
    assert ref.count == sim.meta["cka_tokens"]
    r = torch.cat([torch.linalg.qr(layer_weights(smollm2, l).o.double())[1] for l in range(smollm2.n_layers)])
    for name, want in (("cka", ref.cka(r)), ("cka_z", ref.cka())):
        assert maxdiff(sim[name], want) < 1e-5, (name, maxdiff(sim[name], want))
