"""`headscope compare` as a library function: what OTHER kept, lost or gained against BASE, row by row, with paired
intervals; writes nothing until the result is saved."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import COMPARE_CSV, COMPARE_ITEMS_NPZ, COMPARE_JSON
from ..capacity.kvcache import CachePlan, check_supported
from ..capacity.kvcache.plans import check_plan_fits
from ..io import atomic_write_bytes, atomic_write_text, csv_text
from ..models.adapter import HeadModel
from ..options import OptionError, Result
from ..options.record import IntervalsUsed, Record
from ..provenance import model_record, provenance
from ..table import to_jsonable
from .cache import plan_record, read_cache, through_cache
from .checks import check_same_tokenizer
from .items import npz_bytes, split
from .options import CompareOptions
from .reuse import read_base, reused_items
from .suite import Row, check_rows_fit, prepare_rows
from .verdict import Change, paired_change


@dataclass
class CompareSettings(Record):
    """compare.json's settings: the tolerance of a verdict, the paired intervals, the rows, OTHER's cache."""

    tolerance: float  # a share of BASE's value
    intervals: IntervalsUsed
    rows: list[str]  # the capabilities, in order
    # the head-aware KV cache OTHER decoded through (None: its own full cache)
    cache: dict[str, Any] | None


@dataclass
class CompareRecord(Record):
    """compare.json: the settings, notes, each row's record (its change, per-item values) and both models."""

    settings: CompareSettings
    notes: list[str]
    # capability -> describe, metric, fingerprint, change, items (base, other)
    rows: dict[str, dict[str, Any]]
    base: dict[str, Any]  # the model's record (name, fingerprint, ...)
    other: dict[str, Any]
    provenance: dict[str, Any]


@dataclass
class CompareResult(Result):
    """compare.csv (one row per capability), compare.json (settings, both models, per-item values) and, when a row
    keeps more than one value per item (the role census's per-head sums), compare_items.npz beside it
    (compare/items.py)."""

    changes: list[Change]
    record: CompareRecord
    base_name: str
    other_name: str

    @property
    def files(self) -> tuple[str, ...]:  # type: ignore[override]
        _, arrays = split(self.record.to_json())
        return (COMPARE_CSV.name, COMPARE_JSON.name, *((COMPARE_ITEMS_NPZ.name,) if arrays else ()))

    def to_pandas(self) -> Any:
        import pandas as pd  # only for this table; pandas costs ~0.5 s to import

        return pd.DataFrame([c.row() for c in self.changes])

    def write(self, folder: Path) -> None:
        atomic_write_text(folder / COMPARE_CSV.name, csv_text([c.row() for c in self.changes]))
        record, arrays = split(self.record.to_json())  # the arrays of more than one value per item, by npz key
        atomic_write_text(folder / COMPARE_JSON.name, json.dumps(to_jsonable(record), indent=1, allow_nan=False) + "\n")
        if arrays:
            atomic_write_bytes(folder / COMPARE_ITEMS_NPZ.name, npz_bytes(arrays))

    def verdict(self, capability: str) -> str:
        """The verdict of one row ('lm', 'induction', 'pairs:ioi', ...)."""
        return self.change(capability).verdict

    def change(self, capability: str) -> Change:
        for c in self.changes:
            if c.capability == capability:
                return c
        raise KeyError(f"no row {capability!r}; rows: {', '.join(c.capability for c in self.changes)}")

    def lines(self) -> list[str]:
        tol = self.record.settings.tolerance
        iv = self.record.settings.intervals
        cache = self.record.settings.cache
        through = "" if not cache else (f" through a head-aware KV cache ({cache['full_kv_heads']} of "
                                        f"{cache['kv_heads']} KV heads full, the others {cache['sink']} sink + "
                                        f"{cache['window']} recent tokens; {cache['pattern']}"
                                        f"{', row ' + cache['row'] if cache.get('row') else ''}"
                                        f"{', reversed' if cache['reversed'] else ''})")
        out = [f"{self.other_name}{through} against {self.base_name} (tolerance {tol:.0%} of BASE's value):"]
        out += [f"  {c.sentence()}" for c in self.changes]
        lost = [c.capability for c in self.changes if c.verdict == "lost"]
        out.append(f"lost: {', '.join(lost)}" if lost else "lost: none of the rows measured")
        out += [f"note: {n}" for n in self.record.notes]
        out.append(f"[lo, hi]: {iv.level:.0%} paired intervals of the change, {iv.method} bootstrap over the "
                   f"items ({iv.B} resamples)")
        return out


def _reused(rows: list[Row], opts: CompareOptions,
            earlier: dict[str, dict[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """BASE's per-item sums of each row an earlier compare (`opts.base_from`) measured on the same items, read (and a
    missing or damaged compare_items.npz refused) before any forward."""
    out = {}
    for row in (r for r in rows if r.reusable):
        got = reused_items(earlier, row.capability, row.fingerprint, row.metric, opts.base_from or "")
        if got is not None:
            out[row.capability] = got
    return out


def _compare_row(row: Row, base: HeadModel, other: HeadModel, opts: CompareOptions, earlier: dict[str, dict[str, Any]],
                 b: dict[str, np.ndarray] | None, plan: CachePlan | None) -> tuple[Change, dict[str, Any]]:
    """One row: BASE's per-item sums `b` (reused) or measured, OTHER's measured, the paired change and the record."""
    t0 = time.perf_counter()
    reused = b is not None
    if reused and row.restore is not None:
        row.restore(earlier[row.capability])
    if b is None:
        b = row.measure(base)
    t1 = time.perf_counter()
    with through_cache(other, plan) if plan is not None else nullcontext():
        o = row.measure(other)
    t2 = time.perf_counter()
    change = paired_change(row.capability, row.metric, row.higher_is_better, base=b, other=o, statistic=row.statistic,
                           settings=opts.intervals(), tolerance=opts.tolerance)
    rec = {**row.describe, "metric": row.metric, "higher_is_better": row.higher_is_better,
           "fingerprint": row.fingerprint, "base_reused_from": opts.base_from if reused else None,
           "needed": change.needed, "seconds": {"base": t1 - t0, "other": t2 - t1},
           "items": {"base": {k: v.tolist() for k, v in b.items()}, "other": {k: v.tolist() for k, v in o.items()}}}
    return change, rec


def compare(base: HeadModel, other: HeadModel, options: CompareOptions | None = None, *, data: Any = None,
            plan: CachePlan | None = None, plan_from: str = "a plan given in Python", lenient: bool = False,
            **changes: Any) -> CompareResult:
    """`headscope compare` on two loaded models: each capability's value in both, the paired change with its
    interval, and the verdict (lost, kept, gained, cannot tell) against `options.tolerance`.

    `data`: the passages of the language-model row (else `options.data`). Keywords override single options:
    `compare(base, other, tasks=("lm", "induction"), items=16)`. The models must share a tokenizer; every row's
    items are prepared (and a bad one refused) before either model runs. `base_from`: the folder of an earlier
    compare against the same BASE, whose BASE measurements are reused on the same items (`reuse`).

    `plan`: OTHER decodes through this head-aware cache (as `options.cache` does from a file; `plan_from` says where
    it came from in compare.json). `lenient`: rows OTHER's family or tokenizer cannot measure are left out with a
    note instead of refused (the compressing verbs' checks, `check`).
    """
    opts = (options or CompareOptions(base=base.name, other=other.name)).replace(**changes)
    if opts.base is None or opts.other is None:
        opts = opts.replace(base=opts.base or base.name, other=opts.other or other.name)
    opts = opts.validate()
    check_same_tokenizer(base, other)
    plan, cache_record = _cache(other, opts, plan, plan_from)
    base_record = model_record(base)
    earlier = read_base(opts.base_from, base, base_record["fingerprint"]) if opts.base_from else {}
    rows, notes = prepare_rows(base, opts, data, cached=plan is not None, lenient=lenient)
    check_rows_fit(rows)
    reused = _reused(rows, opts, earlier)
    got = [_compare_row(r, base, other, opts, earlier, reused.get(r.capability), plan) for r in rows]
    intervals = IntervalsUsed.from_json({**opts.intervals().record(), "resampled": "items (passages, pairs, "
                                         "haystacks) of both models together, with replacement"})
    settings = CompareSettings(tolerance=opts.tolerance, intervals=intervals, rows=[r.capability for r in rows],
                               cache=cache_record)
    record = CompareRecord(settings=settings, notes=notes,
                           rows={c.capability: {**rec, "change": c.row()} for c, rec in got},
                           base=base_record, other=model_record(other),
                           provenance=provenance("compare", base, None, opts.with_only()))
    return CompareResult([c for c, _ in got], record, base.name, other.name)


def _cache(other: HeadModel, opts: CompareOptions, plan: CachePlan | None,
           plan_from: str) -> tuple[CachePlan | None, dict[str, Any] | None]:
    """The head-aware cache OTHER decodes through (given, or read from `opts.cache`) and its record, checked against
    OTHER before any forward; (None, None) for none."""
    if plan is not None and opts.cache is not None:
        raise OptionError("cache", "and a plan given in Python both name OTHER's cache: give one")
    if plan is None and opts.cache is None:
        return None, None
    check_supported(other)
    if plan is not None:
        check_plan_fits(plan, other, plan_from)
        return plan, plan_record(plan, plan_from)
    assert opts.cache is not None
    source = read_cache(opts.cache, opts.cache_row, opts.cache_reversed)
    plan = source.plan(other, opts.keep_full, opts.cache_reversed)
    return plan, source.record(plan, opts.cache_reversed)


def per_item(result: CompareResult, capability: str, model: str = "other") -> dict[str, np.ndarray]:
    """The per-item sums a row was computed from (`model`: 'base' or 'other')."""
    items = result.record.rows[capability]["items"][model]
    return {k: np.asarray(v) for k, v in items.items()}


__all__ = ["CompareResult", "compare", "per_item"]
