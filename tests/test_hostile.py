"""Issue 31: a results folder someone sent you cannot run code or point headscope at other files; refusals come
before the work; every size a user gives is bounded before the work; files read back are checked.

Each test builds the hostile or damaged input, checks the exit code and the one line, that nothing ran or was
written that should not be, and that a rerun (with --force where the folder must be started over) works."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from test_artifacts import tiny_bert_dir
from test_bad_input import refused
from users import as_user

from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.io import inside
from headscope.train import Trainer

SMALL = ["--limit", "3", "--max-length", "16"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("hostile"))


class _Payload:
    """Unpickling this runs `touch MARKER`: what a crafted resume file would do if headscope unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile(path: Path, marker: Path) -> Path:
    """A torch checkpoint whose unpickling creates `marker` (torch.save pickles the payload as a call)."""
    torch.save({"model": {"w": torch.zeros(1)}, "n_removed": 1, "step": _Payload(marker)}, path)
    with open(path.with_suffix(".plain"), "wb") as f:  # the same payload as a plain pickle stream
        pickle.dump({"model": _Payload(marker)}, f)
    return path


def test_the_payload_really_runs_when_unpickled(tmp_path):
    """The test's own check: without weights_only the file runs its code (so the tests below can fail)."""
    marker = tmp_path / "ran"
    torch.load(hostile(tmp_path / "x.pt", marker), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("suffix", [".pt", ".plain"])
def test_trainer_read_never_runs_a_crafted_state(tmp_path, suffix):
    marker = tmp_path / "ran"
    path = hostile(tmp_path / "x.pt", marker).with_suffix(suffix)
    with pytest.raises(HeadscopeError, match=rf"{path.name} is damaged .*nothing in it was run"):
        Trainer.read(path)
    assert not marker.exists()


def _prune_l0(bert: Path, out: Path) -> list[str]:
    return ["prune", str(bert), "--method", "l0", "--l0-steps", "2", "--fraction", "0.25", "--step", "0.25",
            *SMALL, "--out", str(out)]


def test_hostile_l0_gate_state_never_runs(tmp_path, capsys, bert):
    out, marker = tmp_path / "o", tmp_path / "ran"
    out.mkdir()
    hostile(out / "l0_gates.partial.pt", marker)
    line = refused(tmp_path, capsys, _prune_l0(bert, out), "l0_gates.partial.pt is damaged")
    assert "pass --force" in line and not marker.exists()
    assert main([*_prune_l0(bert, out), "--force"]) == 0 and not marker.exists()
    assert (out / "prune.json").is_file() and not (out / "l0_gates.partial.pt").exists()


@pytest.fixture()
def recover_run(monkeypatch, minilm):
    """prune --recover on a tiny GPT-2 reading MiniLM's tokenizer (as tests/test_faults.py runs it)."""
    from headscope.models.adapter import HeadModel
    from headscope.models.tiny import tiny_model
    from headscope.options import groups  # prune loads through PruneOptions.load

    def load(*args, **kwargs):
        tiny = tiny_model("gpt2", init_std=0.2, vocab_size=minilm.tokenizer.vocab_size)
        return HeadModel(model=tiny.model, tokenizer=minilm.tokenizer, name="tiny-gpt2", source="config")

    monkeypatch.setattr(groups, "load_model", load)
    return ["prune", "tiny", "--fraction", "75%", "--step", "0.25", "--limit", "6", "--max-length", "16",
            "--batch-size", "2", "--recover", "2", "--recover-lr", "1e-3"]


@pytest.fixture()
def interrupted(tmp_path, monkeypatch, recover_run):
    """A `prune --recover` run stopped after its first point: OUT holds the partial json and its state file."""
    import headscope.redundancy.importance as importance

    out = tmp_path / "o"
    real, calls = importance.score, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(importance, "score", flaky)
    assert main([*recover_run, "--out", str(out)]) == 130
    monkeypatch.setattr(importance, "score", real)
    return out


def test_hostile_recovery_state_never_runs(tmp_path, capsys, interrupted, recover_run):
    out, marker = interrupted, tmp_path / "ran"
    state = out / json.loads((out / "prune_curve.partial.json").read_text())["state"]["file"]
    hostile(state, marker)
    capsys.readouterr()
    line = refused(tmp_path, capsys, [*recover_run, "--out", str(out)], f"{state} is damaged")
    assert "pass --force to start over" in line and not marker.exists()
    assert main([*recover_run, "--out", str(out), "--force"]) == 0 and not marker.exists()


@pytest.mark.parametrize("name", ["../evil.pt", "ABS", "sub/../../evil.pt", "link/evil.pt", ""])
def test_resume_json_cannot_name_a_file_outside_its_folder(tmp_path, capsys, interrupted, recover_run, name):
    out, marker = interrupted, tmp_path / "ran"
    hostile(tmp_path / "evil.pt", marker)  # what the json points at, beside --out
    (out / "link").symlink_to(tmp_path)
    saved = json.loads((out / "prune_curve.partial.json").read_text())
    saved["state"]["file"] = str(tmp_path / "evil.pt") if name == "ABS" else name
    (out / "prune_curve.partial.json").write_text(json.dumps(saved))
    capsys.readouterr()
    said = "not a file name" if not name else "outside"
    line = refused(tmp_path, capsys, [*recover_run, "--out", str(out)], said)
    assert "prune_curve.partial.json names" in line and not marker.exists()
    (out / "link").unlink()
    assert main([*recover_run, "--out", str(out), "--force"]) == 0 and not marker.exists()


def test_inside(tmp_path):
    assert inside(tmp_path, "a/b.pt", "rec", "fix it") == tmp_path / "a" / "b.pt"
    for name in ("/etc/passwd", "..", "../x", "a/../../x", "", None, 3, "a\x00b"):
        with pytest.raises(HeadscopeError, match="rec names .*fix it"):
            inside(tmp_path, name, "rec", "fix it")


def test_a_weight_index_cannot_name_a_file_outside_the_model(tmp_path, capsys):
    from headscope.models.checkpoint import load_weights

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../other/model.safetensors"}}))
    with pytest.raises(HeadscopeError, match="model.safetensors.index.json names '../other/model.safetensors'"):
        load_weights(torch.nn.Linear(1, 1), tmp_path / "m")


# --- refusals before the work: output locations, the conversion cache --------------------------------------------
@pytest.mark.parametrize("argv, files, says", [
    (["kvcache", "smollm2", "--export-card", "X", "--out", "X"], [], "writing --export-card would replace --out"),
    (["kvcache", "smollm2", "--export-card", "o", "--out", "o/sub"], [], "writing --export-card would replace --out"),
    (["kvcache", "smollm2", "--export-card", "o/kvcache.csv", "--out", "o"], [], "is a file --out writes"),
    (["analyze", "{bert}", "--out", "{bert}"], [], "is the model's own folder"),
    (["analyze", "--data", "o/heads.csv", "--out", "o", "--force"], ["o/heads.csv"], "lies where --out 'o'"),
    (["prune", "{bert}/model", "--fraction", "0.2", "--save-model", "--out", "{bert}", "--force"], [],
     "lies where --out"),
    (["roles", "--long", "64", "--long-data", "c/x.txt", "--export-card", "c", "--force"], ["c/x.txt"],
     "--long-data 'c/x.txt' lies where --export-card writes"),
])
def test_output_locations_refused_before_the_model_loads(tmp_path, capsys, bert, monkeypatch, argv, files, says):
    from headscope.commands import _common
    from headscope.options import groups

    def never(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(_common, "load_model", never)  # verbs that load through _common.load_from_args
    monkeypatch.setattr(groups, "load_model", never)  # and through Options.load
    base = tmp_path / "b"
    shutil.copytree(bert, base)
    shutil.copytree(bert, base / "model")
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("the cat saw the dog .\n")
    argv = [a.replace("{bert}", str(base)) for a in argv]
    refused(tmp_path, capsys, argv, says)


def test_separate_locations_run(tmp_path, bert):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["analyze", str(bert), *SMALL, "--out", "o"]) == 0
        assert main(["analyze", str(bert), *SMALL, "--out", str(tmp_path / "o2")]) == 0
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("cache", ["file", "file/sub"])
def test_a_cache_that_cannot_hold_the_copy_is_refused_before_converting(tmp_path, capsys, monkeypatch, cache):
    from headscope.models import loading

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / cache))
    monkeypatch.setattr(loading, "_dequantise", lambda *a: pytest.fail("converted before the cache was checked"))
    line = refused(tmp_path, capsys, ["analyze", "smollm2", "--limit", "1"], "HEADSCOPE_CACHE")
    assert "set HEADSCOPE_CACHE to a writable folder" in line


def test_a_truncated_cache_entry_is_rebuilt(tmp_path, monkeypatch, caplog):
    import transformers
    from test_artifacts import tiny_llama_dir

    from headscope.models import loading

    src, _ = tiny_llama_dir(tmp_path)
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    entry = loading.float_copy_dir("smollm2")
    shutil.copytree(src, entry)
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:2000])  # a full disk cut it
    calls = []

    def dequantise(*a):
        calls.append(a)
        return (transformers.AutoModelForCausalLM.from_pretrained(src), transformers.AutoTokenizer.from_pretrained(src))

    monkeypatch.setattr(loading, "_dequantise", dequantise)
    hm = loading.load_model("smollm2")
    assert len(calls) == 1 and "is damaged" in caplog.text and hm.n_layers == 2
    assert weights.stat().st_size == (src / "model.safetensors").stat().st_size
    loading.load_model("smollm2")  # the rebuilt entry is used as it is
    assert len(calls) == 1


# --- the study: its record read back, its report across reruns, a failing stage ------------------------------------
def _study_json(tmp_path: Path, data) -> Path:
    out = tmp_path / "s"
    out.mkdir(exist_ok=True)
    (out / "study.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return out


GOOD = {"format": 1, "stages": {"analyze": {"status": "done", "key": "k", "dir": ".", "level": 0,
                                            "files": {"heads.csv": "a" * 64}}}, "plan": {"analyze": 0}}


@pytest.mark.parametrize("edit, says", [
    ('{"format": 1, "stages": {"ana', "not JSON"),
    ({**GOOD, "plan": {"analyze": "big"}}, "plan.analyze is 'big'"),
    ({**GOOD, "plan": {"analyze": -1}}, "plan.analyze is -1"),
    ({**GOOD, "stages": []}, "stages is []"),
    ({**GOOD, "stages": {"analyze": {"status": "done", "level": "0"}}}, "stages.analyze.level is '0'"),
    ({**GOOD, "stages": {"analyze": {"status": "maybe"}}}, "stages.analyze.status is 'maybe'"),
    ({**GOOD, "stages": {"analyze": {"status": "done", "files": {"../../etc/passwd": "a" * 64}}}}, "outside"),
    ({**GOOD, "stages": {"analyze": {"status": "done", "dir": "/etc", "files": {"passwd": "a" * 64}}}}, "outside"),
    ({**GOOD, "budget_s": True}, "budget_s is True"),
    ({**GOOD, "format": 7}, "format 7"),
    ([1, 2], "not a JSON object"),
])
def test_a_damaged_study_json_is_refused_by_name(tmp_path, capsys, bert, edit, says):
    from headscope.study.runner import check_out
    from headscope.study.state import State

    out = _study_json(tmp_path, edit)
    with pytest.raises(HeadscopeError, match="study.json is damaged or edited"):
        State.load(out)
    line = refused(tmp_path, capsys, ["study", str(bert), "--budget", "10m", "--out", str(out)], says)
    assert "pass --force to start the study over" in line
    assert check_out(out, force=True) is None  # --force plans anew (and clear_study removes the file)


def test_a_good_study_json_loads(tmp_path):
    from headscope.study.state import State

    assert State.load(_study_json(tmp_path, GOOD)).data == GOOD


@pytest.mark.parametrize("text, says", [("1h1h", "the unit 'h' twice"), ("30m1h", "out of order"),
                                        ("10m5m", "the unit 'm' twice"), ("5s1m", "out of order")])
def test_a_repeated_budget_unit_is_refused(tmp_path, capsys, text, says):
    refused(tmp_path, capsys, ["study", "--budget", text], says)


def test_every_report_figure_is_named_so_a_rerun_clears_it():
    """Each report-*.png a report module can write is among figure_names() (which the report and the study clear
    and check): a name missing there made every study rerun fail its report."""
    import re

    import headscope.report as report_pkg
    from headscope.report.build import figure_names
    from headscope.report.heads import GRID_PLOT_COLUMNS, grid_plot_name

    literal = {m for f in Path(report_pkg.__file__).parent.glob("*.py")
               for m in re.findall(r"report-[a-z0-9_-]+\.png", f.read_text())}
    assert literal and literal <= set(figure_names()), literal - set(figure_names())
    assert {grid_plot_name(c) for c in GRID_PLOT_COLUMNS} <= set(figure_names())


def test_a_rerun_clears_every_figure_of_the_last_report(tmp_path):
    from headscope.study.state import clear_stage_files

    for name in ("report.html", "report-roles.png", "report-some-future-figure.png", "heads.csv"):
        (tmp_path / name).write_text("x")
    clear_stage_files(tmp_path, "report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.csv"]


def test_a_stage_failing_on_a_clash_is_failed_not_unsupported(tmp_path, monkeypatch):
    from headscope.errors import OutputConflict
    from headscope.study import runner
    from headscope.study.state import State

    def clash(call, hm, log):
        raise OutputConflict("report-roles.png appeared in 's' while this run was writing")

    monkeypatch.setattr(runner, "run_call", clash)
    r = object.__new__(runner._Runner)
    r.state, r.failed, r.stages, r.hm, r.results = State(tmp_path), [], [], None, {}
    r.ctx = type("Ctx", (), {"out": str(tmp_path)})()
    r.progress = type("P", (), {"say": lambda self, s: None})()
    stage = type("Stage", (), {"name": "report", "verb": "report"})()
    rec: dict = {}
    assert r.attempt(1, stage, None, rec) is False
    assert rec["status"] == "failed" and r.failed == ["report"], rec


# --- messages that say what is wrong: a damaged pruning record, a full disk ----------------------------------------
@pytest.fixture()
def pruned_dir(tmp_path) -> Path:
    """A tiny LLaMA with heads pruned differently per layer, saved (its own loader and headscope_pruning.json)."""
    from headscope.models.checkpoint import save_model
    from headscope.models.tiny import tiny_model

    hm = tiny_model("llama")
    hm.slice_heads(0, [0, 1, 3, 4])  # two of each KV group (group size 3)
    return save_model(hm, tmp_path / "pruned")


@pytest.mark.parametrize("damage, says", [
    ("{ cut", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"format": 1}', "it has no kept_heads"),
    ('{"kept_heads": "L0H1"}', "kept_heads is L0H1, not {layer: [head, ...]}"),
    ('{"kept_heads": {"x": [1]}}', "not {layer: [head, ...]}"),
    ('{"kept_heads": {"9": [0, 1]}}', "kept_heads of layer 9"),
])
def test_a_damaged_pruning_record_is_named(tmp_path, capsys, pruned_dir, damage, says):
    from headscope.models.checkpoint import load_checkpoint

    record = pruned_dir / "headscope_pruning.json"
    good = record.read_bytes()
    record.write_text(damage)
    line = refused(tmp_path, capsys, ["analyze", str(pruned_dir), "--out", "o"], says)
    assert "headscope_pruning.json is damaged" in line and "records which heads" in line
    record.write_bytes(good)
    assert load_checkpoint(pruned_dir).heads_in_layer(0) == 4  # the intact record loads again


def test_a_full_disk_inside_torchs_writer_is_said(tmp_path, monkeypatch):
    from headscope import train

    m = torch.nn.Linear(64, 64)
    t = Trainer(m, m.parameters(), lr=1e-3, steps=1)

    def short_write(obj, f):
        Path(f).write_bytes(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4352")

    monkeypatch.setattr(train.torch, "save", short_write)
    need = (64 * 64 + 64) * 4 + t.generator.get_state().numel()  # the weights and the generator's state, in bytes
    with pytest.raises(HeadscopeError, match=rf"the disk is full: writing '.*state.pt' needed about "
                                             rf"{need / 1024:.1f} KiB and the filesystem holding .* has .* free"):
        t.save(tmp_path / "state.pt")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_full_disk_while_writing_results_is_one_line_and_a_rerun_works(tmp_path, capsys, monkeypatch, bert):
    import errno

    from headscope.table import HeadTable

    real = HeadTable.to_json

    def full(self, path, *a, **k):
        Path(path).write_text("{")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(HeadTable, "to_json", full)
    line = refused(tmp_path, capsys, ["analyze", str(bert), *SMALL, "--out", "o"], "the disk is full: writing 'o'")
    assert "free some space there" in line
    monkeypatch.setattr(HeadTable, "to_json", real)
    os.chdir(tmp_path)
    try:
        assert main(["analyze", str(bert), *SMALL, "--out", "o"]) == 0
    finally:
        os.chdir(Path(__file__).parent.parent)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["heads.csv", "heads.json"]


# --- an unreadable --data, as a user without root's override reads it -------------------------------------------


def test_unreadable_data_refused_by_the_open_itself(tmp_path, bert):
    import subprocess
    import sys

    data = tmp_path / "secret.txt"
    data.write_text("the cat saw the dog .\nthe small bird sang .\n")
    data.chmod(0)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    try:
        r = subprocess.run([*as_user(), sys.executable, "-m", "headscope", "analyze", str(bert), "--data", str(data),
                            *SMALL, "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=300)
        lines = [l for l in r.stderr.splitlines() if l.startswith("headscope ")]
        assert r.returncode == 2, r.stderr
        assert lines == [f"headscope analyze: error: {str(data)!r} cannot be read (Permission denied); give a file "
                         f"this user can read (check its permissions, e.g. chmod u+r, or its owner)"], r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()
    finally:
        data.chmod(0o644)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["analyze", str(bert), "--data", str(data), *SMALL, "--out", "o"]) == 0  # readable: it runs
    finally:
        os.chdir(cwd)


# --- what a killed export leaves beside its file -----------------------------------------------------------------
def _bpe_llama(path: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from headscope.models.checkpoint import save_model
    from headscope.models.tiny import tiny_model

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat saw a dog"] * 10, vocab_size=280, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    hm = tiny_model("llama", vocab_size=280)
    hm.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>",
                                           bos_token="<|endoftext|>")
    return save_model(hm, path)


def test_a_killed_exports_temp_file_is_removed_by_the_next_export(tmp_path, monkeypatch, capsys):
    import subprocess

    import gguf

    src = _bpe_llama(tmp_path / "m")
    seen = []

    def killed(self, *a, **k):  # what the writer's temp file is called while it writes
        seen.extend(p.name for p in tmp_path.glob(".m.gguf.*"))
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", killed)
    assert main(["export", str(src), "--to", "gguf", "--out", str(tmp_path / "m.gguf")]) == 130
    monkeypatch.undo()
    assert len(seen) == 1 and seen[0].startswith(f".m.gguf.{os.getpid()}.") and seen[0].endswith(".tmp"), seen
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        stale = tmp_path / f".m.gguf.{dead.pid}.a1b2c3.tmp"  # a SIGKILLed export's leftover: its writer is gone
        busy = tmp_path / f".m.gguf.{live.pid}.d4e5f6.tmp"  # another export still writing
        other = tmp_path / f".n.gguf.{dead.pid}.a1b2c3.tmp"  # another file's
        for p in (stale, busy, other):
            p.write_bytes(b"GGUF" + bytes(1000))
        assert main(["export", str(src), "--to", "gguf", "--out", str(tmp_path / "m.gguf")]) == 0
        assert not stale.exists() and busy.exists() and other.exists() and (tmp_path / "m.gguf").is_file()
    finally:
        live.kill()
        live.wait()


def test_a_report_into_the_folder_it_reads_is_not_a_conflict(tmp_path, bert):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["analyze", str(bert), *SMALL, "--out", "runs"]) == 0
        assert main(["report", "--no-model", "--from", "runs", "--out", "runs"]) == 0
    finally:
        os.chdir(cwd)
    assert (tmp_path / "runs" / "report.html").is_file()


# --- the other records a changed checkpoint reads back -----------------------------------------------------------
@pytest.fixture()
def mla_dir(tmp_path) -> Path:
    from headscope.capacity import mla
    from headscope.capacity.mla.checkpoint import save_mla
    from headscope.models.tiny import tiny_model

    hm = tiny_model("llama", init_std=0.2)
    calib = [list(range(5, 40)), list(range(60, 90))]
    return save_mla(mla.convert_to_mla(hm, 7, 4, data=calib), tmp_path / "m")


@pytest.mark.parametrize("damage, says", [("{ cut", "not JSON"), ("[1]", "not a JSON object"),
                                          ("{}", "KeyError")])
def test_a_damaged_mla_record_is_named(tmp_path, capsys, mla_dir, damage, says):
    from headscope.capacity.mla.checkpoint import load_mla

    record = mla_dir / "headscope_mla.json"
    good = record.read_bytes()
    record.write_text(damage)
    line = refused(tmp_path, capsys, ["analyze", str(mla_dir), "--out", "o"], says)
    assert "headscope_mla.json is damaged" in line and "copy the checkpoint again" in line
    record.write_bytes(good)
    assert load_mla(mla_dir).n_layers == 2


@pytest.mark.parametrize("base", ['"x"', '{"model_type": "nope", "architectures": []}', '{"model_type": "llama", '
                                                                                         '"architectures": 3}'])
def test_a_damaged_own_type_config_is_named(tmp_path, capsys, mla_dir, base):
    cfg = mla_dir / "config.json"
    data = json.loads(cfg.read_text())
    data["headscope_base"] = json.loads(base)
    cfg.write_text(json.dumps(data))
    line = refused(tmp_path, capsys, ["analyze", str(mla_dir), "--out", "o"], "config.json is damaged")
    assert "headscope_base is" in line


def test_a_training_state_that_does_not_fit_is_named(tmp_path):
    m = torch.nn.Linear(4, 4)
    t = Trainer(m, m.parameters(), lr=1e-3, steps=1)
    t.save(tmp_path / "s.pt")
    blob = Trainer.read(tmp_path / "s.pt")
    other = torch.nn.Linear(4, 3)
    with pytest.raises(HeadscopeError, match="the saved training state does not fit this run .*force=True"):
        Trainer(other, other.parameters(), lr=1e-3, steps=1).load_state_dict(blob)
    torch.save({"model": {}}, tmp_path / "bare.pt")
    with pytest.raises(HeadscopeError, match=r"bare.pt is damaged \(no optimizer, generator, step, losses in it\)"):
        Trainer.read(tmp_path / "bare.pt")
