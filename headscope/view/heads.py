"""The per-head evidence beside the live maps: what analyze, roles, score, kvcache and patch measured.

Files are found and read by their declared names (`headscope.artifacts`, through the report's `Sources`)
in the --from folders, earlier folders winning, a study folder like any other. Each file's numbers come
with the command that produced it, rebuilt from its provenance record. A file written for another model
is refused by name (`provenance.check_made_for`); rows outside the served model's heads are refused too.
"""

from __future__ import annotations

import copy
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import (
    EDGES_CSV,
    HEADS_CSV,
    IMPORTANCE_CSV,
    KVCACHE_JSON,
    PATCHING_CSV,
    PATHS_CSV,
    ROLES_CSV,
    ROLES_JSON,
    artifact,
)
from ..capacity.options import KvcacheOptions
from ..errors import HeadscopeError
from ..heads import Head, KVGroup, read_node, split_heads
from ..learned.options import AnalyzeOptions, RolesOptions
from ..learned.roles.registry import resolve
from ..models.adapter import HeadModel
from ..options import Options, spec_of
from ..provenance import check_made_for, recorded_for
from ..redundancy.options import ScoreOptions
from ..report.sources import (
    MALFORMED,
    TEXT_COLUMNS,
    Sources,
    Table,
    clean,
    no_text_among_numbers,
    read_heads,
    unreadable,
)
from .card_schema import (
    Edge,
    EdgeLists,
    HeadsTable,
    KvChoice,
    Measure,
    Patching,
    PathEntry,
    RoleDetail,
    Source,
    Statistic,
    to_json,
)

__all__ = ["command_of", "heads_table"]

# The Options class of each verb whose files the view reads: a provenance record keeps option values by field
# name, and the command line spells them as that class's flags; values equal to their defaults are left out.
_VERB_OPTIONS: dict[str, type[Options]] = {"analyze": AnalyzeOptions, "roles": RolesOptions, "score": ScoreOptions,
                                           "kvcache": KvcacheOptions}
_SKIP_OPTIONS = ("model", "from_command_line")
# the strongest paths a head card lists (out of it and into it)
PATHS_PER_HEAD = 3
# the strongest circuit edges a head card lists, out of it and into it (each)
EDGES_PER_HEAD = 3


def _defaults(cls: type[Options] | None) -> dict[str, Any]:
    if cls is None:
        return {}
    out = {}
    for f in fields(cls):
        if f.default is not MISSING:
            out[f.name] = list(f.default) if isinstance(f.default, tuple) else f.default
    return out


def command_of(rec: Mapping[str, Any] | None) -> str | None:
    """The command line a provenance record describes (verb, model, every option not at its default), or None."""
    if not rec or not rec.get("verb"):
        return None
    model = rec.get("model") or {}
    verb = str(rec["verb"])
    cls = _VERB_OPTIONS.get(verb.split()[0])
    flags, defaults = (cls.flags() if cls is not None else {}), _defaults(cls)
    repeated = {f.name for f in fields(cls) if (spec := spec_of(f)) is not None and spec.append} if cls else set()
    source = str(model.get("source") or model.get("name") or "MODEL")
    # a built-in model is named on the command line by its name alone
    source = source.removeprefix("builtin:")
    parts = ["headscope", *verb.split(), source]
    for k, v in sorted((rec.get("options") or {}).items()):
        if k in _SKIP_OPTIONS or v is None or v is False or v == [] or (k in defaults and defaults[k] == v):
            continue
        flag = flags.get(k) or "--" + k.replace("_", "-")
        if v is True:
            parts.append(flag)
        elif isinstance(v, list) and (k in repeated or cls is None):
            for item in v:  # a repeatable option: --from A --from B
                parts += [flag, str(item)]
        elif isinstance(v, list):  # a list given as one comma-separated value: --method a,b
            parts += [flag, ",".join(map(str, v))]
        else:
            parts += [flag, str(v)]
    return " ".join(shlex.quote(p) for p in parts)


def _source(path: Path) -> Source:
    found = recorded_for(path)
    rec = found[1] if found else None
    return Source(file=path.name, folder=str(path.parent), verb=(rec or {}).get("verb") or artifact(path.name).verb,
                  command=command_of(rec), data=(rec or {}).get("data"))


def _flat(n_layers: int, n_heads: int) -> list[Any]:
    return [None] * (n_layers * n_heads)


def _grid(table: Table, column: str, n_layers: int, n_heads: int) -> list[Any]:
    """A CSV column as a flat row-major list over the served model's heads (None where absent)."""
    out = _flat(n_layers, n_heads)
    numbers = column not in TEXT_COLUMNS
    for name in ("layer", "head", *([column] if numbers else [])):
        no_text_among_numbers(name, [r[name] for r in table.rows if r.get(name) is not None])
    for i, r in enumerate(table.rows):
        l, h = r.get("layer"), r.get("head")
        if not isinstance(l, int) or not isinstance(h, int) or isinstance(l, bool) or isinstance(h, bool):
            raise HeadscopeError(f"has layer {l!r}, head {h!r} on line {i + 2}, not head numbers")
        if not (0 <= l < n_layers and 0 <= h < n_heads):
            raise HeadscopeError(f"has a row for layer {l}, head {h}, outside the served model's {n_layers} x "
                                 f"{n_heads} heads (written for another model?)")
        v = r.get(column)
        if numbers and v is not None and _number(v) is None:
            raise HeadscopeError(f"holds {str(v)[:40]!r} on line {i + 2} of its numeric column {column}")
        out[l * n_heads + h] = v
    return out


def _bounds(table: Table, column: str, n_layers: int, n_heads: int) -> dict[str, list[Any] | None]:
    """A column's lower and upper bounds over the heads (None where the file has no such column)."""
    return {side: _grid(table, f"{column}_{side}", n_layers, n_heads) if f"{column}_{side}" in table.columns
            else None for side in ("lo", "hi")}


def _number(v: Any) -> float | None:
    """A finite number of a table cell (rows hold JSON-ready values), else None."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _rank(values: Sequence[Any]) -> list[int | None]:
    """Rank 1 = the largest value (the most important head); None for a missing value."""
    v = np.array([np.nan if x is None else float(x) for x in values])
    order = np.argsort(-np.where(np.isnan(v), -np.inf, v), kind="stable")
    ranks: list[int | None] = [None] * len(v)
    for r, i in enumerate(order):
        if not math.isnan(v[i]):
            ranks[int(i)] = r + 1
    return ranks


def _statistics(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    table = read_heads(src)
    if table is None:
        return
    # read_heads falls back to roles.csv when heads.csv is absent or unusable
    name = HEADS_CSV.name if HEADS_CSV.name in src.found and HEADS_CSV.name not in src.problems else ROLES_CSV.name
    src.touched.append(name)
    out.sources["statistics"] = _source(src.found[name])
    if (table.n_layers, table.n_heads) != (n_layers, n_heads):
        raise HeadscopeError(f"has {table.n_layers} x {table.n_heads} heads; the served model has {n_layers} x "
                             f"{n_heads} (written for another model?)")
    for col, arr in table.columns.items():
        a = np.asarray(arr)
        if a.dtype.kind == "f" and not col.endswith(("_lo", "_hi")):
            bounds = {side: clean(np.asarray(table[f"{col}_{side}"], float).ravel().tolist())
                      if f"{col}_{side}" in table.columns else None for side in ("lo", "hi")}
            out.statistics[col] = Statistic(values=clean(a.ravel().tolist()), meaning=ROLES_CSV.meaning(col), **bounds)


def _roles(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    table = src.csv(ROLES_CSV.name)
    if table is None:
        return
    out.sources["roles"] = _source(table.path)
    out.roles = [str(v or "") for v in _grid(table, "roles", n_layers, n_heads)]
    out.uncertain = [str(v or "") for v in _grid(table, "uncertain_roles", n_layers, n_heads)]
    doc = src.json(ROLES_JSON.name) or {}
    detail: dict[str, list[RoleDetail]] = {}
    census = doc.get("census")
    for role, entries in (census.items() if isinstance(census, dict) else ()):
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, dict) and isinstance(e.get("head"), str):
                detail.setdefault(e["head"], []).append(RoleDetail(**clean({"role": str(role), **{
                    k: e.get(k) for k in ("score", "lo", "hi", "baseline", "held_share")}, **_direction(str(role))})))
    out.role_detail = detail


def _direction(role: str) -> dict[str, Any]:
    """The role's meaning and which way its score is better (`local`'s mean distance: lower), from the registry."""
    found = resolve(role)
    return {} if found is None else {"help": found[0].help, "higher_is_better": bool(found[0].higher_is_better)}


def _importance(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    table = src.csv(IMPORTANCE_CSV.name)
    if table is None:
        return
    out.sources["importance"] = _source(table.path)
    for col in IMPORTANCE_CSV.members("importance_<method>", table.columns):
        values = _grid(table, col, n_layers, n_heads)
        out.importance[col.removeprefix("importance_")] = Measure(values=values, rank=_rank(values),
                                                                  **_bounds(table, col, n_layers, n_heads))


def _kvcache(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    doc = src.json(KVCACHE_JSON.name)
    if doc is None:
        return
    out.sources["kvcache"] = _source(src.found[KVCACHE_JSON.name])
    n_kv = doc.get("n_kv_heads")
    if not isinstance(n_kv, int) or n_kv < 1 or n_heads % n_kv:
        src.fault(KVCACHE_JSON.name, f"records n_kv_heads {n_kv!r}, which does not divide {n_heads} query heads")
        return
    group = n_heads // n_kv
    rows = doc.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise HeadscopeError("holds rows that are not a list of objects (one per method and budget)")
    for row in rows:
        full = row.get("full_heads")
        if row.get("method") == "full" or not isinstance(full, list) or len(full) != n_layers:
            continue
        kept = [bool(isinstance(f, list) and (h // group) in f) for f in full for h in range(n_heads)]
        budget = row.get("budget")
        how = f" by {row['chosen_by']}" if row.get("chosen_by") else ""
        label = f"{row.get('method')}{how}, {budget:.0%} of KV heads full" if isinstance(budget, (int, float)) \
            else f"{row.get('method')}{how}"
        out.kvcache.append(KvChoice(label=label, full=kept, window=_tokens(row, "window"), sink=_tokens(row, "sink")))


def _tokens(row: Mapping[str, Any], key: str) -> int | None:
    """A kvcache row's token count (its window or sink); None where the row has none or holds NaN or inf."""
    v = clean(row.get(key))
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise HeadscopeError(f"holds {key} {str(v)[:40]!r} in a row, not a number of tokens")
    return int(v)


def _patching(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    """Each head's exact patching effect, or its attribution estimate where the run had no exact scan."""
    table = src.csv(PATCHING_CSV.name)
    if table is None:
        return
    measure = "effect" if "effect" in table.columns else "attribution"
    out.sources["patching"] = _source(table.path)
    out.patching = Patching(values=_grid(table, measure, n_layers, n_heads), measure=measure,
                            **_bounds(table, measure, n_layers, n_heads))


def _paths(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    """Per head, its strongest paths (paths.csv) out of it and into it, by |effect|: {"L3H2": [path, ...]}."""
    table = src.csv(PATHS_CSV.name)
    if table is None:
        return
    out.sources["paths"] = _source(table.path)
    rows = []
    for r in table.rows:
        effect = _number(r.get("effect"))
        if effect is not None:
            rows.append(PathEntry(**clean({"sender": str(r.get("sender")), "receiver": str(r.get("receiver")),
                                           "via": str(r.get("via")), "effect": effect,
                                           "lo": _number(r.get("effect_lo")), "hi": _number(r.get("effect_hi"))})))
    rows.sort(key=lambda p: -abs(p.effect))
    per: dict[str, list[PathEntry]] = {}
    for p in rows:
        ends = {*(split_heads(p.sender) or ()), Head.read(p.receiver)} - {None}  # a sender may be several heads
        for name in {str(head) for head in ends}:
            if len(per.setdefault(name, [])) < PATHS_PER_HEAD:
                per[name].append(p)
    out.paths = per


def _edges(src: Sources, out: HeadsTable, n_layers: int, n_heads: int) -> None:
    """Per head, its strongest circuit edges (edges.csv, `headscope circuit`) by |score|: {"L3H2": {"out": [...],
    "in": [...]}}. An edge into a KV group's keys or values (`L3G1.k`) goes into every query head of that group."""
    table = src.csv(EDGES_CSV.name)
    if table is None:
        return
    out.sources["edges"] = _source(table.path)
    rows: list[dict[str, Any]] = []
    groups = 1
    for r in table.rows:
        score = _number(r.get("score"))
        if score is None:
            continue
        edge: dict[str, Any] = {"sender": str(r.get("sender")), "receiver": str(r.get("receiver")), "score": score,
                "lo": _number(r.get("score_lo")), "hi": _number(r.get("score_hi"))}
        node = read_node(edge["receiver"])
        if node is not None and isinstance(node[0], KVGroup):
            groups = max(groups, node[0].kv_head + 1)
        rows.append(edge)
    if n_heads % groups:
        raise ValueError(f"edges.csv names {groups} KV groups, which do not divide {n_heads} query heads")
    size = n_heads // groups
    rows.sort(key=lambda e: -abs(e["score"]))
    per: dict[str, EdgeLists] = {}

    def add(name: str, side: str, edge: dict[str, Any]) -> None:
        lists = per.setdefault(name, EdgeLists())
        chosen = lists.out if side == "out" else lists.incoming
        if len(chosen) < EDGES_PER_HEAD:
            chosen.append(Edge(**clean(edge)))

    for e in rows:
        sender = read_node(e["sender"])
        if sender is not None and isinstance(sender[0], Head):
            add(e["sender"], "out", e)
        receiver = read_node(e["receiver"])
        if receiver is None:
            continue
        unit = receiver[0]
        for head in [unit] if isinstance(unit, Head) else unit.query_heads(size):
            add(head.name, "in", e)
    out.edges = per


def heads_table(hm: HeadModel, dirs: Sequence[str | Path]) -> dict[str, Any]:
    """The per-head evidence in `dirs` for the served model, JSON-ready: every list is flat over
    (layer, head), row-major. Files another model's run wrote are refused, naming the file."""
    if not isinstance(hm, HeadModel):
        raise HeadscopeError(f"hm must be a loaded model (headscope.load_model(...)), got {type(hm).__name__}")
    if isinstance(dirs, (str, bytes, Path)) or not all(isinstance(d, (str, Path)) for d in dirs):
        raise HeadscopeError(f"dirs must be a list of folders, got {dirs!r}")
    for d in dirs:
        if not str(d).strip() or not Path(d).is_dir():
            raise HeadscopeError(f"dirs holds {str(d)!r}, which is not a folder; give folders holding other verbs' "
                                 f"outputs")
    n_layers, n_heads = hm.n_layers, hm.n_heads
    src = Sources.scan(dirs)
    for path in src.found.values():
        check_made_for(path, hm, "--from")
    out = HeadsTable(n_layers=n_layers, n_heads=n_heads, folders=[str(d) for d in src.dirs])
    for part in (_statistics, _roles, _importance, _kvcache, _patching, _paths, _edges):
        _part(part, src, out, n_layers, n_heads)
    out.problems = list(src.problems.values())
    # the JSON the page reads (view/card_schema.py); whatever a file held, nothing that is not JSON (NaN, inf)
    # leaves the server
    return clean(to_json(out))


def _part(part: Callable[[Sources, HeadsTable, int, int], None], src: Sources, out: HeadsTable,
          n_layers: int, n_heads: int) -> None:
    """Add one file's evidence to `out`; a file whose content is malformed is named in `src.problems` and left
    out whole (what it had added is undone), and the other files are served."""
    kept = copy.deepcopy(out)
    src.touched.clear()
    try:
        part(src, out, n_layers, n_heads)
    except MALFORMED as e:
        for f in fields(out):
            setattr(out, f.name, getattr(kept, f.name))
        name = src.touched[-1] if src.touched else part.__name__.strip("_")
        why = str(e) if isinstance(e, HeadscopeError) else f"cannot be read ({unreadable(e)})"
        if name in src.found:
            src.fault(name, why)
        else:
            src.problems[name] = f"{name}: {why}"
