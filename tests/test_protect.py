"""`prune --protect`: heads that carry a capability, measured before pruning, are never removed.

On a hand-built model with two planted induction heads (whose effects are known: half each), `--protect induction`
keeps both while the curve without it prunes them; a fraction past the unprotected share stops there and says so;
the units of a GQA curve skip protected heads; bad names and capabilities the model cannot do are one line, exit 2,
before any forward."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_compare import POS, TOK, D, P, V, planted_model

import headscope
from headscope.cli import main
from headscope.errors import OptionError
from headscope.models.tiny import tiny_model
from headscope.redundancy.curves import candidate_units, prune_curve
from headscope.redundancy.options import PruneOptions

BIG = 104  # residual coordinates 104..125 are free in the planted model (TOK, POS, PREV, IND, then two anchors)
# Passages that follow the bigram rule w_i -> w_(i+1) and never repeat a word: the induction heads have nothing to
# copy there, so the language-model loss barely needs them, and the bigram head is all that predicts.
TEXTS = [" ".join(f"w{s + j}" for j in range(10)) for s in range(2, 12)]
INDUCTION = ["L1H0", "L1H1"]


def two_induction_heads() -> headscope.HeadModel:
    """The planted model of test_compare with its two empty heads filled in:

    - L0H1, a bigram head: each position attends to itself and writes its token into BIG, which the unembedding
      reads (+3 on the next word); the direct bigram path is removed, so this head alone predicts TEXTS;
    - L1H1, a copy of the induction head L1H0: each writes the copied token into IND (+10 on its logit), so on the
      induction pairs each carries half the logit difference (its normalised effect is 1/2)."""
    hm = planted_model()
    m, dh, c = hm.model, D // 2, 15.5
    first, second = m.transformer.h[0].attn, m.transformer.h[1].attn
    with torch.no_grad():
        for t in range(P):  # c_attn: q | k | v blocks of D columns, head 1 at columns dh.. of each
            first.c_attn.weight[POS + t, dh + t] = c
            first.c_attn.weight[POS + t, D + dh + t] = c
        for i in range(2, V):
            first.c_attn.weight[TOK + i, 2 * D + dh + i] = 1.0
            first.c_proj.weight[dh + i, BIG + i - 2] = 1.0
        for i in range(2, V - 1):
            m.lm_head.weight[i + 1, BIG + i - 2] = 3.0
            m.lm_head.weight[i + 1, TOK + i] = 0.0
        for block in range(3):  # q, k, v: head 1's columns take head 0's
            head0 = second.c_attn.weight[:, block * D:block * D + dh]
            second.c_attn.weight[:, block * D + dh:block * D + 2 * dh] = head0
        second.c_proj.weight[dh:] = second.c_proj.weight[:dh]
    return hm


def _removed(res) -> list[str]:
    return [h for p in res.points for h in p.removed]


def test_protected_induction_heads_are_never_pruned_and_the_curve_stops_at_the_unprotected_share(tmp_path):
    hm = two_induction_heads()
    opts = PruneOptions(method="ablation", fraction=0.75, step=0.25, bootstrap=200)
    plain = prune_curve(hm, TEXTS, opts, progress=False)
    assert set(INDUCTION) & set(_removed(plain)), _removed(plain)  # unprotected, an induction head goes
    assert plain.points[-1].n_removed == 3

    result = headscope.prune(hm, TEXTS, opts.replace(protect=("induction",)))
    removed = _removed(result.curve)
    assert not set(INDUCTION) & set(removed), removed
    assert removed == ["L0H0", "L0H1"]  # the other two, in ablation order, then nothing is left to offer
    result.save(tmp_path)
    summary = json.loads((tmp_path / "prune.json").read_text())
    prot = summary["protected"]
    assert prot["heads"] == INDUCTION
    assert prot["stopped_early"] and prot["stopped_at"] == {"n_removed": 2, "fraction_removed": 0.5}
    assert prot["settings"]["induction"]["pairs"] == 32 and prot["settings"]["induction"]["seed"] == 0
    for h in prot["by_capability"]["induction"]:
        # two identical heads share the copied token's +10: half the logit difference each
        assert h["effect"] == pytest.approx(0.5, abs=0.03) and 0 < h["lo"] <= h["effect"] <= h["hi"], h
    lines = "\n".join(result.lines())
    assert "protected 2 heads, never pruned: L1H0, L1H1 (induction)" in lines
    assert "the curve stopped early at 2 heads removed (50.0%)" in lines


def test_a_fraction_within_the_unprotected_share_is_not_an_early_stop():
    result = headscope.prune(two_induction_heads(), TEXTS, method="ablation", fraction=0.5, step=0.25,
                             bootstrap=200, protect=("induction",))
    prot = result.summary.protected
    assert prot is not None
    assert _removed(result.curve) == ["L0H0", "L0H1"]
    assert not prot["stopped_early"] and prot["stopped_at"] is None
    assert "stopped early" not in "\n".join(result.lines())


def test_units_skip_protected_heads():
    hm = tiny_model("llama")  # 6 query heads in 2 KV groups of 3 (group 0: heads 0-2, group 1: heads 3-5)
    assert (hm.n_heads, hm.group_size) == (6, 3)
    scores = np.tile(np.arange(6, dtype=float), (hm.n_layers, 1))  # head h scores h: the lowest go first
    protected = frozenset({(0, 0), (1, 4)})
    heads = candidate_units(hm, scores, set(), "head", protected)
    assert all(h not in protected for _, unit in heads for h in unit) and len(heads) == 6 * hm.n_layers - 2
    # slices: each group's least important unprotected head, so layer 0 starts with heads 1 and 3
    slices = [unit for _, unit in candidate_units(hm, scores, set(), "slice", protected) if unit[0][0] == 0]
    assert slices == [[(0, 1), (0, 3)], [(0, 2), (0, 4)]]  # group 0 keeps only its protected head 0
    groups = [unit for _, unit in candidate_units(hm, scores, set(), "group", protected) if unit[0][0] == 1]
    assert groups == [[(1, 0), (1, 1), (1, 2)]]  # group 1 of layer 1 holds the protected head 4


def test_a_protected_slice_curve_on_gqa_keeps_the_heads_and_loads(monkeypatch):
    """On a GQA model (unit slice) the protected head stays, each KV group keeps the same number of heads, and a cap
    past what the slices can take stops early. The protected set is given (a random tiny model carries no capability
    one could name in advance): the measurement is the other tests'; this one is the curve's."""
    from headscope.redundancy import protect

    hm = tiny_model("llama", init_std=0.2)  # 2 layers x 6 query heads, KV groups of 3
    kept = protect.Protection([protect.ProtectedHead(0, 0, "induction", 1.0, 0.5, 1.5)], {"induction": {}})
    monkeypatch.setattr("headscope.redundancy.curves.loop.find_protected", lambda *a, **k: kept)
    ids = [[5 + (3 * i + 7 * j) % 100 for j in range(12)] for i in range(6)]
    # 0.95 of 12 heads is 11; the slices can take 10: layer 0 two slices (group 0 keeps its protected head 0), layer
    # 1 all three
    res = prune_curve(hm, ids, fraction=0.95, step=0.17, protect=("induction",), bootstrap=200, progress=False)
    removed = _removed(res)
    assert "L0H0" not in removed and len(removed) == 10
    assert res.meta["protected"]["stopped_at"] == {"n_removed": 10, "fraction_removed": 10 / 12}
    small = res.pruned_model(hm)
    per_group = [[sum(1 for h in small.kept_heads(l) if h // 3 == k) for k in range(2)] for l in range(hm.n_layers)]
    assert all(a == b for a, b in per_group), per_group


def _refused(argv, capsys) -> str:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


def test_bad_capabilities_are_one_line_before_any_forward(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "out")
    line = _refused(["prune", "--fraction", "0.5", "--protect", "inductoin", "--out", out], capsys)
    assert "--protect names 'inductoin'" in line and "did you mean 'induction'" in line
    line = _refused(["prune", "--fraction", "0.5", "--unit", "block", "--protect", "ioi", "--out", out], capsys)
    assert "--protect keeps heads out of head curves" in line
    assert "twice" in _refused(["prune", "--fraction", "0.5", "--protect", "ioi,ioi", "--out", out], capsys)
    hm = two_induction_heads()
    calls = []
    hm.model.register_forward_pre_hook(lambda *a: calls.append(1))
    monkeypatch.setattr(PruneOptions, "load", lambda self: hm)
    line = _refused(["prune", "planted", "--data", _texts(tmp_path), "--fraction", "0.5", "--protect", "masked",
                     "--out", out], capsys)
    assert "--protect names 'masked', which planted (a decoder) cannot do; a decoder protects ioi" in line
    line = _refused(["prune", "planted", "--data", _texts(tmp_path), "--fraction", "0.5", "--protect", "retrieval",
                     "--out", out], capsys)
    assert "planted's 32 positions hold no needle haystack" in line
    assert not calls
    with pytest.raises(OptionError, match="protect names 'ioi', which tiny-bert \\(an encoder\\) cannot do"):
        prune_curve(tiny_model("bert"), [[5, 6, 7, 8]] * 4, fraction=0.5, protect=("ioi",), progress=False)


def _texts(tmp_path) -> str:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


def test_retrieval_heads_are_judged_on_the_lower_bound(monkeypatch):
    """The retrieval rule (score >= 0.1 and >= 3 x the uniform head's) must hold for the interval's lower bound: a
    head whose estimate passes but whose bound does not is not protected. The scores are given (what `roles --long`
    measures is its own tests'); the decision is this one's."""
    from headscope.redundancy import protect

    score = np.array([[0.5, 0.3, 0.05], [0.2, 0.12, 0.0]])  # [layer, head]
    lo = np.array([[0.4, 0.05, 0.01], [0.11, 0.11, 0.0]])
    baseline = np.array([[0.03, 0.03, 0.03], [0.03, 0.04, 0.03]])  # L1H1: 0.11 < 3 x 0.04
    report = {"needles": {"haystacks": [{}] * 8, "succeeded": 6}, "scores": {"retrieval_score": score},
              "baselines": {"retrieval_score_uniform": baseline},
              "uncertainty": {"bounds": {"retrieval_score": {"lo": lo, "hi": score + 0.1}}}}
    seen = {}

    def long_roles(hm, length, **kw):
        seen.update(length=length, **kw)
        return report

    monkeypatch.setattr(protect, "long_roles", long_roles)
    hm = tiny_model("gpt2")
    heads, how = protect._retrieval_heads(hm, protect.IntervalSettings(seed=3), progress=False)
    assert [(p.name, p.effect, p.lo) for p in heads] == [("L0H0", 0.5, 0.4), ("L1H0", 0.2, 0.11)]
    assert seen["length"] == min(512, hm.max_positions) and seen["haystacks"] == 8 and seen["windows"] == 0
    assert how["answered"] == 6 and how["haystacks"] == 8 and how["seed"] == 3 and how["threshold"] == 0.1
