"""HeadTable: the one record that flows through headscope.

Columns are `[n_layers, n_heads]` float arrays keyed by snake_case names; `meta` holds what the
numbers came from (model, data, tokens seen, seed, versions). Each stage reads the columns it
needs and returns a new table with its own columns added; inputs are never modified in place.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from .errors import HeadscopeError, did_you_mean
from .heads import Head
from .io import atomic_write_text, csv_text

if TYPE_CHECKING:
    import pandas as pd

KEY_COLUMNS = ("layer", "head")


def head_name(layer: int, head: int) -> str:
    """A head written as text: `L3H7` (`str(Head(layer, head))`; `headscope.heads` holds the one formatter)."""
    return Head(layer, head).name


def parse_head(text: str) -> Head:
    """Parse `L3H7` (case-insensitive) into `Head(3, 7)`, which is the tuple `(3, 7)` (`Head.parse`)."""
    return Head.parse(text)


@dataclass
class HeadTable:
    """Per-(layer, head) columns plus metadata."""

    n_layers: int
    n_heads: int
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cols = {}
        for name, values in self.columns.items():
            cols[name] = self._checked(name, values)
        self.columns = cols

    def _checked(self, name: str, values: Any) -> np.ndarray:
        if name in KEY_COLUMNS:
            raise HeadscopeError(f"column name {name!r} is reserved for the row keys")
        arr = np.asarray(values)
        if arr.dtype.kind not in "fiub":
            arr = arr.astype(object)
        elif arr.dtype.kind != "f":
            arr = arr.astype(np.float64)
        if arr.shape != (self.n_layers, self.n_heads):
            raise HeadscopeError(
                f"column {name!r} has shape {arr.shape}; a HeadTable column must be "
                f"[n_layers, n_heads] = ({self.n_layers}, {self.n_heads})"
            )
        return arr

    # --- access --------------------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(
                f"no column {name!r}{did_you_mean(name, self.columns)}; columns: {', '.join(self.columns)}"
            ) from None

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def heads(self) -> Iterator[Head]:
        """Every head, `Head(layer, head)`, in row order (layer, then head)."""
        for layer in range(self.n_layers):
            for head in range(self.n_heads):
                yield Head(layer, head)

    def with_columns(self, columns: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None,
                     **more: Any) -> "HeadTable":
        """A new table with columns added or replaced (and meta updated); `self` is unchanged."""
        cols = dict(self.columns)
        cols.update(columns or {})
        cols.update(more)
        return HeadTable(self.n_layers, self.n_heads, cols, {**self.meta, **(meta or {})})

    def top(self, column: str, k: int = 5, largest: bool = True) -> list[tuple[int, int, float]]:
        """The k heads with the largest (or smallest) value of a numeric column, NaNs last."""
        values = self[column].astype(float)
        order = np.argsort(np.where(np.isnan(values), -np.inf if largest else np.inf, values), axis=None)
        if largest:
            order = order[::-1]
        return [(int(i // self.n_heads), int(i % self.n_heads), float(values.flat[i])) for i in order[:k]]

    # --- conversion ----------------------------------------------------------------------
    def to_records(self) -> list[dict[str, Any]]:
        """One dict per head, keys `layer`, `head`, then the columns."""
        rows = []
        for layer, head in self.heads():
            row: dict[str, Any] = {"layer": layer, "head": head}
            for name, arr in self.columns.items():
                v = arr[layer, head]
                row[name] = v.item() if hasattr(v, "item") else v
            rows.append(row)
        return rows

    def to_pandas(self) -> pd.DataFrame:
        """A DataFrame, one row per head sorted by layer then head."""
        import pandas as pd  # optional export; pandas costs ~0.5 s to import

        return pd.DataFrame.from_records(self.to_records(), columns=[*KEY_COLUMNS, *self.columns])

    @classmethod
    def from_pandas(cls, df: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> "HeadTable":
        """Build a table from a DataFrame with `layer` and `head` columns."""
        missing = [k for k in KEY_COLUMNS if k not in df.columns]
        if missing:
            raise HeadscopeError(f"table is missing the key column(s) {missing}; heads.csv starts with layer,head")
        n_layers = int(df["layer"].max()) + 1
        n_heads = int(df["head"].max()) + 1
        if len(df) != n_layers * n_heads:
            raise HeadscopeError(f"table has {len(df)} rows; expected n_layers*n_heads = {n_layers * n_heads}")
        dup = df.duplicated(list(KEY_COLUMNS))
        if dup.any() or int(df["layer"].min()) < 0 or int(df["head"].min()) < 0:
            row = df[dup].iloc[0] if dup.any() else df.iloc[0]
            raise HeadscopeError(f"table lists head {Head(int(row['layer']), int(row['head']))} twice or a negative "
                                 f"index; every (layer, head) of the grid must appear once")
        df = df.sort_values(list(KEY_COLUMNS))
        cols = {}
        for name in df.columns:
            if name in KEY_COLUMNS:
                continue
            values = df[name].to_numpy()
            if values.dtype.kind == "O":
                values = np.array(["" if (isinstance(v, float) and math.isnan(v)) else v for v in values],
                                  dtype=object)
            cols[name] = values.reshape(n_layers, n_heads)
        return cls(n_layers, n_heads, cols, dict(meta or {}))

    def to_csv(self, path: str | Path | None = None) -> str:
        """heads.csv: one row per head, first columns `layer,head`; written atomically if `path`.
        Cells as every headscope CSV writes them (`headscope.io.csv_text`)."""
        text = csv_text(self.to_records(), [*KEY_COLUMNS, *self.columns])
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_csv(cls, path: str | Path) -> "HeadTable":
        """Read a heads.csv written by `to_csv` (or any tool following its contract)."""
        import pandas as pd  # optional export; pandas costs ~0.5 s to import

        return cls.from_pandas(pd.read_csv(path, keep_default_na=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: `meta`, `columns` (names), `rows` (one dict per head)."""
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "meta": self.meta,
                "columns": list(self.columns), "rows": self.to_records()}

    def to_json(self, path: str | Path | None = None) -> str:
        """heads.json: the table plus metadata; NaN becomes null. Written atomically if `path`."""
        text = json.dumps(to_jsonable(self.to_dict()), indent=1, allow_nan=False)
        if path is not None:
            atomic_write_text(path, text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | Path) -> "HeadTable":
        """Read heads.json (a path, or the JSON text itself)."""
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            text = Path(path_or_text).read_text(encoding="utf-8")
        data = json.loads(text)
        n_layers, n_heads = int(data["n_layers"]), int(data["n_heads"])
        cols: dict[str, np.ndarray] = {}
        for name in data["columns"]:
            flat = [r[name] for r in data["rows"]]
            numeric = all(v is None or isinstance(v, (int, float)) for v in flat)
            arr = np.array([np.nan if v is None else v for v in flat], dtype=float if numeric else object)
            cols[name] = arr.reshape(n_layers, n_heads)
        return cls(n_layers, n_heads, cols, data.get("meta", {}))


def to_jsonable(obj: Any, digits: int | None = None) -> Any:
    """Turn numpy values and NaN/inf into plain JSON values (NaN -> null), recursively; with
    `digits`, floats are rounded to that many significant digits (smaller files)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, digits) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist(), digits)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        return float(f"{obj:.{digits}g}") if digits is not None else obj
    return obj


def fmt(v: float, width: int = 5) -> str:
    """A number with two decimals in `width` characters; NaN or None as a dash."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    return f"{v:{width}.2f}"


def grid(table: HeadTable, column: str, title: str) -> str:
    """A layers x heads grid of one column as text."""
    values = table[column]
    lines = [f"{title} ({column})", "layer " + "".join(f"{'H' + str(h):>6}" for h in range(table.n_heads))]
    for layer in range(table.n_layers):
        lines.append(f"L{layer:<4} " + "".join(" " + fmt(float(v)) for v in np.asarray(values[layer], float)))
    return "\n".join(lines)
