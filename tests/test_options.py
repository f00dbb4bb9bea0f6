"""The spine's options: every verb's flags are its Options fields one to one, one spelling per concept in
--help, old spellings still read (with a note), and a bad value gets the same problem from Python and the CLI."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

import pytest

from headscope.cli import build_parser, main
from headscope.options import OptionError, Options, flag_of, spec_of

# The second spellings this round retired: none may appear in any verb's --help.
RETIRED = ("--data-limit", "--passages", "--seq", "--batch", "--train-batch", "--score-haystacks", "--uptrain",
           "--recover")


def _verbs() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _option_verbs() -> dict[str, tuple[argparse.ArgumentParser, type[Options]]]:
    return {verb: (p, p.get_default("options_class")) for verb, p in _verbs().items()
            if p.get_default("options_class") is not None}


def test_every_verb_but_models_has_options():
    assert sorted(set(_verbs()) - set(_option_verbs())) == ["models"]  # `models` takes no option


@pytest.mark.parametrize("verb", sorted(_option_verbs()))
def test_flags_and_fields_match_one_to_one(verb):
    parser, cls = _option_verbs()[verb]
    visible = {a.dest: a for a in parser._actions
               if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS}
    fields = {f.name: f for f in dataclasses.fields(cls) if spec_of(f) is not None}
    assert sorted(visible) == sorted(fields), f"{verb}: flags and {cls.__name__} fields differ"
    for name, f in fields.items():
        action, spec = visible[name], spec_of(f)
        shown = next((o for o in action.option_strings if o.startswith("--")), name.upper())
        assert shown == flag_of(name, spec), (verb, name)
        if not spec.append:
            assert action.default == f.default, f"{verb} {name}: CLI default {action.default!r} != {f.default!r}"


@pytest.mark.parametrize("verb", sorted(_option_verbs()))
def test_help_offers_one_spelling_per_concept(verb):
    text = _verbs()[verb].format_help()
    shown = {w.strip(",[]()") for w in text.split() if w.startswith("--")}
    assert not shown & set(RETIRED), f"headscope {verb} --help offers {sorted(shown & set(RETIRED))}"


def test_one_name_per_shared_concept():
    """Where two verbs have a field of the same name, it is the same flag; the concepts use the shared names."""
    flags: dict[str, set[str]] = {}
    for _, cls in _option_verbs().values():
        for name, flag in cls.flags().items():
            flags.setdefault(name, set()).add(flag)
    assert {n: f for n, f in flags.items() if len(f) > 1} == {}
    for name in ("limit", "batch_size", "max_length", "seed", "data", "out", "force", "ci", "bootstrap"):
        assert name in flags


@pytest.mark.parametrize("argv,field,value", [
    (["gqa", "m", "--kv-heads", "1", "--data-limit", "5"], "limit", 5),
    (["gqa", "m", "--kv-heads", "1", "--uptrain", "3"], "steps", 3),
    (["kvcache", "m", "--passages", "3", "--score-haystacks", "2"], "haystacks", 2),
    (["kvcache", "m", "--from", "x.csv"], "scores", "x.csv"),
    (["kv", "minilm", "--seq", "100", "--batch", "3"], "batch_size", 3),
    (["prune", "--recover", "2"], "recover_steps", 2),
    (["export", "d", "--to", "gguf", "--out", "f.gguf"], "file", "f.gguf"),
])
def test_old_spellings_still_read_with_a_note(argv, field, value, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args.options_class.from_namespace(args), field) == value
    assert "is now --" in capsys.readouterr().err


def _spec_rows():
    from bad_options import spec_rows

    return spec_rows({verb: cls for verb, (_, cls) in _option_verbs().items()})


@pytest.mark.parametrize("row", _spec_rows(), ids=lambda r: f"{r.verb}-{r.field}-{r.bound}")
def test_bad_value_names_the_field_in_python_and_the_flag_on_the_cli(row, tmp_path, capsys):
    """Generated from the specs: for every bound of every option, a value just past it is refused from Python with
    an OptionError naming the field (a notebook user is told `l0_steps`, never a flag), and from the CLI with the
    same problem under the flag, exit 2, one line, nothing written."""
    from bad_options import GIVEN, GIVEN_ARGS

    _, cls = _option_verbs()[row.verb]
    with pytest.raises(OptionError) as python:
        cls(**GIVEN.get(row.verb, {}), **{row.field: row.value}).validate()
    assert python.value.name == row.field
    assert str(python.value).startswith(f"{row.field} ") and "--" not in str(python.value), str(python.value)
    flag = cls.flags()[row.field]
    value = row.value[0] if isinstance(row.value, tuple) else row.value
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        try:
            rc = main([row.verb, *GIVEN_ARGS.get(row.verb, ()), flag, str(value)])
        except SystemExit as e:  # argparse refuses an unknown choice itself, naming the flag
            rc = e.code
    finally:
        os.chdir(cwd)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headscope ")]
    assert rc == 2 and len(err) == 1, err
    if row.bound == "choices":
        assert f"argument {flag}: invalid choice: {str(value)!r}" in err[0], err[0]
    else:
        # the memory available moves between the two calls: the problem up to it must match
        machine = re.compile(r"this machine has .*")
        expect = machine.sub("this machine has ...", f"{flag} {python.value.problem}")
        assert machine.sub("this machine has ...", err[0]).endswith(expect), (err[0], python.value.problem)
    assert os.listdir(tmp_path) == []


def test_every_kind_of_bound_is_generated():
    """The generator covers every Spec bound some option states (a new kind of bound must reach it too)."""
    bounds = {r.bound for r in _spec_rows()}
    assert {"choices", "at_least", "above", "at_most", "most"} <= bounds, bounds


def test_options_are_typed_and_frozen():
    from headscope.redundancy.options import ScoreOptions

    opts = ScoreOptions(methods=("taylor",), limit=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.limit = 3  # type: ignore[misc]
    assert opts.replace(limit=4).limit == 4 and opts.limit == 8
    with pytest.raises(ValueError, match="did you mean 'limit'"):
        opts.replace(limt=4)
