"""What later stages and the answers read of a stage: its Result in memory where it ran in this process, else its
saved files (a stage reused from an earlier run), through one reader per artifact.

Each artifact the answers read has one `Source` here: the stage that writes it and what of its Result the file
holds. Both ways give the record in the file's own value model (a JSON artifact as JSON's types, NaN as its writer
writes it; a CSV artifact as rows of text cells, formatted by the writer's own cell formatter), so an answer reads
the same values, and says the same words, whether its stage ran now or was reused.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts import (
    CIRCUIT_JSON,
    CLUSTERS_JSON,
    COMPARE_CSV,
    GQA_JSON,
    HEADS_CSV,
    IMPORTANCE_CSV,
    IMPORTANCE_JSON,
    KV_CSV,
    KVCACHE_JSON,
    MLA_JSON,
    PATCHING_CSV,
    PATCHING_JSON,
    PRUNE_CURVE_CSV,
    PRUNE_JSON,
    RANK_CORRELATION_CSV,
    REDUNDANCY_CSV,
    ROLES_CSV,
    ROLES_JSON,
)
from ..io import format_cell
from ..learned.verbs import RolesResult
from ..options import Record, Result
from ..table import to_jsonable
from .stages import SUBDIRS
from .verbs import Several

__all__ = ["Records", "retrieval_measured"]


@dataclass(frozen=True)
class Source:
    """Where an artifact comes from: the stage that writes it, and its content in that stage's Result."""

    stage: str
    # the Result -> what its writer serialises (an object, or rows)
    content: Callable[[Any], Any]
    # whether the writer turns NaN into null first (`table.to_jsonable`)
    jsonable: bool = False


def _rank_rows(result: Any) -> list[dict[str, str]]:
    """rank_correlation.csv's rows as pandas writes them (`%.4f`, NaN empty, the index under an empty name)."""
    frame = result.correlations
    return [{"": str(name), **{str(c): "" if v != v else f"{v:.4f}" for c, v in row.items()}}
            for name, row in frame.iterrows()]


JSON_SOURCES: dict[str, Source] = {
    ROLES_JSON.name: Source("roles", lambda r: r.report, jsonable=True),
    CLUSTERS_JSON.name: Source("similar", lambda r: r.record),
    IMPORTANCE_JSON.name: Source("score", lambda r: r.table.to_dict(), jsonable=True),
    PATCHING_JSON.name: Source("patch", lambda r: r.record, jsonable=True),
    CIRCUIT_JSON.name: Source("circuit", lambda r: r.record, jsonable=True),
    PRUNE_JSON.name: Source("prune", lambda r: r.summary),
    GQA_JSON.name: Source("gqa", lambda r: r.report),
    MLA_JSON.name: Source("mla", lambda r: r.report),
    KVCACHE_JSON.name: Source("kvcache", lambda r: r.report, jsonable=True),
}
CSV_SOURCES: dict[str, Source] = {
    HEADS_CSV.name: Source("analyze", lambda r: r.table.to_records()),
    ROLES_CSV.name: Source("roles", lambda r: r.table.to_records()),
    IMPORTANCE_CSV.name: Source("score", lambda r: r.table.to_records()),
    PATCHING_CSV.name: Source("patch", lambda r: r.table.to_records()),
    KV_CSV.name: Source("kv", lambda r: r.records()),
    PRUNE_CURVE_CSV.name: Source("prune", lambda r: r.curve.records()),
    REDUNDANCY_CSV.name: Source("prune", lambda r: r.curve.redundancy()),
    RANK_CORRELATION_CSV.name: Source("score", _rank_rows),
}


class Records:
    """The artifacts of a study's folder `out`, each from its stage's Result in `results` (the stages run in this
    process) or, for a stage not among them, from its file."""

    def __init__(self, out: Path, results: Mapping[str, Result] | None = None) -> None:
        self.out = Path(out)
        self.results = dict(results or {})

    @classmethod
    def of(cls, where: Path | Records) -> Records:
        """`where` itself, or a folder's records read from its files alone."""
        return where if isinstance(where, Records) else cls(Path(where))

    def _path(self, source: Source, name: str) -> Path:
        return self.out / SUBDIRS.get(source.stage, "") / name

    def json(self, name: str) -> dict[str, Any] | None:
        """A JSON artifact's object, or None when its stage wrote none (or the file is unreadable)."""
        source = JSON_SOURCES[name]
        result = self.results.get(source.stage)
        if result is not None:
            content = source.content(result)
            if isinstance(content, Record):  # a typed record: the JSON object its file holds
                content = content.to_json()
            data = json.loads(json.dumps(to_jsonable(content) if source.jsonable else content, default=str))
        else:
            data = read_json(self._path(source, name))
        return data if isinstance(data, dict) else None

    def rows(self, name: str) -> list[dict[str, str]]:
        """A CSV artifact's rows as text cells ([] when its stage wrote none)."""
        source = CSV_SOURCES[name]
        result = self.results.get(source.stage)
        if result is None:
            return read_rows(self._path(source, name))
        return _cells(source.content(result))

    def compared(self, model: str) -> list[dict[str, str]]:
        """compare.csv's rows of the compare stage's run on `model` (prune, gqa, mla): [] when it wrote none."""
        several = self.results.get("compare")
        if isinstance(several, Several):
            result = several.by.get(model)
            return _cells([c.row() for c in getattr(result, "changes", [])])
        return read_rows(self.out / SUBDIRS["compare"] / model / COMPARE_CSV.name)


def _cells(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Rows as their CSV writer writes the cells (`io.format_cell`)."""
    return [{str(k): v if isinstance(v, str) else format_cell(v) for k, v in r.items()} for r in rows]


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_rows(path: Path) -> list[dict[str, str]]:
    """A CSV file's rows ([] when it is missing or unreadable)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _finite(value: object) -> bool:
    """Whether a cell (a number, or its text in a CSV) holds a finite number."""
    try:
        # a CSV's text or a table's number: float() takes both
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def retrieval_measured(roles: Result | None, out: Path) -> bool:
    """Whether the roles stage measured some head's retrieval score (its long-range pass): from its Result (`roles`),
    else from roles.csv in `out`."""
    if isinstance(roles, RolesResult):
        table = roles.table
        return "retrieval_score" in table and any(_finite(v) for v in table["retrieval_score"].ravel())
    return any(_finite(r.get("retrieval_score")) for r in read_rows(out / ROLES_CSV.name))
