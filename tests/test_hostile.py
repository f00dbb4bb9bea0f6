"""Issue 31: a results folder someone sent you cannot run code or point headscope at other files; refusals come
before the work; every size a user gives is bounded before the work; files read back are checked.

Each test builds the hostile or damaged input, checks the exit code and the one line, that nothing ran or was
written that should not be, and that a rerun (with --force where the folder must be started over) works."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from test_artifacts import tiny_bert_dir
from test_bad_input import refused

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
    from headscope.commands import _common
    from headscope.models.adapter import HeadModel
    from headscope.models.tiny import tiny_model

    def load(*args, **kwargs):
        tiny = tiny_model("gpt2", init_std=0.2, vocab_size=minilm.tokenizer.vocab_size)
        return HeadModel(model=tiny.model, tokenizer=minilm.tokenizer, name="tiny-gpt2", source="config")

    monkeypatch.setattr(_common, "load_model", load)
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
