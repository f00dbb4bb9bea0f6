"""L0 head gates (issue 24): hard-concrete sampling against its closed form, gate training that moves only the
gates, a planted model whose dead head closes first and whose twins keep one, a target share reached,
resume to the same gates, and `score` / `prune --method l0` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_artifacts import tiny_llama_dir
from test_bad_input import refused

from headscope.cli import main
from headscope.eval.evaluate import prepare, read_task_data
from headscope.models.checkpoint import load_checkpoint
from headscope.models.tiny import tiny_model
from headscope.redundancy.curves import L0_STATE, prune_curve
from headscope.redundancy.importance import L0Settings, ScoreSettings, score
from headscope.redundancy.importance.hard_concrete import GAMMA, ZETA, HardConcreteGates, Stretch
from headscope.redundancy.importance.l0 import GateTraining


@pytest.mark.parametrize("log_alpha,beta", [(-2.0, 2 / 3), (0.0, 2 / 3), (1.5, 2 / 3), (0.5, 0.3), (-0.5, 1.5)])
def test_share_of_open_gates_equals_the_closed_form(log_alpha, beta):
    """Over 400,000 draws the share of non-zero gates is P(z != 0) = sigmoid(log_alpha - beta log(-gamma/zeta)),
    within 5 binomial standard errors."""
    n = 400_000
    st = Stretch(beta)
    la = torch.full((n,), log_alpha, dtype=torch.float64)
    z = st.sample(la, torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    p = 1.0 / (1.0 + math.exp(-(log_alpha - beta * math.log(-GAMMA / ZETA))))
    se = math.sqrt(p * (1 - p) / n)
    got = float((z != 0).double().mean())
    assert abs(got - p) < 5 * se, f"empirical {got:.5f} vs closed form {p:.5f} (5 se = {5 * se:.5f})"
    assert float(st.open_probability(torch.tensor(log_alpha))) == pytest.approx(p, abs=1e-6)
    assert bool(((z >= 0) & (z <= 1)).all()) and float((z == 1).double().mean()) > 0  # mass at both ends


def test_deterministic_gate_is_the_formula():
    """At test time z = min(1, max(0, sigmoid(log_alpha) (zeta - gamma) + gamma)), computed here by hand."""
    values = [-6.0, -2.4, -1.0, 0.0, 0.7, 2.0, 6.0]
    got = Stretch().deterministic(torch.tensor(values, dtype=torch.float64)).tolist()
    for v, g in zip(values, got, strict=True):
        want = min(1.0, max(0.0, 1.0 / (1.0 + math.exp(-v)) * (ZETA - GAMMA) + GAMMA))
        assert g == pytest.approx(want, abs=1e-12), (v, g, want)
    gates = HardConcreteGates((1, 3), Stretch())
    with torch.no_grad():
        gates.log_alpha.copy_(torch.tensor([[-6.0, 0.0, 6.0]]))
    assert gates.deterministic()[0].tolist() == pytest.approx([0.0, 0.5, 1.0], abs=1e-6)


def _data(n: int = 8, length: int = 12, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 120, (length,), generator=g).tolist() for _ in range(n)]


def _training(hm, settings: L0Settings, n: int = 8, per: str = "head", batch_size: int = 4) -> GateTraining:
    prep, metric = prepare(hm, _data(n), "auto")
    return GateTraining(hm, prep, metric, None, settings, per=per, batch_size=batch_size)


def test_gate_training_moves_the_gates_only():
    hm = tiny_model("llama", init_std=0.2)
    before = {k: v.clone() for k, v in hm.model.state_dict().items()}
    run = _training(hm, L0Settings(steps=6, target=0.5))
    start = run.gates.log_alpha.detach().clone()
    run.run()
    for k, v in hm.model.state_dict().items():
        assert torch.equal(before[k], v), f"{k} changed by {float((before[k] - v).abs().max()):.3g}"
    assert all(p.grad is None and p.requires_grad for p in hm.model.parameters())
    assert not torch.equal(start, run.gates.log_alpha.detach())


def planted():
    """Two layers of two heads, MLPs off: L0H0 is dead (its output projection is zero), L0H1 carries what layer 1
    reads, and L1H0 = L1H1 are twins (same queries, keys, values and output rows) strong enough that the final
    LayerNorm makes one of them enough: KL to the full model is 0 without L0H0, ~0.05 without one twin, ~0.9
    without both, ~1.2 without L0H1."""
    hm = tiny_model("gpt2", init_std=0.3, n_head=2, n_embd=16)
    d, e = 8, 16
    with torch.no_grad():
        for block in hm.model.transformer.h:
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
        a0, a1 = hm.model.transformer.h[0].attn, hm.model.transformer.h[1].attn
        a0.c_proj.weight[0:d].zero_()
        a0.c_proj.weight[d:2 * d] *= 4.0
        for off in (0, e, 2 * e):  # GPT-2's fused c_attn: q, k, v side by side, head h at columns h*d..(h+1)*d
            a1.c_attn.weight[:, off + d:off + 2 * d] = a1.c_attn.weight[:, off:off + d]
            a1.c_attn.bias[off + d:off + 2 * d] = a1.c_attn.bias[off:off + d]
        a1.c_proj.weight[d:2 * d] = a1.c_proj.weight[0:d]
        a1.c_proj.weight *= 6.0
    return hm


@pytest.mark.parametrize("seed", [0, 1])
def test_planted_dead_head_closes_first_and_one_twin_stays(seed):
    hm = planted()
    prep, metric = prepare(hm, _data(16, 16), "auto")
    run = GateTraining(hm, prep, metric, None, L0Settings(steps=300, target=0.5), batch_size=8, seed=seed)
    first_closed: list[int] = []

    def watch(step: int, loss: float) -> None:
        p = run.gates.open_probability().detach().ravel()
        for u in range(4):
            if p[u] < 0.5 and u not in first_closed:
                first_closed.append(u)

    run.run(on_step=watch)
    p = run.open_probability()
    assert first_closed and first_closed[0] == 0, f"first closed: {first_closed}; P(open) {p.round(3).tolist()}"
    assert p[0, 0] < 0.5 and p[0, 1] > 0.5, p.round(3).tolist()  # the dead head closed, the carrier kept
    assert (p[1] > 0.5).sum() == 1, f"exactly one twin stays open: {p.round(3).tolist()}"


@pytest.mark.parametrize("family,target", [("llama", 0.25), ("gpt2", 0.5)])
def test_target_share_is_reached_within_one_head(family, target):
    hm = tiny_model(family, init_std=0.2)
    run = _training(hm, L0Settings(steps=250, target=target))
    run.run()
    closed = int((run.open_probability() < 0.5).sum())
    want = target * hm.n_layers * hm.n_heads
    assert abs(closed - want) <= 1, f"{closed} heads closed, target {want:g}"


def test_group_gates_close_whole_kv_groups():
    hm = tiny_model("llama", init_std=0.2)  # 6 query heads on 2 KV heads per layer
    run = _training(hm, L0Settings(steps=150, target=0.5), per="group")
    run.run()
    p = run.open_probability()
    assert run.gates.log_alpha.shape == (2, 2)
    assert np.array_equal(p[:, :3], np.repeat(p[:, :1], 3, 1)) and np.array_equal(p[:, 3:], np.repeat(p[:, 3:4], 3, 1))


def test_interrupted_training_resumes_to_the_same_gates(tmp_path):
    settings = L0Settings(steps=30, target=0.3, save_every=5)
    hm = tiny_model("llama", init_std=0.2)
    whole = _training(hm, settings)
    whole.run()
    ckpt = tmp_path / L0_STATE
    first = _training(hm, settings)

    def stop(step: int, loss: float) -> None:
        if step == 17:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        first.run(ckpt, on_step=stop)
    assert ckpt.exists()
    again = _training(hm, settings)
    again.run(ckpt)
    assert torch.equal(again.gates.log_alpha, whole.gates.log_alpha)
    other = _training(hm, L0Settings(steps=30, target=0.4, save_every=5))
    with pytest.raises(Exception, match="other settings"):
        other.run(ckpt)


def test_score_l0_column_is_open_probability_marked_learned():
    hm = tiny_model("bert", init_std=0.2)
    base = torch.ones(hm.n_layers, hm.n_heads)
    base[0, 1] = 0
    settings = ScoreSettings(methods="l0", batch_size=3, criterion_settings={"l0": {"settings": L0Settings(steps=20)}})
    t = score(hm, _data(6), settings, gates=base)
    v = t["importance_l0"]
    assert np.isnan(v[0, 1]) and np.all((v[np.isfinite(v)] >= 0) & (v[np.isfinite(v)] <= 1))
    assert np.isnan(t["importance_l0_lo"]).all() and np.isnan(t["importance_l0_hi"]).all()
    rec = t.meta["learned"]["l0"]
    assert "no per-passage bootstrap interval" in rec["interval"] and rec["steps_done"] == 20


def test_prune_l0_gqa_slices_load_and_resume(tmp_path, monkeypatch):
    """prune --method l0 on a GQA model: per-query-head gates, slices taken so every group keeps as many heads;
    the saved model loads; the gate state is cleared when the run completes; a rerun after an interrupted
    curve resumes to the same gates."""
    src, text = tiny_llama_dir(tmp_path, init_std=0.2)
    out = tmp_path / "out"
    argv = ["prune", str(src), "--method", "l0", "--fraction", "34%", "--step", "0.17", "--data", str(text),
            "--limit", "8", "--max-length", "16", "--l0-steps", "40", "--save-model", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "prune.json").read_text())
    assert summary["learned"]["l0"]["steps_done"] == 40 and not (out / L0_STATE).exists()
    small = load_checkpoint(out / "model")
    kept = [small.heads_in_layer(l) for l in range(small.n_layers)]
    assert sum(kept) == 12 - 4, kept  # 4 of 12 heads: two slices of two groups
    probs = summary["learned"]["open_probability"]
    # The same run through the library, interrupted during gate training, then rerun on its folder.
    hm, data = load_checkpoint(src), read_task_data(str(text), 8)
    kw = dict(method="l0", fraction=0.34, step=0.17, max_length=16, checkpoint=tmp_path / "again", progress=False,
              l0_steps=40)  # the gates' target: the fraction
    real_loss = GateTraining._loss

    def interrupted(self, batch):
        if self.trainer.step == 27:
            raise KeyboardInterrupt
        return real_loss(self, batch)

    monkeypatch.setattr(GateTraining, "_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prune_curve(hm, data, **kw)
    assert (tmp_path / "again" / L0_STATE).exists()
    monkeypatch.setattr(GateTraining, "_loss", real_loss)
    res = prune_curve(hm, data, **kw)
    assert res.scores["open_probability"] == probs


@pytest.mark.parametrize("argv,message", [
    (["score", "--method", "l0", "--l0-target", "1"], "--l0-target (the L0 gates' target share"),
    (["score", "--method", "l0", "--l0-target", "-0.1"], "--l0-target (the L0 gates' target share"),
    (["score", "--method", "l0", "--l0-temperature", "0"], "--l0-temperature (the hard-concrete temperature) must be"),
    (["prune", "--method", "l0", "--fraction", "0.2", "--l0-penalty", "-1"], "--l0-penalty (the L0 penalty) must be"),
    (["prune", "--method", "l0", "--fraction", "0.2", "--l0-temperature", "-0.5"], "--l0-temperature (the hard-"),
    (["prune", "--method", "l0", "--target-drop", "1%"], "needs --l0-penalty or --l0-target"),
])
def test_bad_l0_settings_refused(tmp_path, capsys, argv, message):
    refused(tmp_path, capsys, argv, message)
