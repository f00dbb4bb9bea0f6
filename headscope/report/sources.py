"""Tolerant readers for the files the other verbs write into an output directory.

Each reader returns plain JSON-ready Python values (or None when the file is absent), and checks
which columns exist instead of assuming them: the report must keep working while the verbs that
feed it change their outputs.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HeadscopeError
from ..table import HeadTable, parse_head, to_jsonable

log = logging.getLogger(__name__)

# The file each report section reads, and the verb that writes it (for "not run yet" notes).
PRODUCERS: dict[str, str] = {
    "heads.csv": "analyze",
    "roles.json": "roles",
    "syntax.csv": "roles",
    "similar_pairs.csv": "similar",
    "similarity.npz": "similar",
    "clusters.json": "similar",
    "importance.csv": "score",
    "importance.json": "score",
    "rank_correlation.csv": "score",
    "prune_curve.csv": "prune",
    "redundancy.csv": "prune",
    "prune.json": "prune",
    "kv.csv": "kv",
    "sweep.csv": "sweep",
    "gqa.json": "gqa",
}


@dataclass
class Sources:
    """Where each input file was found (first match over the search directories)."""

    dirs: list[Path]
    found: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def scan(cls, dirs: Sequence[str | Path]) -> Sources:
        """Look for every known file in `dirs`, earlier directories winning."""
        paths = []
        for d in dirs:
            p = Path(d)
            if p not in paths:
                paths.append(p)
        found: dict[str, Path] = {}
        for name in PRODUCERS:
            for d in paths:
                if (d / name).is_file():
                    found[name] = d / name
                    break
        return cls(paths, found)

    def get(self, name: str) -> Path | None:
        return self.found.get(name)


def clean(v: Any) -> Any:
    """A JSON-ready value: numpy scalars to Python, NaN/inf to None, floats rounded to 5 significant digits."""
    return to_jsonable(v, digits=5)


def read_csv_records(path: Path) -> tuple[list[str], list[dict[str, Any]]] | None:
    """A CSV as (column names, rows); None (with a warning) when it cannot be read."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except Exception as e:  # a half-written or foreign file must not break the whole report
        log.warning("cannot read %s (%s); its section is left out", path, e)
        return None
    df = df.replace([np.inf, -np.inf], np.nan)
    rows = [clean({k: (None if (isinstance(v, float) and math.isnan(v)) else v) for k, v in r.items()})
            for r in df.to_dict(orient="records")]
    return [str(c) for c in df.columns], rows


def read_json(path: Path) -> Any:
    """A JSON file, or None (with a warning) when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except Exception as e:
        log.warning("cannot read %s (%s); its section is left out", path, e)
        return None


def read_heads(path: Path) -> HeadTable | None:
    """heads.csv as a HeadTable, with meta from heads.json beside it when present."""
    try:
        table = HeadTable.from_csv(path)
    except Exception as e:
        log.warning("cannot read %s (%s); computing the statistics instead", path, e)
        return None
    js = path.with_name("heads.json")
    if js.is_file():
        data = read_json(js)
        if isinstance(data, dict) and isinstance(data.get("meta"), dict):
            table = table.with_columns(meta=data["meta"])
    return table


def head_index(row: dict[str, Any], n_layers: int, n_heads: int, key: str | None = None) -> tuple[int, int] | None:
    """(layer, head) of a row that has `layer`/`head` ints or a head written `L3H7` (in `key` or `head`)."""
    if key is not None:
        v = row.get(key)
        try:
            lh = parse_head(str(v))
        except HeadscopeError:
            return None
    else:
        layer, head = row.get("layer"), row.get("head")
        if isinstance(head, str):
            try:
                lh = parse_head(head)
            except HeadscopeError:
                return None
        elif isinstance(layer, (int, float)) and isinstance(head, (int, float)):
            lh = (int(layer), int(head))
        else:
            return None
    if 0 <= lh[0] < n_layers and 0 <= lh[1] < n_heads:
        return lh
    return None


def grid_columns(path: Path, n_layers: int, n_heads: int, prefix: str = "") -> dict[str, list]:
    """Numeric per-head columns of a layer,head CSV (e.g. importance.csv) as flat row-major lists."""
    got = read_csv_records(path)
    if got is None:
        return {}
    names, rows = got
    out: dict[str, list] = {}
    numeric = [c for c in names if c not in ("layer", "head") and c.startswith(prefix)
               and all(r.get(c) is None or isinstance(r.get(c), (int, float)) for r in rows)]
    for c in numeric:
        flat: list = [None] * (n_layers * n_heads)
        for r in rows:
            lh = head_index(r, n_layers, n_heads)
            if lh is not None:
                flat[lh[0] * n_heads + lh[1]] = r.get(c)
        out[c] = flat
    return out


def square_matrix(path: Path) -> dict[str, Any] | None:
    """A square CSV matrix with names in the header and first column (rank_correlation.csv)."""
    import pandas as pd

    try:
        df = pd.read_csv(path, index_col=0)
    except Exception as e:
        log.warning("cannot read %s (%s); its section is left out", path, e)
        return None
    return {"names": [str(c) for c in df.columns], "rows": [str(i) for i in df.index],
            "values": clean(df.to_numpy(dtype=float))}


def per_head_from_json(data: Any, n_layers: int, n_heads: int) -> dict[str, dict[str, Any]]:
    """Per-head entries of a JSON document (roles.json), keyed `L3H7`, whatever its exact layout.

    Accepts `{"heads": [{layer, head, ...}]}`, `{"heads": {"L3H7": {...}}}`, a bare list of such rows,
    or `{"L3H7": {...}}` at the top level; everything else is ignored.
    """
    out: dict[str, dict[str, Any]] = {}

    def add(lh: tuple[int, int] | None, rec: Any) -> None:
        if lh is not None and isinstance(rec, dict):
            out.setdefault(f"L{lh[0]}H{lh[1]}", {}).update(
                {k: v for k, v in rec.items() if k not in ("layer", "head", "name")})

    def walk(obj: Any, depth: int = 0) -> None:
        if depth > 2:
            return
        if isinstance(obj, list):
            for r in obj:
                if isinstance(r, dict):
                    lh = head_index(r, n_layers, n_heads)
                    if lh is None and "name" in r:
                        lh = head_index(r, n_layers, n_heads, key="name")
                    add(lh, r)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                try:
                    lh = parse_head(k)
                except HeadscopeError:
                    lh = None
                if lh is not None:
                    add(lh if lh[0] < n_layers and lh[1] < n_heads else None, v)
                elif isinstance(v, (list, dict)) and k not in ("meta",):
                    walk(v, depth + 1)

    walk(data)
    return out
