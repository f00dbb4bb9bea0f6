""""N heads can go within a drop" is decided on the upper bound of the drop's interval (issue 36): one rule
(`drop_claim`), and prune's printout, study's answer and the report's sentences all change when a curve's
interval crosses the threshold."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from headscope.models.tiny import tiny_model
from headscope.redundancy.curves import CurvePoint, CurveResult, drop_claim, prune_curve, summary_claims
from headscope.redundancy.curves.text import curve_lines
from headscope.report.pruning import summary_sentences
from headscope.study.answers import answers

HELDOUT = 32


def _curve(hi_at_half: float) -> CurveResult:
    """A synthetic head curve of 8 heads: 0, 2, 4, 6 removed with drops 0, 2%, 4%, 8%; the upper bound of the
    drop at 4 removed (50%) is `hi_at_half`, the 2%-point's interval is [1%, 3%]."""
    drops = [0.0, 0.02, 0.04, 0.08]
    his = [0.0, 0.03, hi_at_half, 0.11]
    los = [0.0, 0.01, 0.03, 0.06]
    points = [CurvePoint(step=i, n_removed=2 * i, fraction_removed=0.25 * i, metric=3.0 + math.log1p(d), drop=d,
                         removed=[f"L{i % 2}H{j}" for j in range(2)] if i else [],
                         bounds={"metric_lo": 3.0, "metric_hi": 3.1, "drop_lo": lo, "drop_hi": hi})
              for i, (d, lo, hi) in enumerate(zip(drops, los, his, strict=True))]
    return CurveResult(model="tiny", n_layers=2, n_heads=4, n_kv_heads=4, unit="head", scope="heads",
                       method="taylor", metric="lm_loss", higher_is_better=False, points=points, target_drop=0.05,
                       recover_steps=0, meta={"heldout_passages": HELDOUT, "heldout": "wikitext",
                                              "data": "wikitext", "passages": 16})


def _prune_text(res: CurveResult, capsys: pytest.CaptureFixture[str]) -> str:
    return "\n".join(curve_lines(res, res.summary()))  # what `headscope prune` prints for the curve


def _study_q3(res: CurveResult, tmp_path) -> str:
    (tmp_path / "prune.json").write_text(json.dumps(res.summary()), encoding="utf-8")
    return answers(tmp_path, {"stages": {}, "model": {"heads": 8}})["q3"]


def test_rule_on_the_bound():
    w = {"fraction_removed": 0.27, "n_removed": 72, "drop": 0.0438, "drop_lo": -0.054, "drop_hi": 0.1587,
         "confident": {"fraction_removed": 0.0, "n_removed": 0, "drop_hi": 0.0}}
    c = drop_claim(0.05, w, 32)
    assert c.verdict == "cannot tell" and c.count == 0 and c.point_count == 72
    # the half-width (hi - drop) must shrink to level - drop: passages grow by that ratio squared
    assert c.needed == math.ceil(32 * ((0.1587 - 0.0438) / (0.05 - 0.0438)) ** 2)
    s = c.sentence()
    assert s.startswith("between 0% (0) and 27% (72) of heads can go within a 5% drop") and "too few" in s, s
    assert f"--heldout-limit {c.needed}" in s and "[-5.40%, 15.87%]" in s, s
    inside = drop_claim(0.05, {**w, "drop_hi": 0.049}, 32)
    assert inside.verdict == "can go" and inside.count == 72 and inside.needed is None
    assert inside.sentence().startswith("27% of heads (72) can go within a 5% drop: drop 4.38% [-5.40%, 4.90%]")
    assert drop_claim(0.05, {"fraction_removed": 0.0, "n_removed": 0, "drop": 0.09}).verdict == "none"
    bare = drop_claim(0.05, {"fraction_removed": 0.25, "n_removed": 2, "drop": 0.01})
    assert bare.verdict == "no interval" and "can go" not in bare.sentence()


def test_no_can_go_claim_reaches_past_its_threshold():
    rng = np.random.default_rng(0)
    for _ in range(500):
        level = float(rng.choice([0.01, 0.05, 0.1]))
        drop = float(rng.uniform(0, level))
        lo, hi = drop - float(rng.uniform(0, 0.05)), drop + float(rng.uniform(0, 0.05))
        c_hi = float(rng.uniform(0, hi))
        n = int(rng.integers(1, 50))
        c = drop_claim(level, {"fraction_removed": n / 72, "n_removed": n, "drop": drop, "drop_lo": lo,
                               "drop_hi": hi, "confident": {"fraction_removed": 0.01, "n_removed": 1,
                                                            "drop": c_hi / 2, "drop_lo": 0.0, "drop_hi": c_hi}}, 40)
        if c.count:
            assert c.hi is not None and c.hi <= level + 1e-12, c
        assert ("can go within" in c.sentence().split(":")[0]) == (c.verdict in ("can go", "cannot tell")), c


@pytest.mark.parametrize("hi, claimed", [(0.045, "50% of heads (4) can go within a 5% drop: drop 4.00% [3.00%, 4.50%]"),
                                         (0.07, "between 25% (2) and 50% (4) of heads can go within a 5% drop")])
def test_prune_study_and_report_follow_the_bound(hi, claimed, tmp_path, capsys):
    res = _curve(hi)
    claims = res.summary()["claims"]
    assert claims["5%"]["verdict"] == ("can go" if hi <= 0.05 else "cannot tell")
    printed = _prune_text(res, capsys)
    assert claimed in printed, printed
    q3 = _study_q3(res, tmp_path)
    assert claimed.replace("5% drop", "5% drop of perplexity without recovery") in q3, q3
    report = " ".join(summary_sentences(res.summary()))
    assert claimed.replace("5% drop", "5% drop of perplexity").capitalize() in report, report
    for text in (printed, q3, report):
        if hi > 0.05:  # the point estimate's 50% is never said to go: only the bound's 25% is
            assert "50% of heads (4) can go" not in text and "too few to say" in text, text
        found = list(re.finditer(r"can go within a (\d+)% drop[^:\n(]*: drop [-\d.]+% \[[-\d.]+%, ([-\d.]+)%\]",
                                 text))
        assert len(found) == (hi <= 0.05), text  # the 5% claim, and only when its bound stays within
        for m in found:
            assert float(m.group(2)) <= float(m.group(1)), m.group(0)


def test_a_real_curve_claims_on_its_bound():
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(5, 120, (14,), generator=g).tolist() for _ in range(8)]
    res = prune_curve(tiny_model("gpt2", init_std=0.2), data, method="gradient", target_drop=0.05, step=0.125,
                      progress=False)
    summary = res.summary()
    for key, c in summary_claims(summary).items():
        assert c.record() == summary["claims"][key]
        within = summary["within"][key]
        if c.verdict == "can go":
            assert c.count == within["n_removed"] and within["drop_hi"] <= c.level + 1e-12
        elif c.verdict == "cannot tell":
            assert within["drop_hi"] > c.level and c.count == (within["confident"]["n_removed"] if c.count else 0)


def test_census_scores_carry_their_units():
    from headscope.learned.roles.registry import ROLES
    from headscope.report.roles import census_rows, score_unit

    rows = census_rows({"local": [{"head": "L0H1", "score": 0.97, "baseline": 12.17}],
                        "sink": [{"head": "L2H3", "score": 0.81, "lo": 0.7, "hi": 0.9, "baseline": 0.1}]})
    assert rows[0]["best"] == "L0H1 0.97 tokens (baseline 12.17 tokens)", rows
    assert rows[1]["best"] == "L2H3 0.81 [0.70, 0.90] of the attention weight (baseline 0.10 of the attention weight)"
    assert all(score_unit(name) for name in ROLES), [n for n in ROLES if not score_unit(n)]
    assert score_unit("syntactic:nsubj") == "accuracy"


def test_help_lists_the_verbs_by_question():
    from headscope.cli import VERB_GROUPS, build_parser

    text = build_parser().format_help()
    titles = [t for t, _ in VERB_GROUPS] + ["tools"]
    where = [text.index(f"\n{t}:\n") for t in titles]
    assert where == sorted(where), text
    verbs = re.findall(r"^  (\w+)\s{2,}", text, flags=re.M)
    assert verbs[0] == "study" and len(verbs) == len(set(verbs)), verbs
    grouped = [v for _, g in VERB_GROUPS for v in g]
    assert [v for v in verbs if v in grouped] == [v for v in grouped if v in verbs], verbs
    assert {"analyze", "prune", "kv", "report", "score", "roles"} <= set(verbs)


def test_study_spends_time_left_on_an_answer_it_cannot_tell(tmp_path):
    from headscope.study.leftover import widths

    for hi, want in ((0.07, (0.07 - 0.04) / (0.05 - 0.04)), (0.045, (0.045 - 0.03) / 0.05)):
        (tmp_path / "prune.json").write_text(json.dumps(_curve(hi).summary()), encoding="utf-8")
        assert widths(tmp_path)["prune"] == pytest.approx(want)  # cannot tell: 3.0 (> 1), settled: 0.3
