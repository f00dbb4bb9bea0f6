"""What the page reads, declared once: the heads table (`/api/heads`, the evidence on each head's card) and the
model's info (embedded in the page, and `/api/info`).

`heads.py` and `page.py` build these records and send `to_json(record)`; `assets/view.js` reads them under the
names its header declares (`// schema: NAME Record`), and tests/test_view_schema.py checks both sides: the JSON
the server sends validates here, every field view.js reads exists here, and every field here is read by view.js
or marked `not_shown(why)`. Per-head lists are flat over (layer, head), row-major.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["ROOTS", "HeadsTable", "PageInfo", "json_name", "not_shown", "omitted_if_none", "problems_of",
           "shown", "to_json"]

_NOT_SHOWN = "not_shown"  # metadata: why the page does not read this field
# metadata: the key is left out of the JSON when the value is None
_OMITTED = "omitted_if_none"
# metadata: the JSON key, where it is not a Python name (`in`)
_JSON_NAME = "json_name"


def not_shown(why: str, **kw: Any) -> Any:
    """A field the page does not read (sent for API users and tests), and why."""
    return field(metadata={_NOT_SHOWN: why}, **kw)


def omitted_if_none() -> Any:
    """A field whose key is absent from the JSON when it has no value (the page tests for its presence)."""
    return field(default=None, metadata={_OMITTED: True})


def shown(f: dataclasses.Field[Any]) -> bool:
    return _NOT_SHOWN not in f.metadata


def json_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(_JSON_NAME, f.name))


# ---- the heads table ------------------------------------------------------------------------------------

@dataclass
class Source:
    """The file a part of the table came from, and the command that made it."""

    file: str
    folder: str = not_shown("the card names the file; the folders are listed once (HeadsTable.folders)")
    verb: str | None = not_shown("the command says it")
    command: str | None = None  # None: the file has no provenance record
    data: Any = not_shown("the provenance record's data description, for API users", default=None)


@dataclass
class Statistic:
    """A heads.csv (or roles.csv) column: one value per head, with its interval where the file has one."""

    values: list[float | None]
    meaning: str = not_shown("the column's meaning, from its declared artifact (the grid names the column)")
    lo: list[float | None] | None = omitted_if_none()
    hi: list[float | None] | None = omitted_if_none()


@dataclass
class Measure:
    """One importance method: each head's score, interval and rank (1 = most important)."""

    values: list[float | None]
    lo: list[float | None] | None = omitted_if_none()
    hi: list[float | None] | None = omitted_if_none()
    rank: list[int | None] = field(default_factory=list)


@dataclass
class Patching:
    """Each head's exact patching effect, or its attribution estimate (`measure`) where no exact scan ran."""

    values: list[float | None]
    lo: list[float | None] | None = omitted_if_none()
    hi: list[float | None] | None = omitted_if_none()
    measure: str = "effect"


@dataclass
class RoleDetail:
    """A role a head holds (roles.json's census): its score beside its baseline, and the role's meaning."""

    role: str
    score: float | None = None
    lo: float | None = None
    hi: float | None = None
    baseline: float | None = None
    held_share: float | None = not_shown("the share of resamples that hold the role, for API users", default=None)
    help: str | None = omitted_if_none()  # absent for a role the registry no longer knows
    higher_is_better: bool | None = omitted_if_none()


@dataclass
class KvChoice:
    """One kvcache row: which heads keep their full KV cache; the others keep `sink` + `window` tokens."""

    label: str
    full: list[bool]
    window: int | None = None
    sink: int | None = None


@dataclass
class PathEntry:
    """A path-patching path (paths.csv) through a head."""

    sender: str
    receiver: str
    via: str
    effect: float
    lo: float | None = None
    hi: float | None = None


@dataclass
class Edge:
    """A circuit edge (edges.csv) out of or into a head."""

    sender: str
    receiver: str
    score: float
    lo: float | None = None
    hi: float | None = None


@dataclass
class EdgeLists:
    """A head's strongest circuit edges out of it and into it."""

    out: list[Edge] = field(default_factory=list)
    incoming: list[Edge] = field(default_factory=list, metadata={_JSON_NAME: "in"})


@dataclass
class HeadsTable:
    """The per-head evidence found in the --from folders, with the files it came from."""

    n_layers: int = not_shown("the page's model info holds the shape")
    n_heads: int = not_shown("the page's model info holds the shape")
    folders: list[str] = field(default_factory=list)
    sources: dict[str, Source] = field(default_factory=dict)  # part ("roles", "importance", ...) -> its file
    statistics: dict[str, Statistic] = field(default_factory=dict)  # column -> values
    # per head: its roles, ";"-separated ("" for none); None: no roles.csv
    roles: list[str] | None = None
    # per head: roles whose estimate passes but whose bound does not
    uncertain: list[str] | None = None
    role_detail: dict[str, list[RoleDetail]] = field(default_factory=dict)  # head name -> its roles
    importance: dict[str, Measure] = field(default_factory=dict)  # method -> measure
    kvcache: list[KvChoice] = field(default_factory=list)
    patching: Patching | None = None
    paths: dict[str, list[PathEntry]] = field(default_factory=dict)  # head name -> its strongest paths
    edges: dict[str, EdgeLists] = field(default_factory=dict)  # head name -> its strongest edges
    problems: list[str] = field(default_factory=list)  # one line per file that could not be used


# ---- the model's info -----------------------------------------------------------------------------------

@dataclass
class PageInfo:
    """What the page knows about the served model: name, shape, limits, examples and features."""

    name: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    heads_in_layer: list[int]
    causal: bool
    max_tokens: int
    max_chars: int
    small_max: int
    examples: list[str]
    generates: bool
    max_new_tokens: int
    weightings: list[str]
    max_window: int = not_shown("the server refuses a larger window; the page asks for its fixed WINDOW", default=0)
    max_positions: int | None = not_shown("the server cuts a text to the model's positions and says so",
                                          default=None)


ROOTS: tuple[type[Any], ...] = (HeadsTable, PageInfo)


# ---- to JSON and back -------------------------------------------------------------------------------------

def to_json(value: Any) -> Any:
    """A record as the JSON-ready value the page reads (keys by their JSON names, omitted Nones left out)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is None and f.metadata.get(_OMITTED):
                continue
            out[json_name(f)] = to_json(v)
        return out
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def problems_of(value: Any, tp: Any, where: str = "$") -> list[str]:
    """Where a JSON value does not match the declared type `tp` (a record class, or a field's type); [] if it does."""
    if tp is Any:
        return []
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return []
        found = [problems_of(value, t, where) for t in options if t is not type(None)]
        if any(not p for p in found):
            return []
        return found[0] if len(found) == 1 else [f"{where}: {value!r:.60} is none of {tp}"]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record_problems(value, tp, where)
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        (item,) = typing.get_args(tp)
        return [p for i, v in enumerate(value) for p in problems_of(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        _, item = typing.get_args(tp)
        return [p for k, v in value.items() for p in problems_of(v, item, f"{where}.{k}")]
    return [] if _is(value, tp) else [f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r:.60}"]


def _is(value: Any, tp: Any) -> bool:
    if tp is float:  # JSON has one number type: a whole number is a float too
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _record_problems(value: Any, cls: type[Any], where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object ({cls.__name__}), got {type(value).__name__}"]
    hints = typing.get_type_hints(cls)
    declared = {json_name(f): f for f in dataclasses.fields(cls)}
    out = [f"{where}: {k!r} is not a field of {cls.__name__}" for k in value if k not in declared]
    for key, f in declared.items():
        if key not in value:
            if not f.metadata.get(_OMITTED):
                out.append(f"{where}: {cls.__name__}.{key} is missing")
            continue
        out += problems_of(value[key], hints[f.name], f"{where}.{key}")
    return out
