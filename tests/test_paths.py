"""Path patching (headscope.learned.causal.paths) against a by-hand implementation and a planted circuit."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from headscope.learned.causal.pairs import induction_pairs
from headscope.learned.causal.patching import logits_at, metric_values
from headscope.learned.causal.paths import PathJob, path_jobs, path_scan
from headscope.models.tiny import tiny_model
from headscope.uncertainty import IntervalSettings


def _receiver_channels(hm, layer, via, head):
    """The projection module and output channels of a receiver's q (or its KV group's k, v), written out per family
    from transformers' own modules, without the adapter's layout code."""
    block, d, H, G = hm.layers[layer], hm.d_head, hm.n_heads, hm.n_kv_heads
    kv = head // (H // G)
    family = hm.spec.family
    if family == "gpt2":  # c_attn: [all q | all k | all v]
        start = {"q": head * d, "k": H * d + kv * d, "v": H * d + G * d + kv * d}[via]
        return block.attn.c_attn, torch.arange(start, start + d)
    if family == "phi3":  # qkv_proj: [all q | all k | all v]
        start = {"q": head * d, "k": H * d + kv * d, "v": H * d + G * d + kv * d}[via]
        return block.self_attn.qkv_proj, torch.arange(start, start + d)
    if family == "gpt_neox":  # query_key_value: [h0 q, h0 k, h0 v, h1 q, ...]
        start = 3 * head * d + "qkv".index(via) * d
        return block.attention.query_key_value, torch.arange(start, start + d)
    mod = getattr(block.self_attn, f"{via}_proj")
    if family == "qwen3_5" and via == "q":  # q_proj: [h0 query, h0 gate, h1 query, ...]
        return mod, torch.arange(2 * head * d, 2 * head * d + d)
    start = (head if via == "q" else kv) * d
    return mod, torch.arange(start, start + d)


def _run(hm, b, ids, pre=None, post=None):
    """The metric per pair with forward pre-hooks {module: fn(args)} and forward hooks {module: fn(out)}."""
    handles = [m.register_forward_pre_hook(lambda mod, args, f=f: f(args)) for m, f in (pre or {}).items()]
    handles += [m.register_forward_hook(lambda mod, args, out, f=f: f(out)) for m, f in (post or {}).items()]
    try:
        with torch.no_grad():
            return metric_values(logits_at(hm, ids, b.mask, b.position), b.answer, b.wrong, "logit_diff")
    finally:
        for h in handles:
            h.remove()


def _by_hand(hm, b, senders, receiver, via):
    """Denoising path patching, three runs by hand: the head outputs (out-projection inputs) of clean and corrupt;
    the corrupt run with every head frozen at corrupt but the senders at clean, recording the receiver's projection
    (or the metric, for the logits); the corrupt run with the receiver's channels from that record."""
    d, outs = hm.d_head, [hm.out_proj(l) for l in range(hm.n_layers) if hm.heads_in_layer(l)]
    layer_of = {hm.out_proj(l): l for l in range(hm.n_layers) if hm.heads_in_layer(l)}
    clean, corrupt = {}, {}
    _run(hm, b, b.clean, pre={m: lambda a, m=m: clean.__setitem__(m, a[0].clone()) for m in outs})
    _run(hm, b, b.corrupt, pre={m: lambda a, m=m: corrupt.__setitem__(m, a[0].clone()) for m in outs})

    def frozen(m):
        def f(args):
            x = corrupt[m].clone()
            for layer, head in senders:
                if layer_of[m] == layer:
                    x[..., head * d:(head + 1) * d] = clean[m][..., head * d:(head + 1) * d]
            return (x,)
        return f

    freeze = {m: frozen(m) for m in outs}
    if receiver is None:
        return _run(hm, b, b.corrupt, pre=freeze).double().numpy()
    mod, ch = _receiver_channels(hm, receiver[0], via, receiver[1])
    seen = {}
    _run(hm, b, b.corrupt, pre=freeze, post={mod: lambda out: seen.__setitem__("x", out.clone())})

    def swap(out):
        out = out.clone()
        out[..., ch] = seen["x"][..., ch]
        return out

    return _run(hm, b, b.corrupt, post={mod: swap}).double().numpy()


@pytest.mark.parametrize("family,overrides", [
    ("llama", {"num_hidden_layers": 3}),  # GQA; a frozen layer between sender and receiver
    ("gpt2", {}),  # fused [q | k | v] Conv1D
    ("phi3", {}),  # fused Linear
    ("gpt_neox", {}),  # fused per head
    ("qwen3_5_text", {}),  # gated query rows; a headless first layer
])
def test_path_patching_equals_a_by_hand_implementation(family, overrides):
    hm = tiny_model(family, **overrides)
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=3)
    last = hm.n_layers - 1
    receivers = [(last, 0), (last, hm.n_heads - 1)]
    got = path_scan(hm, b, receivers, batch_size=3, copies=5)
    assert len(got.jobs) == len(path_jobs(hm, receivers))
    for i, j in enumerate(got.jobs):
        if j.receiver is None and j.sender[0][1] % 2 == 1:
            continue  # every other direct path is enough; all receiver paths are checked
        want = _by_hand(hm, b, j.sender, j.receiver, j.via)
        np.testing.assert_allclose(got.runs.patched[:, i], want, rtol=1e-4, atol=1e-5, err_msg=str(j))


def test_a_set_of_senders_patched_together_equals_the_by_hand_runs():
    """Wang et al.'s classes of heads: heads of two layers patched together as one sender, into a receiver after
    both (LLaMA GQA, 3 layers), equal to the by-hand runs; a set of one head is that head's own path."""
    hm = tiny_model("llama", num_hidden_layers=3)
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=6)
    group = [(1, 2), (0, 4), (0, 1)]
    got = path_scan(hm, b, [(2, 3)], group=group, batch_size=3, copies=4)
    assert [(j.sender, j.receiver, j.via) for j in got.jobs] == [
        (((0, 1), (0, 4), (1, 2)), None, "direct"), *[(((0, 1), (0, 4), (1, 2)), (2, 3), v) for v in "qkv"]]
    for i, j in enumerate(got.jobs):
        np.testing.assert_allclose(got.runs.patched[:, i], _by_hand(hm, b, j.sender, j.receiver, j.via), rtol=1e-4,
                                   atol=1e-5, err_msg=str(j))
    alone = path_scan(hm, b, [(2, 3)], group=[(1, 2)], copies=4)
    every = path_scan(hm, b, [(2, 3)], copies=6)
    row = {(j.sender, j.receiver, j.via): every.runs.patched[:, i] for i, j in enumerate(every.jobs)}
    for i, j in enumerate(alone.jobs):
        np.testing.assert_allclose(alone.runs.patched[:, i], row[j.sender, j.receiver, j.via], rtol=1e-5, atol=1e-6)
    assert got.rows(IntervalSettings(B=200))[0]["sender"] == "L0H1+L0H4+L1H2"


def test_a_k_or_v_path_reaches_the_receivers_whole_kv_group():
    """GQA: heads 0 and 1 of a layer share a KV head, so a K or V path into either is the same patch (the same
    numbers), while their Q paths differ."""
    hm = tiny_model("llama")
    assert hm.group_size > 1
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=5)
    got = path_scan(hm, b, [(1, 0), (1, 1)], copies=6)
    by = {(j.sender, j.receiver, j.via): got.runs.patched[:, i] for i, j in enumerate(got.jobs)}
    for s in [((0, h),) for h in range(hm.n_heads)]:
        for via in ("k", "v"):
            np.testing.assert_array_equal(by[s, (1, 0), via], by[s, (1, 1), via])
    assert any(not np.allclose(by[s, (1, 0), "q"], by[s, (1, 1), "q"]) for s in [((0, h),) for h in range(hm.n_heads)])


def test_a_last_layer_heads_direct_path_is_its_exact_patch():
    """Nothing comes after a head of the last layer to freeze: its path to the logits is its activation patch."""
    from headscope.learned.causal.patching import exact_scan

    hm = tiny_model("llama")
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=4)
    paths = path_scan(hm, b, [], copies=4)
    exact = exact_scan(hm, b, copies=4)
    last = hm.n_layers - 1
    for i, j in enumerate(paths.jobs):
        (layer, head), = j.sender
        if layer == last:
            np.testing.assert_allclose(paths.runs.patched[:, i], exact.patched[:, last, head], rtol=1e-5,
                                       atol=1e-6)


def _planted(hm):
    """Layer 0 head 2 writes a subspace U that nothing else in layer 0 writes (the other heads' and the MLP's
    writes are projected off U); layer 1 head 4's keys read only U. The path L0H2 -> L1H4 via k is the only
    path into L1H4's keys but for the norm's scale, which every head's write changes."""
    d, D = hm.d_head, hm.d_model
    u = torch.linalg.qr(torch.randn(D, d, generator=torch.Generator().manual_seed(0)))[0]  # [D, d] orthonormal
    off = torch.eye(D) - u @ u.T
    w0, w1 = hm.qkv_weights(0), hm.qkv_weights(1)
    v0, o0, k1 = w0.v.clone(), off @ hm.out_weight(0), w1.k.clone()
    v0[2 * d:3 * d] = u.T
    o0[:, 2 * d:3 * d] = 3 * u
    k1[4 * d:5 * d] = u.T
    hm.set_qkv_weights(0, type(w0)(w0.q, w0.k, v0))
    hm.set_out_weight(0, o0)
    hm.set_qkv_weights(1, type(w1)(w1.q, k1, w1.v))
    down = hm.layers[0].mlp.down_proj
    with torch.no_grad():
        down.weight.copy_(off @ down.weight)


def test_path_patching_and_k_composition_recover_a_planted_pair():
    from headscope.learned.causal.composition import composition, top_pairs

    hm = tiny_model("llama", num_key_value_heads=6)
    _planted(hm)
    b = induction_pairs(None, hm.vocab_size, n=6, length=6, seed=0)
    got = path_scan(hm, b, [(1, h) for h in range(hm.n_heads)], copies=8)
    r = got.runs
    effect = (r.patched.mean(0) - r.corrupt.mean()) / (r.clean.mean() - r.corrupt.mean())
    k_paths = {(j.sender[0], j.receiver): abs(effect[i]) for i, j in enumerate(got.jobs) if j.via == "k"}
    into = {s: v for (s, r), v in k_paths.items() if r == (1, 4)}
    assert max(into, key=into.get) == (0, 2)
    # the other senders reach L1H4's keys only through the norm's scale: three orders of magnitude less
    assert all(v < 1e-2 * into[(0, 2)] for s, v in into.items() if s != (0, 2))
    assert max(k_paths, key=k_paths.get) == ((0, 2), (1, 4))
    assert top_pairs(composition(hm)["k"], 1)[0][:4] == (0, 2, 1, 4)
    assert PathJob(((0, 2),), (1, 4), "k") in got.jobs


@pytest.mark.parametrize("family, paths, says", [
    ("llama", "L7H0", "receiver L7H0 is not a head of tiny-llama: it has layers 0-1"),
    ("llama", "L1H9", "receiver L1H9 is not a head of tiny-llama: layer 1 has heads [0, 1, 2, 3, 4, 5]"),
    ("deepseek_v3", "1", "multi-head latent attention has no per-head Linear Q/K/V"),
    ("llama", "L1H0 --senders L0H6", "sender L0H6 is not a head of tiny-llama: layer 0 has heads [0, 1, 2, 3, 4, 5]"),
])
def test_receivers_a_model_cannot_have_are_refused_before_any_forward(family, paths, says):
    import headscope

    hm = tiny_model(family)
    b = induction_pairs(None, hm.vocab_size, n=2, length=4, seed=0)
    calls = []
    handle = hm.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(headscope.HeadscopeError, match=re.escape(says)):
            paths, _, senders = paths.partition(" --senders ")
            headscope.patch(hm, b, paths=paths, senders=senders or None, bootstrap=200)
    finally:
        handle.remove()
    assert not calls
    if family == "deepseek_v3":  # paths to the logits need no Q/K/V channels
        assert len(headscope.patch(hm, b, paths="logits", bootstrap=200).paths) == hm.n_layers * hm.n_heads


def test_patch_with_a_set_of_senders_from_python():
    import headscope

    hm = tiny_model("llama")
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=7)
    res = headscope.patch(hm, b, paths="L1H3", senders="L0H2,L0H1", bootstrap=200)
    assert [(r["sender"], r["receiver"], r["via"]) for r in res.paths] == [
        ("L0H1+L0H2", "logits", "direct"), *[("L0H1+L0H2", "L1H3", v) for v in "qkv"]]
    assert res.record.paths["senders"] == "L0H1+L0H2 together"
    assert any("senders: L0H1+L0H2 together" in line for line in res.lines())
