"""Library errors name fields, the command line names flags (issue 41): a notebook user is told `l0_steps`, a CLI
user `--l0-steps`, from one message. The library raises `OptionError(field, problem)` or a `HeadscopeError` whose
`fields` list the options it names; only the CLI layer (`options.cli.as_flags`) turns them into flags."""

from __future__ import annotations

import ast
import itertools
import os
import re
from pathlib import Path

import pytest

from headscope.cli import main
from headscope.errors import HeadscopeError, OptionError, OutputConflict
from headscope.io import prepare_out_dir
from headscope.options.cli import as_flags

PACKAGE = Path(__file__).resolve().parents[1] / "headscope"
CLI_LAYER = ("commands/", "options/cli.py", "cli.py", "study/cli.py")  # relative to headscope/: where flags belong

# (module, flag) -> why a library message may name that flag. None does: a message deliberately about the command
# line belongs in the CLI layer. An entry whose message is gone fails the test too.
ALLOWED: dict[tuple[str, str], str] = {}


def _error_classes(trees: dict[str, ast.Module]) -> set[str]:
    """The names of exception classes: the builtins messages use and every class deriving from one of them."""
    names = {"HeadscopeError", "ValueError", "KeyError", "TypeError", "RuntimeError", "FileNotFoundError"}
    grown = True
    while grown:
        grown = False
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in names and any(
                        isinstance(b, ast.Name) and b.id in names for b in node.bases):
                    names.add(node.name)
                    grown = True
    return names


def _flags_named(node: ast.AST) -> list[str]:
    """The flags a message's string literals name: `--foo` in text, and `--{name}` built in an f-string."""
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            found += re.findall(r"(?<![\w-])--[a-z][\w-]*", n.value)
        if isinstance(n, ast.JoinedStr):
            for a, b in itertools.pairwise(n.values):
                if isinstance(a, ast.Constant) and str(a.value).endswith("--") and isinstance(b, ast.FormattedValue):
                    found.append("--{...}")
    return found


def library_flag_messages() -> dict[tuple[str, str], list[int]]:
    """(module, flag) -> lines, for every error a library module outside the CLI layer raises or builds whose
    message names a flag."""
    trees = {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
             for p in sorted(PACKAGE.rglob("*.py"))}
    errors = _error_classes(trees)
    found: dict[tuple[str, str], list[int]] = {}
    for module, tree in trees.items():
        if module.startswith(CLI_LAYER):
            continue
        for node in ast.walk(tree):
            message = None
            if isinstance(node, ast.Raise) and node.exc is not None:
                message = node.exc
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                message = node if name in errors else None
            for flag in _flags_named(message) if message is not None else ():
                found.setdefault((module, flag), []).append(node.lineno)
    return found


def test_no_library_error_names_a_flag():
    found = library_flag_messages()
    named = {f"headscope/{m}:{min(lines)} names {flag}" for (m, flag), lines in found.items()
             if (m, flag) not in ALLOWED}
    assert not named, ("library errors must name fields (OptionError(field, problem), or HeadscopeError(..., "
                       "fields=...)); the CLI turns them into flags: " + "; ".join(sorted(named)))
    stale = sorted(f"{m} {flag}" for m, flag in ALLOWED if (m, flag) not in found)
    assert not stale, f"allow-list entries whose message is gone (remove them): {stale}"


def test_the_scan_finds_a_flag_in_a_message():
    """The scan itself: a raise naming a flag, directly or built as `--{name}`, is found; a field name is not."""
    tree = ast.parse('raise HeadscopeError(f"--limit must be at least 1")\n'
                     'raise OptionError("limit", "must be at least 1")\n'
                     'err = HeadscopeError(f"--{name} is bad")\n')
    raises = [n for n in ast.walk(tree) if isinstance(n, (ast.Raise, ast.Call))]
    assert [f for n in raises if isinstance(n, ast.Raise) for f in _flags_named(n.exc)] == ["--limit"]
    assert "--{...}" in _flags_named(tree.body[2])


@pytest.mark.parametrize("message,names,says", [
    ("pass force=True to replace it", ("force",), "pass --force to replace it"),
    ("kv_heads=4 does not divide 6", ("kv_heads",), "--kv-heads 4 does not divide 6"),
    ("give device_map='auto' with it", ("device_map",), "give --device-map auto with it"),
    ("needs l0_penalty or l0_target", ("l0_penalty", "l0_target"), "needs --l0-penalty or --l0-target"),
    ("give folders (from_dirs) made from one model", ("from_dirs",), "give folders (--from) made from one model"),
    # a field's name inside a word, a path or a quoted value is left alone; so is a field the message does not list
    ("'steps' in 'a/steps/b' at l0_steps; steps", ("steps",), "'steps' in 'a/steps/b' at l0_steps; --steps"),
    ("raise limit or give more text", ("limit",), "raise --limit or give more text"),
])
def test_as_flags(message, names, says):
    assert as_flags(message, names, {"from_dirs": "--from"}) == says


def _cli(tmp_path, capsys, argv: list[str]) -> str:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(argv)
    finally:
        os.chdir(cwd)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headscope ")]
    assert rc == 2 and len(lines) == 1, lines
    return lines[0]


def test_l0_steps_by_its_name_in_python_and_its_flag_on_the_cli(tmp_path, capsys):
    """The issue's example: a notebook user who passes l0_steps=0 is told `l0_steps`, a CLI user `--l0-steps`."""
    from headscope.redundancy.options import ScoreOptions

    with pytest.raises(OptionError) as e:
        ScoreOptions(methods=("l0",), l0_steps=0).validate()
    assert e.value.name == "l0_steps" and str(e.value).startswith("l0_steps (steps of L0 gate training) must be")
    assert "--" not in str(e.value)
    line = _cli(tmp_path, capsys, ["score", "--method", "l0", "--l0-steps", "0"])
    assert line == f"headscope score: error: --l0-steps {e.value.problem}"


def test_an_option_error_naming_two_fields(tmp_path, capsys):
    """A problem that names a second option (`also`) says it as a field in Python and as a flag on the CLI."""
    from headscope.capacity.options import KvcacheOptions

    with pytest.raises(OptionError) as e:
        KvcacheOptions(model="m", keep_full="25%", threshold=0.5).validate()
    assert str(e.value) == "keep_full (a share of KV heads) or threshold (a score): give one, not both"
    line = _cli(tmp_path, capsys, ["kvcache", "m", "--keep-full", "25%", "--threshold", "0.5"])
    assert line.endswith("error: --keep-full (a share of KV heads) or --threshold (a score): give one, not both")


def test_a_domain_error_naming_a_field(tmp_path, capsys):
    """An error about no one option (a folder holding results) names `force=True` for Python; the CLI says --force."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "heads.csv").write_text("mine")
    with pytest.raises(OutputConflict) as e:
        prepare_out_dir(tmp_path / "out", force=False, will_write=["heads.csv"])
    assert "pass force=True to overwrite them" in str(e.value) and "--" not in str(e.value)
    assert e.value.fields == ("force", "out")
    line = _cli(tmp_path, capsys, ["analyze", "--out", "out", "--limit", "1"])
    assert "pass --force to overwrite them or choose another folder as --out" in line, line


def test_fields_survive_the_cli_for_every_error_class():
    """`fields` is a keyword of every user-facing error class, so any of them can name options."""
    for cls in (HeadscopeError, OutputConflict):
        assert cls("x", fields=("force",)).fields == ("force",)
    assert OptionError("limit", "is bad", also=("data",)).fields == ("limit", "data")
