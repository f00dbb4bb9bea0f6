"""The schema of headscope's output files: a `Field` (a CSV column or a JSON / .npz key), an `Artifact` (one
file: name, kind, the verbs that write it, its fields) and the one row writer, `write_csv`.

The declarations themselves (every file every verb writes) are in `headscope.artifacts`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadscopeError, did_you_mean
from ..io import atomic_write_text, csv_columns, csv_text

__all__ = ["BOUNDS", "KINDS", "Artifact", "Field", "bound_of", "write_csv"]

KINDS = ("csv", "json", "npz", "png", "dir", "html")
_FAMILY = re.compile(r"<[a-z_]+>")
# What a placeholder stands for: a name's characters, with those of compare's row and role names (roles:positional:-3)
# and of a sum's count (induction_score|count); never "/", which separates compare_items.npz's parts.
_MEMBER = "[A-Za-z0-9_:|+-]+"


@dataclass(frozen=True)
class Field:
    """One column of a CSV file, or one top-level key of a JSON or .npz file."""

    # `<...>` marks a family: importance_<method> stands for importance_gradient, ...
    name: str
    meaning: str = ""
    # "" = always written; else the option or model kind that makes the writer add it
    when: str = ""

    @property
    def is_family(self) -> bool:
        """Whether the name stands for several fields (it holds a `<...>` placeholder)."""
        return bool(_FAMILY.search(self.name))

    @property
    def required(self) -> bool:
        """Whether every file of this kind has exactly this field."""
        return not self.when and not self.is_family

    def matches(self, name: str) -> bool:
        """Whether `name` is this field (or a member of this family)."""
        if not self.is_family:
            return name == self.name
        # Only the placeholders are wildcards; the rest of the name matches literally.
        pattern = _MEMBER.join(re.escape(p) for p in _FAMILY.split(self.name))
        return re.fullmatch(pattern, name) is not None


# a figure's confidence interval: `<column>_lo`, `<column>_hi` right after it
BOUNDS = ("_lo", "_hi")


def bound_of(name: str) -> str | None:
    """The column whose interval bound `name` is (`entropy_lo` -> `entropy`), or None."""
    return name[:-3] if name.endswith(BOUNDS) else None


@dataclass(frozen=True)
class Artifact:
    """One output file (or directory) of a verb, and the fields it holds.

    With `bounds`, every field may be followed by its confidence interval's bounds `<field>_lo` and
    `<field>_hi` (headscope.uncertainty); they belong to that field: declared, ordered and explained with it,
    and never members of a family themselves."""

    name: str
    kind: str
    # producing verb -> "" (every run writes it) or the option that makes it write it
    verbs: Mapping[str, str]
    summary: str
    fields: tuple[Field, ...] = ()
    bounds: bool = False

    @property
    def verb(self) -> str:
        """The verb to run to get this file (the first producer)."""
        return next(iter(self.verbs))

    def columns(self) -> list[str]:
        """Every declared field name that is not a family, in order (a CSV writer's header)."""
        return [f.name for f in self.fields if not f.is_family]

    def required(self) -> list[str]:
        """Fields every such file holds."""
        return [f.name for f in self.fields if f.required]

    def field_for(self, name: str) -> Field | None:
        """The declaration `name` belongs to (a family matches its members; a bound its field's), or None."""
        stem = bound_of(name) if self.bounds else None
        if stem is not None:
            owner = self.field_for(stem)
            if owner is not None:
                return owner
        return next((f for f in self.fields if f.matches(name)), None)

    def members(self, family: str, names: Iterable[str]) -> list[str]:
        """The names among `names` that belong to the field or family `family`, in their order (interval
        bounds excluded: they belong to their member)."""
        decl = next((f for f in self.fields if f.name == family), None)
        if decl is None:
            known = [f.name for f in self.fields]
            raise HeadscopeError(f"{self.name} declares no field {family!r}{did_you_mean(family, known)}")
        def is_bound(n: str) -> bool:
            member = bound_of(n)
            return self.bounds and member is not None and self.field_for(member) is not None

        return [n for n in names if decl.matches(n) and not is_bound(n)]

    def missing(self, names: Iterable[str]) -> list[str]:
        """Required fields absent from `names`."""
        have = set(names)
        return [n for n in self.required() if n not in have]

    def check(self, names: Sequence[str]) -> list[str]:
        """Problems of a real file's fields against this declaration (empty when it conforms):
        missing required fields, undeclared fields, and (CSV) columns out of the declared order."""
        problems = []
        if self.missing(names):
            problems.append(f"missing {', '.join(self.missing(names))}")
        undeclared = [n for n in names if self.field_for(n) is None]
        if undeclared:
            problems.append(f"undeclared {', '.join(undeclared)}")
        if self.kind == "csv":
            index = [self.fields.index(f) for f in map(self.field_for, names) if f is not None]
            if index != sorted(index):
                problems.append(f"columns out of the declared order: {list(names)}")
        return problems

    def meaning(self, name: str) -> str:
        """What a field means (a family's meaning for its members; a bound says so), or ''."""
        stem = bound_of(name) if self.bounds else None
        if stem is not None and self.field_for(stem) is not None:
            side = "lower" if name.endswith("_lo") else "upper"
            return f"{side} bound of {stem}'s confidence interval (level and method in the JSON's intervals)"
        f = self.field_for(name)
        return f.meaning if f is not None else ""


def write_csv(folder: str | Path, declared: Artifact, rows: Sequence[Mapping[str, Any]],
              columns: Sequence[str] | None = None) -> Path:
    """Write `rows` as the CSV file `declared` into `folder` (atomically) and return its path.

    Columns are `columns`, or every key of the rows in the order they first appear; they must match the
    declaration (required fields present, nothing undeclared, in the declared order), so a writer cannot
    drift from what the report and the docs read. Cells are formatted by `headscope.io.format_cell`."""
    if declared.kind != "csv":
        raise ValueError(f"{declared.name} is a {declared.kind} file, not a CSV")
    cols = list(columns) if columns is not None else csv_columns(rows)
    problems = declared.check(cols)
    if problems:
        raise ValueError(f"rows for {declared.name} do not match its declaration: {'; '.join(problems)}")
    path = Path(folder) / declared.name
    atomic_write_text(path, csv_text(rows, cols))
    return path


# The provenance key of a verb's JSON file (headscope.provenance), declared by every such file.
PROVENANCE = Field("provenance", "verb, model (name, config and weights fingerprints), data (source, passages, "
                                 "sha256), options and versions: see headscope.provenance",
                   # optional only so that files written before provenance was recorded still read
                   "every run (absent from files written before headscope recorded provenance)")
