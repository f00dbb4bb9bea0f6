"""`Options`: the base of every verb's options, one frozen dataclass per verb.

A verb's options are composed from the shared groups (`groups.py`) plus its own fields. `validate()` checks
every value once, in domain words, for the CLI and for Python alike; `check_paths()` adds what only a run
that writes needs (its output folder and files). The CLI builds the verb's parser from the same fields
(`cli.py`), so a flag, its keyword and its doc cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from ..errors import HeadscopeError, did_you_mean
from .spec import check_bounds, check_types, flag_of, spec_of

O = TypeVar("O", bound="Options")


@dataclass(frozen=True, kw_only=True)
class Options:
    """Typed options with defaults; groups and verbs extend `check` (calling `super().check()`)."""

    def validate(self: O) -> O:
        """Refuse a bad value (an `OptionError` naming the field); returns the options themselves."""
        check_types(self)
        check_bounds(self)
        self.check()
        return self

    def check(self) -> None:
        """Checks that involve more than one field or more than a bound (extended by groups and verbs)."""

    def check_paths(self) -> None:
        """Checks of the files and folders a run will write, before any work (extended where a verb writes)."""

    def replace(self: O, **changes: Any) -> O:
        """A copy with `changes`; an unknown keyword is refused with the closest name."""
        names = [f.name for f in fields(self)]
        for key in changes:
            if key not in names:
                raise HeadscopeError(f"{type(self).__name__} has no option {key!r}{did_you_mean(key, names)}; "
                                     f"its options: {', '.join(names)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_namespace(cls: type[O], ns: argparse.Namespace) -> O:
        """The options an argparse namespace (built by `cli.add_options`) holds."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            spec = spec_of(f)
            if spec is None or not hasattr(ns, f.name):
                continue
            value = getattr(ns, f.name)
            values[f.name] = tuple(value or ()) if spec.append else value
        return cls(**values)

    @classmethod
    def flags(cls) -> dict[str, str]:
        """Each command-line field's flag as a user types it (positionals by their name in capitals)."""
        return {f.name: flag_of(f.name, spec) for f in fields(cls) if (spec := spec_of(f)) is not None}

    def with_only(self, **changes: Any) -> dict[str, Any]:
        """The fields as a plain dict (with `changes`), for provenance and records."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, **changes}
