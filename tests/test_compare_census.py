"""compare's role census rows (`roles:<role>`, the `heads` task): on the hand-written two-layer model of
test_compare, silencing the planted induction head loses exactly one induction head and keeps the previous-token
head; silencing the previous-token head loses it; each row's count equals what `roles` itself finds on the same
passages and sequences; the count's paired interval is a bootstrap of the difference of counts."""

from __future__ import annotations

import json

import numpy as np
import torch
from test_compare import TEXTS, planted_model

import headscope
from headscope.compare.census import census_spec, compact, count_of
from headscope.compare.verdict import paired_change
from headscope.learned.roles import RoleSettings, Thresholds, roles
from headscope.learned.roles.registry import ROLES
from headscope.redundancy.pruning.heads import prune_heads
from headscope.stats import COUNT
from headscope.uncertainty import IntervalSettings

D, DH = 128, 64  # the planted model's residual width and head size


def silenced(layer: int, head: int) -> headscope.HeadModel:
    """The planted model with one head's query, key, value and output weights all 0: it attends uniformly and
    writes nothing (a head pruned away, in the census's eyes)."""
    hm = planted_model()
    attn = hm.model.transformer.h[layer].attn
    with torch.no_grad():
        for part in range(3):  # c_attn's columns: q | k | v, head h at h * DH of each
            attn.c_attn.weight[:, part * D + head * DH:part * D + (head + 1) * DH] = 0.0
            attn.c_attn.bias[part * D + head * DH:part * D + (head + 1) * DH] = 0.0
        attn.c_proj.weight[head * DH:(head + 1) * DH] = 0.0
    return hm


def census(base: headscope.HeadModel, other: headscope.HeadModel) -> headscope.compare.CompareResult:
    return headscope.compare(base, other, tasks=("heads",), items=12, bootstrap=200, data=TEXTS)


def test_silencing_the_induction_head_loses_one_induction_head_and_keeps_the_previous_token_head():
    got = census(planted_model(), silenced(1, 0))
    ind, prev = got.change("roles:induction"), got.change("roles:previous_token")
    assert (ind.base, ind.other, ind.delta, ind.delta_lo, ind.delta_hi) == (1, 0, -1, -1, -1)
    assert ind.verdict == "lost" and ind.n == 12  # the 12 repeated sequences
    assert (prev.base, prev.other, prev.verdict, prev.n) == (1, 1, "kept", len(TEXTS))
    heads = got.record.rows["roles:induction"]["heads"]
    assert heads == {"base": ["L1H0"], "other": []}
    assert got.record.rows["roles:previous_token"]["heads"] == {"base": ["L0H0"], "other": ["L0H0"]}
    assert got.change("roles:broad").delta == 1  # the silenced head now spreads its weight evenly


def test_silencing_the_previous_token_head_loses_it():
    got = census(planted_model(), silenced(0, 0))
    prev = got.change("roles:previous_token")
    assert (prev.base, prev.other, prev.verdict) == (1, 0, "lost")
    assert got.record.rows["roles:previous_token"]["heads"]["other"] == []


def test_heads_removed_physically_hold_no_role_and_the_others_keep_their_names():
    # prune --save-model removes heads: the census of the smaller model maps its heads to their original ids
    pruned = prune_heads(planted_model(), [(0, 1), (1, 0)])
    assert [pruned.heads_in_layer(layer) for layer in range(2)] == [1, 1]
    got = census(planted_model(), pruned)
    assert got.record.rows["roles:induction"]["heads"] == {"base": ["L1H0"], "other": []}
    assert got.verdict("roles:induction") == "lost"
    assert got.record.rows["roles:broad"]["heads"] == {"base": ["L0H1", "L1H1"], "other": ["L1H1"]}
    assert got.record.rows["roles:previous_token"]["heads"] == {"base": ["L0H0"], "other": ["L0H0"]}


def test_a_head_whose_output_alone_is_zeroed_keeps_its_pattern_and_is_still_counted():
    # the census reads attention patterns: zeroing L1H0's output leaves where it attends; heads:<task> sees the loss
    got = census(planted_model(), planted_model(zero=(1, 0)))
    assert got.change("roles:induction").other == 1 and got.verdict("roles:induction") == "kept"


def test_a_model_against_itself_changes_no_count():
    hm = planted_model()
    got = census(hm, hm)
    assert {c.capability for c in got.changes} == {f"roles:{e.name}" for e, _ in census_spec(True)}
    for c in got.changes:
        assert (c.delta, c.delta_lo, c.delta_hi, c.verdict) == (0, 0, 0, "kept"), c


def test_each_count_is_what_roles_finds_on_the_same_items():
    hm = planted_model()
    got = census(hm, hm)
    table = roles(hm, TEXTS, RoleSettings(n_sequences=12, repeat_length=15, batch_size=16,
                                          intervals=IntervalSettings(B=200)))
    held = {r: 0 for r in ROLES}
    for cell in np.char.add(np.char.add(table["roles"].astype(str), ";"), table["uncertain_roles"].astype(str)).ravel():
        for r in {x for x in cell.split(";") if x}:
            held[r] += 1
    for entry, _ in census_spec(True):
        assert got.change(f"roles:{entry.name}").base == held[entry.name], entry.name
    assert held["induction"] == 1 and held["previous_token"] == 1  # the planted heads, found by both


def test_the_interval_is_a_bootstrap_of_the_difference_of_counts():
    # 10 items; head (0, 0) of BASE passes the previous-token rule on 6 items' mass, OTHER's never
    entry = ROLES.get("previous_token")
    score, base = entry.score, entry.baseline
    mass = np.where(np.arange(10) < 6, 0.9, 0.1)[:, None, None] * np.ones((10, 1, 2))
    mass[:, 0, 1] = 0.05
    b = {score: mass * 20, score + COUNT: np.full((10, 1, 1), 20.0), base: np.full((10, 1, 1), 1.0),
         base + COUNT: np.full((10, 1, 1), 20.0)}
    o = {**b, score: np.full((10, 1, 2), 0.05 * 20)}
    stat = count_of(entry, Thresholds())
    got = paired_change("roles:previous_token", "heads", True, compact(b), compact(o), stat,
                        IntervalSettings(B=400, seed=1, method="percentile"), 0.05)
    assert (got.base, got.other, got.delta) == (1, 0, -1)  # mean mass 0.58 >= 0.5: one head; OTHER none
    # a resample's head passes only when its mean mass reaches 0.5, at least 5 of its 10 draws among the 6 strong
    # items (about 83% of resamples): the difference is -1 or 0, both often, so the interval is [-1, 0]
    assert (got.delta_lo, got.delta_hi) == (-1, 0) and got.verdict == "cannot tell"


def test_counts_and_uniform_baselines_are_kept_once_per_item():
    sums = {"a": np.arange(12.0).reshape(3, 2, 2), "a|count": np.full((3, 2, 2), 4.0)}
    got = compact(sums)
    assert got["a"].shape == (3, 2, 2) and got["a|count"].shape == (3, 1, 1)
    assert json.dumps(got["a|count"].tolist()) == "[[[4.0]], [[4.0]], [[4.0]]]"
