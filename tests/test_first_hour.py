"""The first hour (issue 43): what a study's report and answers say to a newcomer. Roles come from roles.csv
beside heads.csv, the answers name their 95% intervals and the curve's step, say that criteria disagree when
they do, answer question 2 for encoders from the pruning curve per layer, and a study with time left says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.artifacts import HEADS_CSV
from headscope.report.pruning import redundancy_sentences
from headscope.report.sources import Sources, read_heads
from headscope.study.answers import answers
from headscope.study.cli import leftover_line
from headscope.study.stages import PRUNE_TARGET
from headscope.table import HeadTable

L, H = 2, 3


def _heads(out: Path, seed: int = 0, **extra: list[str]) -> HeadTable:
    """Every column heads.csv declares, random, plus `extra` text columns."""
    rng = np.random.default_rng(seed)
    cols: dict[str, object] = {c: rng.random((L, H)) for c in HEADS_CSV.columns() if c not in ("layer", "head")}
    cols.update({k: np.array(v, dtype=object).reshape(L, H) for k, v in extra.items()})
    return HeadTable(L, H, cols)


def test_the_report_takes_roles_from_roles_csv_beside_heads_csv(tmp_path):
    heads = _heads(tmp_path, seed=0)
    heads.to_csv(tmp_path / "heads.csv")
    # roles.csv: the same statistics measured on other passages, plus the role labels
    roles = _heads(tmp_path, seed=1, roles=["sink", "", "broad;sink", "previous_token", "", "sink"])
    roles.to_csv(tmp_path / "roles.csv")
    table = read_heads(Sources.scan([tmp_path]))
    assert table is not None and "roles" in table, table.columns if table else None
    labels = [x if isinstance(x, str) else "" for x in table["roles"].ravel()]  # an empty cell reads as NaN
    assert labels == ["sink", "", "broad;sink", "previous_token", "", "sink"], labels
    # where both files have a column, heads.csv's numbers stay (they are what the heads section is about)
    np.testing.assert_allclose(table["entropy"].astype(float), heads["entropy"], rtol=1e-5)
    assert not np.allclose(table["entropy"].astype(float), roles["entropy"].astype(float))


def test_a_roles_csv_of_another_model_is_named_and_the_heads_stay(tmp_path):
    _heads(tmp_path).to_csv(tmp_path / "heads.csv")
    HeadTable(3, 3, {"roles": np.array(["sink"] * 9, dtype=object).reshape(3, 3)}).to_csv(tmp_path / "roles.csv")
    src = Sources.scan([tmp_path])
    table = read_heads(src)
    assert table is not None and "roles" not in table and "entropy" in table
    assert "roles.csv" in src.problems and "3 layers x 3 heads" in src.problems["roles.csv"], src.problems


def test_no_repeated_sentence_when_no_head_can_go():
    rows = [{"layer": i, "heads": 12, "removable": 0, "removable_recovered": 0} for i in range(3)]
    # prune.json's own sentences already say that no head can go: the per-layer ones add nothing
    assert redundancy_sentences(rows, 0.01, "the upper bound of the drop's interval", said_none=True) == []
    alone = redundancy_sentences(rows, 0.01, "the upper bound of the drop's interval")
    assert len(alone) == 2 and all("first step" in s for s in alone), alone


def _study_folder(out: Path, *, causal: bool, rank: list[list[float]]) -> dict:
    """A study folder as the stages write it (only what the answers read), for a 2 x 6 model."""
    out.mkdir(parents=True, exist_ok=True)
    n_layers, n_heads = 2, 6
    within = {"fraction_removed": 4 / 12, "n_removed": 4, "metric": 0.97, "drop": 0.03, "drop_lo": 0.02,
              "drop_hi": 0.04, "confident": {"fraction_removed": 4 / 12, "n_removed": 4, "drop": 0.03,
                                             "drop_lo": 0.02, "drop_hi": 0.04}}
    (out / "prune.json").write_text(json.dumps({
        "n_layers": n_layers, "n_heads": n_heads, "method": "taylor", "metric": "fidelity",
        "baseline_perplexity": None, "heldout_passages": 64, "target_drop": float(PRUNE_TARGET),
        "within": {"1%": {**within, "n_removed": 0, "fraction_removed": 0.0}, "5%": within},
        "saved_model": {"heads_kept": 8, "parameters": 900, "parameters_original": 1000}}))
    pd.DataFrame({"step": [0, 1, 2], "fraction_removed": [0, 2 / 12, 4 / 12], "n_removed": [0, 4, 8]}).to_csv(
        out / "prune_curve.csv", index=False)
    pd.DataFrame({"layer": [0, 1], "heads": [6, 6], "removable": [1, 3]}).to_csv(out / "redundancy.csv",
                                                                                 index=False)
    names = ["taylor", "entropy", "ablation"]
    pd.DataFrame(rank, index=names, columns=names).to_csv(out / "rank_correlation.csv")
    (out / "importance.json").write_text(json.dumps({"meta": {"stability": {
        m: {"spearman_brown": 0.9} for m in names}}}))
    (out / "roles.json").write_text(json.dumps({"census": {"sink": [{"head": "L0H1"}, {"head": "L1H2"}],
                                                           "previous_token": [{"head": "L0H0"}]}}))
    return {"model": {"heads": n_layers * n_heads, "causal": causal}, "stages": {}}


def test_the_answers_speak_plainly_and_name_their_intervals(tmp_path):
    state = _study_folder(tmp_path, causal=False, rank=[[1, -0.3, 0.9], [-0.3, 1, -0.2], [0.9, -0.2, 1]])
    a = answers(tmp_path, state)
    assert a["q1"].startswith("What the heads learn: of the 12 heads, 2 sink heads, 1 previous-token have a "
                              "clear role"), a["q1"]
    assert "sink heads park their attention" in a["q1"] and "95% interval" in a["q1"], a["q1"]
    q3 = a["q3"]
    assert "33% of heads (4) can go within a 5% drop of fidelity" in q3 and "95% interval" in q3, q3
    assert "how close the pruned model's outputs stay" in q3, q3  # what fidelity is, said once
    # the curve measured 0, 4, 8 heads: the answer is not finer than that, and says so
    assert "the curve measured every 4 heads, so the true number lies between 4 and 7" in q3, q3
    # the saved model is the pruned model the answer describes (the study prunes to that target)
    assert "the saved model (model/) is that pruned model: 8 heads and 90% of the parameters" in q3, q3
    # stable within a criterion, and yet the criteria disagree: both are said
    mean = (-0.3 + 0.9 - 0.2) / 3
    assert "repeats its ranking on two halves" in q3 and "disagree with each other" in q3, q3
    assert f"mean rank correlation {mean:.2f}; taylor vs entropy -0.30" in q3, q3
    # an encoder's question 2 is answered from the pruning curve per layer
    assert "layers 0-1 gave up 1, 3 of their 6 heads" in a["q2"], a["q2"]


def test_criteria_that_agree_are_not_called_in_disagreement(tmp_path):
    state = _study_folder(tmp_path, causal=True, rank=[[1, 0.8, 0.9], [0.8, 1, 0.85], [0.9, 0.85, 1]])
    a = answers(tmp_path, state)
    assert "mostly agree" in a["q3"] and "disagree" not in a["q3"], a["q3"]
    assert "gave up" not in a["q2"], a["q2"]  # a decoder's question 2 is its cache


def test_a_study_with_time_left_says_what_more_would_buy():
    assert leftover_line(None, 600, 590) is None
    assert leftover_line({"left_s": 20}, 600, 580) is None  # under a minute left: nothing to say
    line = leftover_line({"left_s": 200, "next": "score", "next_cost_s": 300, "width": 0.4}, 600, 350)
    # (350 s spent + 300 s for the next size) / 0.85 of the budget the plan fills = 765 s: 13 minutes
    assert line is not None and line.startswith("4:10 of the budget was left: the next step, score one size "
                                                 "larger"), line
    assert line.endswith("--budget 13m would run it"), line
    assert leftover_line({"left_s": 200}, 600, 350) == "4:10 of the budget was left: every stage ran at its " \
                                                       "largest size"


def test_a_target_with_a_fraction_cap_saves_the_claimed_point():
    """`prune --fraction F --target-drop T --save-model` (the study's prune stage): the fraction caps the curve,
    the curve stops past the target, and the saved model is the point the claim names, with its recovered
    weights: the model the study's answer describes."""
    import torch

    from headscope.models.tiny import tiny_model
    from headscope.redundancy.curves.loop import prune_curve

    g = torch.Generator().manual_seed(0)
    data = [torch.randint(5, 120, (14,), generator=g).tolist() for _ in range(8)]
    hm = tiny_model("gpt2", init_std=0.2)
    res = prune_curve(hm, data, method="gradient", target_drop=0.02, fraction=0.75, step=0.125, recover_steps=1,
                      progress=False)
    last = res.points[-1]
    assert last.fraction_removed <= 0.75 + 1e-9
    track = [p.drop_recovered for p in res.points]
    # stopped at the first point past the target (by the point estimate), unless the cap came first
    assert all(d <= 0.02 for d in track[:-1]) and (track[-1] > 0.02 or last.fraction_removed >= 0.75 - 1e-9), track
    claimed = res.claimed(None, True)
    small = res.pruned_model(hm)
    removed = hm.n_layers * hm.n_heads - sum(small.heads_in_layer(layer) for layer in range(small.n_layers))
    assert removed == claimed.n_removed == res.recovered_n_removed, (removed, claimed.n_removed)
    assert len(res.points) >= 2
