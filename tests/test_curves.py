"""Iterative pruning curves: removal order, metric per point, recovery, GQA units, resume, bad input, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from headscope import HeadscopeError
from headscope.eval.evaluate import evaluate
from headscope.models.tiny import tiny_model
from headscope.redundancy.curves import (
    PARTIAL_JSON,
    candidate_units,
    prune_curve,
    pruned_model,
    relative_drop,
)
from headscope.redundancy.importance import ScoreSettings, score
from headscope.redundancy.pruning.heads import kept_heads, prune_heads, pruned_gates


def _data(n: int = 10, length: int = 14, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 120, (length,), generator=g).tolist() for _ in range(n)]


def test_each_point_matches_independent_scoring_and_evaluation():
    hm = tiny_model("gpt2", init_std=0.2)
    data, held = _data(), _data(6, seed=1)
    res = prune_curve(hm, data, method="gradient", fraction=0.5, step=0.125, heldout=held, progress=False)
    assert [r.n_removed for r in res.rows] == [0, 1, 2, 3, 4]
    removed: list[tuple[int, int]] = []
    for row in res.rows[1:]:
        gates = pruned_gates(hm, removed) if removed else None
        s = score(hm, data, ScoreSettings(methods=("gradient",)), gates=gates)["importance_gradient"]
        s = np.where(np.isnan(s), np.inf, s)
        want = divmod(int(np.argmin(s)), hm.n_heads)
        assert row.removed == [f"L{want[0]}H{want[1]}"], f"step {row.step}: removed {row.removed}, argmin {want}"
        removed.append(want)
        value = evaluate(hm, held, gates=pruned_gates(hm, removed)).value
        assert abs(value - row.metric) < 1e-9, f"step {row.step}: curve {row.metric} vs evaluate {value}"
        assert abs(row.drop - (math.exp(value - res.rows[0].metric) - 1)) < 1e-12
    assert abs(res.rows[0].metric - evaluate(hm, held).value) < 1e-9


def test_physically_pruned_model_reproduces_the_last_point():
    hm = tiny_model("bert", init_std=0.2)
    data = _data()
    res = prune_curve(hm, data, method="ablation", fraction=0.5, step=0.25, progress=False)
    small = pruned_model(hm, res)
    assert sum(len(k) for k in kept_heads(small).values()) == hm.n_layers * hm.n_heads - res.rows[-1].n_removed
    # Fidelity of the pruned model against the unpruned one, computed without gates.
    from headscope.eval.evaluate import evaluate_prepared, make_reference, prepare

    prep, _ = prepare(hm, data, "fidelity")
    ref = make_reference(hm, prep)
    got = evaluate_prepared(small, prep, "fidelity", reference=ref).value
    assert abs(got - res.rows[-1].metric) < 1e-5, f"pruned {got} vs curve {res.rows[-1].metric}"


@pytest.mark.parametrize("unit", ["slice", "group"])
def test_gqa_units_are_always_prunable(unit):
    hm = tiny_model("llama", init_std=0.2)  # 6 query heads in 2 groups of 3
    res = prune_curve(hm, _data(), method="taylor", fraction=0.9, step=0.05, unit=unit, progress=False)
    size = hm.n_kv_heads if unit == "slice" else hm.group_size
    for row in res.rows[1:]:
        assert len(row.removed) % size == 0, row.removed
        prune_heads(hm, res.removed_order(row.n_removed))  # raises if repeat_kv could not express it
    assert res.rows[-1].n_removed == (10 if unit == "slice" else 9)


def test_candidate_slices_take_the_weakest_head_of_each_group():
    hm = tiny_model("llama")
    scores = np.array([[5.0, 1.0, 3.0, 0.5, 9.0, 2.0], [1.0] * 6])
    units = candidate_units(hm, scores, set(), "slice")
    layer0 = [heads for _, heads in units if heads[0][0] == 0]
    assert layer0[0] == [(0, 1), (0, 3)] and layer0[1] == [(0, 2), (0, 5)] and layer0[2] == [(0, 0), (0, 4)]


def test_recovery_trains_a_copy_and_helps():
    hm = tiny_model("gpt2", init_std=0.2)
    before = {k: v.clone() for k, v in hm.model.state_dict().items()}
    data = _data(8)
    res = prune_curve(hm, data, method="gradient", fraction=0.5, step=0.25, recover_steps=15, recover_lr=3e-3,
                      progress=False)
    assert all(torch.equal(before[k], v) for k, v in hm.model.state_dict().items()), "input model was modified"
    last = res.rows[-1]
    assert last.metric_recovered < last.metric, f"recovery did not lower the loss: {last}"
    # The recovered weights, physically pruned, give the recovered metric.
    small = pruned_model(hm, res)
    got = evaluate(small, data).value
    assert abs(got - last.metric_recovered) < 1e-5, f"{got} vs {last.metric_recovered}"


def test_target_drop_stops_after_first_crossing():
    hm = tiny_model("bert", init_std=0.2)
    res = prune_curve(hm, _data(), method="gradient", target_drop=0.02, step=0.125, progress=False)
    best = res.best()
    assert best.drop <= 0.02
    assert res.rows[-1].drop > 0.02 or res.rows[-1].n_removed == math.floor(0.95 * 8)
    assert all(r.drop <= 0.02 for r in res.rows[: res.rows.index(best) + 1])
    profile = res.redundancy()
    assert sum(p["removable"] for p in profile) == best.n_removed
    assert [p["heads"] for p in profile] == [4, 4]
    table = res.redundancy_table()
    assert table["removable"].sum() == best.n_removed
    assert np.isnan(table["removed_at"]).sum() == 8 - res.rows[-1].n_removed
    assert [int(table["removable"][l].sum()) for l in range(2)] == [p["removable"] for p in profile]


@pytest.mark.parametrize("target", [0.03, 0.12])
def test_target_drop_with_recovery_keeps_the_weights_of_the_chosen_point(target):
    hm = tiny_model("gpt2", init_std=0.2)
    data = _data(8)
    # A learning rate too small to rescue anything: the recovered curve crosses the target too, and the
    # recovered weights must step back to the last point within it, judged on the upper bound of the drop's
    # interval (claims.py), not on the point estimate.
    res = prune_curve(hm, data, method="gradient", target_drop=target, step=0.125, recover_steps=2,
                      recover_lr=1e-7, progress=False)
    best, by_point = res.claimed(recovered=True), res.best(recovered=True)
    after = res.rows[res.rows.index(best) + 1]  # the bound passes the target before the curve ends
    assert res.has_intervals and after.bounds["drop_recovered_hi"] > target and best.n_removed < by_point.n_removed
    assert best is res.rows[0] or best.bounds["drop_recovered_hi"] <= target
    assert res.recovered_n_removed == best.n_removed
    got = evaluate(pruned_model(hm, res), data).value
    assert abs(got - best.metric_recovered) < 1e-5, f"{got} vs {best.metric_recovered}"


def test_relative_drop():
    assert relative_drop("lm_loss", 2.0, 2.0 + math.log(1.05)) == pytest.approx(0.05)
    assert relative_drop("fidelity", 1.0, 0.97) == pytest.approx(0.03)
    assert relative_drop("accuracy", 0.8, 0.6) == pytest.approx(0.25)


def test_bad_input():
    hm = tiny_model("gpt2")
    data = _data(4)
    for frac in (1.0, -0.1, 1.5):
        with pytest.raises(HeadscopeError, match=r"fraction must be in \[0, 1\)"):
            prune_curve(hm, data, fraction=frac, progress=False)
    with pytest.raises(HeadscopeError, match="did you mean 'gradient'"):
        prune_curve(hm, data, method="gradeint", fraction=0.2, progress=False)
    with pytest.raises(HeadscopeError, match="give a fraction"):
        prune_curve(hm, data, progress=False)
    with pytest.raises(HeadscopeError, match="unit 'slice'"):
        prune_curve(tiny_model("llama"), data, fraction=0.2, unit="head", progress=False)
    with pytest.raises(HeadscopeError, match="step must be in"):
        prune_curve(hm, data, fraction=0.2, step=0, progress=False)


def test_interrupted_run_resumes_to_the_same_curve(tmp_path, monkeypatch):
    import headscope.redundancy.importance as importance

    hm = tiny_model("gpt2", init_std=0.2)
    data = _data(6)
    kw = dict(method="gradient", fraction=0.5, step=0.125, recover_steps=2, progress=False)
    full = prune_curve(hm, data, **kw)
    real, calls = importance.score, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(importance, "score", flaky)
    with pytest.raises(KeyboardInterrupt):
        prune_curve(hm, data, checkpoint=tmp_path, **kw)
    saved = json.loads((tmp_path / PARTIAL_JSON).read_text())
    assert len(saved["rows"]) == 3  # baseline + 2 finished steps
    monkeypatch.setattr(importance, "score", real)
    resumed = prune_curve(hm, data, checkpoint=tmp_path, **kw)
    assert [r.removed for r in resumed.rows] == [r.removed for r in full.rows]
    for a, b in zip(resumed.rows, full.rows, strict=True):
        assert abs(a.metric - b.metric) < 1e-9 and abs(a.metric_recovered - b.metric_recovered) < 1e-5, (a, b)
    with pytest.raises(HeadscopeError, match="other settings"):
        prune_curve(hm, data, checkpoint=tmp_path, **{**kw, "method": "taylor"})


def test_ptb_sentences():
    from headscope.data import ptb_sentences

    train, valid = ptb_sentences("train", 5), ptb_sentences("valid", 5)
    assert len(train) == 5 and all(len(s.split()) >= 6 for s in train)
    assert not set(train) & set(valid)
    with pytest.raises(HeadscopeError, match="did you mean 'valid'"):
        ptb_sentences("vaild")


# --- CLI -------------------------------------------------------------------------------------
def _cli(*argv: str) -> int:
    from headscope.cli import main

    return main(list(argv))


def test_cli_writes_curve_redundancy_and_a_loadable_model(tmp_path, minilm, capsys):
    import csv

    from headscope.models.checkpoint import load_checkpoint

    out = tmp_path / "out"
    rc = _cli("prune", "minilm", "--fraction", "10%", "--step", "0.05", "--limit", "4", "--max-length", "16",
              "--out", str(out), "--save-model")
    assert rc == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["compare.csv", "compare.json",  # the check --save-model ends with (docs/compare.md)
                     "model", "prune.json", "prune_curve.csv", "prune_curve.png", "redundancy.csv"], names
    rows = list(csv.DictReader((out / "prune_curve.csv").read_text().splitlines()))
    assert [int(r["n_removed"]) for r in rows] == [0, 4, 7]  # 5% of 72 heads = 4 per step, capped at 7
    red = list(csv.DictReader((out / "redundancy.csv").read_text().splitlines()))
    summary = json.loads((out / "prune.json").read_text())
    assert sum(int(r["removable"]) for r in red) == len(summary["heads_removed_within_target"])
    assert (out / "prune_curve.png").read_bytes()[:4] == b"\x89PNG"
    small = load_checkpoint(out / "model")
    removed = [h for r in rows for h in r["removed"].split()]
    assert sum(small.heads_in_layer(l) for l in range(6)) == 72 - len(removed) == 65
    # The saved model reproduces the curve's last point (fidelity against the unpruned MiniLM).
    from headscope.data import read_texts
    from headscope.eval.evaluate import evaluate_prepared, make_reference, prepare

    prep, _ = prepare(minilm, read_texts(None, 4), "fidelity", 16)
    got = evaluate_prepared(small, prep, "fidelity", reference=make_reference(minilm, prep)).value
    assert abs(got - float(rows[-1]["metric"])) < 1e-5, f"{got} vs {rows[-1]['metric']}"
    # A second run refuses to overwrite without --force.
    assert _cli("prune", "minilm", "--fraction", "0.1", "--out", str(out)) == 2
    assert "already holds" in capsys.readouterr().err


def test_cli_interrupted_prune_with_recovery_resumes_to_identical_files(tmp_path, monkeypatch, minilm):
    """Interrupted mid-curve, a rerun resumes from the partial checkpoint (the recovered copy's weights,
    optimizer and batch generator) and writes the same bytes as an uninterrupted run.

    The model is a tiny GPT-2 reading MiniLM's tokenizer (so recovery is LM distillation, and fast)."""
    import headscope.redundancy.importance as importance
    from headscope.models.adapter import HeadModel

    def load(*args, **kwargs):
        tiny = tiny_model("gpt2", init_std=0.2, vocab_size=minilm.tokenizer.vocab_size)
        return HeadModel(model=tiny.model, tokenizer=minilm.tokenizer, name="tiny-gpt2", source="config")

    from headscope.options import groups  # prune loads through PruneOptions.load

    monkeypatch.setattr(groups, "load_model", load)
    # Batches of 2 of the 6 passages: a resumed run that drew other batches would train differently.
    argv = ["prune", "tiny", "--fraction", "50%", "--step", "0.25", "--limit", "6", "--max-length", "16",
            "--batch-size", "2", "--recover-steps", "2", "--recover-lr", "1e-3"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert _cli(*argv, "--out", str(full)) == 0
    real, calls = importance.score, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # while scoring for the second point
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(importance, "score", flaky)
    assert _cli(*argv, "--out", str(part)) == 130
    saved = json.loads((part / PARTIAL_JSON).read_text())
    assert len(saved["rows"]) == 2 and (part / saved["state"]["file"]).exists()
    monkeypatch.setattr(importance, "score", real)
    assert _cli(*argv, "--out", str(part)) == 0
    names = sorted(p.name for p in full.iterdir())
    assert sorted(p.name for p in part.iterdir()) == names, "the partial checkpoint should be cleared"
    for name in names:
        assert (part / name).read_bytes() == (full / name).read_bytes(), f"{name} differs after resuming"
    rows = (full / "prune_curve.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 and "perplexity_recovered" in rows[0]  # 0, 2, 4 of 8 heads, recovered too


@pytest.mark.parametrize("argv, message", [
    (["--fraction", "1.0"], "fraction must be in [0, 1)"),
    (["--fraction=-5%"], "fraction must be in [0, 1)"),
    (["--fraction", "0.2", "--method", "gradinet"], "did you mean 'gradient'"),
    ([], "give a fraction"),
])
def test_cli_bad_input(tmp_path, capsys, argv, message):
    assert _cli("prune", "minilm", "--out", str(tmp_path / "o"), *argv) == 2
    err = capsys.readouterr().err
    assert message in err and "headscope prune: error:" in err, err
    assert not (tmp_path / "o").exists()
