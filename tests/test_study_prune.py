"""The study's prune stage (issue 42 item 5): its sizes step finely enough that a model with heads to spare gets a
pruned model within the 5% target (a tiny encoder whose head importances are planted: dead heads go, the curve stops
at the first live one); a fragile model, whose least important head already costs more than the target, keeps the
original, which the third answer says in plain words and the compare stage leaves out; the cost counts the points a
target-stopped curve measures."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import BertModel

from headscope.cli import main
from headscope.models.loading import load_model
from headscope.study import costs, runner
from headscope.study import stages as S
from headscope.study.answers import answers
from headscope.study.probe import Probe
from headscope.study.records import Records
from headscope.study.unpruned import kept_original
from headscope.study.verbs import run_call
from tests.test_study import tiny_bert_dir

# The heads of the tiny BERT (2 layers x 4) whose output projection is zeroed: removing them changes nothing.
DEAD = {(0, 1), (1, 2)}


def _planted_bert(base: Path, scale: float, dead: set[tuple[int, int]], ffn: bool = True) -> Path:
    """The study tests' tiny BERT with every head's output projection times `scale` (its heads then carry the
    final hidden states) and the `dead` heads' zeroed; without `ffn`, the FFNs add nothing (only heads remain)."""
    path = tiny_bert_dir(base)
    model = BertModel.from_pretrained(path)
    d = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        for layer, block in enumerate(model.encoder.layer):
            if not ffn:
                block.output.dense.weight.zero_()  # the FFN's output projection
            w = block.attention.output.dense.weight  # [d_model, heads * d_head]: a head's columns
            w.mul_(scale)
            for h in range(model.config.num_attention_heads):
                if (layer, h) in dead:
                    w[:, h * d:(h + 1) * d] = 0
    model.save_pretrained(path)
    return path


def _prune_stage(path: Path, out: Path):
    """The study's prune stage at its cheapest size on the model at `path`, run as the study runs it (on the loaded
    model, saved into `out`): its Result."""
    hm = load_model(str(path))
    family = S.Family.of(hm)
    ctx = S.Ctx(str(path), runner.DEFAULT_DATA, runner.DEFAULT_PRUNE_DATA, runner.DEFAULT_HELDOUT, str(out), family)
    stage = next(s for s in S.stages_for(family) if s.name == "prune")
    return run_call(stage.call(ctx, 0), hm, out / "prune.log")


def _family(heads: int, n_kv: int, layers: int = 2) -> S.Family:
    per_layer = heads // layers
    return S.Family("m", "llama", True, layers, per_layer, n_kv, 8, 32, 2048, heads)


def test_every_size_steps_finely_and_stops_at_the_target():
    for lv in next(s for s in S.stages_for(_family(8, 4)) if s.name == "prune").levels:
        assert lv["step"] <= 0.02 and lv["fraction"] >= 0.5, lv
    o = S._prune_options(S.Ctx("m", "d", "p", "h", "/tmp/x", _family(8, 4)), {"n": 8, "heldout": 16, "fraction": 0.5,
                                                                              "step": 0.02, "recover": 0})
    assert (o.target_drop, o.step, o.fraction, o.save_model) == (S.PRUNE_TARGET, 0.02, 0.5, True)


def test_a_model_with_heads_to_spare_gets_a_pruned_model_within_the_target(tmp_path):
    """Two planted dead heads (Taylor scores them 0, removing them changes nothing) and six live ones, each of which
    carries the final hidden states: the cheapest size removes one head a point, takes the two dead ones within the
    target, stops at the first live one (past 5%), and saves the model without exactly the dead heads."""
    result = _prune_stage(_planted_bert(tmp_path, 10.0, DEAD), tmp_path / "out")
    points = result.curve.points
    assert [p.n_removed for p in points] == [0, 1, 2, 3]  # stopped before the fraction's cap (4 heads)
    assert {n for p in points[1:3] for n in p.removed} == {"L0H1", "L1H2"}
    assert points[1].drop == pytest.approx(0.0, abs=1e-6) and points[1].bounds["drop_hi"] <= S.PRUNE_TARGET
    assert points[3].drop > S.PRUNE_TARGET
    assert result.summary.saved_model["heads_kept"] == 6
    assert kept_original(Records(tmp_path / "out", {"prune": result})) is None


def test_a_fragile_model_keeps_the_original_and_the_answer_says_so(tmp_path):
    """Every head live and strong: even the first point of the cheapest size (one head) passes the target, so the
    saved model has every head; the third answer says so in plain words, with the first point's drop."""
    out = tmp_path / "out"
    result = _prune_stage(_planted_bert(tmp_path, 10.0, set()), out)
    first = result.curve.points[1]
    assert first.n_removed == 1 and first.drop > S.PRUNE_TARGET
    assert result.summary.saved_model["heads_kept"] == 8
    rec = Records(out, {"prune": result})
    kept = kept_original(rec)
    assert kept is not None
    cost = (f"even removing the least important head costs more than 5% of fidelity (a drop of {first.drop:.1%} "
            f"[{first.bounds['drop_lo']:.1%}, {first.bounds['drop_hi']:.1%}] without recovery)")
    assert kept.sentence() == f"{cost}: the study kept the original (model/ holds all 8 heads) and did not compare " \
                              f"it with itself"
    state = {"stages": {"prune": {"status": "done"}, "compare": {"status": "not supported"}}, "model": {"heads": 8}}
    q3 = answers(rec, state)["q3"]
    assert kept.sentence() in q3 and "against the original, the pruned model" not in q3, q3


def test_a_fragile_models_study_skips_the_compare_stage_with_the_reason(tmp_path, capsys):
    """The whole study of a model whose every head carries its outputs (no FFN to fall back on): whatever size the
    plan gives prune (here its richest, 8 recovery steps a point), the first head passes 5%; the compare stage is
    skipped with the first step's cost, read here from prune_curve.csv, and the report is written."""
    out = tmp_path / "study"
    assert main(["study", str(_planted_bert(tmp_path, 10.0, set(), ffn=False)), "--budget", "2m", "--out",
                 str(out)]) == 0
    st = json.loads((out / "study.json").read_text())
    assert st["stages"]["prune"]["status"] == "done" and (out / "model" / "config.json").is_file()
    with open(out / "prune_curve.csv", encoding="utf-8", newline="") as f:
        first = next(r for r in csv.DictReader(f) if float(r["n_removed"]) > 0)
    assert first["n_removed"] == "1"
    drop, lo, hi = (float(first[k]) for k in ("drop_recovered", "drop_recovered_lo", "drop_recovered_hi"))
    assert drop > S.PRUNE_TARGET
    cost = (f"even removing the least important head costs more than 5% of fidelity (a drop of {drop:.1%} "
            f"[{lo:.1%}, {hi:.1%}] after recovery)")
    assert st["stages"]["compare"] == {"status": "not supported", "reason": "no compressed model to compare: prune "
                                                                            f"kept the original model: {cost}"}
    assert not (out / "compare").exists() and (out / "report.html").is_file()
    assert f"{cost}: the study kept the original (model/ holds all 8 heads) and did not compare it with itself" in \
        st["answers"]["q3"]
    capsys.readouterr()


def test_the_cost_counts_the_points_until_the_target():
    """By hand: the points a target-stopped curve measures are those expected within the target and the one past
    it, in whole units (GQA slices), capped by the fraction."""
    lv = {"n": 8, "heldout": 16, "fraction": 0.5, "step": 0.02, "recover": 0}
    # SmolLM2's shape: 270 heads, 9 per layer in 3 KV groups; 2% is 5 heads, so 2 slices (6 heads) a point;
    # 10% expected within is 27 heads: 5 points, then the one past the target
    smol = S.Family("m", "llama", True, 30, 9, 3, 64, 576, 8192, 270)
    assert costs.PRUNE_EXPECTED_WITHIN[False] == 0.1 and S.prune_points(smol, lv) == 6
    # an MHA model of 8 heads: one head a point (a step of at least one), 0.8 expected within: 1 point, then 1 past
    assert S.prune_points(_family(8, 4), lv) == 2
    # the fraction caps it: a 4-head model at 50% measures 2 points at most
    assert S.prune_points(_family(4, 2), {**lv, "fraction": 0.25}) == 1
    p = Probe(load_s=2.0, fwd_s=0.1, train_s=0.3, cpu_s=0.05, length=64, passages=16)
    per_point = 8 * 0.3 + 16 * 0.1  # re-scoring by Taylor, one held-out pass (no recovery)
    by_hand = 16 * 0.1 + 6 * per_point + costs.PRUNE_LOADS * 2.0 + 0.05 * (costs.PRUNE_CPU_FIXED +
                                                                            costs.PRUNE_CPU_PER_POINT * 6)
    assert S._prune_cost(p, smol, lv) == pytest.approx(by_hand)
    # with recovery the curve stops on the recovered drop, later: 13% expected within is 35.1 heads, 6 points and the
    # one past (the study's SmolLM2 run measured these 7); per point the held-out metric before and after recovery,
    # and the recovery steps
    rec = {**lv, "recover": 2}
    assert costs.PRUNE_EXPECTED_WITHIN[True] == 0.13 and S.prune_points(smol, rec) == 7
    per_point = 8 * 0.3 + 2 * 16 * 0.1 + 2 * costs.RECOVERY_BATCH * 0.3 * costs.RECOVERY_TRAIN
    assert S._prune_cost(p, smol, rec) == pytest.approx(16 * 0.1 + 7 * per_point + costs.PRUNE_LOADS * 2.0 + 0.05 * (
        costs.PRUNE_CPU_FIXED + costs.PRUNE_CPU_PER_POINT * 7))
    assert math.isfinite(S._prune_cost(p, _family(8, 4), lv))
