"""Uptraining for the head-aware cache: the training-time per-head masked forward equals decoding through
`HeadAwareCache` token by token (what is trained is what is evaluated), uptraining lowers the distillation
loss, `headscope kvcache --uptrain` end to end and its bad input."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from test_bad_input import refused
from test_kvcache import PLANS, _decode_logits, _reference_logits
from test_kvcache_cli import SMALL, llama  # noqa: F401  (the module-scoped fixture)

from headscope.capacity.kvcache import CachePlan, HeadAwareCache, head_aware_attention
from headscope.capacity.kvcache.uptrain import cut_batches, masked_loss, uptrain_head_aware, windowed_training
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.models.tiny import tiny_model


def _model(seed: int = 0):
    return tiny_model("llama", seed=seed, init_std=0.2, num_key_value_heads=3, max_position_embeddings=128)


def _masked_logits(hm, plan: CachePlan, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with windowed_training(hm, plan), torch.no_grad():
        return hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits


@pytest.mark.parametrize("full,sink,window", PLANS)
def test_masked_forward_equals_cache_decoding(full, sink, window):
    hm = _model()
    plan = CachePlan(full, 3, 2, sink, window)
    ids = torch.randint(3, 120, (2, 40), generator=torch.Generator().manual_seed(2))
    masked = _masked_logits(hm, plan, ids)
    with head_aware_attention(hm):
        decoded = _decode_logits(hm, HeadAwareCache(plan), ids, prefill=1)  # one token at a time
    ref = _reference_logits(hm, plan, ids)  # the hand-written per-head reference of test_kvcache
    scale = decoded.abs().max()
    assert (masked - decoded).abs().max() / scale < 1e-5, f"max abs diff {(masked - decoded).abs().max()}"
    assert (masked - ref).abs().max() / scale < 1e-5, f"max abs diff {(masked - ref).abs().max()}"
    assert hm.config._attn_implementation != "headscope_kvcache_masked"  # restored
    assert not any(hasattr(hm.attention(layer), "_headscope_kv_plan") for layer in range(hm.n_layers))


def test_masked_forward_with_explicit_mask_and_windowing_matters():
    hm = _model()
    plan = CachePlan(((0,), ()), 3, 2, 1, 3)
    ids = torch.randint(3, 120, (1, 30), generator=torch.Generator().manual_seed(3))
    with_mask = _masked_logits(hm, plan, ids, torch.ones_like(ids))
    without = _masked_logits(hm, plan, ids)
    assert (with_mask - without).abs().max() < 1e-5
    with torch.no_grad():
        plain = hm.model(input_ids=ids, use_cache=False).logits
    assert (with_mask - plain)[:, :4].abs().max() < 1e-5  # inside sink + window nothing changes
    assert (with_mask - plain)[:, 10:].abs().max() > 1e-3  # beyond it the windowed heads see less


def test_full_plan_equals_the_plain_model_and_gradients_flow():
    hm = _model()
    plan = CachePlan.all_full(hm.n_layers, 3, 2, sink=1, window=2)
    ids = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = hm.model(input_ids=ids, use_cache=False).logits
    assert (_masked_logits(hm, plan, ids) - plain).abs().max() < 1e-5
    windowed = CachePlan(((1,), ()), 3, 2, 1, 4)
    with windowed_training(hm, windowed):
        hm.model(input_ids=ids, use_cache=False).logits.square().mean().backward()
    q = hm.attention(1).q_proj.weight.grad
    assert q is not None and q.abs().sum() > 0


def test_uptraining_lowers_the_distillation_loss_and_leaves_the_model():
    hm = _model(seed=1)
    plan = CachePlan(((0,), (2,)), 3, 2, 1, 4)
    g = torch.Generator().manual_seed(5)
    batches = cut_batches(torch.randint(3, 120, (2, 70), generator=g).tolist(), 32, 2)
    before_weights = {k: v.clone() for k, v in hm.model.state_dict().items()}
    before = masked_loss(hm, hm, plan, batches)
    student, log_ = uptrain_head_aware(hm, plan, batches, 12, lr=3e-3, seed=0)
    after = masked_loss(student, hm, plan, batches)
    assert before > 1e-3, f"the windowed model should differ from the teacher; loss {before}"
    assert after < 0.8 * before, f"distillation loss {before:.5f} -> {after:.5f}"
    assert len(log_.losses) == 12 and log_.settings["steps"] == 12
    assert all(torch.equal(v, hm.model.state_dict()[k]) for k, v in before_weights.items())  # input untouched
    frozen = ("embed_tokens.weight", "mlp.up_proj.weight", "norm.weight")
    for name, p in student.model.named_parameters():
        if any(name.endswith(f) for f in frozen):
            assert torch.equal(p, before_weights[name]), f"{name} trained but only attention should"


def test_cut_batches_cut_and_refuse():
    batches = cut_batches([list(range(10)), list(range(100, 107))], 3, 2)  # pieces: 3 + 2, the tails dropped
    assert [b.input_ids.tolist() for b in batches] == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [100, 101, 102]],
                                                       [[103, 104, 105]]]
    assert all(bool(b.attention_mask.all()) for b in batches)
    with pytest.raises(HeadscopeError, match="no training text holds"):
        cut_batches([[1, 2]], 50)


def test_plan_that_does_not_fit_is_refused():
    hm = _model()
    with pytest.raises(HeadscopeError, match="does not fit"):
        with windowed_training(hm, CachePlan(((0,),), 3, 2, 1, 4)):
            pass


def test_kvcache_cli_uptrain(llama, tmp_path):  # noqa: F811
    src, text = llama
    out = tmp_path / "out"
    train = tmp_path / "train.txt"
    train.write_text(text.read_text())
    assert main(["kvcache", str(src), "--keep-full", "34%", "--data", str(text), "--needles", "1",
                 "--haystacks", "1", *SMALL, "--uptrain-steps", "2", "--train-data", str(train),
                 "--train-length", "24", "--out", str(out)]) == 0
    with (out / "kvcache.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["uptrain_steps"]) for r in rows] == [("full", "0"), ("score", "0"), ("score", "2"),
                                                                   ("random", "0")]
    assert rows[1]["kv_bytes_measured"] == rows[2]["kv_bytes_measured"] == rows[2]["kv_bytes_formula"]
    assert rows[1]["perplexity"] != rows[2]["perplexity"]
    report = json.loads((out / "kvcache.json").read_text())
    assert report["settings"]["uptrain"]["steps"] == 2 and report["settings"]["uptrain"]["passage_tokens"] == 24
    assert len(report["rows"][2]["uptrain"]["losses"]) == 2


def test_kvcache_cli_uptrain_on_the_rest_of_data(llama, tmp_path):  # noqa: F811
    src, text = llama  # 3 lines: the first is evaluated, the other two train
    out = tmp_path / "out"
    assert main(["kvcache", str(src), "--keep-full", "67%", "--data", str(text), "--needles", "0", "--no-random",
                 "--haystacks", "1", *SMALL, "--uptrain-steps", "1", "--train-length", "32", "--out", str(out)]) == 0
    report = json.loads((out / "kvcache.json").read_text())
    assert report["settings"]["uptrain"]["texts"] == 2
    assert [r["uptrain_steps"] for r in report["rows"]] == [0, 0, 1]


@pytest.mark.parametrize("extra,message", [
    (["--uptrain-steps", "-1"], "--uptrain-steps must be 0 or more; got -1"),
    (["--uptrain-steps", "2", "--uptrain-lr", "0"], "--uptrain-lr must be a positive number"),
    (["--uptrain-steps", "2", "--train-length", "1"], "--train-length must be at least 2"),
    (["--uptrain-steps", "2", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--uptrain-steps", "2", "--threshold", "0.5"], "does not take --threshold"),
    (["--uptrain-steps", "2", "--train-data", "missing.txt"], "missing.txt"),
])
def test_bad_uptrain_input(llama, tmp_path, capsys, extra, message):  # noqa: F811
    src, text = llama
    refused(tmp_path, capsys, ["kvcache", str(src), "--data", str(text), "--sink", "2", "--window", "8", *extra],
            message)
