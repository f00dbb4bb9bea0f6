"""One common check for every verb, in the spirit of scikit-learn's estimator checks: run through the CLI
and through its library function on the same tiny model, the verb writes the same files (byte for byte, but
for the provenance's run-specific fields) and the library call writes nothing until `save`.

To add a verb: one row in CASES: the CLI's arguments after the model, and the library call that should give
the same result (`fn(hm, data, options)`, options built from the same values).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headscope.cli import main
from headscope.models import load_model
from headscope.options import Result

Case = tuple[list[str], Callable[[Any, dict[str, Any]], Result]]


# Each library call gets `given`: the model, data and out the CLI was given (they are options too, and
# provenance records them).
def _analyze(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.learned.options import AnalyzeOptions
    from headscope.learned.verbs import analyze

    return analyze(hm, given["data"], AnalyzeOptions(**given, limit=4, max_length=16, batch_size=2, bootstrap=200))


def _score(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.redundancy.options import ScoreOptions
    from headscope.redundancy.verbs import score

    return score(hm, given["data"], ScoreOptions(**given, limit=4, max_length=16, batch_size=2, bootstrap=200,
                                                 methods=("taylor", "output_norm")))


def _score_units(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.redundancy.options import ScoreOptions
    from headscope.redundancy.verbs import score

    return score(hm, given["data"], ScoreOptions(**given, limit=4, max_length=16, batch_size=2, unit="attention"))


def _patch(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.learned.options import PatchOptions
    from headscope.learned.verbs import patch

    return patch(hm, None, PatchOptions(**given, batch_size=2, copies=5, bootstrap=200))


CASES: dict[str, Case] = {
    "analyze": (["--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200"], _analyze),
    "score": (["--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200",
               "--method", "taylor,output_norm"], _score),
    "score --unit attention": (["--unit", "attention", "--limit", "4", "--max-length", "16", "--batch-size", "2"],
                               _score_units),
    "patch": (["--batch-size", "2", "--copies", "5", "--bootstrap", "200"], _patch),
}
# Verbs that read prompt pairs, not passages: they run on a tiny causal LM (they read logits) with --pairs.
PAIRS = {"patch"}
PAIRS_TEXT = "".join(
    f'{{"clean": "the of {a} to in", "corrupt": "the of {b} to in", "answer": "{a}", "wrong": "{b}"}}\n'
    for a, b in (("is", "was"), ("he", "it"), ("his", "for"), ("on", "at")))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _without_run_fields(name: str, data: bytes) -> Any:
    """A file's content to compare: JSON without what differs between two runs of the same thing (seconds)."""
    if not name.endswith(".json"):
        return data
    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "wall_s", "elapsed_s")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(json.loads(data))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    from test_artifacts import tiny_bert_dir, tiny_llama_dir

    base = tmp_path_factory.mktemp("common")
    model = tiny_bert_dir(base)
    text = base / "text.txt"
    text.write_text("the cat saw a dog .\na small bird sang .\nmary saw john .\nshe smiled at him .\n")
    pairs = base / "pairs.jsonl"
    pairs.write_text(PAIRS_TEXT)
    return {"data": (model, text), "pairs": (tiny_llama_dir(base)[0], pairs)}


@pytest.mark.parametrize("verb", sorted(CASES))
def test_cli_and_library_give_the_same_files(verb, inputs, tmp_path, capsys):
    kind = "pairs" if verb in PAIRS else "data"
    model, text = inputs[kind]
    argv, library = CASES[verb]
    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    assert main([verb.split()[0], str(model), f"--{kind}", str(text), *argv, "--out", str(cli_out)]) == 0
    printed = capsys.readouterr().out
    hm = load_model(str(model))
    before = sorted(os.listdir(tmp_path))
    result = library(hm, {"model": str(model), kind: str(text), "out": str(cli_out)})
    assert sorted(os.listdir(tmp_path)) == before, "the library call wrote something before save()"
    assert result.lines() and "\n".join(result.lines()) in printed  # the CLI prints what the result says
    assert len(result.to_pandas()) > 0
    written = result.save(lib_out)
    assert sorted(p.name for p in written) == sorted(result.files)
    cli, lib = _files(cli_out), _files(lib_out)
    assert sorted(cli) == sorted(lib)
    for name in cli:
        assert _without_run_fields(name, cli[name]) == _without_run_fields(name, lib[name]), name
