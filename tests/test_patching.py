"""Activation and attribution patching (headscope.learned.causal) against hand-built references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.learned.causal.pairs import induction_pairs
from headscope.learned.causal.patching import exact_scan, logits_at, metric_values
from headscope.models.tiny import tiny_model


def _by_hand(hm, b, layer, head, metric, position=None):
    """The corrupt run with head (layer, head)'s slice of the out-projection input replaced by the clean run's."""
    d = hm.d_head
    saved = {}

    def keep(module, args):
        saved["x"] = args[0].detach().clone()

    def replace(module, args):
        x = args[0].clone()
        at = slice(None) if position is None else slice(position, position + 1)
        x[:, at, head * d:(head + 1) * d] = saved["x"][:, at, head * d:(head + 1) * d]
        return (x,)

    proj = hm.out_proj(layer)
    with torch.no_grad():
        h = proj.register_forward_pre_hook(keep)
        try:
            logits_at(hm, b.clean, b.mask, b.position)
        finally:
            h.remove()
        h = proj.register_forward_pre_hook(replace)
        try:
            out = metric_values(logits_at(hm, b.corrupt, b.mask, b.position), b.answer, b.wrong, metric)
        finally:
            h.remove()
    return out.double().numpy()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])
@pytest.mark.parametrize("metric", ["logit_diff", "prob", "loss"])
def test_exact_patching_equals_separate_forwards(family, metric):
    hm = tiny_model(family)
    b = induction_pairs(None, hm.vocab_size, n=5, length=6, seed=1)
    runs = exact_scan(hm, b, metric=metric, batch_size=3, copies=5)
    for layer in range(hm.n_layers):
        for head in range(hm.n_heads):
            np.testing.assert_allclose(runs.patched[:, layer, head], _by_hand(hm, b, layer, head, metric),
                                       rtol=1e-4, atol=1e-5)
    # fewer forwards than one per head and chunk of pairs
    assert runs.forwards < 2 * hm.n_layers * hm.n_heads


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_exact_patching_with_as_many_pairs_as_positions(family):
    """The copies share the layers before the first patched one: nothing of length `pos` may be taken for a batch."""
    hm = tiny_model(family)
    b = induction_pairs(None, hm.vocab_size, n=9, length=5, seed=7)  # 9 pairs of 9 tokens
    runs = exact_scan(hm, b, batch_size=9, copies=3)
    for layer, head in [(0, 1), (1, 0), (1, hm.n_heads - 1)]:
        np.testing.assert_allclose(runs.patched[:, layer, head], _by_hand(hm, b, layer, head, "logit_diff"),
                                   rtol=1e-4, atol=1e-5)


def test_per_position_patching_equals_separate_forwards():
    hm = tiny_model("llama")
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=2)
    runs = exact_scan(hm, b, positions="each", batch_size=4, copies=7)
    for layer, head, pos in [(0, 0, 0), (0, 3, 4), (1, 5, 8), (1, 2, 6)]:
        np.testing.assert_allclose(runs.patched[:, layer, head, pos], _by_hand(hm, b, layer, head, "logit_diff",
                                                                               pos), rtol=1e-4, atol=1e-5)


def test_noising_patches_the_clean_run():
    hm = tiny_model("llama")
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=3)
    den, noi = exact_scan(hm, b), exact_scan(hm, b, direction="noising")
    np.testing.assert_allclose(den.clean, noi.clean, rtol=1e-5)
    np.testing.assert_allclose(den.corrupt, noi.corrupt, rtol=1e-5)
    swapped = type(b)(b.corrupt, b.clean, b.mask, b.position, b.answer, b.wrong, b.pairs, b.source)
    np.testing.assert_allclose(noi.patched, exact_scan(hm, swapped).patched, rtol=1e-5, atol=1e-6)


class _Zero(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


def _linear_model():
    """A one-layer GPT-2 with no MLP and no final norm: logits are affine in layer 0's head outputs, and those
    outputs depend on the embeddings only, so logit_diff is linear in every head's z."""
    hm = tiny_model("gpt2", n_layer=1)
    hm.model.transformer.h[0].mlp = _Zero()
    hm.model.transformer.ln_f = torch.nn.Identity()
    return hm


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_attribution_equals_exact_on_a_model_linear_in_head_outputs(direction):
    from headscope.learned.causal.attribution import attribution_scan

    hm = _linear_model()
    b = induction_pairs(None, hm.vocab_size, n=6, length=5, seed=4)
    exact = exact_scan(hm, b, direction=direction)
    attr = attribution_scan(hm, b, direction=direction, batch_size=4)
    np.testing.assert_allclose(attr.patched, exact.patched, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(attr.clean, exact.clean, rtol=1e-5)


def test_attribution_is_first_order_on_a_nonlinear_model():
    """On a 2-layer model (norms, MLPs, softmax) attribution is an estimate: it tracks exact, and differs from it."""
    from headscope.learned.causal.attribution import agreement, attribution_scan
    from headscope.uncertainty import IntervalSettings

    hm = tiny_model("llama", init_std=0.1)
    b = induction_pairs(None, hm.vocab_size, n=8, length=6, seed=5)
    st = IntervalSettings(B=200)
    exact, attr = exact_scan(hm, b).effect(st).value, attribution_scan(hm, b).effect(st).value
    assert not np.allclose(exact, attr, rtol=1e-3, atol=1e-3)
    got = agreement(exact, attr)
    assert got["heads"] == hm.n_layers * hm.n_heads and len(got["most_different"]) == 5
    gaps = [abs(h["exact"] - h["attribution"]) for h in got["most_different"]]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] == pytest.approx(np.nanmax(np.abs(exact - attr)))


def test_effect_intervals_cover_the_true_effect_at_about_their_level():
    """Per-pair metrics with known means: clean 2, corrupt 0, a head's patched run 0.5, so its effect is 0.25."""
    from headscope.learned.causal.patching import Runs
    from headscope.uncertainty import IntervalSettings, binomial_interval

    rng = np.random.default_rng(0)
    sims, n, hits = 300, 40, 0
    for s in range(sims):
        clean, corrupt = rng.normal(2.0, 1.0, n), rng.normal(0.0, 1.0, n)
        patched = (corrupt + rng.normal(0.5, 0.7, n))[:, None, None]
        iv = Runs(clean, corrupt, patched, "denoising").effect(IntervalSettings(B=400, seed=s))
        hits += bool(iv.lo[0, 0] <= 0.25 <= iv.hi[0, 0])
    lo, hi = binomial_interval(hits, sims, 0.99)
    assert lo <= 0.95 <= hi, f"coverage {hits / sims:.3f} ({hits}/{sims})"


def test_dla_is_left_out_where_the_attention_output_is_normed():
    from headscope.learned.causal.dla import dla_values

    hm = tiny_model("gemma3_text")
    assert dla_values(hm, induction_pairs(None, hm.vocab_size, n=2, length=4)) is None


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_dla_sums_with_the_rest_to_the_logit_difference(family):
    """On a one-layer model without MLP, the residual at the last position is the embeddings plus the heads'
    writes plus the output bias; with the frozen scale the final norm is linear, so the heads' DLA plus the
    non-head parts' equal the model's logit difference."""
    from headscope.learned.causal.dla import dla_values, final_norm, frozen_norm

    hm = tiny_model(family, **({"n_layer": 1} if family == "gpt2" else {"num_hidden_layers": 1}))
    hm.layers[0].mlp = _Zero()
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=6)
    dla = dla_values(hm, b)
    assert dla is not None and np.isfinite(dla).all()
    # the rest: the residual minus the heads' writes, through the same frozen norm
    norm = final_norm(hm)
    seen = {}
    h = norm.register_forward_pre_hook(lambda m, a: seen.update(x=a[0].detach()))
    try:
        with torch.no_grad():
            logits = logits_at(hm, b.clean, b.mask, b.position)
    finally:
        h.remove()
    idx = torch.arange(len(b))
    x = seen["x"][idx, b.position]
    w_u = hm.output_embeddings.weight.detach()
    direction = w_u[b.answer] - w_u[b.wrong]
    with torch.no_grad():
        whole = (frozen_norm(norm, x, x) * direction).sum(-1).double().numpy()
        bias = getattr(norm, "bias", None)
        if bias is not None:
            whole += (bias * direction).sum(-1).double().numpy()
    got = (logits.gather(1, b.answer[:, None]) - logits.gather(1, b.wrong[:, None]))[:, 0].double().numpy()
    np.testing.assert_allclose(whole, got, rtol=1e-4, atol=1e-4)  # the frozen norm of the whole is the norm
    # the rest, found independently: the block's input (embeddings) plus the output projection's bias
    inp = {}

    def keep_input(module, args, kwargs):
        inp["x"] = (args[0] if args else kwargs["hidden_states"]).detach()

    h = hm.layers[0].register_forward_pre_hook(keep_input, with_kwargs=True)
    try:
        with torch.no_grad():
            logits_at(hm, b.clean, b.mask, b.position)
    finally:
        h.remove()
    rest = inp["x"][idx, b.position]
    o_bias = getattr(hm.out_proj(0), "bias", None)
    if o_bias is not None:
        rest = rest + o_bias.detach()
    with torch.no_grad():
        rest_dla = (frozen_norm(norm, rest[:, None], x[:, None])[:, 0] * direction).sum(-1).double().numpy()
    np.testing.assert_allclose(dla[:, 0].sum(1) + rest_dla, whole, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from test_artifacts import tiny_llama_dir

    return tiny_llama_dir(tmp_path_factory.mktemp("patch"))[0]


GOOD = '{"clean": "the of and to a in is", "corrupt": "the of and to he in is", "answer": "a", "wrong": "he"}\n'


@pytest.mark.parametrize("content, says", [
    ("", "holds no pairs"),
    (GOOD + "{not json\n", "line 2: not JSON"),
    ('{"clean": "the of a", "corrupt": "the of he", "answer": "a", "wrong": "a"}\n', "line 1: answer 'a' and wrong "
     "'a' are the same token"),
    (GOOD + '{"clean": "the of a", "corrupt": "the of", "answer": "a", "wrong": "he"}\n',
     "line 2: clean and corrupt texts have 3 and 2 tokens"),
    ('{"clean": "the of a", "corrupt": "the of he", "answer": "a in", "wrong": "he"}\n',
     "line 1: 'a in' is 2 tokens, not one"),
    ('{"clean": "the of a", "corrupt": "the of he", "answer": "a"}\n', "line 1: needs non-empty strings"),
])
def test_bad_pairs_get_one_line_and_exit_2(llama_dir, tmp_path, capsys, content, says):
    from headscope.cli import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(content)
    rc = main(["patch", str(llama_dir), "--pairs", str(pairs), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("headscope ")]
    assert rc == 2 and len(lines) == 1 and says in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_patch_from_python_and_per_position_file(llama_dir, tmp_path):
    import headscope
    from headscope.models import load_model

    hm = load_model(str(llama_dir))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(GOOD * 3)
    res = headscope.patch(hm, pairs, positions="each", bootstrap=200)
    written = res.save(tmp_path / "out")
    assert sorted(p.name for p in written) == ["composition.npz", "patching.csv", "patching.json",
                                                        "patching_positions.csv"]
    with np.load(tmp_path / "out" / "composition.npz", allow_pickle=False) as z:
        assert set(z.files) == {"q", "k", "v", "meta"} and z["k"].shape == (2, 6, 2, 6)
    rows = (tmp_path / "out" / "patching_positions.csv").read_text().splitlines()
    assert rows[0] == "layer,head,position,effect,effect_lo,effect_hi" and len(rows) == 1 + 12 * 7
    only = headscope.patch(hm, pairs, methods=("attribution",), bootstrap=200)
    assert "effect" not in only.table.columns and "attribution" in only.table.columns
    np.testing.assert_allclose(only.table["attribution"], res.table["attribution"], rtol=1e-6)



def _direct_scores(hm, a_layer, a_head, b_layer, b_head):
    """Composition scores from the full d_model x d_model matrices, formed by hand."""
    d = hm.d_head
    wa, wb = hm.qkv_weights(a_layer), hm.qkv_weights(b_layer)
    kva, kvb = a_head // hm.group_size, b_head // hm.group_size
    rows = lambda w, i: w.detach().double()[i * d:(i + 1) * d]  # noqa: E731
    ov_a = hm.out_weight(a_layer).detach().double()[:, a_head * d:(a_head + 1) * d] @ rows(wa.v, kva)
    ov_b = hm.out_weight(b_layer).detach().double()[:, b_head * d:(b_head + 1) * d] @ rows(wb.v, kvb)
    qk_b = rows(wb.q, b_head).T @ rows(wb.k, kvb)
    fro = torch.linalg.matrix_norm
    return {"q": fro(qk_b.T @ ov_a) / (fro(qk_b) * fro(ov_a)), "k": fro(qk_b @ ov_a) / (fro(qk_b) * fro(ov_a)),
            "v": fro(ov_b @ ov_a) / (fro(ov_b) * fro(ov_a))}


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt2", "qwen3"])  # GQA, MQA, MHA, head_dim != D/H
def test_composition_equals_the_full_matrices(family):
    from headscope.learned.causal.composition import composition

    hm = tiny_model(family)
    got = composition(hm)
    assert all(np.isnan(got[k][1, :, 0, :]).all() and np.isnan(got[k][0, :, 0, :]).all() for k in got)
    for a, b in [(0, 1), (hm.n_heads - 1, 0), (1, hm.n_heads - 1)]:
        want = _direct_scores(hm, 0, a, 1, b)
        for kind in ("q", "k", "v"):
            assert got[kind][0, a, 1, b] == pytest.approx(float(want[kind]), rel=1e-9)


def test_k_composition_finds_a_planted_previous_token_to_induction_pair():
    """Layer 0 head 2 writes its value subspace U; layer 1 head 4's keys read exactly U: K-composition ranks
    (L0H2 -> L1H4) first of all head pairs, and Q- and V-composition do not single it out."""
    from headscope.learned.causal.composition import composition, top_pairs

    hm = tiny_model("llama", num_key_value_heads=6)
    d, D = hm.d_head, hm.d_model
    u = torch.linalg.qr(torch.randn(D, d, generator=torch.Generator().manual_seed(0)))[0]  # [D, d] orthonormal
    w0, w1 = hm.qkv_weights(0), hm.qkv_weights(1)
    v0, o0, k1 = w0.v.clone(), hm.out_weight(0).clone(), w1.k.clone()
    v0[2 * d:3 * d] = u.T
    o0[:, 2 * d:3 * d] = u
    k1[4 * d:5 * d] = u.T
    hm.set_qkv_weights(0, type(w0)(w0.q, w0.k, v0))
    hm.set_out_weight(0, o0)
    hm.set_qkv_weights(1, type(w1)(w1.q, k1, w1.v))
    scores = composition(hm)
    assert top_pairs(scores["k"], 1)[0][:4] == (0, 2, 1, 4)
    assert top_pairs(scores["k"], 2)[1][4] < 0.8 * top_pairs(scores["k"], 1)[0][4]


def test_an_encoders_metric_is_read_at_the_mask():
    """A masked LM: the metric position is the mask token's, and exact patching there equals hand patching."""
    import transformers as tf

    from headscope.learned.causal.pairs import Pair, tokenize_pairs
    from headscope.models import wrap
    from headscope.models.tiny import tiny_config

    words = "the cat saw a dog bird sang small mary john".split()
    # a WordPiece vocabulary given as a dict (transformers 5's BertTokenizerFast(vocab_file=...) maps every word
    # to [UNK] here, which would leave answer and wrong one token and the metric 0)
    tok = tf.BertTokenizerFast(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                                   *words])})
    torch.manual_seed(0)
    hm = wrap(tf.BertForMaskedLM(tiny_config("bert")).eval(), tok, "tiny-mlm")
    pairs = [Pair("the cat saw {mask} dog", "the bird saw {mask} dog", "a", "small"),
             Pair("mary saw [MASK] small bird", "john saw [MASK] small bird", "the", "a")]
    b = tokenize_pairs(tok, pairs, hm.causal, "pairs")
    assert b.position.tolist() == [4, 3]  # [CLS] counts
    assert tok.unk_token_id not in b.clean.tolist()[0] and (b.answer != b.wrong).all()
    runs = exact_scan(hm, b, copies=3)
    for layer, head in [(0, 0), (1, 3)]:
        np.testing.assert_allclose(runs.patched[:, layer, head], _by_hand(hm, b, layer, head, "logit_diff"),
                                   rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="mask token"):
        tokenize_pairs(tok, [Pair("the cat saw a dog", "the bird saw a dog", "a", "small")], False, "pairs")
