"""The spine's options: every verb's flags are its Options fields one to one, one spelling per concept in
--help, old spellings still read (with a note), and a bad value gets the same problem from Python and the CLI."""

from __future__ import annotations

import argparse
import dataclasses
import os

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


def _bounded_fields():
    """(verb, field, a bad value) for every option whose bounds state what is bad."""
    cases = []
    for verb, (_, cls) in sorted(_option_verbs().items()):
        for f in dataclasses.fields(cls):
            spec = spec_of(f)
            if spec is None or spec.positional:
                continue
            if spec.at_least is not None:
                cases.append((verb, f.name, int(spec.at_least) - 1))
            elif spec.above is not None:
                cases.append((verb, f.name, float(spec.above)))
    return cases


@pytest.mark.parametrize("verb,field,bad", _bounded_fields())
def test_bad_value_same_problem_from_python_and_cli(verb, field, bad, tmp_path, capsys):
    _, cls = _option_verbs()[verb]
    given = {"gqa": {"model": "m", "kv_heads": 1}, "mla": {"model": "m", "kv_rank": 4}, "kvcache": {"model": "m"},
             "export": {"model": "d", "to": "gguf", "file": "f.gguf"},
             "compare": {"base": "a", "other": "b"}}.get(verb, {})
    with pytest.raises(OptionError) as python:
        cls(**given, **{field: bad}).validate()
    assert python.value.name == field
    flag = cls.flags()[field]
    required = {"gqa": ["m", "--kv-heads", "1"], "mla": ["m", "--kv-rank", "4"], "kvcache": ["m"],
                "export": ["d", "--to", "gguf", "--file", "f.gguf"], "compare": ["a", "b"]}.get(verb, [])
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main([verb, *required, flag, str(bad)])
    finally:
        os.chdir(cwd)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headscope ")]
    assert rc == 2 and len(err) == 1, err
    assert err[0].endswith(f"{flag} {python.value.problem}"), (err[0], python.value.problem)
    assert os.listdir(tmp_path) == []


def test_options_are_typed_and_frozen():
    from headscope.redundancy.options import ScoreOptions

    opts = ScoreOptions(methods=("taylor",), limit=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.limit = 3  # type: ignore[misc]
    assert opts.replace(limit=4).limit == 4 and opts.limit == 8
    with pytest.raises(ValueError, match="did you mean 'limit'"):
        opts.replace(limt=4)
