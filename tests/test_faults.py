"""Issue 26: each class of fault and bad input, with inputs built here: one line and exit 2 for user errors,
nothing new on disk; for faults, nothing left that blocks a rerun and the rerun's files byte-identical to an
uninterrupted run's."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_artifacts import tiny_bert_dir, tiny_llama_dir
from test_bad_input import listing, refused

from headscope.cli import main
from headscope.models.tiny import tiny_model

SMALL = ["--limit", "3", "--max-length", "16"]
# What a verb needs before its options are read (checked before anything loads, so never loaded here).
REQUIRED = {"kvcache": ["smollm2"], "gqa": ["smollm2", "--kv-heads", "1"], "mla": ["smollm2", "--kv-rank", "8"]}


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("faults"))


def _run(tmp_path: Path, argv: list[str]) -> int:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return main(argv)
    finally:
        os.chdir(cwd)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- user errors that exited 1: now one line, exit 2, nothing written --------------------------------------
def test_conllu_head_past_the_sentence(tmp_path, capsys):
    (tmp_path / "bad.conllu").write_text("1\tThe\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tcat\t_\t_\t_\t_\t9\troot\t_\t_\n\n")
    # read before the model loads (the default minilm would take seconds): the refusal is immediate
    refused(tmp_path, capsys, ["roles", "--treebank", "bad.conllu"], "holds no well-formed sentence")
    from headscope.data import read_conllu
    from headscope.errors import HeadscopeError

    with pytest.raises(HeadscopeError, match=r"bad.conllu:2: .*head 9 points past the sentence's 2 words"):
        read_conllu(tmp_path / "bad.conllu", strict=True)


def _gguf_header_cut() -> bytes:
    """A GGUF v3 header that claims 5 metadata entries, then ends: what `head -c 100` of a real file gives."""
    return b"GGUF" + struct.pack("<IQQ", 3, 1, 5) + struct.pack("<Q", 40) + b"general.architecture"


@pytest.mark.parametrize("damage,message", [
    ("truncate", "is truncated: it holds"),
    ("heads", "is not divisible by num_attention_heads 5"),
    ("gguf", "the file ends inside its header"),
])
def test_damaged_models(tmp_path, capsys, bert, damage, message):
    if damage == "gguf":
        (tmp_path / "cut.gguf").write_bytes(_gguf_header_cut())
        model = "cut.gguf"
    else:
        shutil.copytree(bert, tmp_path / "m")
        model = "m"
        if damage == "truncate":
            f = tmp_path / "m" / "model.safetensors"
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        else:
            cfg = json.loads((tmp_path / "m" / "config.json").read_text())
            (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 5}))
    refused(tmp_path, capsys, ["analyze", model, "--out", "o"], message)


def test_pruned_checkpoint_without_its_record_loads_from_the_config(tmp_path):
    from headscope import load_model
    from headscope.models.checkpoint import PRUNING_FILE, save_model

    hm = tiny_model("bert")
    hm.slice_heads(0, [0, 2])
    save_model(hm, tmp_path / "pruned")
    (tmp_path / "pruned" / PRUNING_FILE).unlink()
    back = load_model(str(tmp_path / "pruned"))
    assert [back.heads_in_layer(l) for l in range(back.n_layers)] == [hm.heads_in_layer(l) for l in range(hm.n_layers)]


@pytest.mark.parametrize("verb", ["analyze", "score", "prune", "roles", "similar", "sweep", "kvcache", "tasks",
                                  "gqa", "mla"])
@pytest.mark.parametrize("seed", ["-1", str(2**32), str(10**30)])
def test_one_seed_rule_for_every_verb(tmp_path, capsys, verb, seed):
    argv = [verb, *REQUIRED.get(verb, []), "--seed", seed]
    refused(tmp_path, capsys, argv, f"--seed must be a whole number from 0 to 4294967295 (2**32 - 1, what torch, "
                                    f"numpy and random all accept); got {seed}")


def test_every_output_location_checked_before_work(tmp_path, capsys):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    refused(tmp_path, capsys, ["analyze", "--out", "gone"], "is a symlink to")
    refused(tmp_path, capsys, ["analyze", "--out", "gone/sub"], "is a symlink to")
    refused(tmp_path, capsys, ["analyze", "--out", ""], "--out is empty")
    refused(tmp_path, capsys, ["roles", "--long", "128", "--export-card", "gone"], "--export-card 'gone' is a symlink")


def test_corrupt_resume_files_named_with_force(tmp_path, capsys, bert):
    out = tmp_path / "o"
    out.mkdir()
    (out / "prune_curve.partial.json").write_text('{"settings": {"model": ')  # cut mid-write by an old version
    before = listing(tmp_path)
    argv = ["prune", str(bert), "--fraction", "0.25", "--step", "0.25", *SMALL, "--out", str(out)]
    line = refused(tmp_path, capsys, argv, "prune_curve.partial.json is damaged (not JSON")
    assert "pass --force to start over" in line and listing(tmp_path) == before
    assert _run(tmp_path, [*argv, "--force"]) == 0
    assert not (out / "prune_curve.partial.json").exists()


# --- prune --recover: the checkpoint pair is crash-consistent ----------------------------------------------
@pytest.fixture()
def recover_run(monkeypatch, minilm):
    """prune --recover on a tiny GPT-2 reading MiniLM's tokenizer (recovery is LM distillation, and fast)."""
    from headscope.models.adapter import HeadModel
    from headscope.options import groups  # prune loads through PruneOptions.load

    def load(*args, **kwargs):
        tiny = tiny_model("gpt2", init_std=0.2, vocab_size=minilm.tokenizer.vocab_size)
        return HeadModel(model=tiny.model, tokenizer=minilm.tokenizer, name="tiny-gpt2", source="config")

    monkeypatch.setattr(groups, "load_model", load)
    return ["prune", "tiny", "--fraction", "75%", "--step", "0.25", "--limit", "6", "--max-length", "16",
            "--batch-size", "2", "--recover-steps", "2", "--recover-lr", "1e-3"]


def test_prune_recover_crash_between_the_two_checkpoint_writes(tmp_path, monkeypatch, capsys, recover_run):
    import headscope.redundancy.curves.checkpoint as ckpt

    full, part = tmp_path / "full", tmp_path / "part"
    assert main([*recover_run, "--out", str(full)]) == 0
    real, calls = ckpt.atomic_write_text, {"n": 0}

    def crash_before_the_json(path, text):
        calls["n"] += 1
        if calls["n"] == 2:  # the second point's weights are on disk; its json is not
            raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(ckpt, "atomic_write_text", crash_before_the_json)
    assert main([*recover_run, "--out", str(part)]) == 130
    saved = json.loads((part / ckpt.PARTIAL_JSON).read_text())
    states = sorted(p.name for p in part.glob("prune_curve.partial*.pt"))
    assert len(saved["rows"]) == 2 and len(states) == 2 and saved["state"]["file"] in states  # one orphan
    monkeypatch.setattr(ckpt, "atomic_write_text", real)
    capsys.readouterr()
    assert main([*recover_run, "--out", str(part)]) == 0, capsys.readouterr().err
    assert _files(part) == _files(full), "the resumed run's files differ from an uninterrupted run's"


def test_prune_recover_truncated_state_named(tmp_path, monkeypatch, capsys, recover_run):
    import headscope.redundancy.importance as importance
    from headscope.redundancy.curves import PARTIAL_JSON

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
    state = out / json.loads((out / PARTIAL_JSON).read_text())["state"]["file"]
    state.write_bytes(state.read_bytes()[:1000])
    capsys.readouterr()
    line = refused(tmp_path, capsys, [*recover_run, "--out", str(out)], f"{state} is damaged")
    assert "pass --force to start over" in line
    assert main([*recover_run, "--out", str(out), "--force"]) == 0


# --- outputs appear together or not at all; a lock per --out ------------------------------------------------
def test_a_failed_write_leaves_nothing_and_the_rerun_matches(tmp_path, monkeypatch, capsys, bert):
    from headscope.table import HeadTable

    argv = ["analyze", str(bert), *SMALL]
    assert _run(tmp_path, [*argv, "--out", "clean"]) == 0
    real = HeadTable.to_json

    def disk_full(self, path=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(HeadTable, "to_json", disk_full)
    before = listing(tmp_path)
    assert _run(tmp_path, [*argv, "--out", "o"]) == 2  # heads.csv was written (into staging), heads.json failed
    assert "error: the disk is full: writing 'o'" in capsys.readouterr().err  # said as such (issue 31), exit 2
    assert listing(tmp_path) == before, "a failed run left files behind"
    monkeypatch.setattr(HeadTable, "to_json", real)
    assert _run(tmp_path, [*argv, "--out", "o"]) == 0
    assert _files(tmp_path / "o") == _files(tmp_path / "clean")


def test_report_failing_half_way_leaves_nothing(tmp_path, monkeypatch, bert):
    import headscope.report.verbs as report

    argv = ["report", str(bert), "--sentences", "1", *SMALL]
    real = report.atomic_write_text

    def broken(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "atomic_write_text", broken)  # the page, written after heads.csv/.json and figures
    before = listing(tmp_path)
    assert _run(tmp_path, [*argv, "--out", "r"]) == 2  # a full disk is said as such (issue 31)
    assert listing(tmp_path) == before  # neither the computed heads.csv/.json nor the figures
    monkeypatch.setattr(report, "atomic_write_text", real)
    assert _run(tmp_path, [*argv, "--out", "r"]) == 0
    assert {"heads.csv", "heads.json", "report.html"} <= {p.name for p in (tmp_path / "r").iterdir()}


def test_killed_runs_leftovers_removed_by_the_next_run(tmp_path, bert):
    out = tmp_path / "o"
    out.mkdir()
    stale = tmp_path / ".o.staging.999999.abcd"  # what a SIGKILLed run's staging folder looks like
    stale.mkdir()
    (stale / "heads.csv").write_text("half")
    (out / ".heads.csv.x1y2.tmp").write_text("half")
    assert _run(tmp_path, ["analyze", str(bert), *SMALL, "--out", "o"]) == 0
    assert not stale.exists() and sorted(p.name for p in out.iterdir()) == ["heads.csv", "heads.json"]


def test_a_second_run_on_the_same_out_is_refused(tmp_path, capsys):
    from headscope.io import out_lock

    with out_lock(tmp_path / "o", "headscope analyze"):
        line = refused(tmp_path, capsys, ["kv", "minilm", "--out", "o"], "--out 'o' is in use by pid")
    assert f"pid {os.getpid()} (headscope analyze, since " in line
    assert _run(tmp_path, ["kv", "minilm", "--out", "o"]) == 0  # released: the next run goes ahead
    capsys.readouterr()


# --- SIGTERM like SIGINT; spill folders of dead processes -------------------------------------------------
def test_sigterm_during_exact_cka_removes_the_spill(tmp_path, bert):
    spill = tmp_path / "tmp"
    spill.mkdir()
    script = (
        "import sys, time\n"
        "import headscope.learned.cka as cka\n"
        "real = cka.SpilledExactCKA.ckas\n"
        "def slow(self, *a, **k):\n"
        "    time.sleep(60)\n"
        "    return real(self, *a, **k)\n"
        "cka.SpilledExactCKA.ckas = slow\n"
        "from headscope.cli import main\n"
        f"sys.exit(main(['similar', {str(bert)!r}, '--cka', 'exact', '--limit', '3', '--max-length', '16', "
        f"'--out', {str(tmp_path / 'o')!r}]))\n")
    env = {**os.environ, "TMPDIR": str(spill), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any((d / "samples.bin").exists() for d in spill.glob("headscope-cka-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.2)
    proc.terminate()
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err
    assert not list(spill.glob("headscope-cka-*")) and not (tmp_path / "o").exists()


def test_stale_spill_folders_of_dead_processes_removed(tmp_path):
    from headscope.learned.cka import SpilledExactCKA

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"headscope-cka-{dead.pid}-abc"
    live = tmp_path / f"headscope-cka-{os.getppid()}-def"  # a live process's: kept
    for d in (stale, live):
        d.mkdir()
        (d / "samples.bin").write_bytes(b"x" * 64)
    cka = SpilledExactCKA(2, 4, spill_dir=str(tmp_path))
    try:
        assert not stale.exists() and live.exists()
    finally:
        cka.close()


# --- silent nonsense, now refused ---------------------------------------------------------------------------
def test_report_refuses_files_of_two_runs_or_cut_rows(tmp_path, capsys, bert):
    for out, limit in (("a", "3"), ("b", "4")):
        assert _run(tmp_path, ["analyze", str(bert), "--limit", limit, "--max-length", "16", "--out", out]) == 0
    (tmp_path / "mixed").mkdir()
    shutil.copy(tmp_path / "a" / "heads.csv", tmp_path / "mixed")
    shutil.copy(tmp_path / "b" / "heads.json", tmp_path / "mixed")
    capsys.readouterr()
    refused(tmp_path, capsys, ["report", "--no-model", "--out", "mixed"], "are from different runs")
    lines = (tmp_path / "a" / "heads.csv").read_text().splitlines(keepends=True)
    n_heads = tiny_model("bert").n_heads
    (tmp_path / "a" / "heads.csv").write_text("".join(lines[: 1 + len(lines[1:]) - n_heads]))  # one layer gone
    refused(tmp_path, capsys, ["report", "--no-model", "--out", "a"], "the file is cut or edited")
    refused(tmp_path, capsys, ["report", "--no-model", "--from", "a/heads.csv", "--out", "r"],
            "--from 'a/heads.csv' is a file; give the folder holding a verb's outputs: 'a'")


def test_kvcache_from_another_models_file(tmp_path, capsys):
    import numpy as np
    from test_artifacts import WORDS

    src, text = tiny_llama_dir(tmp_path, num_key_value_heads=3, max_position_embeddings=128, init_std=0.2)
    long = tmp_path / "long.txt"
    long.write_text("\n".join(" ".join(np.random.default_rng(0).choice(WORDS, 100)) for _ in range(2)) + "\n")
    other = tmp_path / "other"
    other.mkdir()
    small_src, _ = tiny_llama_dir(other, num_hidden_layers=1, num_key_value_heads=3, init_std=0.2)
    assert _run(tmp_path, ["analyze", str(small_src), "--data", str(text), *SMALL, "--out", "theirs"]) == 0
    # a user's own file of the other grid (no provenance beside it) fits inside this model's: its rows are counted
    (tmp_path / "mine").mkdir()
    shutil.copy(tmp_path / "theirs" / "heads.csv", tmp_path / "mine" / "scores.csv")
    capsys.readouterr()
    kv = ["kvcache", str(src), "--data", str(long), "--sink", "2", "--window", "8", "--context", "64",
          "--limit", "1", "--needles", "0", "--by", "entropy"]
    refused(tmp_path, capsys, [*kv, "--scores", "theirs/heads.csv"], "was written for")
    refused(tmp_path, capsys, [*kv, "--scores", "mine/scores.csv"], "has rows for 6 of this model's 12 heads")


def test_score_with_every_head_pruned(tmp_path, capsys, bert):
    hm = tiny_model("bert")
    every = ",".join(f"L{l}H{h}" for l in range(hm.n_layers) for h in range(hm.n_heads))
    refused(tmp_path, capsys, ["score", str(bert), *SMALL, "--pruned", every, "--out", "o"],
            f"--pruned lists all {hm.n_layers * hm.n_heads} heads")


@pytest.mark.parametrize("name", ["notes.csv", "notes.md", "notes.json"])
def test_data_files_headscope_does_not_read(tmp_path, capsys, name):
    (tmp_path / name).write_text("text,label\nhello world,1\n")
    refused(tmp_path, capsys, ["analyze", "--data", name], "give a .txt (one passage a line), .jsonl")


# --- the minor ones -----------------------------------------------------------------------------------------
def test_minor_ones(tmp_path, capsys):
    (tmp_path / "u16.txt").write_bytes("hello world\n".encode("utf-16"))
    refused(tmp_path, capsys, ["analyze", "--data", "u16.txt"], "is UTF-16LE (it starts with a UTF-16LE byte-order")
    os.mkfifo(tmp_path / "fifo.txt")
    refused(tmp_path, capsys, ["analyze", "--data", "fifo.txt"], "is not a regular file")
    os.unlink(tmp_path / "fifo.txt")
    refused(tmp_path, capsys, ["models", "bogus"], "headscope models: error: unrecognized arguments: bogus")
    refused(tmp_path, capsys, ["sweep", "--heads", "3", "--d-model", "64"], "no valid configuration to train")
    assert len(capsys.readouterr().err.splitlines()) == 0  # refused() read it: one line


def test_long_refused_before_the_short_pass(tmp_path, capsys, monkeypatch):
    import headscope.learned.verbs as verbs

    def never(*a, **k):
        raise AssertionError("the short-text pass ran")

    monkeypatch.setattr(verbs, "roles_table", never)
    src, text = tiny_llama_dir(tmp_path, max_position_embeddings=128)
    refused(tmp_path, capsys, ["roles", str(src), "--data", str(text), "--long", "10000000", "--out", "o"],
            "--long 10000000 exceeds")


def test_model_without_tokenizer_told_what_to_copy(tmp_path, capsys):
    tiny_model("bert").model.save_pretrained(tmp_path / "m")
    line = refused(tmp_path, capsys, ["analyze", "m", "--out", "o"], "has no tokenizer")
    assert "copy the tokenizer files of the model it came from" in line
