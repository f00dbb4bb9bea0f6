"""The linear probe that gives a classifier-less model a classification head: the fit against its optimality
condition, the split, labels that stay with their passages, and MiniLM on the built-in polarity sentences
(accuracy, the wrapper against the probe applied by hand, the classification task against ablation by hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headscope.data import TextSource, batches, labelled_builtin, pad_id, prepare_tokens, read_texts
from headscope.errors import HeadscopeError
from headscope.eval.evaluate import evaluate, is_labelled
from headscope.eval.probe import fit_logistic, fit_probe, majority_share, pooled_features, split_labelled


def test_fit_logistic_is_the_penalised_optimum():
    """At the returned weights the gradient of mean cross-entropy + l2/2 |W_z|^2 (standardised features)
    vanishes, and the raw-feature form predicts what the standardised one does."""
    g = torch.Generator().manual_seed(0)
    n, d, k, l2 = 120, 7, 3, 0.05
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.1, 20, d, dtype=torch.float64) + 5
    y = (x[:, 0] / 0.1 + x[:, 3] / 10 > 0).long() + (x[:, 5] > 5).long()  # 3 classes, not separable by one axis
    w, b = fit_logistic(x, y, k, l2)
    mu, sd = x.mean(0), x.std(0)
    wz = (w * sd).requires_grad_(True)
    bz = (b + w @ mu).requires_grad_(True)
    z = (x - mu) / sd
    loss = F.cross_entropy(z @ wz.T + bz, y) + 0.5 * l2 * (wz * wz).sum()
    gw, gb = torch.autograd.grad(loss, (wz, bz))
    assert max(gw.abs().max().item(), gb.abs().max().item()) < 1e-7, (gw.abs().max(), gb.abs().max())
    torch.testing.assert_close(x @ w.T + b, z @ wz.detach().T + bz.detach(), atol=1e-9, rtol=0)
    with pytest.raises(HeadscopeError, match="must be positive"):
        fit_logistic(x, y, k, 0.0)


def test_split_is_stratified_disjoint_and_seeded():
    labels = ["a"] * 10 + ["b"] * 6
    tr, te = split_labelled([""] * 16, labels, 0.5, seed=3)
    assert sorted(tr + te) == list(range(16)) and not set(tr) & set(te)
    assert [labels[i] for i in tr].count("a") == 5 and [labels[i] for i in tr].count("b") == 3
    assert split_labelled([""] * 16, labels, 0.5, seed=3) == (tr, te)
    assert split_labelled([""] * 16, labels, 0.5, seed=4) != (tr, te)
    with pytest.raises(HeadscopeError, match="too few to split"):
        split_labelled([""] * 3, ["a", "a", "b"], 0.5, seed=0)
    with pytest.raises(HeadscopeError, match="between 0 and 1"):
        split_labelled([""] * 4, ["a", "b"] * 2, 1.0, seed=0)
    assert majority_share([0, 0, 1]) == pytest.approx(2 / 3)


def test_polarity_builtin():
    texts, labels, source = labelled_builtin("polarity")
    assert len(texts) == 200 and labels.count("neg") == 100 and labels.count("pos") == 100
    assert "the action clichés just pile up ." in texts  # the file is Windows-1252, decoded as such
    assert read_texts("polarity").texts == texts and is_labelled("polarity") and source.startswith("gensim:")
    with pytest.raises(HeadscopeError, match="did you mean 'polarity'"):
        labelled_builtin("polarty")


def test_labels_stay_with_their_passages(minilm):
    """A passage that tokenises to special tokens only is skipped, and its label with it (it used to shift
    every later label by one)."""
    src = TextSource(["a fine film", "[SEP]", "dull and slow", "[CLS] [SEP]", "bright"], "x")
    tok = prepare_tokens(minilm, src, 16, labels=[0, 1, 2, 3, 4])
    assert tok.labels == [0, 2, 4] and tok.texts.texts == ["a fine film", "dull and slow", "bright"]
    with pytest.raises(HeadscopeError, match="labels go with"):
        prepare_tokens(minilm, src, 16, labels=[0, 1])


def test_minilm_probe_on_polarity(minilm):
    """MiniLM's frozen features separate polarity well above chance; the wrapper's logits are the probe applied
    to the pooled features by hand; `evaluate` through the wrapper gives the probe's own test accuracy."""
    p = fit_probe(minilm, "polarity", seed=0)
    assert len(p.train) == len(p.test) == 100 and p.labels == ["neg", "pos"]
    assert p.test_accuracy >= 0.65 and p.train_accuracy >= p.test_accuracy  # majority share 0.5
    x = pooled_features(minilm, p.test).float()
    pick = sorted(range(len(p.test.ids)), key=lambda i: len(p.test.ids[i]))[::45]  # short, middle, long
    b = next(iter(batches([p.test.ids[i] for i in pick], 3, pad_id=pad_id(minilm))))  # right-padded
    with torch.no_grad():
        want = p.hm.model.probe(x[[pick[i] for i in b.index]])
        got = p.hm.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    assert b.attention_mask.min() == 0  # padding reached the wrapper
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    res = evaluate(p.hm, p.test, "accuracy")
    assert res.value == pytest.approx(p.test_accuracy, abs=1e-12)
    assert p.hm.n_layers == minilm.n_layers and p.hm.model.wrapped is minilm.model  # shared, not copied
    with pytest.raises(HeadscopeError, match="at least two classes"):
        fit_probe(minilm, [{"text": "good", "label": 1}, {"text": "fine", "label": 1}])


def test_classification_task_is_ablation_through_the_probe(minilm):
    """The classification task on a classifier-less model: a probe fitted on half of polarity, each head's
    ablation importance = test accuracy with every head on minus accuracy with that head zeroed, by hand."""
    from headscope.redundancy.importance.tasks import TASKS, TaskContext

    ctx = TaskContext(minilm, None, "ablation", 24, 64, 8, 0)
    got = TASKS.get("classification").fn(ctx)
    assert got.shape == (minilm.n_layers, minilm.n_heads)
    info = ctx.info
    assert info["scored_passages"] == 24 and info["classifier"]["test_passages"] == 100
    p = fit_probe(minilm, "polarity", max_length=64, batch_size=8, seed=0)
    test = p.test
    test.ids, test.labels = test.ids[:24], test.labels[:24]
    base = evaluate(p.hm, test, "accuracy").value
    assert base == pytest.approx(info["accuracy"], abs=1e-12)
    for layer, head in ((0, 3), (5, 7)):
        gates = torch.ones(minilm.n_layers, minilm.n_heads)
        gates[layer, head] = 0
        want = base - evaluate(p.hm, test, "accuracy", gates=gates).value
        assert got[layer, head] == pytest.approx(want, abs=1e-12), (layer, head)
    assert np.isfinite(got).all()
