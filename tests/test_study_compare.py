"""The study's `compare` stage (issue 42 item 5): a tiny decoder's study compares its pruned, GQA and MLA models with
the original (compare/<stage>/compare.csv), measuring the original once; questions 3 and 2 say what each kept and
lost as compare.csv's verdicts have it; a rerun reuses the stage; a study whose prune saved no model skips it with
the reason; an original changed in place by a stage before is refused rather than compared."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.study import comparing as C
from headscope.study import runner
from headscope.study.answers import answers
from headscope.study.comparing import RETRIEVAL_LENGTH, cost, tasks_for
from headscope.study.probe import Probe
from headscope.study.stages import Family
from tests.test_study import tiny_bert_dir, tiny_llama_dir

CAPABILITY = {"lm": "language modelling", "induction": "induction"}


@pytest.fixture(scope="module")
def decoder_study(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny LLaMA's study (3m budget; its tokenizer knows no IOI name, its 64 positions hold no haystack)."""
    base = tmp_path_factory.mktemp("compare-study")
    out = base / "study"
    assert main(["study", str(tiny_llama_dir(base)), "--budget", "3m", "--out", str(out)]) == 0
    return out, json.loads((out / "study.json").read_text())


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _words(r: dict[str, str]) -> str:
    """A row's change as the answer must give it, worked out here from the CSV's cells."""
    base, delta, lo, hi = (float(r[k]) for k in ("base", "delta", "delta_lo", "delta_hi"))
    if r["metric"] == "perplexity":  # a share of the original's perplexity
        return f"{CAPABILITY[r['capability']]} (perplexity {delta / base:+.1%} [{lo / base:+.1%}, {hi / base:+.1%}])"
    return (f"{CAPABILITY[r['capability']]} (logit difference {base:.2f} -> {float(r['other']):.2f}, {delta:+.2f} "
            f"[{lo:+.2f}, {hi:+.2f}])")


def _check_clause(answer: str, who: str, stage: str, rows: list[dict[str, str]]) -> None:
    """Every row of compare.csv sits, with its change and interval, in the answer's group of its own verdict."""
    start = answer.index(f"against the original, {who} ") + len(f"against the original, {who} ")
    clause = answer[start:answer.index(f" (compare/{stage}/compare.csv: 95% intervals", start)]
    groups = {}
    for g in clause.split("; "):
        verdict = next(v for v in ("kept", "lost", "gained", "cannot tell for") if g.startswith(v + " "))
        groups[verdict.removesuffix(" for")] = g
    assert set(groups) == {r["verdict"] for r in rows}, (clause, rows)
    for r in rows:
        assert _words(r) in groups[r["verdict"]], (_words(r), clause)


def test_the_compare_stage_judges_each_compressed_model_against_the_original(decoder_study):
    out, st = decoder_study
    rec = st["stages"]["compare"]
    assert rec["status"] == "done" and "compare" in st["plan"], rec
    assert set(rec["files"]) == {f"{m}/compare.{x}" for m in ("prune", "gqa", "mla") for x in ("csv", "json")}
    for stage, model in (("prune", out / "model"), ("gqa", out / "gqa" / "model"), ("mla", out / "mla" / "model")):
        rows = _rows(out / "compare" / stage / "compare.csv")
        # language modelling and induction; no IOI (the tokenizer holds none of its names), no retrieval (64 positions)
        assert [r["capability"] for r in rows] == ["lm", "induction"], rows
        assert all(r["verdict"] in ("kept", "lost", "gained", "cannot tell") for r in rows)
        record = json.loads((out / "compare" / stage / "compare.json").read_text())
        assert record["other"]["source"] == str(model) and record["settings"]["tolerance"] == 0.05
    # The original is measured once: the GQA and MLA comparisons took its values from the pruned model's comparison.
    first = json.loads((out / "compare" / "prune" / "compare.json").read_text())["rows"]
    for stage in ("gqa", "mla"):
        later = json.loads((out / "compare" / stage / "compare.json").read_text())["rows"]
        for cap, row in later.items():
            assert row["base_reused_from"] == str(out / "compare" / "prune"), (stage, cap)
            assert row["items"]["base"] == first[cap]["items"]["base"]
    # The answers say what each model kept and lost, as compare.csv's verdicts have it.
    _check_clause(st["answers"]["q3"], "the pruned model", "prune", _rows(out / "compare" / "prune" / "compare.csv"))
    for stage, who in (("gqa", "the GQA model"), ("mla", "the MLA model")):
        _check_clause(st["answers"]["q2"], who, stage, _rows(out / "compare" / stage / "compare.csv"))
    assert answers(out, st) == st["answers"]  # the same words from the saved compare.csv as from the Results


def test_a_rerun_reuses_the_compare_stage(decoder_study, capsys):
    out, st = decoder_study
    kept = {rel: (out / "compare" / rel).read_bytes() for rel in st["stages"]["compare"]["files"]}
    assert main(["study", str(out.parent / "llama"), "--budget", "3m", "--out", str(out)]) == 0
    assert "compare: reused" in capsys.readouterr().err  # the progress lines
    again = json.loads((out / "study.json").read_text())
    assert again["stages"]["compare"]["reused"] and again["answers"] == st["answers"]
    for rel, data in kept.items():
        assert (out / "compare" / rel).read_bytes() == data, rel


def test_the_stage_is_skipped_when_prune_saved_no_model(tmp_path, monkeypatch, capsys):
    """An encoder's only compressed model is the pruned one: prune refused, the compare stage says so in its place."""
    real = runner.run_call

    def refuse_prune(call, hm, log, append=False):
        if call.verb == "prune":
            raise HeadscopeError("prune refuses this model (a test)")
        return real(call, hm, log, append)

    monkeypatch.setattr(runner, "run_call", refuse_prune)
    out = tmp_path / "study"
    assert main(["study", str(tiny_bert_dir(tmp_path)), "--budget", "2m", "--out", str(out)]) == 0
    st = json.loads((out / "study.json").read_text())
    assert st["stages"]["prune"]["status"] == "not supported"
    rec = st["stages"]["compare"]
    assert rec == {"status": "not supported", "reason": "no compressed model to compare: prune not supported: prune "
                                                        "refuses this model (a test)"}, rec
    assert "compare: no compressed model to compare: prune not supported" in capsys.readouterr().err
    assert not (out / "compare").exists()
    assert "no pruning curve (prune refuses this model (a test))" in st["answers"]["q3"]


def test_an_original_changed_in_place_is_not_compared(tmp_path, monkeypatch):
    """The stages before compare copy the model before they change it; one that changed it in place would make the
    comparison meaningless, so the stage fails with that reason instead."""
    import torch  # here: the one weight this test changes

    real = runner.run_call

    def prune_in_place(call, hm, log, append=False):
        result = real(call, hm, log, append)
        if call.verb == "prune":
            with torch.no_grad():
                next(hm.model.parameters()).add_(1.0)
        return result

    monkeypatch.setattr(runner, "run_call", prune_in_place)
    out = tmp_path / "study"
    assert main(["study", str(tiny_bert_dir(tmp_path)), "--budget", "2m", "--out", str(out)]) == 1
    rec = json.loads((out / "study.json").read_text())["stages"]["compare"]
    assert rec["status"] == "failed" and "the study's model changed before the compare stage" in rec["reason"], rec


def test_the_rows_and_the_cost_follow_the_family():
    def fam(causal: bool, positions: int, pair_tasks: tuple[str, ...]) -> Family:
        return Family("m", "llama" if causal else "bert", causal, 2, 4, 2, 8, 32, positions, 8, pair_tasks=pair_tasks)

    assert tasks_for(fam(True, 2048, ("ioi", "induction"))) == ("lm", "ioi", "induction", "retrieval")
    assert tasks_for(fam(True, RETRIEVAL_LENGTH - 1, ("induction",))) == ("lm", "induction")
    assert tasks_for(fam(False, 512, ("masked",))) == ("fidelity", "masked")
    assert tasks_for(fam(False, 512, ())) == ("fidelity",)
    p = Probe(load_s=2.0, fwd_s=0.1, train_s=0.3, cpu_s=0.05, length=64, passages=16)
    f = fam(True, 2048, ("ioi", "induction"))
    lv = {"n": 16, "items": 16, "haystacks": 4}
    one, three = cost(p, f, lv, 1), cost(p, f, lv, 3)
    # by hand: 16 passages, 16 pairs of each of 2 tasks, 4 haystacks of 256 / 64 passages, their attention 1.25x
    forwards = C.LM_FWD * 16 + C.PAIR_FWD * 16 * 2 + C.HAYSTACK_FWD * 4 * 4 * 1.25
    assert one == pytest.approx(2.0 + 2 * forwards * 0.1 + 4 * C.ROW_CPU * 0.05)
    # each further model: its load, its forwards and its rows' bootstrap; the original's forwards once
    assert three - one == pytest.approx(2 * (2.0 + forwards * 0.1 + 4 * C.ROW_CPU * 0.05))


def test_a_compressing_stage_run_again_with_the_time_left_is_compared_again(tmp_path):
    """When the time left runs prune (or gqa, mla) again, the compare stage follows it (its estimate counted in the
    rerun's cost); a stage compare does not read, or a compare left out of the plan, brings nothing after it."""
    from headscope.study.state import State

    f = Family("m", "llama", True, 2, 4, 2, 8, 32, 2048, 8, pair_tasks=("induction",))
    r = object.__new__(runner._Runner)
    r.stages = runner.stages_for(f)
    r.state, r.family, r.spent_est = State(tmp_path), f, 0.0
    r.probe = Probe(load_s=2.0, fwd_s=0.1, train_s=0.3, cpu_s=0.05, length=64, passages=16)
    r.state.data["plan"] = {"prune": 1, "gqa": 0, "compare": 1, "report": 0}
    ran = []
    r.one = lambda i, stage, level: ran.append((i, stage.name, level))
    compare = next(s for s in r.stages if s.name == "compare")
    assert [s.name for s in r.readers("prune")] == ["compare"] and r.readers("score") == []
    assert r.readers_cost("prune") == pytest.approx(compare.cost(r.probe, f, compare.levels[1]))
    r.rerun_readers("prune")
    assert ran == [(r.stages.index(compare) + 1, "compare", 1)]
    del r.state.data["plan"]["compare"]
    assert r.readers("gqa") == [] and r.readers_cost("gqa") == 0
