"""One patching run: exact and/or attribution patching, DLA, their intervals and agreement, as a HeadTable
(patching.csv), an optional per-position array (patching_positions.csv) and the record patching.json holds."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ...heads import Head
from ...models.adapter import HeadModel
from ...table import HeadTable, to_jsonable
from ...uncertainty import Interval, IntervalSettings, PassageSums, bootstrap, mean_of
from .attribution import agreement, attribution_scan
from .composition import composition, top_pairs
from .dla import dla_interval, dla_values
from .pairs import PairBatch
from .patching import Runs, exact_scan
from .paths import path_scan, sender_name


@dataclass
class PatchRun:
    table: HeadTable
    positions: Interval | None
    record: dict[str, Any]
    composition: dict[str, np.ndarray] | None = None
    paths: list[dict[str, Any]] | None = None


def pairs_fingerprint(b: PairBatch) -> dict[str, Any]:
    """The data record provenance keeps for a set of pairs: source, count and the sha256 of their token ids."""
    h = hashlib.sha256()
    for t in (b.clean, b.corrupt, b.mask, b.position, b.answer, b.wrong):
        h.update(t.numpy().astype(np.int64).tobytes())
    return {"source": b.source, "pairs": len(b), "skipped": b.skipped, "sha256": h.hexdigest()}


def _mean(values: np.ndarray, settings: IntervalSettings) -> dict[str, float]:
    sums = PassageSums({"v": values, "n": np.ones(len(values))})
    iv = bootstrap(sums, mean_of("v", "n"), settings)
    return {"value": float(iv.value), "lo": float(iv.lo), "hi": float(iv.hi)}


def _bar(desc: str, hm: HeadModel, b: PairBatch, batch_size: int) -> Any:
    """A progress bar over heads x batches of pairs (shown on a terminal only)."""
    heads = sum(hm.heads_in_layer(l) for l in range(hm.n_layers))
    return tqdm(total=heads * -(-len(b) // batch_size), desc=desc, unit="head", disable=None, leave=False)


def choose_receivers(hm: HeadModel, want: int | list[Head], table: HeadTable) -> tuple[list[Head], str]:
    """The receivers --paths asks for and how they were chosen: the heads named, or the N heads of largest |effect|
    (|attribution| without the exact method) among those with a layer of heads before them."""
    if isinstance(want, list):
        return want, "named by --paths"
    col = "effect" if "effect" in table.columns else "attribution"
    first = min(l for l in range(hm.n_layers) if hm.heads_in_layer(l))
    size = np.abs(np.nan_to_num(table[col], nan=0.0))
    size[:first + 1] = -1.0  # no head before them: nothing to receive
    order = np.argsort(-size, axis=None)[:want]
    heads = [Head(int(l), int(h)) for l, h in (np.unravel_index(i, size.shape) for i in order) if size[l, h] >= 0]
    return heads, f"the {want} heads of largest |{col}| with heads before them"


def run_paths(hm: HeadModel, b: PairBatch, want: int | list[Head], table: HeadTable, *, group: list[Head] | None,
              metric: str, direction: str, batch_size: int, copies: int, settings: IntervalSettings) -> tuple[
                  list[dict[str, Any]], dict[str, Any]]:
    """paths.csv's rows and patching.json's record of them."""
    receivers, how = choose_receivers(hm, want, table)
    t0 = time.perf_counter()
    with _bar("path patching", hm, b, batch_size) as bar:
        got = path_scan(hm, b, receivers, group=group, metric=metric, direction=direction, batch_size=batch_size,
                        copies=copies, progress=bar.update)
    rows = got.rows(settings)
    strongest = sorted((r for r in rows if np.isfinite(r["effect"])), key=lambda r: -abs(r["effect"]))[:10]
    senders = "each head alone" if group is None else f"{sender_name(tuple(sorted(set(group))))} together"
    return rows, {"receivers": [Head(*r).name for r in receivers], "chosen": how, "senders": senders,
                  "forwards": got.runs.forwards,
                  "seconds": time.perf_counter() - t0, "strongest": strongest}


def run_patching(hm: HeadModel, b: PairBatch, *, metric: str, direction: str, positions: str,
                 methods: tuple[str, ...], batch_size: int, copies: int, settings: IntervalSettings,
                 paths: int | list[Head] | None = None, senders: list[Head] | None = None) -> PatchRun:
    """Every head's exact effect (methods with exact), attribution estimate (with attribution) and DLA."""
    cols: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {"metric": metric, "direction": direction, "positions": positions,
                              "methods": list(methods)}
    seconds: dict[str, float] = {}
    runs: Runs | None = None
    exact: Interval | None = None
    per_position: Interval | None = None
    if "exact" in methods:
        t0 = time.perf_counter()
        with _bar("exact patching", hm, b, batch_size) as bar:
            runs = exact_scan(hm, b, metric=metric, direction=direction, batch_size=batch_size, copies=copies,
                              progress=bar.update)
        exact = runs.effect(settings)
        cols.update(exact.columns("effect"))
        record["forwards"] = {"exact": runs.forwards}
        if positions == "each":
            per_position = exact_scan(hm, b, metric=metric, direction=direction, positions="each",
                                      batch_size=batch_size, copies=copies).effect(settings)
        seconds["exact"] = time.perf_counter() - t0
    if "attribution" in methods:
        t0 = time.perf_counter()
        attr_runs = attribution_scan(hm, b, metric=metric, direction=direction, batch_size=batch_size)
        attr = attr_runs.effect(settings)
        cols.update(attr.columns("attribution"))
        runs = runs or attr_runs
        seconds["attribution"] = time.perf_counter() - t0
        if exact is not None:
            record["agreement"] = agreement(exact.value, attr.value)
    dla = dla_values(hm, b, batch_size)
    if dla is None:
        cols["dla"] = np.full((hm.n_layers, hm.n_heads), np.nan)
        record["dla"] = "not computed: no final norm followed by a linear unembedding, or the attention output " \
                        "is normed before the residual (docs/patching.md)"
    else:
        cols.update(dla_interval(dla, settings).columns("dla"))
        record["dla"] = "logit(answer) - logit(wrong), clean run, final norm's scale frozen"
    assert runs is not None  # validate() requires a method
    record.update(M_clean=_mean(runs.clean, settings), M_corrupt=_mean(runs.corrupt, settings),
                  pairs=b.record(), intervals=settings.record(), seconds=seconds)
    record["intervals"]["resampled"] = "pairs, with replacement"
    table = HeadTable(hm.n_layers, hm.n_heads, cols, {"pairs": len(b), "metric": metric, "direction": direction})
    comp = None
    if hm.n_layers > 1 and hm.spec.refusal("qkv") is None:
        comp = composition(hm)
        record["composition"] = {k: [{"sender": Head(a, b).name, "receiver": Head(c, d).name, "score": s}
                                     for a, b, c, d, s in top_pairs(v, 5)] for k, v in comp.items()}
    else:
        record["composition"] = "not computed: one layer, or per-head Q/K/V weights headscope cannot read"
    path_rows = None
    if paths is not None:
        path_rows, record["paths"] = run_paths(hm, b, paths, table, group=senders, metric=metric, direction=direction,
                                               batch_size=batch_size, copies=copies, settings=settings)
    return PatchRun(table, per_position, record, comp, path_rows)


def positions_rows(iv: Interval, b: PairBatch) -> list[dict[str, Any]]:
    """patching_positions.csv's rows: one per head and position."""
    L, H, T = iv.value.shape
    return [{"layer": l, "head": h, "position": p, "effect": iv.value[l, h, p], "effect_lo": iv.lo[l, h, p],
             "effect_hi": iv.hi[l, h, p]} for l in range(L) for h in range(H) for p in range(T)
            if not np.isnan(iv.value[l, h, p])]


def dumps(record: dict[str, Any]) -> str:
    """patching.json's text (NaN as null)."""
    return json.dumps(to_jsonable(record), indent=1, allow_nan=False) + "\n"
