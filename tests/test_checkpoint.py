"""Checkpoints (models/checkpoint.py) and the one atomic directory writer (io.atomic_dir).

save_model -> load round trips for pruned and unpruned models, file modes under umask 022, and
atomic_dir's promises: nothing left behind on an error, the old folder kept or put back.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from headscope import HeadscopeError, load_model
from headscope.io import atomic_dir
from headscope.models.checkpoint import PRUNING_FILE, REMOTE_MODULE, load_checkpoint, save_model
from headscope.models.tiny import tiny_model
from headscope.redundancy.pruning.heads import prune_heads

TOL = 1e-5


def _out(hm, ids):
    with torch.no_grad():
        out = hm.model(input_ids=ids, use_cache=False)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _ids():
    return torch.randint(5, 120, (2, 8), generator=torch.Generator().manual_seed(5))


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_unpruned_round_trip_is_a_plain_checkpoint(tmp_path, family):
    hm = tiny_model(family, init_std=0.2)
    path = save_model(hm, tmp_path / "m")
    assert not (path / PRUNING_FILE).exists() and not (path / f"{REMOTE_MODULE}.py").exists()
    assert "auto_map" not in json.loads((path / "config.json").read_text())
    again = load_checkpoint(path)  # (load_model needs a tokenizer beside an unpruned model; tiny ones have none)
    assert not again.pruned
    d = (_out(again, _ids()) - _out(hm, _ids())).abs().max().item()
    assert d < TOL, f"{family}: max abs diff {d:.3g}"


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_pruned_round_trip_keeps_heads_and_outputs(tmp_path, family):
    hm = tiny_model(family, init_std=0.2)
    heads = {0: [0, 1, 2], 1: [1, 4]} if family == "llama" else {0: [1, 3], 1: list(range(hm.n_heads))}
    small = prune_heads(hm, heads)
    path = save_model(small, tmp_path / "m")
    record = json.loads((path / PRUNING_FILE).read_text())
    assert record["n_heads_kept"] == sum(small.heads_in_layer(l) for l in range(small.n_layers))
    assert (path / f"{REMOTE_MODULE}.py").exists()
    for again in (load_checkpoint(path), load_model(str(path))):
        assert [again.kept_heads(l) for l in range(2)] == [small.kept_heads(l) for l in range(2)]
        d = (_out(again, _ids()) - _out(small, _ids())).abs().max().item()
        assert d < TOL, f"{family}: max abs diff {d:.3g}"


def test_saved_files_have_umask_modes(tmp_path, umask_022):
    """safetensors writes model.safetensors 0600; every saved file must read like the others (0644)."""
    path = save_model(prune_heads(tiny_model("gpt2"), [(0, 1)]), tmp_path / "m")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()}
    assert "model.safetensors" in modes and f"{REMOTE_MODULE}.py" in modes
    assert all(m == 0o644 for m in modes.values()), {n: oct(m) for n, m in modes.items()}
    assert stat.S_IMODE(path.stat().st_mode) == 0o755


def test_save_refuses_an_existing_folder_and_replaces_with_force(tmp_path):
    hm = tiny_model("bert")
    path = save_model(hm, tmp_path / "m")
    with pytest.raises(HeadscopeError, match="already exists; pass force=True"):
        save_model(prune_heads(hm, [(0, 0)]), path)
    assert not (path / PRUNING_FILE).exists()
    save_model(prune_heads(hm, [(0, 0)]), path, force=True)
    assert json.loads((path / PRUNING_FILE).read_text())["pruned_heads"] == ["L0H0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_load_checkpoint_explains_a_folder_without_a_model(tmp_path):
    with pytest.raises(HeadscopeError, match="no config.json"):
        load_checkpoint(tmp_path)


# --- atomic_dir ------------------------------------------------------------------------------------
def test_atomic_dir_leaves_nothing_on_an_exception(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "half.txt").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_keeps_the_old_folder_when_the_new_one_fails(tmp_path):
    old = tmp_path / "out"
    old.mkdir()
    (old / "mine.txt").write_text("precious")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(old, force=True) as tmp:
            (tmp / "new.txt").write_text("x")
            raise RuntimeError("boom")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in old.iterdir()] == ["mine.txt"] and (old / "mine.txt").read_text() == "precious"


def test_atomic_dir_refuses_before_writing_and_replaces_with_force(tmp_path):
    old = tmp_path / "out"
    old.mkdir()
    (old / "mine.txt").write_text("old")
    ran = []
    with pytest.raises(HeadscopeError, match="already exists"):
        with atomic_dir(old):
            ran.append(1)
    assert not ran
    with atomic_dir(old, force=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in old.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_puts_the_old_folder_back_when_the_final_rename_fails(tmp_path, monkeypatch):
    old = tmp_path / "out"
    old.mkdir()
    (old / "mine.txt").write_text("old")
    real = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # 1: old folder aside, 2: new folder into place
            raise OSError("disk trouble")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk trouble"):
        with atomic_dir(old, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (old / "mine.txt").read_text() == "old"


def test_atomic_dir_gives_private_files_umask_modes(tmp_path, umask_022):
    with atomic_dir(tmp_path / "out") as tmp:
        fd = os.open(tmp / "private.bin", os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(tmp / "sub" / "run.sh", 0o700)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "private.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((out / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "sub" / "run.sh").stat().st_mode) == 0o755


def test_atomic_dir_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(HeadscopeError, match="exists and is not a directory"):
        with atomic_dir(tmp_path / "out", force=True):
            pass
