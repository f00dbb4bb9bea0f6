"""Choosing the full KV heads: GQA-aware scores, budgets, thresholds, the random control, score files."""

from __future__ import annotations

import numpy as np
import pytest

from headscope.capacity.kvcache.choice import (
    choose_random,
    choose_threshold,
    choose_top,
    kv_head_scores,
    n_full_for,
    parse_budget,
    parse_budgets,
    read_scores,
    read_scores_file,
    scores_matrix,
)
from headscope.errors import HeadscopeError

# 2 layers x 6 query heads, groups of 2 (3 KV heads per layer)
SCORES = np.array([[0.9, 0.0, 0.1, 0.2, 0.0, 0.05],
                   [0.0, 0.3, 0.8, 0.7, np.nan, 0.0]])


def test_kv_head_score_is_the_best_query_head_of_its_group():
    assert np.allclose(kv_head_scores(SCORES, 3), [[0.9, 0.2, 0.05], [0.3, 0.8, 0.0]])  # NaN never wins


def test_top_keeps_the_best_kv_heads_and_counts_riders():
    c = choose_top(SCORES, 3, 2 / 6, "retrieval_score")
    assert c.full.tolist() == [[True, False, False], [False, True, False]]
    assert c.n_full == 2 and c.full_heads() == [[0], [1]]
    # cut = 0.8: L0H1 (0.0, beside 0.9) and L1H3 (0.7, beside 0.8) stay full only because of their group mates
    assert c.riders == 2
    plan = c.plan(group_size=2, sink=4, window=16)
    assert plan.full == ((0,), (1,)) and plan.windowed(0) == (1, 2) and plan.n_windowed == 4


def test_threshold_windows_a_kv_head_only_when_all_its_query_heads_fall_below():
    c = choose_threshold(SCORES, 3, 0.15, "retrieval_score")
    # L0: KV0 (0.9), KV1 (0.2 >= 0.15); L1: KV0 (0.3), KV1 (0.8); freed: L0 KV2, L1 KV2
    assert c.full.tolist() == [[True, True, False], [True, True, False]]
    assert c.budget == pytest.approx(4 / 6)
    assert c.riders == 3  # L0H1 (0.0), L0H2 (0.1), L1H0 (0.0): below 0.15, kept by a group mate
    with pytest.raises(HeadscopeError, match="no head"):
        choose_threshold(SCORES, 3, 5.0, "retrieval_score")


def test_random_control_has_equal_bytes_and_follows_the_seed():
    a, b = choose_random(2, 3, 4, seed=1, budget=0.5), choose_random(2, 3, 4, seed=1, budget=0.5)
    assert a.n_full == 4 and np.array_equal(a.full, b.full)
    assert any(not np.array_equal(choose_random(2, 3, 4, seed=s, budget=0.5).full, a.full) for s in range(2, 8))


def test_ties_broken_by_the_seed_not_by_position():
    flat = np.zeros((4, 6))
    picks = {tuple(choose_top(flat, 3, 1 / 12, "x", seed=s).full.ravel()) for s in range(12)}
    assert len(picks) > 3


@pytest.mark.parametrize("text,value", [("25%", 0.25), ("0.5", 0.5), ("100%", 1.0), ("1", 1.0)])
def test_budget_parsing(text, value):
    assert parse_budget(text) == value


@pytest.mark.parametrize("text", ["0", "0%", "-10%", "1.5", "120%", "nan", "abc", ""])
def test_budget_outside_0_1_refused(text):
    with pytest.raises(HeadscopeError, match="^keep_full"):
        parse_budgets(text)


def test_n_full_rounds_and_keeps_one():
    assert n_full_for(0.25, 90) == 23 and n_full_for(0.001, 90) == 1 and n_full_for(1.0, 90) == 90


def test_read_scores_from_a_heads_file(tmp_path):
    p = tmp_path / "roles.csv"
    rows = ["layer,head,entropy,retrieval_score,roles"] + [f"{l},{h},{l + h},{SCORES[l, h]},x" for l in range(2)
                                                          for h in range(6)]
    p.write_text("\n".join(rows).replace("nan", ""))
    s = read_scores(p, "retrieval_score", 2, 6)
    assert np.allclose(s, SCORES, equal_nan=True)
    assert np.allclose(read_scores(p, "-entropy", 2, 6), -np.add.outer(np.arange(2), np.arange(6)))
    with pytest.raises(HeadscopeError, match="no column 'retrieval_scor'.*did you mean"):
        read_scores(p, "retrieval_scor", 2, 6)
    with pytest.raises(HeadscopeError, match="another model"):
        read_scores(p, "entropy", 1, 6)
    with pytest.raises(HeadscopeError, match="not a file"):
        read_scores(tmp_path / "none.csv", "entropy", 2, 6)


def test_scores_file_is_read_once(tmp_path):
    """kvcache reads --from when it checks its options; the matrix is built later from what was read."""
    p = tmp_path / "heads.csv"
    p.write_text("layer,head,entropy\n" + "\n".join(f"{l},{h},{l * 6 + h}" for l in range(2) for h in range(6)))
    f = read_scores_file(p, "-entropy")
    p.unlink()  # the model loads after the check: nothing reads the file again
    assert np.array_equal(scores_matrix(f, 2, 6), -np.arange(12.0).reshape(2, 6))
    with pytest.raises(HeadscopeError, match="another model"):
        scores_matrix(f, 2, 5)
