"""`headscope study`: a tiny model's study end to end within a small budget (every expected file and report
section), an interrupted study whose rerun reuses the finished stages (byte-identical, far less time), the
budget's parsing and plan, and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest

from headscope.cli import build_parser, main
from headscope.errors import HeadscopeError
from headscope.models.tiny import tiny_model
from headscope.study import budget as B
from headscope.study import runner
from headscope.study.answers import answers

WORDS = ("the of and to a in is was for on that with as by at it from he his she her they them we you i said "
         "n't 's mr. million year new company market share stock price also but would more will has had have "
         "are be been its their this an or not about which who one two three up out last years first "
         "than some other over after into could only people time can president government business").split()


def tiny_bert_dir(base: Path) -> Path:
    """A tiny BERT whose word-level tokenizer knows the commonest PTB words ([CLS] ... [SEP] around each)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                ("[SEP]", 3)])
    path = base / "bert"
    tiny_model("bert", init_std=0.2, vocab_size=len(vocab)).model.save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(path)
    return path


def tiny_llama_dir(base: Path) -> Path:
    """A tiny LLaMA (6 query heads, 2 KV heads, 64 positions) with a word-level tokenizer over WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", ".", ",", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = base / "llama"
    tiny_model("llama", vocab_size=len(vocab)).model.save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("model"))


def _page_data(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', html, re.DOTALL)[1])


EXPECTED = ["heads.csv", "heads.json", "roles.csv", "roles.json", "syntax.csv", "similar_pairs.csv", "similarity.npz",
            "clusters.json", "importance.csv", "importance.json", "rank_correlation.csv", "prune_curve.csv",
            "prune_curve.png", "redundancy.csv", "prune.json", "model", "kv.csv", "kv.json", "report.html",
            "study.json"]


def _count_loads(monkeypatch) -> list[str]:
    """Every model load from here on (transformers' from_pretrained, whichever class), by class name."""
    from transformers import modeling_utils

    loads: list[str] = []
    real = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(cls.__name__)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(modeling_utils.PreTrainedModel, "from_pretrained", classmethod(counting))
    return loads


def parse_command(command: str):
    """The verb and Options a logged command line parses into, through the CLI's own parser."""
    argv = shlex.split(command)
    assert argv[0] == "headscope", command
    args = build_parser().parse_args(argv[1:])
    return args.verb, args.options_class.from_namespace(args)


def _rerun_by_hand(out: Path, st: dict, stage: str, capsys) -> None:
    """Run a done stage's logged command through the CLI into the same folder (its files moved aside) and compare
    every file it wrote, byte for byte, with the study's."""
    rec = st["stages"][stage]
    root = out / rec["dir"]
    kept = {rel: (root / rel).read_bytes() for rel in rec["files"]}
    for rel in {Path(r).parts[0] for r in rec["files"]}:
        p = root / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    assert main(shlex.split(rec["command"])[1:]) == 0, rec["command"]
    capsys.readouterr()
    for rel, data in kept.items():
        assert (root / rel).read_bytes() == data, (stage, rel, rec["command"])


def test_a_tiny_study_end_to_end(bert, tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    loads = _count_loads(monkeypatch)
    t = time.perf_counter()
    assert main(["study", str(bert), "--budget", "3m", "--out", str(out)]) == 0
    elapsed = time.perf_counter() - t
    # the study's one load, every stage running on it (8 loads before the spine); the compare stage builds the pruned
    # model it judges from its config and weights (a pruned checkpoint is no from_pretrained load)
    assert len(loads) == 1, loads
    assert elapsed < 180 + B.tolerance_s(180), elapsed
    st = json.loads((out / "study.json").read_text())
    for name in EXPECTED:
        assert (out / name).exists(), (name, st["stages"])
    done = {n for n, r in st["stages"].items() if r["status"] == "done"}
    assert done == {"analyze", "roles", "similar", "score", "prune", "kv", "compare", "report"}, st["stages"]
    for n in ("gqa", "mla", "kvcache"):  # decoder stages: one line each, saying why
        assert st["stages"][n]["status"] == "not supported" and st["stages"][n]["reason"]
    for n in done:
        rec = st["stages"][n]
        assert rec["command"].startswith(f"headscope {n} ") and rec["seconds"] >= 0 and rec["files"], n
    # an encoder's compressed model is the pruned one: compared on fidelity (this BertModel has no masked-LM head)
    assert set(st["stages"]["compare"]["files"]) == {"prune/compare.csv", "prune/compare.json"}
    # The logged command is rendered from the stage's Options and parses back into them through the CLI.
    verb, prune = parse_command(st["stages"]["prune"]["command"])
    assert verb == "prune" and (prune.fraction, prune.target_drop, prune.method, prune.save_model) == \
        (0.6, 0.05, "taylor", True), prune
    assert parse_command(st["stages"]["score"]["command"])[1].methods == ("taylor", "output_norm", "entropy",
                                                                         "ablation")
    printed = capsys.readouterr().out
    paragraphs = [p for p in printed.split("\n\n") if p.strip()]
    assert paragraphs[0].startswith("What the heads learn: of the 8 heads")
    assert paragraphs[1].startswith("Are more heads better: the MHA cache costs")
    assert paragraphs[2].startswith("Which heads are redundant: ") and "held-out passages" in paragraphs[2]
    d = _page_data((out / "report.html").read_text(encoding="utf-8"))
    assert d["study"]["answers"] == [st["answers"][q] for q in ("q1", "q2", "q3")]
    assert st["answers"]["q1"] in printed
    # The study's answers came from the stages' Results in memory; a resumed study reads the same from the files.
    assert answers(out, st) == st["answers"]
    # No "not run yet" box for any stage the family supports; the rest say why in one line.
    assert not any("not run yet" in m for m in d["missing"].values()), d["missing"]
    for key in ("heads", "roles", "syntax", "similarity", "kv", "importance", "rank_correlation", "prune_curve",
                "prune_summary", "redundancy"):
        assert key not in d["missing"] and key not in d["na"], key
    assert "not supported for this model (gqa)" in d["na"]["gqa"] and "sweep" in d["na"]
    notes = [p["note"] for p in d["panels"] if p.get("note")]
    assert all(p.get("na") for p in d["panels"] if p.get("note")), notes
    # Time left goes where intervals are widest: every stage with intervals has a relative width.
    from headscope.study.leftover import widths

    w = widths(out)
    assert set(w) == {"analyze", "score", "prune"} and all(v >= 0 for v in w.values()), w
    # The KV table names the model, shows each quantity once, formatted.
    kv = d["kv"]
    assert "bytes_per_token" not in kv["columns"] and "per token" in kv["columns"] and "vs MHA" in kv["columns"]
    assert all("site-packages" not in str(r["name"]) for r in kv["rows"])
    # A stage's logged command reproduces it by hand: the same files, byte for byte (score's record timings, the
    # report embeds the study's own record: both left out).
    for stage in ("analyze", "roles", "similar", "prune", "kv"):
        _rerun_by_hand(out, st, stage, capsys)


def test_a_tiny_decoder_study_converts_its_kv_heads(tmp_path, capsys, monkeypatch):
    """A decoder's study adds GQA and MLA conversion (into their own folders); the head-aware cache and the
    long-range roles need 512 positions, which this model lacks: one line each."""
    model = tiny_llama_dir(tmp_path)
    out = tmp_path / "study"
    loads = _count_loads(monkeypatch)
    assert main(["study", str(model), "--budget", "3m", "--out", str(out)]) == 0
    # the study's one load (gqa and mla convert copies of it), then the compare stage's load of the GQA model it
    # judges against it (it builds the pruned and MLA models from their configs and weights: no from_pretrained)
    assert len(loads) == 2, loads
    st = json.loads((out / "study.json").read_text())
    status = {n: r["status"] for n, r in st["stages"].items()}
    assert status == {"analyze": "done", "roles": "done", "similar": "done", "score": "done", "prune": "done",
                      "patch": "not supported", "circuit": "not supported", "kv": "done", "gqa": "done", "mla": "done",
                      "compare": "done", "kvcache": "not supported", "report": "done"}
    assert "512-token contexts" in st["stages"]["kvcache"]["reason"]
    # The tokenizer knows no IOI name: every answer and wrong is <unk>, the same token, so no pair can be patched.
    assert "task ioi: none of its" in st["stages"]["patch"]["reason"], st["stages"]["patch"]
    assert f"no causal patching ({st['stages']['patch']['reason']})" in st["answers"]["q1"]
    assert "task ioi: none of its" in st["stages"]["circuit"]["reason"], st["stages"]["circuit"]
    for sub, name in (("gqa", "gqa.json"), ("mla", "mla.json")):
        assert (out / sub / name).is_file() and (out / sub / "model" / "config.json").is_file()
    assert (out / "model" / "config.json").is_file()  # the pruned model
    q2 = st["answers"]["q2"]
    assert "2 -> 1 KV heads moves held-out perplexity" in q2 and "MLA at rank" in q2, q2
    assert answers(out, st) == st["answers"]  # from the Results in memory, and again from the files
    assert "perplexity" in st["answers"]["q3"]
    d = _page_data((out / "report.html").read_text(encoding="utf-8"))
    assert d["gqa"] and not any("not run yet" in m for m in d["missing"].values()), d["missing"]
    assert "syntax" in d["na"] and all(p.get("na") for p in d["panels"] if p.get("note") and not p.get("rows"))
    capsys.readouterr()


def test_an_interrupted_study_continues(bert, tmp_path, monkeypatch):
    out = tmp_path / "study"
    real = runner.run_call

    def interrupt_at_score(call, hm, log):
        if call.verb == "score":  # Ctrl-C while the score stage runs
            raise KeyboardInterrupt
        return real(call, hm, log)

    monkeypatch.setattr(runner, "run_call", interrupt_at_score)
    assert main(["study", str(bert), "--budget", "3m", "--out", str(out)]) == 130
    st = json.loads((out / "study.json").read_text())
    assert [n for n, r in st["stages"].items() if r.get("status") == "done"] == ["analyze", "roles", "similar"]
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "study.json"}
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    monkeypatch.setattr(runner, "run_call", real)
    t = time.perf_counter()
    assert main(["study", str(bert), "--budget", "3m", "--out", str(out)]) == 0
    first = time.perf_counter() - t
    st = json.loads((out / "study.json").read_text())
    assert all(st["stages"][n].get("reused") for n in ("analyze", "roles", "similar"))
    assert not st["stages"]["score"].get("reused") and st["stages"]["score"]["status"] == "done"
    for name, data in before.items():  # the finished stages' files: untouched, byte for byte
        assert (out / name).read_bytes() == data and (out / name).stat().st_mtime_ns == mtimes[name], name
    # A third run reuses everything (the report too): far less time than running the stages.
    t = time.perf_counter()
    assert main(["study", str(bert), "--budget", "3m", "--out", str(out)]) == 0
    again = time.perf_counter() - t
    st2 = json.loads((out / "study.json").read_text())
    assert all(r.get("reused") for r in st2["stages"].values() if r["status"] == "done")
    assert st2["answers"] == st["answers"]  # every stage's record from its file now, from its Result before
    ran = sum(r["seconds"] for r in st2["stages"].values() if r["status"] == "done")
    assert again < ran, (again, ran, first)
    # --force starts over: every stage runs again.
    assert main(["study", str(bert), "--budget", "3m", "--out", str(out), "--force"]) == 0
    st3 = json.loads((out / "study.json").read_text())
    assert not any(r.get("reused") for r in st3["stages"].values())


@pytest.mark.parametrize("text, seconds", [("10m", 600), ("90s", 90), ("1h30m", 5400), ("2.5m", 150), ("1h", 3600)])
def test_durations(text, seconds):
    assert B.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10x", "10", "", "m", "-5m", "0s", "5m10"])
def test_bad_durations(text):
    with pytest.raises(HeadscopeError, match="duration"):
        B.parse_duration(text)


def test_the_plan_fits_the_budget_and_drops_optional_stages_first():
    cost = {"a": [10, 20, 40], "b": [5, 10], "c": [30, 60]}
    plan = B.make_plan(["a", "b", "c"], lambda n, lv: cost[n][lv], lambda n: len(cost[n]), lambda n: n == "a",
                       ["a", "b", "c"], 40)
    assert plan.total() <= 40 and plan.get("a").level is not None
    assert [c.level for c in plan.choices] == [1, 1, None] and "cheapest size needs" in plan.get("c").reason
    # "d" goes first (lowest priority), then "c"; dropping "c" left room for "d" again
    cost2 = {"a": [10], "b": [5], "c": [30], "d": [3]}
    back = B.make_plan(list(cost2), lambda n, lv: cost2[n][lv], lambda n: 1, lambda n: n == "a",
                       ["a", "b", "c", "d"], 20)
    assert [c.level for c in back.choices] == [0, 0, None, 0] and back.total() == 18, back
    roomy = B.make_plan(["a", "b", "c"], lambda n, lv: cost[n][lv], lambda n: len(cost[n]), lambda n: n == "a",
                        ["a", "b", "c"], 1000)
    assert [c.level for c in roomy.choices] == [2, 1, 1]


@pytest.mark.parametrize("argv, match", [
    (["--budget", "10x"], "is not a duration"),
    # Below what the probe alone takes (the stages share one load now: a tiny model's minimum is under a second).
    (["--budget", "0.01s"], "--budget .* is below what a study of .* needs .* give \\d+m or more"),
])
def test_bad_input_one_line_exit_2_nothing_written(bert, tmp_path, capsys, argv, match):
    out = tmp_path / "never"
    assert main(["study", str(bert), *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(match, err[0]), err
    assert not out.exists()


def test_a_model_no_stage_supports(tmp_path, capsys):
    path = tmp_path / "no-tokenizer"
    tiny_model("bert").model.save_pretrained(path)
    out = tmp_path / "never"
    assert main(["study", str(path), "--budget", "1m", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no stage of a study" in err[0], err
    assert not out.exists()


def test_kvcache_stage_takes_the_retrieval_scores_roles_measured(tmp_path):
    """The head-aware cache ranks KV heads by the retrieval scores the roles stage measured (its long-range pass),
    rather than measuring them again; without them it measures its own. What roles measured comes from its Result
    where it ran in this process, else from its roles.csv (a stage reused from an earlier run)."""
    import dataclasses

    import numpy as np

    from headscope.capacity.options import KvcacheOptions
    from headscope.learned.records import RolesReport, RolesText
    from headscope.learned.verbs import RolesResult
    from headscope.options.record import IntervalsUsed
    from headscope.study.records import retrieval_measured
    from headscope.study.stages import Ctx, Family, _kvcache_options
    from headscope.table import HeadTable

    fam = Family("m", "llama", True, 2, 4, 2, 8, 32, 2048, 8)
    ctx = Ctx("m", "ptb-valid", "ptb-train", "ptb-valid", str(tmp_path), fam)
    level = {"context": 512, "window": 128, "passages": 1, "needles": 2, "haystacks": 2}
    o = _kvcache_options(ctx, level)
    assert o.scores is None and o.haystacks == 2
    o = _kvcache_options(dataclasses.replace(ctx, retrieval_scores=True), level)
    assert o.scores == str(tmp_path / "roles.csv") and o.haystacks == KvcacheOptions().haystacks
    # from the file: none without roles.csv or when no head answered, else measured
    assert not retrieval_measured(None, tmp_path)
    (tmp_path / "roles.csv").write_text("layer,head,retrieval_score\n0,0,nan\n")
    assert not retrieval_measured(None, tmp_path)
    (tmp_path / "roles.csv").write_text("layer,head,retrieval_score\n0,0,0.5\n0,1,nan\n")
    assert retrieval_measured(None, tmp_path)
    # from the Result in memory, whatever the folder holds
    (tmp_path / "roles.csv").unlink()

    empty = RolesReport(text=RolesText(data="d", passages=1, first_token="w"), induction={},
                        intervals=IntervalsUsed(level=0.95, method="bca", B=200), roles={}, uncertain={},
                        uncertain_heads=0, census={}, stability={})

    def result(**columns):
        return RolesResult(table=HeadTable(2, 4, columns), report=empty, name="m", n_layers=2, n_heads=4)

    assert not retrieval_measured(result(entropy=np.zeros((2, 4))), tmp_path)
    assert not retrieval_measured(result(retrieval_score=np.full((2, 4), np.nan)), tmp_path)
    assert retrieval_measured(result(retrieval_score=np.eye(2, 4)), tmp_path)


@pytest.mark.parametrize("causal", [True, False])
def test_every_stage_command_parses_back_into_its_options(tmp_path, causal):
    """The command a stage logs is rendered from its Options (no argv is built): through the CLI's parser it gives
    the same Options back, at every size of every stage, including the retrieval scores of an earlier stage."""
    import dataclasses

    from headscope.study.comparing import Candidate
    from headscope.study.stages import Ctx, Family, stages_for
    from headscope.study.verbs import Calls

    fam = Family("m", "llama" if causal else "bert", causal, 2, 4, 2, 8, 32, 2048, 8,
                 pair_tasks=("ioi", "induction") if causal else ("masked",))
    # the compressed models the compare stage judges (the second one's BASE values come from the first's folder)
    saved = (Candidate("prune", str(tmp_path / "out" / "model")), Candidate("gqa", None, "left out: no time"),
             Candidate("mla", str(tmp_path / "out" / "mla" / "model")))
    ctx = Ctx(str(tmp_path / "my model"), "ptb-valid", "ptb-train", "ptb-valid", str(tmp_path / "out"), fam,
              device="cpu", candidates=saved)
    (tmp_path / "out" / "compare" / "prune").mkdir(parents=True)
    (tmp_path / "out" / "compare" / "prune" / "compare.json").write_text("{}")  # base_from's folder
    (tmp_path / "out" / "gqa").mkdir(parents=True)  # a conversion's folder: the report reads it (--from)
    for c in (ctx, dataclasses.replace(ctx, retrieval_scores=True)):
        for stage in stages_for(fam):
            for level in range(len(stage.levels)):
                call = stage.call(c, level)
                for one in [part for _, part in call.parts] if isinstance(call, Calls) else [call]:
                    assert parse_command(one.command()) == (one.verb, one.options), one.command()
