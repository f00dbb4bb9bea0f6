"""headscope.eval.lm against naive per-position loops: NLL, KL, the distillation loss, counted positions."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.eval.lm import counted_positions, distillation_loss, kl_sums, nll_sums, perplexity


def _batch(seed: int = 0, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 4, 2]  # right padding; the last row predicts one token
    mask = torch.zeros(3, 6, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    ids = torch.randint(0, vocab, (3, 6), generator=g)
    a = torch.randn(3, 6, vocab, generator=g, dtype=torch.float64)
    b = torch.randn(3, 6, vocab, generator=g, dtype=torch.float64)
    return ids, mask, a, b, lengths


def test_counted_positions_are_those_with_a_real_next_token():
    _, mask, _, _, lengths = _batch()
    keep = counted_positions(mask)
    assert keep.sum(-1).tolist() == [n - 1 for n in lengths]


def test_nll_equals_a_loop_over_positions():
    ids, mask, logits, _, lengths = _batch()
    got, count = nll_sums(logits, ids, mask)
    for r, n in enumerate(lengths):
        want = sum(-torch.log_softmax(logits[r, t], -1)[ids[r, t + 1]].item() for t in range(n - 1))
        assert got[r].item() == pytest.approx(want, abs=1e-10), f"row {r}: diff {abs(got[r].item() - want):.2e}"
        assert count[r].item() == n - 1


def test_kl_and_distillation_loss_equal_a_loop_over_positions():
    _, mask, ref, cand, lengths = _batch(1)
    sums, count = kl_sums(ref, cand, mask)
    total, n_all = 0.0, 0
    for r, n in enumerate(lengths):
        want = 0.0
        for t in range(n - 1):
            p, q = torch.softmax(ref[r, t], -1), torch.softmax(cand[r, t], -1)
            want += float((p * (p.log() - q.log())).sum())
        assert sums[r].item() == pytest.approx(want, abs=1e-10), f"row {r}: diff {abs(sums[r].item() - want):.2e}"
        total, n_all = total + want, n_all + n - 1
    assert count.sum().item() == n_all
    # The distillation loss is the same KL averaged over the same positions (teacher = reference).
    loss = distillation_loss(cand, ref, mask)
    assert loss.item() == pytest.approx(total / n_all, abs=1e-10)


def test_distillation_loss_is_zero_for_identical_models_and_differentiable_in_the_student():
    _, mask, ref, _, _ = _batch(2)
    assert distillation_loss(ref.clone(), ref, mask).item() == pytest.approx(0.0, abs=1e-12)
    student = (ref + 0.3 * torch.randn_like(ref)).requires_grad_(True)
    teacher = ref.clone().requires_grad_(True)
    distillation_loss(student, teacher, mask).backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None  # the teacher is a fixed target
    # Padding positions never move the loss.
    pad_grad = student.grad[2, 1:]  # row 2 has 2 real tokens: only position 0 predicts a real token
    assert pad_grad.abs().max().item() == 0.0


def test_half_precision_logits_are_widened():
    ids, mask, logits, _, _ = _batch(3)
    a, _ = nll_sums(logits.float(), ids, mask)
    b, _ = nll_sums(logits.bfloat16(), ids, mask)
    assert a.dtype == b.dtype == torch.float64
    assert torch.allclose(a, b, atol=0.1)  # bf16 logits keep ~3 significant digits


def test_perplexity():
    assert perplexity(2 * math.log(3), 2) == pytest.approx(3.0)
    assert math.isnan(perplexity(1.0, 0)) and perplexity(1e6, 1) == math.inf


def test_target_nll_counts_only_positions_with_a_target():
    from headscope.eval.lm import target_nll

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4, 7, generator=g)
    targets = torch.tensor([[1, -100, 3, 0], [-100, -100, 6, 2]])
    nll, n, correct = target_nll(logits, targets)
    want = sum(-torch.log_softmax(logits[b, t], -1)[targets[b, t]].item()
               for b in range(2) for t in range(4) if targets[b, t] != -100)
    assert n == 5 and nll.item() == pytest.approx(want, rel=1e-6)
    assert correct == sum(int(logits[b, t].argmax() == targets[b, t])
                          for b in range(2) for t in range(4) if targets[b, t] != -100)
