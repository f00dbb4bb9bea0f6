"""One option: its default, its one-line doc, and how it looks on the command line (`option(...)`).

An option is a dataclass field whose metadata holds a `Spec`. The CLI builds each verb's parser from these
fields (`options.cli`), so a flag and its Python keyword are one name with one doc, and the bounds stated
here are checked the same way for both (`check_bounds`).
"""

from __future__ import annotations

import math
import numbers
import os
import types
import typing
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any

from ..data.limits import STEPS_MAX, STEPS_WHY, WORK, fits_memory_problem
from ..errors import OptionError


@dataclass(frozen=True)
class Spec:
    """How an option appears on the command line and which values it accepts."""

    help: str
    flag: str | None = None  # default: --field-name
    positional: bool = False
    # no default a run can use: the CLI demands it, validate() refuses None
    required: bool = False
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    parse: Callable[[str], Any] | None = None  # the CLI's text -> value (argparse's type=)
    append: bool = False  # repeatable (`--from A --from B`): a tuple of values
    at_least: float | None = None
    above: float | None = None  # exclusive lower bound
    at_most: float | None = None
    below: float | None = None  # exclusive upper bound
    # an upper bound by kind (`data.limits`): "steps", "threads", "memory_mib" or a WORK key
    most: str | None = None
    # a file or folder the verb reads: it must not lie where the verb writes
    reads: bool = False
    # a file or folder the verb writes whole (a card, a GGUF file, an offload folder)
    whole: bool = False
    # old spellings: still read for one release, hidden from --help
    old: tuple[str, ...] = ()
    group: str | None = None  # the --help section


def option(default: Any, help: str, **spec: Any) -> Any:
    """A dataclass field that is also a command-line option (see `Spec` for the keywords)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults must be immutable: use a tuple")
    return field(default=default, metadata={"spec": Spec(help, **spec)})


def spec_of(f: Field[Any]) -> Spec | None:
    """The field's `Spec`, or None for a field that is no command-line option."""
    spec = f.metadata.get("spec")
    return spec if isinstance(spec, Spec) else None


def flag_of(name: str, spec: Spec) -> str:
    """The flag as a user types it: `--max-length` for `max_length` (positionals by their name)."""
    if spec.positional:
        return name.upper()
    return spec.flag or "--" + name.replace("_", "-")


def _number_text(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def bound_problem(value: Any, spec: Spec) -> str | None:
    """What is wrong with `value` against the bounds and choices of `spec`, or None."""
    if value is None or isinstance(value, bool):
        return None
    if spec.choices is not None and value not in spec.choices:
        return f"must be one of {', '.join(map(str, spec.choices))}; got {value!r}"
    if not isinstance(value, (int, float)):
        return None
    if spec.above == 0 and spec.at_least is None and not value > 0:  # NaN included
        return f"must be a positive number like 1e-3; got {value}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number; got {value}"
    if spec.above is not None and not value > spec.above:
        return f"must be above {_number_text(spec.above)}; got {value}"
    if spec.at_least == 0 and not value >= 0:
        return f"must be 0 or more; got {value}"
    if spec.at_least is not None and not value >= spec.at_least:
        return f"must be at least {_number_text(spec.at_least)}; got {value}"
    if spec.at_most is not None and not value <= spec.at_most:
        return f"must be at most {_number_text(spec.at_most)}; got {value}"
    if spec.below is not None and not value < spec.below:
        return f"must be below {_number_text(spec.below)}; got {value}"
    return most_problem(spec.most, value) if spec.most is not None else None


def most_problem(kind: str, value: int | float) -> str | None:
    """What is wrong with `value` against the upper bound of `kind` (`data.limits`), or None."""
    if kind == "memory_mib":
        return memory_problem(value, 2**20, "the memory it may take (MiB)", share=0.9)
    if kind == "steps":
        most, why = STEPS_MAX, STEPS_WHY
    elif kind == "threads":
        most, why = os.cpu_count() or 1, "the CPUs this machine has: more threads only wait on each other"
    else:
        most, why = WORK[kind]
    return f"must be at most {most:,}; got {value:,} ({why})" if value > most else None


def haystacks_problem(haystacks: int, tokens: int) -> str | None:
    """Haystacks of `tokens` tokens each, held as token ids (a Python int each), against the memory available."""
    if tokens <= 0:
        return None
    return memory_problem(haystacks, 40 * tokens, f"haystacks of {tokens:,} tokens held as token ids")


def memory_problem(value: int | float, bytes_each: float, what: str, share: float = 0.5) -> str | None:
    """`value` times `bytes_each` against `share` of the memory available now: the problem, or None."""
    return fits_memory_problem(int(value), bytes_each, what, share=share)


_KIND_WORDS = {bool: "True or False", int: "a whole number", float: "a number", str: "text"}


def _accepts(kind: Any, value: Any) -> bool | None:
    """Whether `value` is of the declared type `kind` (None: a type this check does not know, so not judged).

    bool is no number here (True is an int to Python, not a count to a user); a whole number is a float's value."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return None


def type_problem(value: Any, annotation: Any) -> str | None:
    """What is wrong with `value` against a field's declared type (`int | None`, `tuple[str, ...]`, ...), or None.

    The CLI converts every flag's text to its type, so this catches what only Python can pass: `limit='5'`,
    `paths=5`, `senders=['L0H0']`, `ci=True`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        if value is None and len(args) < len(typing.get_args(annotation)):
            return None
        problems = [type_problem(value, a) for a in args]
        return None if any(p is None for p in problems) else problems[0]
    if typing.get_origin(annotation) is tuple:
        item = args[0] if args else Any
        if not isinstance(value, (tuple, list)):
            return f"must be a tuple of {_KIND_WORDS.get(item, 'values')}; got {type(value).__name__} {value!r}"
        bad = [v for v in value if _accepts(item, v) is False]
        return f"must hold {_KIND_WORDS[item]} only; got {bad[0]!r} in {value!r}" if bad else None
    if value is None:
        return f"must be {_KIND_WORDS.get(annotation, 'given')}; got None"
    ok = _accepts(annotation, value)
    if ok is False and annotation is str and isinstance(value, os.PathLike):
        return f"must be text, as the command line gives it: str(path); got {type(value).__name__} {str(value)!r}"
    if ok is False:
        return f"must be {_KIND_WORDS[annotation]}; got {type(value).__name__} {value!r}"
    return None


def _hints(cls: type) -> dict[str, Any]:
    """A class's field types, resolved once (the annotations are strings under `from __future__ import annotations`)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


_HINTS: dict[type, dict[str, Any]] = {}


def check_types(options: Any) -> None:
    """Refuse the first command-line field of `options` whose value is not of its declared type."""
    hints = _hints(type(options))
    for f in fields(options):
        spec = spec_of(f)
        if spec is None or f.name not in hints:
            continue
        value = getattr(options, f.name)
        if spec.required and value is None:
            continue  # check_bounds says "is required"
        annotation = hints[f.name]
        if spec.append and value is not None and typing.get_origin(annotation) is not tuple:
            annotation = tuple[annotation, ...]  # type: ignore[valid-type]  # a repeatable flag keeps a tuple
        problem = type_problem(value, annotation)
        if problem:
            raise OptionError(f.name, problem)


def check_bounds(options: Any) -> None:
    """Refuse the first field of `options` whose value breaks its stated bounds or choices."""
    for f in fields(options):
        spec = spec_of(f)
        if spec is None:
            continue
        values = getattr(options, f.name)
        if spec.required and values is None:
            raise OptionError(f.name, "is required")
        for value in values if spec.append and values else (values,):
            problem = bound_problem(value, spec)
            if problem:
                raise OptionError(f.name, problem)
