"""A kvcache run's caches as plans: each kvcache.json row named, the one a user would ship chosen, and a row turned
back into the `CachePlan` it was measured with (what `compare --cache` and `kvcache --check` run OTHER through).

A row is named by its method and budget: `full`, `score@25%`, `random@25%`, `learned@12.5%`. The row a user would
ship is the score's choice (`score@...`) at the run's first budget (or its threshold); a run with `--choose
learned` and no score row ships its first learned row. Rows after uptraining (`uptrain_steps` > 0) are left out:
their cache is the same plan, but the model that decodes through it is the uptrained copy, which kvcache does not
save, so the plan alone cannot reproduce them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import HeadscopeError, OptionError
from ...io import inside
from ...models.adapter import HeadModel
from .cache import CachePlan

REPORT = "kvcache.json"
NEEDED = ("rows", "n_layers", "n_heads", "n_kv_heads")  # the keys a plan is read from
# the methods a user ships, in the order the default row is looked for
SHIPPED = ("score", "learned")


def row_name(row: dict[str, Any]) -> str:
    """`full`, or the method and its budget: `score@25%`, `random@12.5%`."""
    if row["method"] == "full":
        return "full"
    return f"{row['method']}@{float(row['budget']) * 100:g}%"


def plan_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's rows a plan reproduces (no uptrained row), by name, in the report's order."""
    return {row_name(r): r for r in report["rows"] if not r.get("uptrain_steps")}


def shipped_row(report: dict[str, Any], name: str | None = None, source: str = "kvcache.json") -> dict[str, Any]:
    """The row named `name`, or (None) the one a user would ship: the first score row, else the first learned row.
    A name the report lacks is refused in one line naming the rows it holds."""
    rows = plan_rows(report)
    if name is not None:
        if name not in rows:
            raise OptionError("cache_row", f"{name!r} is no row of {source}; its rows: {', '.join(rows)}",
                              also=("cache",))
        return rows[name]
    for method in SHIPPED:
        for row in rows.values():
            if row["method"] == method:
                return row
    raise HeadscopeError(f"{source} holds no chosen cache (rows: {', '.join(rows) or 'none'}): nothing to ship")


def plan_of_row(report: dict[str, Any], row: dict[str, Any], source: str = "kvcache.json") -> CachePlan:
    """The cache a kvcache.json row was measured with: its full KV heads per layer, its sink and window."""
    try:
        n_kv, n_heads = int(report["n_kv_heads"]), int(report["n_heads"])
        full = tuple(tuple(sorted(int(h) for h in heads)) for heads in row["full_heads"])
        sink, window = int(row["sink"]), int(row["window"])
    except (KeyError, TypeError, ValueError) as e:
        raise OptionError("cache", f"'{source}': row {row_name(row)} holds no readable plan ({type(e).__name__}: "
                                   f"{e})") from None
    return CachePlan(full, n_kv, n_heads // n_kv, sink, window)


def check_plan_fits(plan: CachePlan, hm: HeadModel, source: str) -> None:
    """Refuse a plan whose layers or KV heads are not the model's (before any forward)."""
    if (plan.n_layers, plan.n_kv_heads, plan.group_size) != (hm.n_layers, hm.n_kv_heads, hm.group_size):
        raise HeadscopeError(f"{source} is a plan for {plan.n_layers} layers x {plan.n_kv_heads} KV heads "
                             f"({plan.group_size} query heads each); {hm.name} has {hm.n_layers} layers x "
                             f"{hm.n_kv_heads} KV heads ({hm.group_size} query heads each)")


def read_report(path: str | Path) -> tuple[dict[str, Any], str]:
    """A kvcache run's kvcache.json (given as the file or its --out folder) and the path it was read from."""
    p = Path(path)
    # a folder someone sent cannot point the read elsewhere: its kvcache.json stays inside it
    file = inside(p, REPORT, str(p), "give the kvcache run's own folder", fields=("cache",)) if p.is_dir() else p
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise OptionError("cache", f"'{file}': cannot read a kvcache plan ({type(e).__name__}: {e})") from None
    if not isinstance(report, dict) or any(k not in report for k in NEEDED):
        raise OptionError("cache", f"'{file}' is no kvcache.json: it needs {', '.join(NEEDED)} (what headscope "
                                   f"kvcache writes)")
    return report, str(file)


def is_report(path: str | Path) -> bool:
    """Whether `path` is a kvcache --out folder (holding kvcache.json) or a kvcache.json itself."""
    p = Path(path)
    return (p / REPORT).is_file() if p.is_dir() else p.name == REPORT or p.suffix == ".json"


__all__ = ["REPORT", "check_plan_fits", "is_report", "plan_of_row", "plan_rows", "read_report", "row_name",
           "shipped_row"]
