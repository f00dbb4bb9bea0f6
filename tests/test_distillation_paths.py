"""The two former distillation paths (GQA uptraining, pruning recovery) now give identical losses.

Before, GQA uptraining averaged KL(teacher || student) over positions with a real next token, while
pruning recovery also counted the last real token of every passage. Both now train on
`headscope.eval.lm.distillation_loss`; this checks it on one right-padded batch, before any step.
"""

from __future__ import annotations

import copy

import torch

from headscope.capacity import gqa
from headscope.data import batches, pad_id, prepare_tokens
from headscope.eval.lm import distillation_loss
from headscope.eval.metrics import METRICS
from headscope.models.adapter import HeadModel
from headscope.models.tiny import tiny_model
from headscope.redundancy.curves.recovery import Recovery

# Passages of different lengths, so the batch is right-padded (rows end at 30, 17, 9 and 24 tokens).
TEXTS = [list(range(5, 35)), list(range(60, 77)), list(range(90, 99)), list(range(30, 54))]
TOL = 1e-6  # relative: float32 summation order only


def teacher_and_student() -> tuple[HeadModel, HeadModel]:
    """A tiny LLaMA (the teacher) and a copy with every weight perturbed (the student)."""
    teacher = tiny_model("llama", init_std=0.2)
    student = HeadModel(model=copy.deepcopy(teacher.model), tokenizer=None, name="student", source="perturbed")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in student.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return teacher, student


def the_batch(hm: HeadModel):
    b = next(batches(TEXTS, len(TEXTS), pad_id(hm)))
    assert (b.attention_mask == 0).any(), "the batch should hold right padding"
    return b.input_ids, b.attention_mask


def reference_loss(teacher: HeadModel, student: HeadModel) -> float:
    ids, mask = the_batch(teacher)
    with torch.no_grad():
        t = teacher.model(input_ids=ids, attention_mask=mask).logits
        s = student.model(input_ids=ids, attention_mask=mask).logits
    return float(distillation_loss(s, t, mask))


def close(got: float, want: float, what: str) -> None:
    diff = abs(got - want)
    assert diff <= TOL * abs(want), f"{what}: {got} vs distillation_loss {want}, max abs difference {diff:.3g}"


def test_gqa_uptraining_and_pruning_recovery_give_the_distillation_loss():
    teacher, student = teacher_and_student()
    want = reference_loss(teacher, student)
    assert want > 1e-3, want  # the student really differs

    # GQA uptraining: the first step's loss is computed before the optimizer moves anything.
    _, log = gqa.uptrain(student, TEXTS, 1, teacher=teacher, loss="kd", lr=1e-9, batch_size=len(TEXTS))
    close(log.losses[0], want, "gqa.uptrain")

    # Pruning recovery: the registered recovery loss of lm_loss on the same batch ...
    ids, mask = the_batch(teacher)
    entry = METRICS.get("lm_loss")
    close(float(entry.recovery_loss(student, teacher, ids, mask, {}).detach()), want, "lm_loss recovery_loss")

    # ... and one step of the recovery loop itself (all gates open; its batch holds every passage).
    prep = prepare_tokens(teacher, TEXTS, 64)
    rec = Recovery(teacher, prep, "lm_loss", None, lr=1e-9, batch_size=len(TEXTS), seed=0, steps=1)
    rec.hm.model.load_state_dict(student.model.state_dict())
    got = rec.train(torch.ones(teacher.n_layers, teacher.n_heads), 1)
    close(got, want, "curves Recovery.train")


def test_the_old_recovery_formula_would_have_failed_this_check():
    """Counting the last real token too (the former recovery loss) moves the loss far beyond TOL."""
    teacher, student = teacher_and_student()
    ids, mask = the_batch(teacher)
    with torch.no_grad():
        t = torch.log_softmax(teacher.model(input_ids=ids, attention_mask=mask).logits, -1)
        s = torch.log_softmax(student.model(input_ids=ids, attention_mask=mask).logits, -1)
    kl = (t.exp() * (t - s)).sum(-1)  # [batch, pos]
    old = float((kl * mask).sum() / mask.sum())
    want = reference_loss(teacher, student)
    assert abs(old - want) > 100 * TOL * want, (old, want)
