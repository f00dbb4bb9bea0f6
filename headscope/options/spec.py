"""One option: its default, its one-line doc, and how it looks on the command line (`option(...)`).

An option is a dataclass field whose metadata holds a `Spec`. The CLI builds each verb's parser from these
fields (`options.cli`), so a flag and its Python keyword are one name with one doc, and the bounds stated
here are checked the same way for both (`check_bounds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any

from ..errors import HeadscopeError


class OptionError(HeadscopeError):
    """A bad option value: `name` is the Python keyword, `problem` says what is wrong and what would work.

    The library's message names the keyword (`limit must be at least 1; got 0`); the CLI prints the same
    problem under the flag (`--limit must be at least 1; got 0`).
    """

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}")


@dataclass(frozen=True)
class Spec:
    """How an option appears on the command line and which values it accepts."""

    help: str
    flag: str | None = None  # default: --field-name
    positional: bool = False
    required: bool = False  # no default a run can use: the CLI demands it, validate() refuses None
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    parse: Callable[[str], Any] | None = None  # the CLI's text -> value (argparse's type=)
    append: bool = False  # repeatable (`--from A --from B`): a tuple of values
    at_least: float | None = None
    above: float | None = None  # exclusive lower bound
    at_most: float | None = None
    below: float | None = None  # exclusive upper bound
    old: tuple[str, ...] = ()  # old spellings: still read for one release, hidden from --help
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
    return None


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
