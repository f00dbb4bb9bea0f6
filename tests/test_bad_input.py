"""Every bad input a user can give: one line `headscope VERB: error: ...`, exit 2, nothing written (issue 16)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from pathlib import Path

import pytest
import torch
from test_artifacts import tiny_bert_dir

from headscope.cli import main
from headscope.data import read_conllu, read_texts
from headscope.errors import HeadscopeError, OptionError
from headscope.learned.analyze import analyze
from headscope.models.tiny import tiny_model
from headscope.redundancy.curves import check_target_drop


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(tmp_path: Path, capsys, argv: list[str], message: str, code: int = 2) -> str:
    """Run the CLI inside tmp_path; assert the exit code, one error line holding `message`, and no new file."""
    before = listing(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(argv)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("headscope ")]
    assert rc == code, err
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err, err
    assert listing(tmp_path) == before
    return lines[0]


@pytest.mark.parametrize("argv,message", [
    (["analyze", "--batch-size", "0"], "--batch-size must be at least 1; got 0"),
    (["similar", "--max-length", "0"], "--max-length must be at least 1; got 0"),
    (["analyze", "--limit", "-3"], "--limit must be at least 1; got -3"),
    (["analyze", "--device", "bogus"], "--device 'bogus' is not a torch device"),
    (["sweep", "--lr", "-1"], "--lr must be a positive number"),
    (["prune", "--target-drop", "1%", "--recover-lr", "nan"], "--recover-lr must be a positive number"),
    (["report", "--sentences=-5"], "--sentences must be 0 or more"),
    (["prune", "--target-drop", "200%", "--metric", "fidelity"], "largest possible drop is 200%"),
    (["roles", "--treebank", "missing.conllu"], "treebank file 'missing.conllu' does not exist"),
])
def test_cli_options_refused_before_work(tmp_path, capsys, argv, message):
    line = refused(tmp_path, capsys, argv, message)
    assert line.startswith(f"headscope {argv[0]}: error: ") and "[Errno" not in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(tmp_path, capsys):
    refused(tmp_path, capsys, ["analyze", "--device", "cuda"], "CUDA is not available on this machine")


def test_out_naming_a_file_or_unwritable(tmp_path, capsys):
    (tmp_path / "f").write_text("mine")
    refused(tmp_path, capsys, ["sweep", "--steps", "1", "--out", "f"], "--out 'f' is a file")
    refused(tmp_path, capsys, ["analyze", "--out", "f/sub"], "'f' is a file")
    refused(tmp_path, capsys, ["kv", "--classic", "--out", "/proc/headscope-test"], "cannot be written")
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.parametrize("name,content", [
    ("blank.jsonl", '{"text": ""}\n{"text": "   "}\n'),
    ("nul.txt", "\x00\x00\x00\n\x01\x02\n"),
])
def test_data_without_text(tmp_path, capsys, name, content):
    (tmp_path / name).write_text(content)
    refused(tmp_path, capsys, ["analyze", "--data", name], "blank or control bytes")
    with pytest.raises(HeadscopeError, match="blank or control bytes"):
        read_texts(tmp_path / name)


def test_control_passages_skipped_with_a_count(tmp_path, caplog):
    (tmp_path / "mixed.txt").write_text("a real sentence\n\x00\x00\n")
    with caplog.at_level(logging.WARNING):
        assert read_texts(tmp_path / "mixed.txt").texts == ["a real sentence"]
    assert "skipped 1 passage of" in caplog.text


def test_malformed_conllu_counts_sentences(tmp_path, caplog):
    bad = "".join(f"{i}\tw\t_\t_\t_\t_\tX\tdep\t_\t_\n" for i in range(1, 5))  # four lines, one sentence
    (tmp_path / "bad.conllu").write_text(bad + "\n")
    with caplog.at_level(logging.WARNING):
        assert read_conllu(tmp_path / "bad.conllu") == []
    assert "skipped 1 sentence with 4 malformed lines" in caplog.text


def test_unexpected_error_one_line_exit_1(tmp_path, capsys, monkeypatch):
    import headscope.commands.analyze as cmd

    def boom(*a, **k):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(cmd, "read_texts", boom)
    line = refused(tmp_path, capsys, ["analyze"], "unexpected RuntimeError: something broke", code=1)
    assert "run with -v for the traceback" in line
    assert main(["-v", "analyze", "--out", str(tmp_path / "o")]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_api_token_ids_outside_the_vocabulary():
    hm = tiny_model("bert")
    vocab = hm.model.get_input_embeddings().num_embeddings
    with pytest.raises(HeadscopeError, match=f"id {vocab + 5}, outside the vocabulary"):
        analyze(hm, [[1, 2, vocab + 5]])
    with pytest.raises(HeadscopeError, match="outside the vocabulary"):
        analyze(hm, [[-1, 2]])


def test_api_text_empty_after_tokenisation(tmp_path):
    from headscope import load_model

    hm = load_model(str(tiny_bert_dir(tmp_path)))
    with pytest.raises(HeadscopeError, match="special tokens only"):
        analyze(hm, ["[SEP]", "[CLS] [SEP]"])


def test_api_target_drop_bounds():
    with pytest.raises(HeadscopeError, match="largest possible drop is 100%"):
        check_target_drop("accuracy", 1.5)
    check_target_drop("lm_loss", 5.0)  # perplexity can grow without bound
    check_target_drop("fidelity", 0.5)


def test_api_report_options_refused_before_work(tmp_path):
    from headscope.report import render_report

    with pytest.raises(OptionError, match="^sentences must be 0 or more") as e:  # the parameter, not the flag
        render_report(tmp_path / "r", model=None, sentences=-5)
    assert e.value.name == "sentences"
    assert listing(tmp_path) == []


@pytest.mark.parametrize("files,message", [
    ({}, "is not a model directory: it has no config.json"),
    ({"config.json": '{"model_type": "bert"}'}, "has a config.json but no weights"),
    ({"config.json": '{"model_type": "foo_bar"}'}, "model type 'foo_bar' is not supported; supported: "),
])
def test_model_directories_that_are_not_models(tmp_path, capsys, files, message):
    (tmp_path / "m").mkdir()
    for name, text in files.items():
        (tmp_path / "m" / name).write_text(text)
    refused(tmp_path, capsys, ["analyze", "m"], message)


def test_a_normal_run_prints_no_loading_bar_and_each_warning_once(tmp_path):
    """A run's stderr holds our progress and messages only: transformers' "Loading weights" bar is off and
    a warning raised on every batch is printed once (issue 16), in a fresh process as a user runs it."""
    import subprocess
    import sys

    script = (
        "import warnings, sys\n"
        "import headscope.learned.analyze as A\n"
        "real = A.run_stats\n"
        "def noisy(*a, **k):\n"
        "    for _ in range(3):  # the same message from two call sites, three times each\n"
        "        warnings.warn('the same warning on every batch', UserWarning)\n"
        "        warnings.warn('the same warning on every batch', UserWarning)\n"
        "    return real(*a, **k)\n"
        "A.run_stats = noisy\n"
        "from headscope.cli import main\n"
        "sys.exit(main(['analyze', 'minilm', '--limit', '2', '--max-length', '16', "
        f"'--out', {str(tmp_path / 'o')!r}]))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Loading weights" not in r.stderr, r.stderr
    assert r.stderr.count("the same warning on every batch") == 1, r.stderr


# --- every option of every verb through one table (tests/bad_options.py) --------------------------------------
def _verb_options() -> dict[str, dict[str, object]]:
    """verb -> {option as the user types it (positionals by name): its argparse action}."""
    import argparse

    from headscope.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, dict[str, object]] = {}
    for verb, parser in sub.choices.items():
        found[verb] = {}
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction) or a.help == argparse.SUPPRESS:  # old spellings: hidden
                continue
            name = next((o for o in a.option_strings if o.startswith("--")), None) or a.dest
            found[verb][name] = a
    return found


def _spec_rows(bounds: tuple[str, ...] = ()) -> dict[tuple[str, str], object]:
    """(verb, flag) -> a row generated from the option's Spec (its first bound, or the first of `bounds`): the bad
    value just past the bound and the problem `bound_problem` states for it (tests/bad_options.py, spec_rows)."""
    import argparse

    from bad_options import bad, spec_rows

    from headscope.cli import build_parser
    from headscope.options import bound_problem, spec_of

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    classes = {v: p.get_default("options_class") for v, p in sub.choices.items() if p.get_default("options_class")}
    rows: dict[tuple[str, str], object] = {}
    for r in spec_rows(classes):
        if bounds and r.bound not in bounds:
            continue
        cls = classes[r.verb]
        flag = cls.flags()[r.field]
        value = r.value[0] if isinstance(r.value, tuple) else r.value
        spec = spec_of(next(f for f in dataclasses.fields(cls) if f.name == r.field))
        says = f"argument {flag}" if r.bound == "choices" else f"{flag} {bound_problem(value, spec)}"
        says = says.split(", but this machine has")[0]  # the memory available moves from one call to the next
        rows.setdefault((r.verb, flag), bad(flag, str(value), says=says))
    return rows


def _row(verb: str, option: str, action):
    """The table's row for `option` of `verb` (a verb's own before the shared one), else a row generated from the
    option's Spec bounds, or KeyError."""
    from bad_options import BY_VERB, SHARED

    if verb not in BY_VERB:
        raise KeyError(f"verb {verb!r} has no block in tests/bad_options.py BY_VERB")
    if option in BY_VERB[verb]:
        return BY_VERB[verb][option]
    if option in SHARED:
        return SHARED[option]
    return _SPEC_ROWS()[(verb, option)]


_SPEC_ROWS = functools.lru_cache(maxsize=1)(_spec_rows)


def test_every_option_has_a_row():
    missing = []
    for verb, options in _verb_options().items():
        for option, action in options.items():
            try:
                _row(verb, option, action)
            except KeyError:
                missing.append(f"headscope {verb} {option}")
    assert not missing, ("options without a bad-value row in tests/bad_options.py (add one to SHARED or to the "
                         "verb's block of BY_VERB, or FLAG for a flag no value can make bad): " + ", ".join(missing))


def _cases():
    """Every (verb, option) with a bad value to try (flags marked FLAG have none; a missing row fails
    test_every_option_has_a_row, and here too)."""
    cases = []
    for verb, options in sorted(_verb_options().items()):
        for option, action in options.items():
            try:
                if _row(verb, option, action) is None:
                    continue
            except KeyError:
                pass
            cases.append((verb, option))
    return cases


@pytest.fixture(scope="module")
def table_inputs(tmp_path_factory) -> dict[str, str]:
    import numpy as np
    from test_artifacts import WORDS, tiny_llama_dir

    base = tmp_path_factory.mktemp("table")
    llama, text = tiny_llama_dir(base, num_key_value_heads=3, max_position_embeddings=128, init_std=0.2)
    long = base / "long.txt"
    long.write_text("\n".join(" ".join(np.random.default_rng(0).choice(WORDS, 100)) for _ in range(3)) + "\n")
    return {"bert": str(tiny_bert_dir(base)), "llama": str(llama), "text": str(text), "long": str(long)}


@pytest.mark.parametrize("verb,option", _cases())
def test_every_option_refuses_its_bad_value(tmp_path, capsys, table_inputs, verb, option):
    _refuses(tmp_path, capsys, table_inputs, verb, _row(verb, option, _verb_options()[verb][option]))


def _too_large() -> dict[tuple[str, str], object]:
    """The hand rows of TOO_LARGE (bounds no Spec states: memory of a whole configuration, combinations), then a
    generated row for every option whose Spec states an upper bound (`at_most`, `most`)."""
    from bad_options import TOO_LARGE

    rows = {(verb, option): row for verb, hand in TOO_LARGE.items() for option, row in hand.items()}
    for key, row in _spec_rows(("at_most", "most")).items():
        rows.setdefault(key, row)
    return rows


@pytest.mark.parametrize("verb,option", sorted(_too_large()))
def test_every_size_has_an_upper_bound(tmp_path, capsys, table_inputs, verb, option):
    """Each option that sizes memory or work refuses too large a value before the work (issue 31)."""
    assert option in _verb_options()[verb], f"headscope {verb} has no option {option}"
    _refuses(tmp_path, capsys, table_inputs, verb, _too_large()[(verb, option)])


def _refuses(tmp_path, capsys, table_inputs, verb, row):
    """`headscope VERB ROW.args` exits 2 with one line holding `row.says`, no traceback, nothing written."""
    from bad_options import REQUIRED

    args = [a.format(**table_inputs) for a in ((*REQUIRED.get(verb, ()), *row.args) if row.required else row.args)]
    before = listing(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        try:
            rc = main([verb, *args])
        except SystemExit as e:  # argparse's own refusals (types, choices) exit from parse_args
            rc = e.code
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("headscope ")]
    assert rc == 2, f"headscope {verb} {' '.join(args)}: exit {rc}, want 2\n{err}"
    assert len(lines) == 1 and row.says in lines[0], f"headscope {verb} {' '.join(args)}:\n{err}"
    assert "Traceback" not in err and listing(tmp_path) == before
