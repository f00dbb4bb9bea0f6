"""The one training loop: schedule, clipping, divergence, and resume equal to an uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headscope.errors import HeadscopeError
from headscope.train import Trainer, lr_at


def _problem(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    w = torch.randn(4, 1, generator=torch.Generator().manual_seed(99))

    def batch_fn(g: torch.Generator):
        x = torch.randn(16, 4, generator=g)
        return x, x @ w

    def loss_fn(batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean()

    return model, batch_fn, loss_fn


def test_training_lowers_the_loss_and_leaves_eval_mode():
    model, batch_fn, loss_fn = _problem()
    tr = Trainer(model, model.parameters(), lr=1e-2, steps=200, grad_clip=1.0, seed=0)
    losses = tr.run(200, batch_fn, loss_fn)
    assert len(losses) == 200 == tr.step and sum(losses[-20:]) < 0.2 * sum(losses[:20])
    assert not model.training


def test_resume_from_a_saved_state_equals_an_uninterrupted_run(tmp_path):
    """Batches come from the trainer's own generator, so they are restored with the weights."""
    model, batch_fn, loss_fn = _problem()
    whole = Trainer(model, model.parameters(), lr=1e-2, steps=30, schedule="cosine", warmup=0.1, seed=3)
    want = whole.run(30, batch_fn, loss_fn)

    model2, batch_fn2, loss_fn2 = _problem()
    first = Trainer(model2, model2.parameters(), lr=1e-2, steps=30, schedule="cosine", warmup=0.1, seed=3)
    first.run(12, batch_fn2, loss_fn2)
    first.save(tmp_path / "state.pt", note="x")
    model3, batch_fn3, loss_fn3 = _problem(seed=7)  # other initial weights: all must come from the file
    resumed = Trainer(model3, model3.parameters(), lr=1e-2, steps=30, schedule="cosine", warmup=0.1, seed=0)
    state = Trainer.read(tmp_path / "state.pt")
    assert state["note"] == "x"
    resumed.load_state_dict(state)
    resumed.run(18, batch_fn3, loss_fn3)
    assert resumed.losses == want  # bit-identical: same batches, same optimizer state, same schedule
    for a, b in zip(model.parameters(), model3.parameters(), strict=True):
        assert torch.equal(a, b)


def test_schedule_warmup_then_cosine_to_a_tenth():
    assert lr_at(1.0, 0, 100, warmup=0.1, schedule="cosine") == pytest.approx(0.1)
    assert lr_at(1.0, 9, 100, warmup=0.1, schedule="cosine") == pytest.approx(1.0)
    assert lr_at(1.0, 10, 100, warmup=0.1, schedule="cosine") == pytest.approx(1.0)
    assert lr_at(1.0, 100, 100, warmup=0.1, schedule="cosine") == pytest.approx(0.1)
    assert lr_at(1.0, 55, 100, warmup=0.1, schedule="cosine") == pytest.approx(0.55)
    assert all(lr_at(2.0, s, 10) == 2.0 for s in range(10))  # constant, no warmup


def test_divergence_and_bad_settings_are_clear_errors():
    model, batch_fn, _ = _problem()
    tr = Trainer(model, model.parameters(), lr=1e-2, steps=5, desc="recover")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(HeadscopeError, match="recover: training diverged .* at step 0"):
        tr.run(1, batch_fn, lambda b: model(b[0]).sum() * float("nan"))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # no NaN step was taken
    with pytest.raises(HeadscopeError, match="learning rate must be a positive number, got -1"):
        Trainer(model, model.parameters(), lr=-1, steps=5)
    with pytest.raises(HeadscopeError, match="unknown learning-rate schedule 'cosin'"):
        Trainer(model, model.parameters(), lr=1e-3, steps=5, schedule="cosin")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(HeadscopeError, match="nothing to train"):
        Trainer(frozen, [p for p in frozen.parameters() if p.requires_grad], lr=1e-3, steps=5)
