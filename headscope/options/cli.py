"""A verb's argparse parser, built from its Options dataclass: one flag per field, the field's doc as help.

Old spellings of renamed flags (`Spec.old`) still parse for one release, hidden from --help, and print a
one-line note naming the new flag.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, NoReturn

from ..artifacts import ARTIFACTS, outputs
from ..artifacts.locations import MODEL, check_locations
from ..errors import HeadscopeError, did_you_mean
from .base import Options
from .spec import Spec, flag_of, spec_of


class Parser(argparse.ArgumentParser):
    """headscope's parsers: a refusal is one line and exit 2, like every other refusal (argparse would print the
    usage block first), an unknown choice gets a did-you-mean, and flags are never abbreviated (`--f` is no flag:
    an abbreviation that works today would break the day a second flag shares its start). Subparsers are of this
    class too (add_subparsers passes it on)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        choice = re.match(r"argument .*: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
            message += did_you_mean(choice.group(1), options)
        self.exit(2, f"{self.prog}: error: {message}\n")


def unknown_words(parser: argparse.ArgumentParser, words: list[str]) -> str:
    """`words` a parser did not take, each flag among them with the closest flag it has (`--limt (did you mean
    '--limit'?)`); hidden old spellings are not offered."""
    flags = [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
    return " ".join(w + (did_you_mean(w.split("=")[0], flags) if w.startswith("--") else "") for w in words)


def as_flags(message: str, names: tuple[str, ...], flags: dict[str, str]) -> str:
    """`message` with each option field in `names` said as its flag: `force=True` -> `--force`, `kv_heads=4` ->
    `--kv-heads 4`, `device='cpu'` -> `--device cpu`, `l0_steps` -> `--l0-steps` (a field no verb has: its name with
    dashes). The library writes field names (`HeadscopeError.fields`); only the command line speaks in flags."""
    for name in sorted(set(names), key=len, reverse=True):  # `l0_steps` before `steps`
        flag = flags.get(name, "--" + name.replace("_", "-"))
        word = rf"(?<![\w.'\"`/-]){re.escape(name)}"  # not inside a word, a path or a quoted value
        message = re.sub(word + r"=True\b", flag, message)
        message = re.sub(word + r"='([^'\s]*)'", flag + r" \1", message)  # flags hold no backslash
        message = re.sub(word + r"=(?=[^\s=])", flag + " ", message)
        message = re.sub(word + r"(?![\w'\"`=/(-])", flag, message)  # `device(s)`: a plural, no field
    return message


class _OldSpelling(argparse.Action):
    """A renamed flag's old spelling: stores into the new field and says the new name once."""

    def __init__(self, *args: Any, new: str, **kwargs: Any):
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"headscope: note: {option_string} is now {self.new} (the old spelling works until the next release)",
              file=sys.stderr)
        if self.nargs == 0:
            values = True
        elif isinstance(self.default, list) or getattr(self, "append", False):
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def _value_type(annotation: Any) -> Any:
    """int for `int | None`, str for `str`, ...: the type argparse converts a flag's text to."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _value_type(args[0]) if len(args) == 1 else str
    if typing.get_origin(annotation) is tuple:
        return _value_type(typing.get_args(annotation)[0])
    return annotation if annotation in (int, float, str, bool) else str


def add_options(parser: argparse.ArgumentParser, cls: type[Options]) -> None:
    """Add one argument per command-line field of `cls` to `parser` (grouped by `Spec.group`)."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(cls):
        spec = spec_of(f)
        if spec is None:
            continue
        default = f.default if f.default is not MISSING else None
        where: Any = parser
        if spec.group:
            where = groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        kind = _value_type(hints[f.name])
        _add(where, f.name, spec, kind, default)


def _add(where: Any, name: str, spec: Spec, kind: Any, default: Any) -> None:
    flag = flag_of(name, spec)
    kw: dict[str, Any] = {"help": spec.help.replace("%", "%%")}
    if kind is bool:
        # a switch that is on unless turned off (default True) also gets its --no-X: `--check` / `--no-check`
        kw["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
    else:
        kw["type"] = spec.parse or kind
        if spec.metavar:
            kw["metavar"] = spec.metavar
        if spec.choices is not None:
            kw["choices"] = spec.choices
        if spec.append:
            kw["action"] = "append"
    if spec.positional:
        where.add_argument(name, nargs=None if spec.required else "?", default=default, **kw)
        return
    # A required flag with old spellings is demanded by validate(): argparse would not count the old one.
    required = spec.required and not spec.old
    where.add_argument(flag, dest=name, default=None if spec.append else default, required=required, **kw)
    for old in spec.old:
        old_kw: dict[str, Any] = {"help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
        if kind is bool:
            old_kw["nargs"] = 0
        else:
            old_kw["type"] = spec.parse or kind
            if spec.choices is not None:
                old_kw["choices"] = spec.choices
        action = _OldSpelling
        where.add_argument(old, dest=name, action=action, new=flag, **old_kw)


def verb_parser(sub: argparse._SubParsersAction, name: str, cls: type[Options], help: str,
                description: str | None = None, epilog: str | None = None) -> argparse.ArgumentParser:
    """The verb's subparser with every option of `cls`; `options_class` set for the CLI's checks."""
    p = sub.add_parser(name, help=help, description=description or help, epilog=epilog)
    add_options(p, cls)
    p.set_defaults(options_class=cls)
    return p


def to_argv(verb: str, options: Options) -> list[str]:
    """The command line (verb first) that parses back into `options`: each field that differs from its default under
    its own flag (a positional by its value, a repeatable flag once per value, a switch alone). The inverse of
    `verb_parser` + `Options.from_namespace` for every value the parser can produce."""
    argv, flags = [verb], []
    for f in fields(options):
        spec = spec_of(f)
        value = getattr(options, f.name)
        if spec is None or value is None:
            continue
        if spec.positional:
            argv.append(_text(value))
            continue
        default = f.default if f.default is not MISSING else None
        if value == default or (spec.append and not value):
            continue
        flag = flag_of(f.name, spec)
        # a switch on by default differs from it only when turned off
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif spec.append:
            for v in value:
                flags += [flag, _text(v)]
        else:
            flags += [flag, _text(value)]
    return argv + flags


def _text(value: Any) -> str:
    """A value as its flag's text: a tuple comma-joined (how `--method a,b` is parsed), a float by its repr (exact)."""
    if isinstance(value, tuple):
        return ",".join(map(_text, value))
    return repr(value) if isinstance(value, float) else str(value)


def command_line(verb: str, options: Options) -> str:
    """The shell command that runs `verb` with `options` (`headscope analyze MODEL --limit 16 ...`)."""
    return "headscope " + " ".join(shlex.quote(a) for a in to_argv(verb, options))


def check_options(options: Options, verb: str) -> None:
    """Validate `options`, then the files and folders `verb` will write and where they lie against what it reads,
    before any work: what the CLI checks of every verb, for a caller that builds Options itself (a study)."""
    options.validate()
    options.check_paths()
    check_output_locations(options, verb)


def check_output_locations(options: Options, verb: str) -> None:
    """Output locations that collide with each other or with an input, refused before any model loads
    (`artifacts.locations.check_locations`): --export-card equal to --out, --out being the model's folder, --data
    where a result goes, ... Which fields are inputs and which outputs written whole, their Specs say."""
    read: dict[str, Path] = {}
    whole: dict[str, Path] = {}
    flags = options.flags()
    for f in fields(options):
        spec = spec_of(f)
        value = getattr(options, f.name)
        if spec is None or value is None:
            continue
        for v in value if spec.append else (value,):
            if not isinstance(v, str) or not v:
                continue
            label = MODEL if f.name == "model" else (f"{flags[f.name]} {v!r}" if spec.append else flags[f.name])
            if spec.reads and Path(v).exists():
                read[label] = Path(v)
            elif spec.whole:
                whole[label] = Path(v)
    out = None
    folder = getattr(options, "out", None)
    if isinstance(folder, str) and folder.strip():
        try:
            names = outputs(verb, optional=True)
        except HeadscopeError:  # a verb that declares no files
            names = []
        out = ("--out", Path(folder), names)
    check_locations(out, whole, read, {a.name: next(iter(a.verbs)) for a in ARTIFACTS.values()})
