"""`Record`: a JSON object a Result carries, with typed fields for what code reads.

A verb's report (gqa.json, kvcache.json, prune.json, ...) is a JSON object of many keys, some present only on
some runs. Its Result holds it as a `Record` subclass: the keys that code reads (the printout, the table, other
stages, card export) are dataclass fields with types; every other key stays as it came, JSON-ready, in `rest`.
`to_json()` gives the object back with its keys in the order they came, so the file a Result writes is the same,
byte for byte, as the dict it was built from would have given.

    @dataclass
    class KvBytes(Record):
        measured: int
        calculated: int

    kv = KvBytes.from_json({"measured": 10, "formula": "2 x ...", "calculated": 10})
    kv.measured          # 10, an int
    kv.rest              # {"formula": "2 x ..."}
    kv.to_json()         # {"measured": 10, "formula": "2 x ...", "calculated": 10}
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["Estimate", "IntervalsUsed", "Record"]

R = TypeVar("R", bound="Record")


@dataclass
class Record:
    """Typed fields for the keys code reads; `rest`: the other keys, JSON-ready; `to_json` keeps the key order."""

    rest: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)
    # the keys in the order they came (from_json); empty for a record built directly: its fields in their order
    order: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False)

    @classmethod
    def typed_fields(cls) -> list[dataclasses.Field[Any]]:
        """The fields that hold keys of the JSON object (not `rest` and `order`)."""
        return [f for f in dataclasses.fields(cls) if f.name not in ("rest", "order")]

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record of a JSON object: its typed keys (a nested Record built from its object), the rest kept."""
        hints = typing.get_type_hints(cls)
        typed = {f.name: f for f in cls.typed_fields()}
        missing = [name for name, f in typed.items() if name not in data and _required(f)]
        if missing:
            raise TypeError(f"{cls.__name__} needs the keys {missing}; the object has {list(data)}")
        values = {k: _nested(hints[k], v) for k, v in data.items() if k in typed}
        rest = {k: v for k, v in data.items() if k not in typed}
        return cls(**values, rest=rest, order=tuple(data))

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the keys in the order they came (a record built directly: fields, then `rest`)."""
        typed = {f.name: f for f in self.typed_fields()}
        if not self.order:
            keys = [*typed, *self.rest]
        else:
            # the keys as they came, then what came after: keys added to `rest`, fields given another value
            keys = [k for k in self.order if k in typed or k in self.rest]
            keys += [k for k in self.rest if k not in keys]
            keys += [k for k, f in typed.items() if k not in keys and _changed(self, f)]
        return {k: _plain(getattr(self, k) if k in typed else self.rest[k]) for k in keys}


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _changed(record: Record, f: dataclasses.Field[Any]) -> bool:
    """Whether a field absent from the object it came from was given a value since (not its default)."""
    if f.default is not dataclasses.MISSING:
        return bool(getattr(record, f.name) != f.default)
    return f.default_factory is dataclasses.MISSING or bool(getattr(record, f.name) != f.default_factory())


def _nested(tp: Any, value: Any) -> Any:
    """A JSON value as its field's type holds it: an object for a Record field (`R`, `R | None`) becomes an R, a
    list of objects for a `list[R]` field a list of R."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, Record) and isinstance(value, Mapping):
            return t.from_json(value)
        item = typing.get_args(t)[0] if typing.get_origin(t) is list else None
        if isinstance(item, type) and issubclass(item, Record) and isinstance(value, list):
            return [item.from_json(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.to_json() if isinstance(value, Record) else value


# ---- records several Results share ---------------------------------------------------------------------

@dataclass
class Estimate(Record):
    """A mean over the pairs with its bootstrap interval."""

    value: float
    lo: float
    hi: float


@dataclass
class IntervalsUsed(Record):
    """How the intervals were made: level, bootstrap method, resamples (and seed, what was resampled, in rest)."""

    level: float
    method: str
    B: int
    seed: int | None = None
