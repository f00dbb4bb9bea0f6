"""Head similarity against known answers and independent references.

Known answers: a head whose Q/K/V/O weights are copied from another head of the same layer must be
the top pair with JS 0, CKA 1 and subspace cosines 1. References: scipy's Jensen-Shannon per query
on each passage run alone (no padding), CKA on explicitly built head contributions, scipy's
subspace_angles, and attention recomputed by hand from the weights the adapter reads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from scipy.spatial.distance import jensenshannon

from headscope import capture_head_outputs, on_attention_weights
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.learned.similarity import (
    LN2,
    MinibatchCKA,
    Similarity,
    SimilaritySettings,
    StreamingCKA,
    hsic1_linear,
    layer_weights,
    linear_cka,
    principal_cosines,
    similarity,
    weight_similarity,
)
from headscope.models.tiny import tiny_model

LENGTHS = (12, 9, 5, 7)


def passages(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 120, (n,), generator=g).tolist() for n in LENGTHS]


def maxdiff(a, b) -> float:
    return float(np.nanmax(np.abs(np.asarray(a, float) - np.asarray(b, float))))


# --- family-specific weight surgery, written independently of the adapter --------------------
def copy_head(hm, layer: int, src: int, dst: int) -> None:
    """Make query head `dst` of `layer` an exact copy of `src` (Q/K/V rows and W_O columns)."""
    d, D = hm.d_head, hm.d_model
    block = hm.layers[layer]
    with torch.no_grad():
        if hm.spec.family == "bert":
            att = block.attention.self
            for lin in (att.query, att.key, att.value):
                lin.weight[dst * d:(dst + 1) * d] = lin.weight[src * d:(src + 1) * d]
                lin.bias[dst * d:(dst + 1) * d] = lin.bias[src * d:(src + 1) * d]
            o = block.attention.output.dense.weight  # [D, H*d]
            o[:, dst * d:(dst + 1) * d] = o[:, src * d:(src + 1) * d]
        elif hm.spec.family == "gpt2":
            w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: [D, 3D], q|k|v columns
            for part in range(3):
                a, c = part * D + src * d, part * D + dst * d
                w[:, c:c + d] = w[:, a:a + d]
                b[c:c + d] = b[a:a + d]
            o = block.attn.c_proj.weight  # Conv1D: [H*d, D]
            o[dst * d:(dst + 1) * d] = o[src * d:(src + 1) * d]
        else:  # llama GQA: src and dst share a KV head, so only Q and O need copying
            assert src // hm.group_size == dst // hm.group_size
            q = block.self_attn.q_proj.weight
            q[dst * d:(dst + 1) * d] = q[src * d:(src + 1) * d]
            o = block.self_attn.o_proj.weight
            o[:, dst * d:(dst + 1) * d] = o[:, src * d:(src + 1) * d]


def module_out_slice(hm, layer: int, head: int) -> np.ndarray:
    """W_O^h as [D, d], read straight from the module."""
    d = hm.d_head
    block = hm.layers[layer]
    if hm.spec.family == "bert":
        w = block.attention.output.dense.weight[:, head * d:(head + 1) * d]
    elif hm.spec.family == "gpt2":
        w = block.attn.c_proj.weight[head * d:(head + 1) * d].T
    else:
        w = block.self_attn.o_proj.weight[:, head * d:(head + 1) * d]
    return w.detach().double().numpy()


def qkv_biases(hm, layer: int):
    """Q, K, V biases as [heads, d] (zeros for LLaMA, which has none)."""
    block, d, D = hm.layers[layer], hm.d_head, hm.d_model
    if hm.spec.family == "bert":
        a = block.attention.self
        return [lin.bias.detach().view(-1, d) for lin in (a.query, a.key, a.value)]
    if hm.spec.family == "gpt2":
        return [b.view(-1, d) for b in block.attn.c_attn.bias.detach().split(D)]
    return [torch.zeros(hm.n_heads, d), torch.zeros(hm.n_kv_heads, d), torch.zeros(hm.n_kv_heads, d)]


# --- known answer: a copied head ----------------------------------------------------------------
@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_copied_head_is_the_top_pair_with_js0_cka1(family):
    hm = tiny_model(family, init_std=0.2)
    src, dst = 0, 1  # llama: heads 0..2 share KV head 0
    copy_head(hm, 0, src, dst)
    sim = similarity(hm, passages(), SimilaritySettings(batch_size=3))
    top = sim.pairs().iloc[0]
    assert (top.head_a, top.head_b) == (f"L0H{src}", f"L0H{dst}"), sim.pairs().head(3).to_string()
    assert top.js < 1e-6, f"JS of identical heads {top.js}"
    assert abs(top.cka - 1) < 1e-5 and abs(top.cka_z - 1) < 1e-5, f"CKA {top.cka}, CKA(z) {top.cka_z}"
    for col in ("ov_angle_cos", "qk_angle_cos", "ov_write_cos", "ov_read_cos", "qk_query_cos", "qk_key_cos"):
        assert abs(top[col] - 1) < 1e-6, f"{col} = {top[col]}"
    runner_up = sim.pairs().iloc[1]
    assert runner_up.js > 1e-3, f"a second pair is also identical: {runner_up.to_dict()}"


# --- JS against scipy, per query, passages run alone ---------------------------------------------
def reference_js(hm, ids: list[list[int]]) -> np.ndarray:
    """Mean over queries of scipy's JS divergence (natural log), each passage run without padding."""
    n = hm.n_layers * hm.n_heads
    total, count = np.zeros((n, n)), 0
    for seq in ids:
        with torch.no_grad():
            out = hm.model(input_ids=torch.tensor([seq]), output_attentions=True, use_cache=False)
        probs = torch.cat([a[0] for a in out.attentions]).double().numpy()  # [N, q, k]
        for q in range(1 if hm.causal else 0, len(seq)):  # causal: query 0 has a single key
            keys = slice(0, q + 1) if hm.causal else slice(None)
            for i in range(n):
                for j in range(i + 1, n):
                    v = jensenshannon(probs[i, q, keys], probs[j, q, keys]) ** 2  # base e by default
                    total[i, j] += v
                    total[j, i] += v
            count += 1
    return total / count


def test_js_equals_scipy_per_query_reference(tiny):
    ids = passages(1)
    sim = similarity(tiny, ids, SimilaritySettings(batch_size=4, weights=False))  # padded batch
    ref = reference_js(tiny, ids)
    js = sim["js"]
    assert maxdiff(js, ref) < 1e-6, f"max |JS - scipy| = {maxdiff(js, ref):.3g}"
    assert np.array_equal(js, js.T)
    assert np.all(np.diag(js) == 0)
    assert js.min() >= 0 and js.max() <= LN2, (js.min(), js.max())


def test_js_bounds_reach_ln2_for_disjoint_distributions():
    from headscope.learned.similarity import js_divergence, pairwise_js_sums

    assert abs(js_divergence([1, 0], [0, 1]) - math.log(2)) < 1e-12
    # Two queries: identical (JS 0) then disjoint (JS ln 2): the sum is ln 2.
    p = torch.tensor([[0.5, 0.5, 1.0, 0.0], [0.5, 0.5, 0.0, 1.0]])
    s = pairwise_js_sums(p)
    assert abs(s[0, 1].item() - LN2) < 1e-6 and s[0, 0] == 0 and s[1, 1] == 0, s


# --- CKA ------------------------------------------------------------------------------------------
def test_streaming_cka_equals_batch_formula_on_random_data():
    g = torch.Generator().manual_seed(0)
    n, d, T = 5, 3, 200
    # Features with large, different means: the centring is what is being tested.
    x = torch.randn(T, n, d, generator=g, dtype=torch.float64) * 2 + torch.randn(n, d, generator=g,
                                                                                   dtype=torch.float64) * 10
    x[:, 1] = x[:, 0] @ torch.randn(d, d, generator=g, dtype=torch.float64) + 0.1 * x[:, 1]  # some similarity
    acc = StreamingCKA(n, d)
    for a, b in ((0, 7), (7, 60), (60, 61), (61, 200)):  # uneven batches, one of a single sample
        acc.update(x[a:b])
    w = torch.randn(n, 8, d, generator=g, dtype=torch.float64)  # per-group maps d -> 8 ("W_O")
    r = torch.linalg.qr(w)[1]
    got, got_w = acc.cka(), acc.cka(r)
    ref = np.array([[linear_cka(x[:, i], x[:, j]) for j in range(n)] for i in range(n)])
    y = torch.einsum("tid,ied->tie", x, w)  # explicit contributions y_i = W_i x_i
    ref_w = np.array([[linear_cka(y[:, i], y[:, j]) for j in range(n)] for i in range(n)])
    assert maxdiff(got, ref) < 1e-10, f"streaming vs batch CKA: {maxdiff(got, ref):.3g}"
    assert maxdiff(got_w, ref_w) < 1e-10, f"streaming CKA through W vs explicit: {maxdiff(got_w, ref_w):.3g}"
    # float32 input (the model's dtype) stays within 1e-6 thanks to per-batch centring.
    acc32 = StreamingCKA(n, d)
    for a, b in ((0, 100), (100, 200)):
        acc32.update(x[a:b].float())
    assert maxdiff(acc32.cka(), ref) < 1e-6, f"float32 streaming CKA: {maxdiff(acc32.cka(), ref):.3g}"


def test_linear_cka_invariant_to_rotation_and_isotropic_scaling_only():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(100, 6, generator=g, dtype=torch.float64)
    y = x @ torch.randn(6, 4, generator=g, dtype=torch.float64) + 0.5 * torch.randn(100, 4, generator=g,
                                                                                    dtype=torch.float64)
    base = linear_cka(x, y)
    q = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))[0]
    assert abs(linear_cka(x @ q * 3.7, y) - base) < 1e-12
    assert abs(linear_cka(x, y * 0.01 + 5) - base) < 1e-12
    assert abs(linear_cka(x, x) - 1) < 1e-12
    stretched = x * torch.tensor([10.0, 1, 1, 1, 1, 0.1], dtype=torch.float64)
    assert abs(linear_cka(stretched, y) - base) > 1e-3  # not invariant to anisotropic scaling


def test_cka_on_model_equals_explicit_contributions(tiny):
    ids = passages(2)
    sim = similarity(tiny, ids, SimilaritySettings(batch_size=4, weights=False, cka="exact"))
    zs: list[np.ndarray] = []
    for seq in ids:  # each passage alone: no padding anywhere
        store: dict = {}
        with torch.no_grad(), capture_head_outputs(tiny, store):
            tiny.model(input_ids=torch.tensor([seq]), use_cache=False)
        zs.append(torch.cat([store[l][0] for l in range(tiny.n_layers)], dim=1).double().numpy())  # [T, N, d]
    z = np.concatenate(zs)
    n = tiny.n_layers * tiny.n_heads
    contrib = [z[:, i] @ module_out_slice(tiny, i // tiny.n_heads, i % tiny.n_heads).T for i in range(n)]
    ref = np.array([[linear_cka(contrib[i], contrib[j]) for j in range(n)] for i in range(n)])
    ref_z = np.array([[linear_cka(z[:, i], z[:, j]) for j in range(n)] for i in range(n)])
    assert maxdiff(sim["cka"], ref) < 1e-5, f"max |CKA - explicit| = {maxdiff(sim['cka'], ref):.3g}"
    assert maxdiff(sim["cka_z"], ref_z) < 1e-5, f"max |CKA(z) - explicit| = {maxdiff(sim['cka_z'], ref_z):.3g}"
    assert sim.meta["cka_tokens"] == sum(len(s) for s in ids)


def test_padding_does_not_change_js_or_cka(tiny):
    ids = passages(3)
    alone = similarity(tiny, ids, SimilaritySettings(batch_size=1, weights=False))  # no padding
    padded = similarity(tiny, ids, SimilaritySettings(batch_size=len(ids), weights=False))  # all but one row padded
    assert maxdiff(alone["js"], padded["js"]) < 1e-6, maxdiff(alone["js"], padded["js"])
    assert maxdiff(alone["cka"], padded["cka"]) < 1e-5, maxdiff(alone["cka"], padded["cka"])
    assert alone.meta["js_queries"] == padded.meta["js_queries"]


def test_js_max_tokens_samples_queries(tiny):
    ids = passages(4)
    full = similarity(tiny, ids, SimilaritySettings(weights=False))
    few = similarity(tiny, ids, SimilaritySettings(weights=False, js_max_tokens=10, seed=1))
    assert few.meta["js_queries"] == 10 and full.meta["js_queries"] > 10
    assert maxdiff(few["cka"], full["cka"]) < 1e-6  # CKA always uses every token
    assert maxdiff(few["js"], full["js"]) > 0  # a different set of queries
    with pytest.raises(HeadscopeError, match="at least 1"):
        similarity(tiny, ids, SimilaritySettings(js_max_tokens=0))


# --- minibatch CKA --------------------------------------------------------------------------------
def test_hsic1_closed_form_equals_gram_formula_and_ignores_shifts():
    """MinibatchCKA's centred closed form of HSIC_1 equals Song et al.'s Gram formula (hsic1_linear),
    computed directly, on one minibatch of random features, through a per-group transform too."""
    g = torch.Generator().manual_seed(5)
    n_groups, d, n = 4, 3, 37
    x = torch.randn(n, n_groups, d, generator=g, dtype=torch.float64) + 7.0  # a large mean
    x[:, 1] = x[:, 0] @ torch.randn(d, d, generator=g, dtype=torch.float64) + 0.3 * x[:, 1]
    r = torch.randn(n_groups, 5, d, generator=g, dtype=torch.float64)
    acc = MinibatchCKA(n_groups, d, batch=n, transforms={"raw": None, "w": r}, pool=n)
    acc.update(x)
    cka = acc.cka()
    assert acc.minibatches == 1 and acc.count == n
    y = torch.einsum("tnd,nkd->tnk", x, r)
    for name, f in (("raw", x), ("w", y)):
        h = np.array([[hsic1_linear(f[:, i], f[:, j]) for j in range(n_groups)] for i in range(n_groups)])
        got = acc.sums[name].numpy() / n
        assert maxdiff(got, h) < 1e-9 * np.abs(h).max(), f"{name}: {maxdiff(got, h):.3g}"
        ref = h / np.sqrt(np.outer(np.diag(h), np.diag(h)))
        assert maxdiff(cka[name], ref) < 1e-10, f"{name}: {maxdiff(cka[name], ref):.3g}"
    # the Gram formula on uncentred features cancels terms ~(100 / spread)^4 larger than its result:
    # float64 keeps about 8 digits of it here
    shifted = hsic1_linear(x[:, 0] + 100.0, x[:, 1] - 3.0)
    assert abs(shifted - hsic1_linear(x[:, 0], x[:, 1])) < 1e-6 * abs(shifted)


def test_minibatch_cka_averages_minibatches_drawn_from_the_pool():
    """Several minibatches: the sums are the size-weighted HSIC_1 of the pool's seeded draws, every
    sample is used once, and the result does not depend on how the stream was cut into updates."""
    g = torch.Generator().manual_seed(6)
    n_groups, d, n = 3, 4, 70
    x = torch.randn(n, n_groups, d, generator=g, dtype=torch.float64)
    x[:, 2] = x[:, 0] + 0.5 * x[:, 2]
    acc = MinibatchCKA(n_groups, d, batch=16, pool=n)
    acc.update(x[:30])
    acc.update(x[30:])
    acc.finish()
    assert acc.count == n and acc.minibatches == 5  # 4 x 16, then the last 6 (4 .. batch + 3 samples)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    parts = [perm[0:16], perm[16:32], perm[32:48], perm[48:64], perm[64:]]
    ref = sum(len(p) * np.array([[hsic1_linear(x[p, i], x[p, j]) for j in range(n_groups)]
                                 for i in range(n_groups)]) for p in parts)
    assert maxdiff(acc.sums["cka"].numpy(), ref) < 1e-9 * np.abs(ref).max()
    whole = MinibatchCKA(n_groups, d, batch=16, pool=n)
    whole.update(x)
    assert maxdiff(whole.cka()["cka"], acc.cka()["cka"]) < 1e-12


def test_minibatch_pool_uses_every_sample_once_whatever_the_updates(monkeypatch):
    """The pool is one buffer filled in place: with draws while the stream goes on (pool 20, minibatches of 8,
    updates of 7, 13, 1, 30 and 9 samples), every sample lands in exactly one minibatch, every minibatch but the
    last holds 8, and the pool never holds more than pool + batch rows."""
    acc = MinibatchCKA(1, 1, batch=8, pool=20)
    seen: list[list[int]] = []
    monkeypatch.setattr(acc, "_add", lambda x: seen.append([int(v) for v in x[:, 0, 0]]))
    t = 0
    for size in (7, 13, 1, 30, 9):
        acc.update(torch.arange(t, t + size, dtype=torch.float32).view(size, 1, 1))
        t += size
        assert acc._buf.shape[0] == 28 and 0 <= acc._n <= 27
    acc.finish()
    assert sorted(i for mb in seen for i in mb) == list(range(t))
    assert [len(mb) for mb in seen[:-1]] == [8] * (len(seen) - 1) and 4 <= len(seen[-1]) <= 8 + 3


def test_minibatch_cka_tracks_exact_cka_on_many_samples():
    """Independent samples (no passages): with 40 minibatches the estimate is within 0.01 of the exact
    full-data CKA on every pair (both estimate the same population CKA; their gap shrinks with data)."""
    g = torch.Generator().manual_seed(7)
    n_groups, d, n = 6, 8, 10240
    x = torch.randn(n, n_groups, d, generator=g)
    mix = torch.randn(n_groups, n_groups, generator=g) * 0.6
    x = torch.einsum("tnd,mn->tmd", x, torch.eye(n_groups) + mix)  # correlated groups: CKA 0.1 .. 0.9
    acc = MinibatchCKA(n_groups, d, batch=256, pool=1024)
    for s in range(0, n, 500):
        acc.update(x[s:s + 500])
    exact = StreamingCKA(n_groups, d)
    exact.update(x)
    got, ref = acc.cka()["cka"], exact.cka()
    assert np.ptp(ref[np.triu_indices(n_groups, 1)]) > 0.3  # a real range of similarities
    assert maxdiff(got, ref) < 0.01, f"minibatch vs exact CKA: {maxdiff(got, ref):.4f}"


def test_minibatch_cka_options_are_checked():
    with pytest.raises(HeadscopeError, match="at least 8"):
        MinibatchCKA(2, 3, batch=4)
    with pytest.raises(HeadscopeError, match="pool"):
        MinibatchCKA(2, 3, pool=-1)
    acc = MinibatchCKA(2, 3, batch=8)
    acc.update(torch.randn(3, 2, 3))
    with pytest.raises(HeadscopeError, match="at least 4 tokens"):
        acc.cka()
    with pytest.raises(HeadscopeError, match="not one of"):
        similarity(tiny_model("gpt2"), [[5, 6, 7]], SimilaritySettings(cka="biased"))


@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_minibatch_cka_on_real_models(name, request):
    """Real weights, the first 8 built-in sentences (~200 tokens: one minibatch of 256). The minibatch
    estimate equals the unbiased HSIC CKA computed directly from the head outputs (hsic1_linear, 40
    pairs). Against the exact full-data CKA (a biased estimator) it is lower on average and finds no
    cluster the exact one does not: on ~200 tokens the biased CKA is inflated (measured up to 0.09 on
    MiniLM, shrinking with the tokens: docs/similarity.md), so the 0.01 agreement of issue 12 is not
    reachable at this size by any unbiased estimator."""
    from headscope.data import read_texts

    hm = request.getfixturevalue(name)
    texts = read_texts(None).texts[:8]
    mini = similarity(hm, texts, SimilaritySettings(weights=False))
    assert mini.meta["cka_minibatches"] == 1
    store: dict = {}
    zs = []
    for seq in mini_ids(hm, texts):
        with torch.no_grad(), capture_head_outputs(hm, store):
            hm.model(input_ids=torch.tensor([seq]), use_cache=False)
        zs.append(torch.cat([store[l][0] for l in range(hm.n_layers)], dim=1).double())  # [T, N, d]
    z = torch.cat(zs)
    rng = np.random.default_rng(0)
    for i, j in rng.integers(0, mini.n, size=(40, 2)):
        h = hsic1_linear(z[:, i], z[:, j]) / math.sqrt(hsic1_linear(z[:, i], z[:, i]) * hsic1_linear(z[:, j], z[:, j]))
        assert abs(mini["cka_z"][i, j] - h) < 1e-4, (i, j, mini["cka_z"][i, j], h)
    exact = similarity(hm, texts, SimilaritySettings(weights=False, cka="exact"))
    assert maxdiff(exact["js"], mini["js"]) == 0  # JS does not depend on the CKA estimator
    iu = np.triu_indices(mini.n, 1)
    gap = mini["cka"][iu] - exact["cka"][iu]
    assert gap.mean() < 0, f"mean gap {gap.mean():.4f}"  # the biased estimator's inflation, removed
    exact_clusters = [set(c["heads"]) for c in exact.clusters()]
    for c in mini.clusters():  # lower, never inflated: every near-duplicate group is one the exact CKA finds
        assert any(set(c["heads"]) <= e for e in exact_clusters), (c["heads"], exact_clusters)


def mini_ids(hm, texts):
    from headscope.data import prepare_tokens, resolve_max_length

    return prepare_tokens(hm, texts, resolve_max_length(hm, None)).ids


# --- weights --------------------------------------------------------------------------------------
def test_principal_cosines_match_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(20, 4)), rng.normal(size=(20, 6))
    b[:, :2] = a[:, :2] @ rng.normal(size=(2, 2))  # two shared directions -> two cosines of 1
    got = principal_cosines(a, b)
    ref = np.sort(np.cos(scipy.linalg.subspace_angles(a, b)))[::-1]
    assert maxdiff(got, ref) < 1e-10, (got, ref)
    assert abs(got[0] - 1) < 1e-10 and abs(got[1] - 1) < 1e-10
    low = np.column_stack([a[:, 0], 2 * a[:, 0], a[:, 1]])  # rank 2
    got = principal_cosines(low, b)
    ref = np.sort(np.cos(scipy.linalg.subspace_angles(low[:, [0, 2]], b)))[::-1]
    assert len(got) == 2 and maxdiff(got, ref) < 1e-10, (got, ref)


def test_weight_similarity_matches_scipy_on_module_weights(tiny):
    w = weight_similarity(tiny)
    H = tiny.n_heads
    for i, j in ((0, 1), (0, H + 2), (H - 1, 2 * H - 1)):
        a = module_out_slice(tiny, i // H, i % H)
        b = module_out_slice(tiny, j // H, j % H)
        ref = np.cos(scipy.linalg.subspace_angles(a, b)).mean()
        assert abs(w["ov_write_cos"][i, j] - ref) < 1e-8, (i, j, w["ov_write_cos"][i, j], ref)
    for name, m in w.items():
        assert np.allclose(m, m.T) and np.allclose(np.diag(m), 1), name
        assert m.min() > 0 and m.max() <= 1 + 1e-12, name


def test_gqa_heads_of_one_kv_group_share_read_and_key_subspaces():
    hm = tiny_model("llama", init_std=0.2)  # 6 query heads, 2 KV heads: groups {0,1,2}, {3,4,5}
    w = weight_similarity(hm)
    same = [(0, 1), (0, 2), (3, 5)]
    other = [(0, 3), (2, 4)]
    for i, j in same:
        assert abs(w["ov_read_cos"][i, j] - 1) < 1e-9 and abs(w["qk_key_cos"][i, j] - 1) < 1e-9
        assert w["ov_write_cos"][i, j] < 0.99 and w["qk_query_cos"][i, j] < 0.99
    for i, j in other:
        assert w["ov_read_cos"][i, j] < 0.99 and w["qk_key_cos"][i, j] < 0.99


def test_circuit_spaces_are_the_factor_spaces(tiny):
    """The OV circuit W_O^h W_V^g writes into col(W_O^h) and reads row(W_V^g) (full-rank factors)."""
    for layer in range(tiny.n_layers):
        w = layer_weights(tiny, layer)
        for h in range(tiny.n_heads):
            g = h // tiny.group_size
            ov = (w.o[h] @ w.v[g]).double().numpy()  # [D, D], rank d_head
            u, s, vh = np.linalg.svd(ov)
            r = tiny.d_head
            assert s[r - 1] > 1e-6 * s[0], "OV circuit should have full rank d_head"
            assert np.allclose(principal_cosines(u[:, :r], w.o[h].double().numpy()), 1, atol=1e-8)
            assert np.allclose(principal_cosines(vh[:r].T, w.v[g].T.double().numpy()), 1, atol=1e-8)


def test_layer_weights_recompute_the_attention(tiny):
    """Q/K (no RoPE families) and V read by the adapter reproduce the model's probabilities and z."""
    ids = torch.tensor([passages(5)[0]])
    inputs, probs, zs = {}, {}, {}
    hooks = [tiny.attention(l).register_forward_pre_hook(
        lambda m, a, kw, l=l: inputs.__setitem__(l, (a[0] if a else kw["hidden_states"]).detach()),
        with_kwargs=True) for l in range(tiny.n_layers)]
    try:
        with torch.no_grad(), on_attention_weights(tiny, lambda l, p: probs.__setitem__(l, p)), \
                capture_head_outputs(tiny, zs):
            tiny.model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    for layer in range(tiny.n_layers):
        w, (bq, bk, bv) = layer_weights(tiny, layer), qkv_biases(tiny, layer)
        x = inputs[layer][0]  # [T, D]
        kv = torch.arange(tiny.n_heads) // tiny.group_size
        v = torch.einsum("hdD,tD->htd", w.v, x) + bv[:, None]  # [G, T, d]
        z = torch.einsum("hqk,hkd->qhd", probs[layer][0], v[kv])
        assert maxdiff(z, zs[layer][0]) < 1e-5, f"L{layer} z from W_V: {maxdiff(z, zs[layer][0]):.3g}"
        if tiny.spec.family != "llama":  # LLaMA rotates q and k (RoPE) between projection and scores
            q = torch.einsum("hdD,tD->htd", w.q, x) + bq[:, None]
            k = torch.einsum("hdD,tD->htd", w.k, x) + bk[:, None]
            scores = q @ k[kv].transpose(-1, -2) / math.sqrt(tiny.d_head)
            if tiny.causal:
                scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf"))
            p = scores.softmax(-1)
            assert maxdiff(p, probs[layer][0]) < 1e-5, (
                f"L{layer} probs from W_Q, W_K: {maxdiff(p, probs[layer][0]):.3g}"
            )


# --- clusters, files, CLI -------------------------------------------------------------------------
def test_clusters_require_every_pair_to_qualify():
    n = 5
    js = np.full((n, n), 0.3)
    cka = np.full((n, n), 0.1)
    np.fill_diagonal(js, 0)
    np.fill_diagonal(cka, 1)

    def pair(i, j, a, b):
        js[i, j] = js[j, i] = a
        cka[i, j] = cka[j, i] = b

    pair(0, 1, 0.01, 0.95)
    pair(0, 2, 0.02, 0.90)
    pair(1, 2, 0.03, 0.85)
    pair(2, 3, 0.04, 0.82)  # 3 qualifies with 2 but not with 0 and 1: single linkage would chain it in
    pair(0, 4, 0.01, 0.5)  # low JS but different outputs: not a duplicate
    sim = Similarity(1, n, {"js": js, "cka": cka})
    clusters = sim.clusters(js_max=0.05, cka_min=0.8)
    assert [c["heads"] for c in clusters] == [["L0H0", "L0H1", "L0H2"]], clusters
    assert clusters[0]["max_js"] == 0.03 and clusters[0]["min_cka"] == 0.85
    # Complete linkage is greedy, so which qualifying group forms depends on merge order, but every
    # pair inside every cluster always qualifies.
    js[2, 3] = js[3, 2] = 0.01
    for c in Similarity(1, n, {"js": js, "cka": cka}).clusters(js_max=0.05, cka_min=0.8):
        idx = [sim.index(h) for h in c["heads"]]
        assert all(js[i, j] <= 0.05 and cka[i, j] >= 0.8 for i in idx for j in idx), c
    assert sim.clusters(js_max=0.005, cka_min=0.8) == []
    with pytest.raises(HeadscopeError, match="ln 2"):
        sim.clusters(js_max=1.0)


def test_pairs_table_and_npz_round_trip(tmp_path):
    hm = tiny_model("gpt2", init_std=0.2)
    sim = similarity(hm, passages(), SimilaritySettings(batch_size=2))
    df = sim.pairs()
    n = sim.n
    assert list(df.columns[:6]) == ["head_a", "head_b", "js", "cka", "ov_angle_cos", "qk_angle_cos"]
    assert len(df) == n * (n - 1) // 2 and df["js"].is_monotonic_increasing
    row = df.iloc[5]
    assert sim.pair(row.head_a, row.head_b)["js"] == row.js
    sim.to_npz(tmp_path / "s.npz")
    back = Similarity.from_npz(tmp_path / "s.npz")
    assert back.head_names() == sim.head_names() and back.meta["model"] == sim.meta["model"]
    for k, m in sim.matrices.items():
        assert np.array_equal(back[k], m), k


def test_cli_writes_outputs_and_refuses_overwrite(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["similar", "minilm", "--limit", "3", "--out", str(out), "--top", "5", "--js-max-tokens", "30"])
    assert rc == 0
    text = capsys.readouterr().out
    import json

    import pandas as pd

    df = pd.read_csv(out / "similar_pairs.csv")
    assert len(df) == 72 * 71 // 2 and df["js"].is_monotonic_increasing
    assert df.iloc[0].head_a in text and df.iloc[0].head_b in text
    assert Similarity.from_npz(out / "similarity.npz")["cka"].shape == (72, 72)
    assert "clusters" in json.loads((out / "clusters.json").read_text())
    assert main(["similar", "minilm", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["similar", "minilm", "--out", str(tmp_path / "p"), "--cka-min", "1.5"]) == 2


def test_cli_refuses_bad_cka_options_before_loading(tmp_path, capsys, monkeypatch):
    from headscope.options import ModelOptions

    monkeypatch.setattr(ModelOptions, "load", lambda options: pytest.fail("the model loaded"))
    assert main(["similar", "minilm", "--out", str(tmp_path / "a"), "--cka-batch", "4"]) == 2
    assert "at least 8" in capsys.readouterr().err
    assert main(["similar", "minilm", "--out", str(tmp_path / "b"), "--cka-pool", "-1"]) == 2
    assert "--cka-pool" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --- real weights ---------------------------------------------------------------------------------
def test_minilm_broad_heads_l0h7_l0h11_are_the_closest_patterns(minilm):
    """Measured on MiniLM: L0H7 and L0H11 are the lowest-JS pair on the first 6, the first 10 and all
    57 sentences of the built-in sample (JS 0.036-0.040 nats, median pair ~0.23). Both are near-uniform
    'broad' heads (normalised entropy 0.92-0.94): two flat distributions are close in JS whatever
    they attend to, so pattern similarity alone flags broad heads as look-alikes. Their outputs are
    not duplicates (CKA ~0.35 on the full sample), which is why clusters also require CKA."""
    from headscope.data import read_texts
    from headscope.learned.analyze import analyze

    texts = read_texts(None).texts[:6]
    sim = similarity(minilm, texts, SimilaritySettings(weights=False))
    top = sim.pairs().iloc[0]
    assert (top.head_a, top.head_b) == ("L0H7", "L0H11"), sim.pairs().head(3).to_string()
    assert top.js < 0.25 * sim.pairs()["js"].median()
    table = analyze(minilm, texts)
    assert table["entropy_norm"][0, 7] > 0.9 and table["entropy_norm"][0, 11] > 0.9


def test_causal_model_with_only_one_token_passages_is_a_clear_error():
    hm = tiny_model("gpt2", init_std=0.2)
    with pytest.raises(HeadscopeError, match="at least 2 tokens"):
        similarity(hm, [[5], [7]])
