"""The folders compare reads (`--cache DIR`, `--base-from DIR`) cannot point it at files elsewhere: a file of theirs
symlinked out of the folder is refused in one line naming it, and an unreadable one is named, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_compare_check as check_tests
from test_bad_input import refused
from test_compare import TEXTS, planted_model
from users import as_user

import headscope
from headscope.errors import HeadscopeError

# the check's tests' module-scoped fixtures: a tiny LLaMA with its texts, and a kvcache run on it
llama = check_tests.llama
kv_out = check_tests.kv_out
CENSUS = dict(tasks=("induction", "heads"), items=8, bootstrap=200, data=TEXTS)


def _symlinked_out(folder: Path, name: str, outside: Path) -> Path:
    """`folder` (created) whose `name` is a symlink to a copy of `name` in `outside`."""
    folder.mkdir()
    outside.mkdir(exist_ok=True)
    target = outside / name
    (folder / name).symlink_to(target)
    return target


def test_a_kvcache_plan_symlinked_out_of_its_folder_is_refused(llama, kv_out, tmp_path, capsys):
    src, _, _ = llama
    target = _symlinked_out(tmp_path / "given", "kvcache.json", tmp_path / "elsewhere")
    shutil.copy(kv_out / "kvcache.json", target)
    line = refused(tmp_path, capsys, ["compare", str(src), str(src), "--cache", str(tmp_path / "given"), "--tasks",
                                      "lm", "--out", "o"], "which leads outside")
    assert "kvcache.json" in line, line


def test_a_duo_pattern_file_symlinked_out_of_its_folder_is_refused(llama, tmp_path, capsys):
    src, _, _ = llama
    real = check_tests._duo(tmp_path / "real", [[0], [1]], 3, 2, 8)
    target = _symlinked_out(tmp_path / "given", "full_attention_heads.tsv", tmp_path / "elsewhere")
    shutil.copy(real / "full_attention_heads.tsv", target)
    shutil.copy(real / "config.json", tmp_path / "given" / "config.json")
    line = refused(tmp_path, capsys, ["compare", str(src), str(src), "--cache", str(tmp_path / "given"), "--tasks",
                                      "lm", "--out", "o"], "which leads outside")
    assert "full_attention_heads.tsv" in line, line


@pytest.fixture(scope="module")
def census_folder(tmp_path_factory) -> Path:
    """A saved census compare (compare.csv, compare.json and compare_items.npz)."""
    out = tmp_path_factory.mktemp("census") / "out"
    out.mkdir()
    headscope.compare(planted_model(), planted_model(), **CENSUS).save(out)
    return out


@pytest.mark.parametrize("name", ["compare.json", "compare_items.npz"])
def test_base_from_files_symlinked_out_are_refused_before_any_forward(census_folder, tmp_path, name):
    given = tmp_path / "given"
    target = _symlinked_out(given, name, tmp_path / "elsewhere")
    shutil.copy(census_folder / name, target)
    for other in ("compare.csv", "compare.json", "compare_items.npz"):
        if other != name:
            shutil.copy(census_folder / other, given / other)
    base, other = planted_model(), planted_model()
    calls: list[int] = []
    hooks = [hm.model.register_forward_pre_hook(lambda *a: calls.append(1)) for hm in (base, other)]
    with pytest.raises(HeadscopeError, match="which leads outside") as e:
        headscope.compare(base, other, **CENSUS, base_from=str(given))
    for h in hooks:
        h.remove()
    assert name in str(e.value) and "base_from" in e.value.fields and not calls, (str(e.value), calls)


def test_an_unreadable_base_from_record_is_one_line_as_a_user(llama, census_folder, tmp_path):
    src, _, _ = llama
    given = tmp_path / "given"
    shutil.copytree(census_folder, given)
    (given / "compare.json").chmod(0)
    try:
        r = subprocess.run([*as_user(), sys.executable, "-m", "headscope", "compare", str(src), str(src), "--tasks",
                            "lm", "--base-from", str(given), "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    finally:
        (given / "compare.json").chmod(0o644)
    lines = [line for line in r.stderr.splitlines() if line.startswith("headscope ")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cannot be read as a compare.json (PermissionError" in lines[0], lines[0]
    assert not (tmp_path / "o").exists()
