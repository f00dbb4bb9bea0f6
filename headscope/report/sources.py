"""Finding and reading the files the other verbs wrote, by the names declared in `headscope.artifacts`.

A file is used only when it holds every field its declaration says each such file holds; otherwise
its section shows a note naming the file and the missing fields (and which verb to rerun). Nothing
is guessed: no alternative column names, no searching a JSON document for likely keys.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..artifacts import ARTIFACTS, HEADS_CSV, HEADS_JSON, ROLES_CSV, ROLES_JSON, artifact
from ..errors import HeadscopeError
from ..heads import Head
from ..table import HeadTable, to_jsonable

log = logging.getLogger(__name__)

__all__ = ["MALFORMED", "TEXT_COLUMNS", "Malformed", "Part", "Sources", "Table", "clean", "data_url", "json_beside",
           "no_text_among_numbers", "read_heads", "unreadable", "within"]

READABLE = ("csv", "json", "npz")
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, HeadscopeError)  # a file's content faults
# the per-head columns that hold words; every other one numbers
TEXT_COLUMNS = ("roles", "uncertain_roles")


class Malformed(HeadscopeError):
    """A file's content that its reader cannot use, said in words that follow the file's path."""


def no_text_among_numbers(column: str, cells: Sequence[Any]) -> None:
    """Refuse a column of numbers with text among them (pandas then reads the whole column as text)."""
    def number(v: Any) -> bool:
        try:
            float(v)
        except (TypeError, ValueError):
            return False
        return True

    words = [v for v in cells if not number(v)]
    if words and len(words) < len(cells):
        raise Malformed(f"holds {str(words[0])[:40]!r} in its numeric column {column}")


def within(folder: str | Path, name: str) -> Path | None:
    """`folder / name` when it is a file that really lies in `folder`; None when it is absent or a symlink (or a
    path through a symlinked subfolder) leading out of `folder`: a folder someone sent you cannot make headscope
    open files elsewhere."""
    path = Path(folder) / name
    try:
        if not path.is_file():
            return None
        path.resolve(strict=True).relative_to(Path(folder).resolve(strict=True))
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop on Python 3.10-3.12
        return None
    return path


def leads_out(folder: str | Path, name: str) -> bool:
    """Whether `folder / name` is a symlink (or lies under one) whose target is outside `folder`."""
    path = Path(folder) / name
    return (path.is_symlink() or path.exists()) and within(folder, name) is None and not path.is_dir()


def unreadable(e: BaseException) -> str:
    """Why a file could not be read, in a few words (an OSError's own sentence, without the path again)."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {str(e)[:200]}" if not isinstance(e, ValueError) else str(e)[:200]


def clean(v: Any) -> Any:
    """A JSON-ready value: numpy scalars to Python, NaN/inf to None, floats rounded to 5 significant digits."""
    return to_jsonable(v, digits=5)


def data_url(png: bytes) -> str:
    """PNG bytes as a data: URL the page can show without loading anything."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@dataclass
class Table:
    """A declared CSV file's columns and rows (JSON-ready values, None for empty cells)."""

    path: Path
    columns: list[str]
    rows: list[dict[str, Any]]


# Where generic panels go: after each question's own sections, or in "about" (the page's end).
PANEL_PLACES = ("q1", "q2", "q3", "about")


@dataclass
class Part:
    """What one section adds to the page: its data, sentences per question, notes and figures."""

    data: dict[str, Any] = field(default_factory=dict)
    text: dict[str, list[str]] = field(default_factory=dict)  # "q1" | "q2" | "q3" -> sentences
    missing: dict[str, str] = field(default_factory=dict)  # page key -> why the section is empty
    plots: list[str] = field(default_factory=list)  # figure files written beside the page
    panels: list[dict[str, Any]] = field(default_factory=list)  # generic panels, see `panel`

    def say(self, question: str, *sentences: str) -> None:
        """Add plain-language sentences to a question's summary."""
        self.text.setdefault(question, []).extend(sentences)

    def panel(self, question: str, title: str, columns: Sequence[str] = (), rows: Sequence[Any] = (),
              text: Sequence[str] = (), plot: str | None = None, note: str | None = None) -> None:
        """Add a panel the page draws at the end of `question` ("q1" | "q2" | "q3" | "about") with no
        page code of its own: a title, sentences, an optional figure (a data: URL) and a table of `rows`
        (dicts keyed by `columns`, or lists in their order). `note` stands in for an empty panel, saying
        which verb to run. A new report section needs only its module and a line in `build.collect`."""
        if question not in PANEL_PLACES:
            raise ValueError(f"panel place {question!r}; use one of {', '.join(PANEL_PLACES)}")
        rows = [dict(zip(columns, r, strict=True)) if not isinstance(r, dict) else r for r in rows]
        self.panels.append({"place": question, "title": title, "text": list(text), "plot": plot,
                            "columns": list(columns), "rows": clean(rows), "note": note})


@dataclass
class Sources:
    """Where each declared file was found (first match over the search directories), and what was
    wrong with the ones that could not be used."""

    dirs: list[Path]
    found: dict[str, Path] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # file name -> note naming the file and the fault
    touched: list[str] = field(default_factory=list)  # declared names read since `touched` was last cleared

    @classmethod
    def scan(cls, dirs: Sequence[str | Path]) -> Sources:
        """Look for every declared file in `dirs`, earlier directories winning."""
        paths: list[Path] = []
        for d in dirs:
            p = Path(d)
            if p not in paths:
                paths.append(p)
        found: dict[str, Path] = {}
        problems: dict[str, str] = {}
        for name, art in ARTIFACTS.items():
            if art.kind not in READABLE:
                continue
            for d in paths:
                # the first folder holding the name owns it: refused, never opened
                if leads_out(d, name):
                    problems[name] = (f"{d / name} leads outside {str(d)!r} (a symlink); headscope reads only files "
                                      f"inside the folders given: copy the file in instead")
                    log.warning("%s", problems[name])
                    break
                if within(d, name) is not None:
                    found[name] = d / name
                    break
        return cls(paths, found, problems)

    def get(self, name: str) -> Path | None:
        """The path of declared file `name`, or None when no directory holds it."""
        if name in self.found:
            self.touched.append(name)
        return self.found.get(name)

    def fault(self, name: str, what: str, remedy: str | None = None, path: Path | None = None) -> None:
        """Record (and log) that found file `name` cannot be used, e.g. "lacks the declared column x"; `remedy`
        replaces the default "rerun the verb that writes it". `path`: one of several files of that name (each
        comparison's compare.csv), recorded under its path instead of the name."""
        verb = artifact(name).verb
        note = f"{path or self.found[name]} {what}; {remedy or f'rerun `headscope {verb}` to rewrite it'}"
        log.warning("%s", note)
        self.problems[name if path is None else str(path)] = note

    def cannot_read(self, name: str, e: BaseException, path: Path | None = None) -> None:
        """Record that found file `name` could not be read: a permission or disk fault (the user's to fix), or
        content that does not parse (rerun its verb)."""
        if isinstance(e, OSError):
            self.fault(name, f"cannot be read ({unreadable(e)})", "give a file this user can read (check its "
                                                                  "permissions, e.g. chmod u+r, or its owner)", path)
        else:
            self.fault(name, f"cannot be read ({unreadable(e)})", path=path)

    def lacks(self, name: str, present: Sequence[str], path: Path | None = None) -> bool:
        """Record a note and return True when the file lacks fields its declaration requires."""
        missing = artifact(name).missing(present)
        if missing:
            self.fault(name, f"lacks the declared {'column' if artifact(name).kind == 'csv' else 'key'}"
                              f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                              f"(see headscope.artifacts)", path=path)
        return bool(missing)

    def csv(self, name: str) -> Table | None:
        """Declared CSV `name` as a Table; None when absent, unreadable or lacking declared columns."""
        path = self.get(name)
        return None if path is None else self.table(name, path)

    def table(self, name: str, path: Path, one_of_several: bool = False) -> Table | None:
        """The CSV at `path`, declared as `name`, as a Table; None (and a note) when unreadable or lacking
        declared columns. `one_of_several`: a fault is recorded under the path (`fault`)."""
        at = path if one_of_several else None
        try:
            df = pd.read_csv(path, keep_default_na=True)
        except Exception as e:
            # a half-written or foreign file must not break the whole report
            self.cannot_read(name, e, at)
            return None
        columns = [str(c) for c in df.columns]
        if self.lacks(name, columns, at):
            return None
        df = df.replace([np.inf, -np.inf], np.nan)
        rows = [clean({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
                for r in df.to_dict(orient="records")]
        return Table(path, columns, rows)

    def matrix(self, name: str) -> dict[str, Any] | None:
        """A square CSV matrix whose first column and header name the rows (rank_correlation.csv)."""
        path = self.get(name)
        if path is None:
            return None
        try:
            df = pd.read_csv(path, index_col=0)
        except Exception as e:
            self.cannot_read(name, e)
            return None
        if list(map(str, df.columns)) != list(map(str, df.index)):
            self.fault(name, "is not a square matrix with the same names on both axes")
            return None
        try:
            values = df.to_numpy(dtype=float)
        except ValueError as e:
            self.fault(name, f"holds a value that is not a number ({e})")
            return None
        return {"names": [str(c) for c in df.columns], "rows": [str(i) for i in df.index], "values": clean(values)}

    def json(self, name: str) -> dict[str, Any] | None:
        """Declared JSON `name`; None when absent, unreadable, not an object or lacking declared keys."""
        path = self.get(name)
        if path is None:
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:
            self.cannot_read(name, e)
            return None
        if not isinstance(data, dict):
            self.fault(name, f"holds a JSON {type(data).__name__}, not an object")
            return None
        return None if self.lacks(name, list(data)) else data

    def npz(self, name: str) -> dict[str, np.ndarray] | None:
        """Declared .npz `name` as arrays; None when absent, unreadable or lacking declared arrays."""
        path = self.get(name)
        if path is None:
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:
            self.cannot_read(name, e)
            return None
        return None if self.lacks(name, list(arrays)) else arrays

    def note(self, *names: str) -> str:
        """Why a section reading `names` is empty: the first file's fault, or which verb to run."""
        for n in names:
            if n in self.problems:
                return self.problems[n]
        verbs: list[str] = []
        for n in names:
            v = artifact(n).verb
            if v not in verbs:
                verbs.append(v)
        return "not run yet: run " + " and ".join(f"`headscope {v}`" for v in verbs) + f" (no {', '.join(names)})"


def read_heads(src: Sources) -> HeadTable | None:
    """heads.csv (analyze) as a HeadTable, meta from heads.json beside it; without a usable one, roles.csv (the
    same statistics on the roles passages, plus the role columns) and roles.json's provenance.
    None when neither is present and usable (each unusable file is named in `src.problems`)."""
    for name in (HEADS_CSV.name, ROLES_CSV.name):
        path = src.get(name)
        if path is None:
            continue
        try:
            table = HeadTable.from_csv(path)
            for col in table.columns:
                if col not in TEXT_COLUMNS and np.asarray(table[col]).dtype.kind == "O":
                    no_text_among_numbers(col, [v for v in np.asarray(table[col]).ravel() if not pd.isna(v)])
        except Malformed as e:
            src.fault(name, str(e))
            continue
        except Exception as e:
            # a half-written, unreadable or foreign file: named, and the next one tried
            src.cannot_read(name, e)
            continue
        if src.lacks(name, ["layer", "head", *table.columns]):
            continue
        return _with_meta(src, name, path, table)
    return None


def json_beside(src: Sources, path: Path, name: str) -> Any:
    """The JSON document `name` beside `path` (only when it really lies in that folder), or None when it is
    absent or unreadable: it only labels the numbers, which are in the CSV."""
    js = within(path.parent, name)
    if js is None:
        return None
    try:
        return json.loads(js.read_text(encoding="utf-8"))
    except Exception as e:
        log.warning("cannot read %s (%s); the report shows %s without it", js, unreadable(e), path.name)
        return None


def _with_meta(src: Sources, name: str, path: Path, table: HeadTable) -> HeadTable:
    if name == ROLES_CSV.name:
        doc = json_beside(src, path, ROLES_JSON.name)
        prov = doc.get("provenance") if isinstance(doc, dict) else None
        prov = prov if isinstance(prov, dict) else None
        check_grid(path, table, prov)
        meta = {"provenance": prov, "source_file": str(path)} if prov else {"source_file": str(path)}
        return table.with_columns(meta=meta)
    data = json_beside(src, path, HEADS_JSON.name)
    if isinstance(data, dict) and isinstance(data.get("meta"), dict):
        check_grid(path, table, data["meta"].get("provenance"))
        check_same_run(path, table, path.with_name(HEADS_JSON.name), data)
        table = table.with_columns(meta=data["meta"])
    return with_roles(src, table)


def with_roles(src: Sources, table: HeadTable) -> HeadTable:
    """heads.csv's table plus the columns only roles.csv has (the role labels, offset masses, ...), so a
    folder holding both, as a study's does, shows roles. roles.csv's own statistics are measured on other
    passages: where both files have a column, heads.csv's value stays."""
    path = src.get(ROLES_CSV.name)
    if path is None:
        return table
    try:
        roles = HeadTable.from_csv(path)
    except Exception as e:
        # a half-written, unreadable or foreign file: named; the heads stay
        src.cannot_read(ROLES_CSV.name, e)
        return table
    if (roles.n_layers, roles.n_heads) != (table.n_layers, table.n_heads):
        src.fault(ROLES_CSV.name, f"is for {roles.n_layers} layers x {roles.n_heads} heads, not the "
                                  f"{table.n_layers} x {table.n_heads} of {HEADS_CSV.name}")
        return table
    extra = {c: roles[c] for c in roles.columns if c not in table}
    return table.with_columns(extra) if extra else table


def check_grid(path: Path, table: HeadTable, prov: Any) -> None:
    """Refuse a per-head table whose rows do not cover the heads of the model its provenance names (a file cut
    at a line boundary still parses, as a smaller model)."""
    model = prov.get("model") if isinstance(prov, dict) else None
    shape = model.get("shape") if isinstance(model, dict) else None
    if not isinstance(shape, dict) or not {"n_layers", "n_heads"} <= set(shape):
        return
    if (table.n_layers, table.n_heads) != (shape["n_layers"], shape["n_heads"]):
        raise HeadscopeError(
            f"{path} has rows for {table.n_layers} layers x {table.n_heads} heads, but the model it records "
            f"({prov['model'].get('name', '?')}) has {shape['n_layers']} x {shape['n_heads']}: the file is cut or "
            f"edited; rerun the verb that wrote it")


def check_same_run(path: Path, table: HeadTable, js: Path, data: dict[str, Any]) -> None:
    """Refuse a heads.csv whose numbers are not those of the heads.json beside it (files of two runs)."""
    try:
        other = HeadTable.from_json(json.dumps(data))
    except (KeyError, ValueError, TypeError) as e:
        raise HeadscopeError(f"{js} does not read as a heads table ({type(e).__name__}: {e}); rerun analyze") from None
    if (other.n_layers, other.n_heads) != (table.n_layers, table.n_heads):
        raise HeadscopeError(f"{path} has {table.n_layers} x {table.n_heads} heads but {js.name} beside it has "
                             f"{other.n_layers} x {other.n_heads}: they are not one run's files; rerun analyze")
    for col in table.columns:
        if col not in other.columns or table[col].dtype.kind != "f":
            continue
        a, b = np.asarray(table[col], float), np.asarray(other[col], float)
        # The CSV keeps six significant digits; the JSON full precision.
        bad = ~((np.isnan(a) & np.isnan(b)) | np.isclose(a, b, rtol=2e-5, atol=1e-12))
        if bad.any():
            l, h = (int(i) for i in np.argwhere(bad)[0])
            raise HeadscopeError(f"{path} and {js.name} beside it are from different runs ({col} of {Head(l, h)}: "
                                 f"{a[l, h]:.6g} vs {b[l, h]:.6g}); rerun analyze to write both")
