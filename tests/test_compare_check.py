"""Every compressing verb checks what it broke (issue 42, item 4): the budgeted compare `prune --save-model`, `gqa`,
`mla` and `kvcache` end with, and `compare --cache` given a kvcache run.

A planted induction head zeroed is a lost line; --no-check writes nothing; kvcache's check runs the input model
through the plan its shipped row holds, and its perplexities equal kvcache's own cached evaluation of the same
passages; a kvcache plan and the DuoAttention pattern with the same full heads give the same compare.csv; a plan
that does not fit the model, an unknown row, a reversed plan: one line, exit 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from test_artifacts import WORDS, tiny_bert_dir, tiny_llama_dir
from test_bad_input import refused
from test_compare import TEXTS, planted_model

from headscope import artifacts as A
from headscope.capacity.kvcache import CachePlan
from headscope.capacity.kvcache.evaluate import evaluate_perplexity, long_passages_ids
from headscope.capacity.kvcache.plans import plan_of_row, row_name, shipped_row
from headscope.cli import build_parser, main
from headscope.compare.check import CACHE_PASSAGES, DECODER_ROWS, ITEMS, check, check_lines
from headscope.options.cli import to_argv

CACHE = ["--sink", "2", "--window", "8", "--context", "64", "--limit", "1", "--chunk", "16", "--needles", "0",
         "--haystacks", "1"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny LLaMA (6 query heads over 3 KV heads, 128 positions), a short text file and one of 100-word lines."""
    base = tmp_path_factory.mktemp("check")
    src, text = tiny_llama_dir(base, num_key_value_heads=3, max_position_embeddings=128, init_std=0.2)
    rng = np.random.default_rng(0)
    long = base / "long.txt"
    long.write_text("\n".join(" ".join(rng.choice(WORDS, 100)) for _ in range(5)) + "\n")
    return src, text, long


@pytest.fixture(scope="module")
def kv_out(llama, tmp_path_factory) -> Path:
    """A kvcache run with the check on: two budgets, so the shipped row is the first score row."""
    src, _, long = llama
    out = tmp_path_factory.mktemp("kv") / "out"
    assert main(["kvcache", str(src), "--keep-full", "34%,67%", "--data", str(long), *CACHE, "--out", str(out)]) == 0
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_zeroed_induction_head_is_a_lost_line():
    """The planted model's induction head zeroed: the check's induction row is lost and printed as one line; the
    rows the model cannot measure (IOI's names are not in its vocabulary, haystacks past its 32 positions) are
    notes, not refusals."""
    base, other = planted_model(), planted_model(zero=(1, 0))
    got = check(base, other, data=TEXTS)
    assert [c.capability for c in got.changes] == ["lm", "induction"]
    assert got.verdict("induction") == "lost" and got.change("induction").n == ITEMS
    lines = check_lines(got)
    lost = [c.capability for c in got.changes if c.verdict == "lost"]
    assert [line for line in lines if line.startswith("check: lost")] == \
        [f"check: lost {got.change(c).sentence()}" for c in lost]
    assert "check: lost induction: logit_diff" in "\n".join(lines)
    summary = next(line for line in lines if line.startswith("check against"))
    assert f"{len(lost)} of 2 capabilities lost" in summary
    assert any(line.startswith("check: note: ioi: left out") for line in lines), lines
    # the null head L1H1 zeroed: nothing lost, and the summary says so
    same = check(base, planted_model(zero=(1, 1)), data=TEXTS)
    assert [c.verdict for c in same.changes] == ["kept", "kept"]
    assert not [line for line in check_lines(same) if line.startswith("check: lost")]


def test_prune_save_model_writes_the_check_beside_the_model(tmp_path, capsys):
    """prune --save-model on the planted model: three of its four heads go, so the previous-token or the induction
    head is among them and induction is lost (a known outcome whatever the order); compare.csv and compare.json
    lie beside model/, their rows the decoder's that this model can measure. --no-check writes neither."""
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n")
    args = ["prune", "planted", "--fraction", "0.75", "--step", "0.25", "--data", str(data), "--max-length", "16"]
    from headscope.commands import prune

    out = tmp_path / "checked"
    assert prune.run(build_parser().parse_args([*args, "--save-model", "--out", str(out)]), model=planted_model()) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(A.outputs("prune", optional=True))
    rows = _csv(out / "compare.csv")
    assert [r["capability"] for r in rows] == ["lm", "induction"] and set(r["capability"] for r in rows) <= \
        set(DECODER_ROWS)
    assert next(r for r in rows if r["capability"] == "induction")["verdict"] == "lost"
    assert "check: lost induction: logit_diff" in printed and "check against planted" in printed
    record = json.loads((out / "compare.json").read_text())
    assert record["settings"]["rows"] == ["lm", "induction"]
    assert record["other"]["fingerprint"] != record["base"]["fingerprint"]
    bare = tmp_path / "unchecked"
    assert prune.run(build_parser().parse_args([*args, "--save-model", "--no-check", "--out", str(bare)]),
                     model=planted_model()) == 0
    assert sorted(p.name for p in bare.iterdir()) == sorted(A.outputs("prune") + ["model"])
    assert "check against" not in capsys.readouterr().out
    curve_only = tmp_path / "no-model"  # no model, no check: the check is on by default but has nothing to judge
    assert prune.run(build_parser().parse_args([*args, "--out", str(curve_only)]), model=planted_model()) == 0
    assert sorted(p.name for p in curve_only.iterdir()) == sorted(A.outputs("prune"))


def test_gqa_checks_by_default_and_no_check_skips(llama, tmp_path, capsys):
    src, text, _ = llama
    common = ["gqa", str(src), "--kv-heads", "1", "--data", str(text), "--heldout", str(text)]
    assert main([*common, "--out", str(tmp_path / "on")]) == 0
    assert sorted(p.name for p in (tmp_path / "on").iterdir()) == sorted(A.outputs("gqa", optional=True))
    rows = [r["capability"] for r in _csv(tmp_path / "on" / "compare.csv")]
    assert rows[0] == "lm" and set(rows) <= set(DECODER_ROWS), rows
    assert "check against" in capsys.readouterr().out
    assert main([*common, "--no-check", "--out", str(tmp_path / "off")]) == 0
    assert sorted(p.name for p in (tmp_path / "off").iterdir()) == sorted(A.outputs("gqa"))
    assert "check against" not in capsys.readouterr().out


def test_an_encoder_checks_fidelity(tmp_path):
    """prune --save-model on a BERT without a language-model head: the check's one row is fidelity (masked needs
    logits: a note)."""
    bert = tiny_bert_dir(tmp_path)
    out = tmp_path / "out"
    assert main(["prune", str(bert), "--fraction", "25%", "--step", "0.25", "--save-model", "--limit", "3",
                 "--max-length", "16", "--out", str(out)]) == 0
    assert [r["capability"] for r in _csv(out / "compare.csv")] == ["fidelity"]
    notes = json.loads((out / "compare.json").read_text())["notes"]
    assert any(n.startswith("masked: left out") for n in notes), notes


def test_no_check_round_trips_as_a_flag():
    from headscope.capacity.options import GqaOptions

    opts = GqaOptions(model="m", kv_heads=1, capability_check=False)
    argv = to_argv("gqa", opts)
    assert "--no-check" in argv
    assert GqaOptions.from_namespace(build_parser().parse_args(argv)) == opts
    assert build_parser().parse_args(["gqa", "m", "--kv-heads", "1"]).capability_check is True


def test_kvcache_check_runs_the_input_through_the_shipped_plan(llama, kv_out):
    """kvcache's check: OTHER is the input model decoding through the first score row's plan; its lm row equals
    kvcache's own cached evaluation (chunked prefill through a HeadAwareCache) of the same passages, BASE's the
    full cache's."""
    from headscope import load_model

    src, _, long = llama
    assert sorted(p.name for p in kv_out.iterdir()) == sorted(A.outputs("kvcache", optional=True))
    report = json.loads((kv_out / "kvcache.json").read_text())
    row = shipped_row(report)
    assert row_name(row) == "score@34%" and row is report["rows"][1]
    record = json.loads((kv_out / "compare.json").read_text())
    cache = record["settings"]["cache"]
    assert cache["full"] == row["full_heads"] and (cache["sink"], cache["window"]) == (2, 8)
    assert cache["pattern"].endswith("(row score@34%)")
    assert [r["capability"] for r in _csv(kv_out / "compare.csv")][0] == "lm"
    hm = load_model(str(src))
    passages = long_passages_ids(hm.tokenizer, long.read_text().splitlines(), 64, CACHE_PASSAGES)
    assert len(passages) == record["rows"]["lm"]["passages"] == CACHE_PASSAGES
    plan = plan_of_row(report, row)
    assert plan == CachePlan(tuple(tuple(f) for f in row["full_heads"]), 3, 2, 2, 8)
    lm = record["rows"]["lm"]["change"]
    assert lm["other"] == pytest.approx(evaluate_perplexity(hm, plan, passages, 16)["perplexity"], rel=1e-5)
    full = CachePlan.all_full(2, 3, 2, 2, 8)
    assert lm["base"] == pytest.approx(evaluate_perplexity(hm, full, passages, 16)["perplexity"], rel=1e-5)
    assert abs(lm["delta"]) > 1e-3  # windowed heads past sink + window change the predictions


def _duo(folder: Path, full: list[list[int]], n_kv: int, sink: int, window: int) -> Path:
    """A DuoAttention pattern whose top share is exactly `full`: score 1 on those KV heads, 0 elsewhere."""
    folder.mkdir()
    scores = np.zeros((len(full), n_kv))
    for layer, heads in enumerate(full):
        scores[layer, heads] = 1.0
    np.savetxt(folder / "full_attention_heads.tsv", scores, delimiter="\t")
    (folder / "config.json").write_text(json.dumps({"sink_size": sink, "recent_size": window}))
    return folder


def test_compare_cache_takes_a_kvcache_run_like_the_same_duo_pattern(llama, kv_out, tmp_path, capsys):
    """`compare --cache KVCACHE_OUT` (its shipped row, or --cache-row) gives the compare.csv of the DuoAttention
    pattern whose top share holds the same full heads, with the same sink and window."""
    src, _, long = llama
    report = json.loads((kv_out / "kvcache.json").read_text())
    common = ["compare", str(src), str(src), "--tasks", "lm", "--data", str(long), "--max-length", "64", "--limit",
              "4", "--bootstrap", "200"]
    for name, given in {"score@34%": [], "random@67%": ["--cache-row", "random@67%"]}.items():
        row = next(r for r in report["rows"] if row_name(r) == name)
        n_full = sum(len(f) for f in row["full_heads"])
        duo = _duo(tmp_path / f"duo-{n_full}-{name[0]}", row["full_heads"], 3, 2, 8)
        a, b = tmp_path / f"kv-{name}", tmp_path / f"duo-{name}"
        assert main([*common, "--cache", str(kv_out), *given, "--out", str(a)]) == 0
        assert f"row {name}" in capsys.readouterr().out
        assert main([*common, "--cache", str(duo), "--keep-full", str(n_full / 6), "--out", str(b)]) == 0
        assert (a / "compare.csv").read_text() == (b / "compare.csv").read_text()
        got = json.loads((a / "compare.json").read_text())["settings"]["cache"]
        assert got["full"] == row["full_heads"] and got["row"] == name
        assert float(_csv(a / "compare.csv")[0]["delta"]) != 0.0
    # the kvcache.json file itself, not its folder
    assert main([*common, "--cache", str(kv_out / "kvcache.json"), "--out", str(tmp_path / "file")]) == 0
    assert (tmp_path / "file" / "compare.csv").read_text() == (tmp_path / "kv-score@34%" / "compare.csv").read_text()


def test_a_bad_kvcache_plan_is_one_line(llama, kv_out, tmp_path, capsys, monkeypatch):
    src, _, _ = llama
    report = json.loads((kv_out / "kvcache.json").read_text())
    other = tmp_path / "other-model"
    other.mkdir()
    # a plan made for 2 KV heads a layer (the model has 3): refused once the model is known, before any forward
    report.update(n_kv_heads=2, n_heads=4)
    for r in report["rows"]:
        r["full_heads"] = [[h for h in f if h < 2] for f in r["full_heads"]]
    (other / "kvcache.json").write_text(json.dumps(report))
    from headscope.compare import verb

    monkeypatch.setattr(verb, "prepare_rows", lambda *a, **k: pytest.fail("rows prepared for a plan that misfits"))
    line = refused(tmp_path, capsys, ["compare", str(src), str(src), "--cache", str(other), "--out", "o"],
                   "is a plan for 2 layers x 2 KV heads")
    assert "has 2 layers x 3 KV heads" in line
    # an unknown row, a reversed plan, a row without --cache: before any model loads
    monkeypatch.setattr("headscope.commands.compare.load_model", lambda *a, **k: pytest.fail("a model loaded"))
    line = refused(tmp_path, capsys, ["compare", str(src), str(src), "--cache", str(kv_out), "--cache-row", "score",
                                      "--out", "o"], "--cache-row 'score' is no row of")
    assert line.endswith("its rows: full, score@34%, random@34%, score@67%, random@67%"), line
    refused(tmp_path, capsys, ["compare", str(src), str(src), "--cache", str(kv_out), "--cache-reversed", "--out",
                               "o"], "--cache-reversed turns a DuoAttention pattern's ranking upside down")
    refused(tmp_path, capsys, ["compare", str(src), str(src), "--cache", str(tmp_path / "nothing.json"), "--out",
                               "o"], "cannot read a kvcache plan")


def test_a_check_that_cannot_run_says_so_and_leaves_no_stale_files(tmp_path, capsys):
    """No row the model can measure: one line on stderr, no compare file (an earlier run's, there under --force, is
    removed so that none describes another model), and the verb goes on (its own files are complete)."""
    from headscope.commands._check import finish_check
    from headscope.errors import HeadscopeError

    for name in ("compare.csv", "compare.json"):
        (tmp_path / name).write_text("an earlier run's\n")

    def nothing():
        raise HeadscopeError("nothing to compare: no row could be measured (lm: left out (no tokenizer))")

    assert finish_check(nothing, tmp_path, force=True) == []
    assert "check: not run: nothing to compare" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
