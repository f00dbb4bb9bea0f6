"""Importance across tasks: parsing and refusals, the correlation matrix against scipy, task-specific heads on
a hand-made table, metric tasks against `score`, and MiniLM end to end (fidelity, word similarity, syntax)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import spearmanr

from headscope import artifacts as A
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.redundancy.importance import ScoreSettings, score
from headscope.redundancy.importance.tasks import parse_tasks, task_correlations, task_importance, task_specific
from headscope.table import HeadTable
from tests.families import model

IDS = [[5, 17, 33, 8, 90, 41, 12, 7, 66], [9, 3, 71, 28, 54, 19], [44, 10, 101, 6, 23, 88, 15]]


def test_parse_tasks_refusals(tmp_path):
    # classification's default data is the built-in labelled `polarity`; unlabelled data is refused
    assert parse_tasks("lm_ptb,classification") == {"lm_ptb": None, "classification": None}
    with pytest.raises(HeadscopeError, match="needs labelled data.*'ptb-valid' has no labels"):
        parse_tasks("lm_ptb,classification=ptb-valid")
    for bad, msg in (("abc", "context length in tokens"), ("10", "^long must be an integer of at least 64")):
        with pytest.raises(HeadscopeError, match=msg):
            parse_tasks(f"lm_ptb,retrieval={bad}")
    assert parse_tasks("lm_ptb,retrieval=4096")["retrieval"] == "4096"
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"text": "no label here"}\n')
    with pytest.raises(HeadscopeError, match="has no labels"):
        parse_tasks(f"lm_ptb,classification={plain}")
    with pytest.raises(HeadscopeError, match="did you mean 'wordsim'"):
        parse_tasks("lm_ptb,wordsin")
    with pytest.raises(HeadscopeError, match="at least two tasks"):
        parse_tasks("lm_ptb")
    labelled = tmp_path / "l.jsonl"
    labelled.write_text('{"text": "good", "label": 1}\n')
    assert parse_tasks(f"lm_ptb, classification={labelled}") == {"lm_ptb": None, "classification": str(labelled)}


def test_task_importance_columns_equal_score_and_correlations_equal_scipy():
    hm = model("llama")
    t = task_importance(hm, {"lm_ptb": IDS, "fidelity": IDS}, method="ablation", limit=None, max_length=16,
                        batch_size=2)
    settings = ScoreSettings(methods=("ablation",), metric="lm_loss", max_length=16, batch_size=2)
    want = score(hm, IDS, settings)["importance_ablation"]
    np.testing.assert_array_equal(t["importance_lm_ptb"], want)
    corr = task_correlations(t)
    rho = spearmanr(np.ravel(t["importance_lm_ptb"]), np.ravel(t["importance_fidelity"])).statistic
    assert abs(corr.loc["lm_ptb", "fidelity"] - rho) < 1e-12
    with pytest.raises(HeadscopeError, match="does not apply"):
        task_importance(model("bert"), {"lm_ptb": IDS, "fidelity": IDS})


def test_task_specific_on_a_hand_made_table():
    # 2 x 5 heads: task a ranks L0H0 first, b ranks it last; L1H4 is near the top for both.
    a = np.array([[10, 1, 2, 3, 4], [5, 6, 7, 8, 9.5]])
    b = np.array([[0, 9, 8, 7, 6], [5, 4, 3, 2, 10]])
    t = HeadTable(2, 5, {"importance_a": a, "importance_b": b}, {})
    rows = task_specific(t, top=0.3)  # top 3 of 10
    a_not_b = {r["head"] for r in rows if r["task"] == "a"}
    b_not_a = {r["head"] for r in rows if r["task"] == "b"}
    # top-3 of a: L0H0 (10), L1H4 (9.5), L1H3 (8); in b they rank 10, 1 and 9 of 10: L0H0 and L1H3 go
    assert a_not_b == {"L0H0", "L1H3"}
    assert b_not_a == {"L0H1", "L0H2"}  # top-3 of b: L1H4, L0H1, L0H2; L0H1 and L0H2 are in a's bottom half
    r = next(r for r in rows if r["head"] == "L0H0")
    assert (r["rank_task"], r["rank_other"], r["percentile_other"]) == (1, 10, 1.0)


def test_cli_tasks_bad_input_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"text": "no label here"}\n')
    for tasks, msg in ((f"fidelity,classification={plain}", "needs labelled data"),
                       ("fidelity,retrieval=9", "--long must be an integer of at least 64"),
                       ("fidelity,retrieval", "does not apply to"),  # minilm is an encoder: no needle test
                       ):
        assert main(["tasks", "minilm", "--tasks", tasks, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0] and err[0].startswith("headscope tasks: error:"), err
        assert not out.exists()


def test_retrieval_task_uses_answered_haystacks_else_all(monkeypatch):
    """The retrieval task is Wu et al.'s score over the haystacks the model answered; when it answered none,
    every haystack's copy score, and tasks.json's task_info says which (a stand-in long_roles report)."""
    import headscope.redundancy.importance.tasks as tasks_module
    from headscope.redundancy.importance.tasks import TASKS, TaskContext

    hm = model("llama")
    answered = np.full((hm.n_layers, hm.n_heads), 0.25)
    every = np.full((hm.n_layers, hm.n_heads), 0.5)
    calls = []

    def fake(m, length, *, windows, haystacks, seed, progress):
        calls.append((length, windows, haystacks))
        ok = fake.succeeded
        return {"needles": {"succeeded": ok, "needle_accuracy": ok / haystacks, "token_accuracy": 0.9},
                "scores": {"retrieval_score": answered if ok else np.full_like(answered, np.nan),
                           "retrieval_score_all": every}}

    monkeypatch.setattr(tasks_module, "long_roles", fake)  # the name the task calls
    fn = TASKS.get("retrieval").fn
    for ok, want, says in ((2, answered, "answered haystacks"), (0, every, "answered no haystack")):
        fake.succeeded = ok
        ctx = TaskContext(hm, "64", "taylor", None, None, 4, 0)
        np.testing.assert_array_equal(fn(ctx), want)
        assert ctx.info["answered"] == ok and says in ctx.info["score"] and ctx.info["length"] == 64
    assert calls == [(64, 0, 4), (64, 0, 4)]  # needles only, at the task's length
    with pytest.raises(HeadscopeError, match="exceeds"):
        fn(TaskContext(hm, str(hm.max_positions + 1), "taylor", None, None, 4, 0))


def test_wordsim_task_is_the_ablation_of_each_head(monkeypatch):
    """With a stand-in measure whose value is known for every gate setting (a weighted sum of the gates), the
    task returns exactly each head's weight: base minus the value with that head zeroed."""
    import headscope.redundancy.importance.tasks as tasks_module
    from headscope.redundancy.importance.tasks import TASKS, TaskContext

    hm = model("bert")
    weights = np.arange(hm.n_layers * hm.n_heads, dtype=float).reshape(hm.n_layers, hm.n_heads) / 10

    def fake(m, which="wordsim353", gates=None, batch_size=64):
        g = np.ones_like(weights) if gates is None else gates.numpy()
        return float((weights * g).sum())

    monkeypatch.setattr(tasks_module, "wordsim_spearman", fake)  # the name the task calls
    got = TASKS.get("wordsim").fn(TaskContext(hm, None, "taylor", None, None, 4, 0))
    np.testing.assert_allclose(got, weights, atol=1e-12)


def test_minilm_tasks_end_to_end(tmp_path):
    out = tmp_path / "t"
    assert main(["tasks", "minilm", "--tasks", "fidelity,syntax", "--limit", "12", "--max-length", "32",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(A.outputs("tasks"))
    head = (out / "tasks.csv").read_text().splitlines()[0].split(",")
    assert head == ["layer", "head", "importance_fidelity", "importance_syntax"]
    corr = (out / "task_correlation.csv").read_text().splitlines()
    assert corr[0] == ",fidelity,syntax" and len(corr) == 3
    meta = json.loads((out / "tasks.json").read_text())["meta"]
    assert meta["provenance"]["verb"] == "tasks" and set(meta["tasks"]) == {"fidelity", "syntax"}
    (pair,) = meta["correlation_intervals"]["pairs"]  # the printed matrix's interval, over the 72 heads
    assert pair["heads"] == 72 and pair["lo"] < pair["spearman"] < pair["hi"]
    assert abs(pair["spearman"] - float(corr[1].split(",")[2])) < 1e-4
    syntax = np.loadtxt(out / "tasks.csv", delimiter=",", skiprows=1)[:, 3]
    assert 0.3 < syntax.max() <= 1.0  # some head follows some relation far above chance (accuracies in [0, 1])


@pytest.mark.real
def test_smollm2_retrieval_and_probe_classification_end_to_end(tmp_path):
    """SmolLM2 through the CLI with the two tasks that need no file: needle retrieval at 160 tokens and
    polarity through a linear probe; tasks.json says how each was measured."""
    out = tmp_path / "t"
    assert main(["tasks", "smollm2", "--tasks", "retrieval=160,classification", "--method", "taylor",
                 "--limit", "8", "--max-length", "32", "--out", str(out)]) == 0
    meta = json.loads((out / "tasks.json").read_text())["meta"]
    info = meta["task_info"]
    assert info["retrieval"]["length"] == 160 and info["retrieval"]["haystacks"] == 4
    probe = info["classification"]["classifier"]
    assert probe["labels"] == ["neg", "pos"] and probe["test_accuracy"] > probe["majority_share"]
    assert info["classification"]["scored_passages"] == 8
    table = np.loadtxt(out / "tasks.csv", delimiter=",", skiprows=1)
    assert table.shape == (30 * 9, 4)
    assert table[:, 2].max() > 0.1  # some head copies the 6-digit code (Wu et al.'s score; maximum 7/16)
    assert np.isfinite(table[:, 3]).all() and (table[:, 3] != 0).any()
