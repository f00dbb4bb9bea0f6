"""DuoAttention's learned KV heads (issue 24): the mixture is full attention at alpha = 1 and the head-aware
cache's sink + window at alpha = 0, token by token; training moves only the alphas, within [0, 1];
`kvcache --choose learned` writes rows beside the score's and random's at equal bytes; too little text refused."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from test_bad_input import refused
from test_kvcache import _decode_logits
from test_kvcache_cli import SMALL, llama  # noqa: F401  (the module-scoped fixture)

from headscope.capacity.kvcache import CachePlan, HeadAwareCache, head_aware_attention
from headscope.capacity.kvcache.learned import LearnedSettings, MixTraining, mixed_kv, passkey_prompts
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.models.tiny import tiny_model


def _model():
    return tiny_model("llama", init_std=0.2, num_key_value_heads=3, max_position_embeddings=128)


def _mixed_logits(hm, alpha: torch.Tensor, sink: int, window: int, ids: torch.Tensor) -> torch.Tensor:
    with mixed_kv(hm, alpha, sink, window), torch.no_grad():
        return hm.model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("sink,window", [(2, 5), (0, 1), (4, 9)])
def test_mixture_is_full_at_one_and_the_windowed_cache_at_zero(sink, window):
    hm = _model()
    ids = torch.randint(3, 120, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = hm.model(input_ids=ids, use_cache=False).logits
    ones = _mixed_logits(hm, torch.ones(2, 3), sink, window, ids)
    scale = plain.abs().max()
    assert (ones - plain).abs().max() / scale < 1e-5, f"alpha=1: max abs diff {(ones - plain).abs().max():.3g}"
    zeros = _mixed_logits(hm, torch.zeros(2, 3), sink, window, ids)
    with head_aware_attention(hm):
        decoded = _decode_logits(hm, HeadAwareCache(CachePlan(((), ()), 3, 2, sink, window)), ids, prefill=1)
    assert (zeros - decoded).abs().max() / scale < 1e-5, f"alpha=0: max abs diff {(zeros - decoded).abs().max():.3g}"
    # alpha one on some KV heads, zero on others: the cache keeping exactly those full
    mixed = _mixed_logits(hm, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]), sink, window, ids)
    with head_aware_attention(hm):
        part = _decode_logits(hm, HeadAwareCache(CachePlan(((0,), (1, 2)), 3, 2, sink, window)), ids, prefill=1)
    assert (mixed - part).abs().max() / scale < 1e-5, f"0/1 alphas: max abs diff {(mixed - part).abs().max():.3g}"
    assert (zeros - plain)[:, sink + window:].abs().max() > 1e-3  # the window really cuts something


def test_half_alpha_is_the_average_of_the_two():
    hm = _model()
    ids = torch.randint(3, 120, (1, 30), generator=torch.Generator().manual_seed(4))
    alpha = torch.full((2, 3), 0.5)
    alpha[1] = torch.tensor([0.2, 0.9, 0.0])
    # With one layer mixed only, the output of that layer's attention is linear in alpha: check on the
    # attention output of layer 0 through a hook.
    got = {}
    handle = hm.attention(0).register_forward_hook(lambda m, a, o: got.__setitem__("x", o[0].detach()))
    try:
        outs = []
        for a in (torch.ones(2, 3), torch.zeros(2, 3), alpha):
            _mixed_logits(hm, a, 2, 5, ids)
            outs.append(got["x"])
    finally:
        handle.remove()
    assert (outs[2] - 0.5 * (outs[0] + outs[1])).abs().max() < 1e-5


def test_training_moves_only_the_alphas_within_bounds():
    hm = tiny_model("llama", init_std=0.2, num_key_value_heads=3, max_position_embeddings=128)
    before = {k: v.clone() for k, v in hm.model.state_dict().items()}
    class Hay:  # a prompt of random ids whose last 4 tokens are the "answer"
        def __init__(self, n):
            g = torch.Generator().manual_seed(n)
            self.ids = torch.randint(3, 120, (48,), generator=g).tolist()
            self.answer = (44, 48)

    run = MixTraining(hm, [Hay(i) for i in range(3)], 2, 5, LearnedSettings(steps=8, lr=0.2, l1=1.0))
    alpha = run.run()
    for k, v in hm.model.state_dict().items():
        assert torch.equal(before[k], v), k
    assert all(p.grad is None and p.requires_grad for p in hm.model.parameters())
    assert alpha.min() >= 0 and alpha.max() <= 1 and alpha.mean() < 1.0  # the L1 penalty moved them down


def test_kvcache_choose_learned(llama, tmp_path):  # noqa: F811
    src, text = llama
    out = tmp_path / "out"
    assert main(["kvcache", str(src), "--keep-full", "34%", "--data", str(text), "--needles", "1",
                 "--haystacks", "1", "--choose", "learned", "--learn-steps", "3", "--learn-prompts", "2",
                 *SMALL, "--out", str(out), "--export-card", str(tmp_path / "duo")]) == 0
    with (out / "kvcache.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["full", "score", "random", "learned"]
    assert rows[3]["full_kv_heads"] == rows[1]["full_kv_heads"] == rows[2]["full_kv_heads"]
    assert rows[3]["kv_bytes_measured"] == rows[1]["kv_bytes_measured"] and rows[3]["chosen_by"] == "duo_alpha"
    report = json.loads((out / "kvcache.json").read_text())
    rec = report["settings"]["scores"]["learned"]
    assert rec["steps"] == 3 and len(rec["alpha"]) == 2 and len(rec["alpha"][0]) == 3
    # the head pattern DuoAttention and kvpress read holds the learned alphas themselves
    pattern = np.loadtxt(tmp_path / "duo" / "full_attention_heads.tsv", ndmin=2)
    assert pattern.shape == (2, 3) and np.allclose(pattern, rec["alpha"], atol=1e-6)


def test_passkey_prompts_refuse_short_text(llama):  # noqa: F811
    from headscope.models.checkpoint import load_checkpoint

    tok = load_checkpoint(llama[0]).tokenizer
    with pytest.raises(HeadscopeError, match="needs long text for one passkey prompt"):
        passkey_prompts(tok, ["the of and to a in"], 64, 1, 0)
    hays = passkey_prompts(tok, llama[1].read_text().splitlines(), 64, 2, 0)
    assert all(len(h.ids) <= 64 and h.answer[1] == len(h.ids) for h in hays)


@pytest.mark.parametrize("extra,message", [
    (["--limit", "3"], "needs long text for one passkey prompt of --context 64"),
    (["--learn-l1", "0"], "--learn-l1 must be a positive number"),
    (["--learn-steps", "0"], "--learn-steps must be at least 1"),
    (["--threshold", "0.3"], "it does not take --threshold"),
])
def test_bad_learned_input(llama, tmp_path, capsys, extra, message):  # noqa: F811
    src, text = llama
    refused(tmp_path, capsys, ["kvcache", str(src), "--data", str(text), "--choose", "learned", *SMALL, *extra],
            message)
