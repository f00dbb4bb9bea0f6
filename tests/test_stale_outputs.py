"""No file of an earlier run survives a rerun that writes fewer files (Result.save, options/result.py).

A verb whose set of files varies by run (an optional file declared in headscope.artifacts) refuses, without
--force, a folder holding any file it may write, and with --force removes the earlier run's files it does not
write once the new set is in place: `report --from` and `view --from` then never read another run's file as
this one's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_artifacts import tiny_bert_dir, tiny_llama_dir

from headscope import artifacts as A
from headscope.cli import main
from headscope.errors import OutputConflict
from headscope.options import Result

GOOD = '{"clean": "the of and to a in is", "corrupt": "the of and to he in is", "answer": "a", "wrong": "he"}\n'
# (verb, optional file) for every optional file declared: what the mechanism must cover
OPTIONAL = [(verb, a.name) for a in A.ARTIFACTS.values() for verb, when in a.verbs.items() if when]


class Stub(Result):
    """A result writing `names` (a folder for a name without a suffix: model/, runs/), each holding `text`."""

    def __init__(self, names: list[str], text: str) -> None:
        self.files = tuple(names)
        self.text = text

    def write(self, folder: Path) -> None:
        for name in self.files:
            _put(folder / name, self.text)

    def lines(self) -> list[str]:
        return []

    def to_pandas(self) -> None:
        return None


def _put(path: Path, text: str) -> None:
    if path.suffix:
        path.write_text(text)
    else:
        path.mkdir()
        (path / "inside.txt").write_text(text)


def _text(path: Path) -> str:
    return (path if path.suffix else path / "inside.txt").read_text()


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_every_declared_optional_file_is_covered():
    """The list is generated from the declarations: every verb with an optional file is in it."""
    assert ("patch", "composition.npz") in OPTIONAL and ("compare", "compare_items.npz") in OPTIONAL
    assert ("roles", "syntax.csv") in OPTIONAL and ("prune", "model") in OPTIONAL
    assert {v for v, _ in OPTIONAL} >= {"patch", "roles", "prune", "prune --unit", "gqa", "mla", "kvcache", "compare"}


@pytest.mark.parametrize("verb, name", OPTIONAL, ids=[f"{v}:{n}" for v, n in OPTIONAL])
def test_a_rerun_without_an_optional_file_removes_the_earlier_one(tmp_path, verb, name):
    """An earlier run wrote every file `verb` may write; this one writes all but `name`."""
    every = A.outputs(verb, optional=True)
    for n in every:
        _put(tmp_path / n, "earlier")
    (tmp_path / "notes.txt").write_text("the user's")  # no verb's file: never touched
    now = Stub([n for n in every if n != name], "this run")
    with pytest.raises(OutputConflict, match=name.replace(".", r"\.")) as e:  # refused before anything is written
        now.save(tmp_path)
    assert "\n" not in str(e.value) and e.value.fields == ("force", "out")
    assert _names(tmp_path) == sorted([*every, "notes.txt"]) and _text(tmp_path / name) == "earlier"
    assert not [p for p in tmp_path.parent.iterdir() if ".staging." in p.name]
    written = now.save(tmp_path, force=True)
    assert _names(tmp_path) == sorted([*now.files, "notes.txt"]), name
    assert all(_text(p) == "this run" for p in written) and (tmp_path / "notes.txt").read_text() == "the user's"


def test_a_set_no_verb_declares_keeps_its_neighbours(tmp_path):
    """A report's page and figures are no declared verb's whole set: its save replaces its own files only."""
    (tmp_path / "report.html").write_text("earlier")
    (tmp_path / "heads.csv").write_text("earlier")
    Stub(["report.html", "report-roles.png"], "this run").save(tmp_path, force=True)
    assert _names(tmp_path) == ["heads.csv", "report-roles.png", "report.html"]
    assert (tmp_path / "heads.csv").read_text() == "earlier"


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    """Two tiny LLaMA checkpoints: two layers (patch writes composition.npz) and one (it cannot: no later layer)."""
    two = tiny_llama_dir(tmp_path_factory.mktemp("two"))[0]
    one = tiny_llama_dir(tmp_path_factory.mktemp("one"), num_hidden_layers=1)[0]
    return two, one


def test_patch_rerun_leaves_no_composition_npz_of_another_model(llamas, tmp_path, capsys):
    two, one = llamas
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(GOOD * 3)
    out = tmp_path / "out"
    argv = ["patch", "--pairs", str(pairs), "--bootstrap", "200", "--out", str(out)]
    assert main([argv[0], str(two), *argv[1:]]) == 0
    assert "composition.npz" in _names(out)
    with np.load(out / "composition.npz") as z:
        assert z["k"].shape == (2, 6, 2, 6)
    before = (out / "composition.npz").read_bytes()
    capsys.readouterr()
    # without --force: one line, exit 2, nothing changed
    assert main([argv[0], str(one), *argv[1:]]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "composition.npz" in err[0] and "--force" in err[0], err
    assert (out / "composition.npz").read_bytes() == before
    # with --force: the one-layer model's files alone
    assert main([argv[0], str(one), *argv[1:], "--force"]) == 0
    assert _names(out) == ["patching.csv", "patching.json"]
    rows = (out / "patching.csv").read_text().splitlines()
    assert len(rows) == 1 + 6 and json.loads((out / "patching.json").read_text())


def test_prune_rerun_without_save_model_removes_the_earlier_model(tmp_path, capsys):
    bert = str(tiny_bert_dir(tmp_path))
    out = tmp_path / "out"
    argv = ["prune", bert, "--fraction", "25%", "--step", "0.25", "--recover-steps", "0", "--limit", "3",
            "--max-length", "16", "--out", str(out)]
    assert main([*argv, "--save-model", "--no-check"]) == 0
    assert "model" in _names(out)
    capsys.readouterr()
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "model" in err[0] and "--force" in err[0], err
    assert (out / "model").is_dir()
    assert main([*argv, "--force"]) == 0
    assert _names(out) == sorted(A.outputs("prune"))
