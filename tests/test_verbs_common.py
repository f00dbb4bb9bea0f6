"""One common check for every verb, in the spirit of scikit-learn's estimator checks: run through the CLI
and through its library function on the same tiny model, the verb writes the same files (byte for byte, but
for the provenance's run-specific fields) and the library call writes nothing until `save`.

To add a verb: one row in CASES: the CLI's arguments after the model, and the library call that should give
the same result (`fn(hm, data, options)`, options built from the same values).
"""

from __future__ import annotations

import json
import os
import re
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


def _similar(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.learned.options import SimilarOptions
    from headscope.learned.verbs import similar

    return similar(hm, given["data"], SimilarOptions(**given, limit=4, max_length=16, batch_size=2, bootstrap=200,
                                                     top=3, js_max=0.5, cka_min=0.1, cka_batch=8))


def _tasks(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.redundancy.options import TasksOptions
    from headscope.redundancy.verbs import tasks

    return tasks(hm, "fidelity,syntax", TasksOptions(**given, limit=4, max_length=16, batch_size=2))


def _roles(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.learned.options import RolesOptions
    from headscope.learned.verbs import roles

    return roles(hm, given["data"], RolesOptions(**given, limit=4, max_length=16, batch_size=2, bootstrap=200,
                                                 treebank="ewt-test"))


def _prune(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.redundancy.options import PruneOptions
    from headscope.redundancy.verbs import prune

    return prune(hm, given["data"], PruneOptions(**given, heldout=given["data"], limit=4, max_length=16, batch_size=2,
                                                 bootstrap=200, fraction=0.5, step=0.25, save_model=True,
                                                 capability_check=False))


def _prune_units(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.redundancy.options import PruneOptions
    from headscope.redundancy.verbs import prune

    return prune(hm, given["data"], PruneOptions(**given, limit=4, max_length=16, batch_size=2, unit="attention",
                                                 fraction=0.5, step=0.25))


def _report(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.report import ReportOptions, report

    # The report reads --out too: the CLI's folder is set aside so that the library sees it as the CLI did, empty.
    out = Path(given["out"])
    aside = out.with_name(out.name + "-aside")
    out.rename(aside)
    try:
        return report(hm, given["data"], ReportOptions(**given, sentences=1, limit=3, max_length=16))
    finally:
        aside.rename(out)


def _patch(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.learned.causal.verb import patch
    from headscope.learned.options import PatchOptions

    return patch(hm, None, PatchOptions(**given, batch_size=2, copies=5, bootstrap=200, paths="1"))


def _circuit(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.learned.circuits.verb import circuit
    from headscope.learned.options import CircuitOptions

    return circuit(hm, None, CircuitOptions(**given, batch_size=2, bootstrap=200, method="eap"))


def _kv(hm: Any, given: dict[str, Any]) -> Result:
    from headscope.capacity.options import KvOptions
    from headscope.capacity.verbs import kv

    return kv(given["model"], KvOptions(out=given["out"], kv_heads="1,2", classic=True))



CASES: dict[str, Case] = {
    "analyze": (["--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200"], _analyze),
    "score": (["--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200",
               "--method", "taylor,output_norm"], _score),
    "score --unit attention": (["--unit", "attention", "--limit", "4", "--max-length", "16", "--batch-size", "2"],
                               _score_units),
    # prune's own files; the check --save-model ends with is tests/test_compare_check.py's
    "prune": (["--heldout", "{data}", "--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200",
               "--fraction", "0.5", "--step", "0.25", "--save-model", "--no-check"], _prune),
    "prune --unit attention": (["--unit", "attention", "--limit", "4", "--max-length", "16", "--batch-size", "2",
                                "--fraction", "0.5", "--step", "0.25"], _prune_units),
    "report": (["--sentences", "1", "--limit", "3", "--max-length", "16"], _report),
    "roles": (["--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200", "--treebank",
               "ewt-test"], _roles),
    "tasks": (["--tasks", "fidelity,syntax", "--limit", "4", "--max-length", "16", "--batch-size", "2"], _tasks),
    "similar": (["--limit", "4", "--max-length", "16", "--batch-size", "2", "--bootstrap", "200", "--top", "3",
                 "--js-max", "0.5", "--cka-min", "0.1", "--cka-batch", "8"], _similar),
    "kv": (["--kv-heads", "1,2", "--classic"], _kv),
    "patch": (["--batch-size", "2", "--copies", "5", "--bootstrap", "200", "--paths", "1"], _patch),
    "circuit": (["--batch-size", "2", "--bootstrap", "200", "--method", "eap"], _circuit),
}

PAIRS = {"patch", "circuit"}  # verbs that read clean/corrupt prompt pairs (--pairs) on a causal LM instead of --data
PAIRS_TEXT = "".join(
    f'{{"clean": "the of {a} to in", "corrupt": "the of {b} to in", "answer": "{a}", "wrong": "{b}"}}\n'
    for a, b in (("is", "was"), ("he", "it"), ("his", "for"), ("on", "at")))
NO_DATA = {"tasks", "kv"}  # verbs without --data: each task reads its own; kv reads no passages
NO_LINES = {"report"}  # verbs that print nothing on stdout (report says where it wrote, on stderr)
MODELS = {"roles": "minilm"}  # induction needs 24 ordinary tokens: more than the tiny BERT's word list has


def _without_seconds(text: str) -> str:
    return re.sub(r"\d+(\.\d+)? s\)", "? s)", text)


def assert_same_files(cli_out: Path, lib_out: Path, skip: str | None = None) -> None:
    """The CLI's and the library's folders hold the same files with the same content (but for run fields)."""
    cli, lib = _files(cli_out), _files(lib_out)
    assert sorted(cli) == sorted(lib)
    for name in cli:
        if skip is None or not name.endswith(skip):
            assert _without_run_fields(name, cli[name]) == _without_run_fields(name, lib[name]), name


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _without_run_fields(name: str, data: bytes) -> Any:
    """A file's content to compare: JSON without what differs between two runs of the same thing (seconds)."""
    if not name.endswith(".json"):
        return data
    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "wall_s", "elapsed_s", "score_seconds")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(json.loads(data))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    from test_artifacts import tiny_bert_dir

    base = tmp_path_factory.mktemp("common")
    model = tiny_bert_dir(base)
    text = base / "text.txt"
    text.write_text("the cat saw a dog .\na small bird sang .\nmary saw john .\nshe smiled at him .\n")
    return model, text


@pytest.fixture(scope="module")
def pair_inputs(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny causal LM and clean/corrupt prompt pairs over its words (the verbs in PAIRS read --pairs)."""
    from test_artifacts import tiny_llama_dir

    base = tmp_path_factory.mktemp("pairs")
    pairs = base / "pairs.jsonl"
    pairs.write_text(PAIRS_TEXT)
    return tiny_llama_dir(base)[0], pairs


@pytest.mark.parametrize("verb", sorted(CASES))
def test_cli_and_library_give_the_same_files(verb, inputs, pair_inputs, tmp_path, capsys):
    kind = "pairs" if verb in PAIRS else "data"
    model, text = inputs if kind == "data" else pair_inputs
    model = MODELS.get(verb, model)
    argv, library = CASES[verb]
    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    data = {} if verb in NO_DATA else {kind: str(text)}
    argv = [a.replace("{data}", str(text)) for a in argv]
    assert main([verb.split()[0], str(model), *(f"--{k}={v}" for k, v in data.items()), *argv,
                 "--out", str(cli_out)]) == 0
    printed = capsys.readouterr().out
    hm = load_model(str(model))
    before = sorted(os.listdir(tmp_path))
    result = library(hm, {"model": str(model), **data, "out": str(cli_out)})
    assert sorted(os.listdir(tmp_path)) == before, "the library call wrote something before save()"
    assert result.lines() or verb in NO_LINES
    # the CLI prints what the result says (but for the seconds a step took: tasks, score --unit print them)
    assert _without_seconds("\n".join(result.lines())) in _without_seconds(printed)
    assert len(result.to_pandas()) > 0
    written = result.save(lib_out)
    assert sorted(p.name for p in written) == sorted(result.files)
    cli, lib = _files(cli_out), _files(lib_out)
    assert sorted(cli) == sorted(lib)
    for name in cli:
        assert _without_run_fields(name, cli[name]) == _without_run_fields(name, lib[name]), name


@pytest.mark.parametrize("verb", ["gqa", "mla"])
def test_conversions_cli_and_library_give_the_same_files(verb, tmp_path, capsys):
    """gqa and mla: the same checkpoint (weights byte for byte) and report from the CLI and from the library
    call on a loaded model, which writes nothing until save."""
    from test_mla import _cli_checkpoint

    import headscope

    src, text = _cli_checkpoint(tmp_path)
    size = {"gqa": {"kv_heads": 1}, "mla": {"kv_rank": 4, "rope_dims": 4}}[verb]
    flags = [x for k, v in size.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    assert main([verb, str(src), *flags, "--data", str(text), "--heldout", str(text), "--steps", "2",
                 "--max-length", "16", "--out", str(cli_out)]) == 0
    printed = capsys.readouterr().out
    hm = load_model(str(src))
    before = sorted(os.listdir(tmp_path))
    result = getattr(headscope, verb)(hm, text, model=str(src), out=str(cli_out), heldout=str(text), steps=2,
                                      max_length=16, **size)
    assert sorted(os.listdir(tmp_path)) == before, "the library call wrote something before save()"
    assert "\n".join(result.lines()) in printed
    assert list(result.to_pandas()["stage"]) == ["before", "after", "uptrained"]
    result.save(lib_out)
    headscope.compare.check(hm, result.model).save(lib_out)  # the CLI ends with the check (--check, the default)
    assert_same_files(cli_out, lib_out)


def test_kvcache_cli_and_library_give_the_same_files(tmp_path, capsys):
    """The head-aware cache from the CLI and from `capacity.verbs.kvcache` on a loaded model: the same files."""
    import numpy as np
    from test_artifacts import WORDS, tiny_llama_dir

    from headscope.capacity.options import KvcacheOptions
    from headscope.capacity.verbs import kvcache

    model, _ = tiny_llama_dir(tmp_path, num_key_value_heads=3, max_position_embeddings=128, init_std=0.2)
    text = tmp_path / "long.txt"
    rng = np.random.default_rng(0)
    text.write_text("\n".join(" ".join(rng.choice(WORDS, 100)) for _ in range(3)) + "\n")
    sizes = {"keep_full": "34%,67%", "needles": 1, "haystacks": 1, "sink": 2, "window": 8, "context": 64, "limit": 1,
             "chunk": 16, "bootstrap": 200}
    argv = [x for k, v in sizes.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    assert main(["kvcache", str(model), "--data", str(text), *argv, "--out", str(cli_out)]) == 0
    printed = capsys.readouterr().out
    hm = load_model(str(model))
    before = sorted(os.listdir(tmp_path))
    result = kvcache(hm, str(text), KvcacheOptions(model=str(model), data=str(text), out=str(cli_out), **sizes))
    assert sorted(os.listdir(tmp_path)) == before, "the library call wrote something before save()"
    assert "\n".join(result.lines()) in printed and len(result.to_pandas()) > 0
    result.save(lib_out)
    from headscope.compare.check import check_kvcache  # the CLI ends with the check (--check, the default)
    from headscope.data import read_texts

    check_kvcache(hm, result, read_texts(str(text)).texts).save(lib_out)
    assert_same_files(cli_out, lib_out)


def test_sweep_cli_and_library_give_the_same_files(tmp_path, capsys):
    """sweep from the CLI, then from `capacity.verbs.sweep` resuming from the CLI's folder (training times differ
    between two runs; nothing else may): the same files, and nothing written before save."""
    from headscope.capacity.options import SweepOptions
    from headscope.capacity.verbs import sweep

    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    argv = ["--task", "xor", "--heads", "1,2", "--steps", "3", "--eval-tokens", "100", "--no-progress"]
    assert main(["sweep", *argv, "--out", str(cli_out)]) == 0
    printed = capsys.readouterr().out
    before = _files(cli_out)
    result = sweep(SweepOptions(out=str(cli_out), task="xor", heads=(1, 2), steps=3, eval_tokens=100,
                                no_progress=True), saved=str(cli_out))
    assert _files(cli_out) == before, "the library call wrote something before save()"
    assert "\n".join(result.lines()) in printed and len(result.to_pandas()) == 2
    result.save(lib_out)
    assert_same_files(cli_out, lib_out, skip=".png")  # figures carry matplotlib's metadata; their data is the CSV's
