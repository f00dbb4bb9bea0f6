"""`headscope patch` as a library function: activation and attribution patching of every head on prompt pairs,
with direct logit attribution and composition scores; writes nothing until the result is saved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...artifacts import (
    COMPOSITION_NPZ,
    PATCHING_CSV,
    PATCHING_JSON,
    PATCHING_POSITIONS_CSV,
    PATHS_CSV,
)
from ...errors import HeadscopeError
from ...heads import Head
from ...io import atomic_write_bytes, atomic_write_text, csv_text
from ...models.adapter import HeadModel
from ...models.capabilities import why_not
from ...options import OptionError, Result
from ...provenance import provenance
from ...table import HeadTable, grid
from ...uncertainty import Interval
from ..options import PatchOptions, head_list, path_receivers
from .composition import npz_bytes
from .pairs import PYTHON_PAIRS, PairBatch, check_batch, given_pairs, load_pairs, pad_of, tokenize_pairs
from .paths import check_head, check_receivers
from .records import PatchRecord
from .run import dumps, pairs_fingerprint, positions_rows, run_patching


@dataclass
class PatchResult(Result):
    """Activation patching: patching.csv, patching.json (and patching_positions.csv with --positions each)."""

    table: HeadTable
    name: str
    record: PatchRecord
    pairs: PairBatch
    positions: Interval | None = None
    composition: dict[str, np.ndarray] | None = None
    paths: list[dict[str, Any]] | None = None

    def to_pandas(self) -> Any:
        return self.table.to_pandas()

    @property
    def files(self) -> tuple[str, ...]:  # type: ignore[override]
        extra = (PATCHING_POSITIONS_CSV.name,) if self.positions is not None else ()
        comp = (COMPOSITION_NPZ.name,) if self.composition is not None else ()
        paths = (PATHS_CSV.name,) if self.paths is not None else ()
        return (PATCHING_CSV.name, PATCHING_JSON.name, *extra, *paths, *comp)

    def write(self, folder: Path) -> None:
        self.table.to_csv(folder / PATCHING_CSV.name)
        atomic_write_text(folder / PATCHING_JSON.name, dumps(self.record.to_json()))
        if self.positions is not None:
            atomic_write_text(folder / PATCHING_POSITIONS_CSV.name, csv_text(positions_rows(self.positions,
                                                                                             self.pairs)))
        if self.paths is not None:
            atomic_write_text(folder / PATHS_CSV.name, csv_text(self.paths))
        if self.composition is not None:
            meta = {"model": self.name, "axes": ["sender layer", "sender head", "receiver layer", "receiver head"]}
            atomic_write_bytes(folder / COMPOSITION_NPZ.name, npz_bytes(self.composition, meta))

    def lines(self) -> list[str]:
        r, t = self.record, self.table
        mc, mx = r.M_clean, r.M_corrupt
        out = [f"{self.name}: {len(self.pairs)} pairs from {self.pairs.source}"
               + (f" ({self.pairs.skipped} left out: the tokenizer cannot hold them)" if self.pairs.skipped else ""),
               f"{r.metric}: M(clean) {mc.value:.3f} [{mc.lo:.3f}, {mc.hi:.3f}], "
               f"M(corrupt) {mx.value:.3f} [{mx.lo:.3f}, {mx.hi:.3f}]; {r.direction}"]
        for col, title in (("effect", "exact effect (1 = restores the clean metric)"),
                           ("attribution", "attribution patching (first-order estimate)")):
            if col in t.columns:
                out += ["", grid(t, col, title), "", f"top heads by |{col}|:"]
                size = np.abs(np.nan_to_num(t[col], nan=0.0))
                for l, h, _ in t.with_columns({"_abs": size}).top("_abs", 5):
                    out.append(f"  {Head(l, h)} {t[col][l, h]:+.3f} [{t[f'{col}_lo'][l, h]:+.3f}, "
                               f"{t[f'{col}_hi'][l, h]:+.3f}]")
        if r.agreement is not None:
            a = r.agreement
            worst = ", ".join(f"{Head(d['layer'], d['head'])} ({d['exact']:+.2f} vs {d['attribution']:+.2f})"
                              for d in a["most_different"][:3])
            out += ["", f"attribution vs exact: Spearman {a['spearman']:.3f} over {a['heads']} heads; most "
                        f"different: {worst}"]
        if isinstance(r.composition, dict):
            top = ", ".join(f"{p['sender']}->{p['receiver']} {p['score']:.2f}" for p in r.composition["k"][:3])
            out += [f"strongest K-composition (Elhage et al. 2021): {top}"]
        if r.paths is not None:
            out += ["", *path_lines(r.paths)]
        iv = r.intervals
        out += ["", f"[lo, hi]: {iv.level:.0%} intervals, {iv.method} bootstrap over the {len(self.pairs)} "
                    f"pairs ({iv.B} resamples)"]
        return out


def path_lines(record: dict[str, Any]) -> list[str]:
    """The strongest paths, for the terminal."""
    receivers = ", ".join(record["receivers"]) or "none (the logits alone)"
    senders = f"; senders: {record['senders']}" if "senders" in record else ""
    out = [f"path patching ({record['forwards']} forwards): receivers {receivers} ({record['chosen']}){senders}; "
           f"strongest paths:"]
    for p in record["strongest"][:6]:
        via = "" if p["via"] == "direct" else f" via {p['via']}"
        out.append(f"  {p['sender']} -> {p['receiver']}{via} {p['effect']:+.3f} [{p['effect_lo']:+.3f}, "
                   f"{p['effect_hi']:+.3f}]")
    return out


def patch(hm: HeadModel, pairs: Any = None, options: PatchOptions | None = None, **changes: Any) -> PatchResult:
    """`headscope patch` on a loaded model: each head's causal effect on clean/corrupt prompt pairs.

    `pairs`: a JSONL path, a PairBatch, or a list of pairs (`Pair`s or {"clean", "corrupt", "answer", "wrong"}
    dicts, checked as a file's lines are); None: `options.pairs` or the built-in `options.task`, never both.
    Keywords override single options: `patch(hm, task="ioi", methods=("attribution",))`.
    """
    opts = (options or PatchOptions()).replace(**changes)
    given = given_pairs(pairs)
    if given is not None:  # the pairs given here stand for --pairs
        if opts.task is not None:
            raise OptionError("pairs", f"and task {opts.task!r} are both given; give one: pairs here, or task= for a "
                                       f"built-in set")
        source = given.source if isinstance(given, PairBatch) else str(given) if isinstance(given, (str, Path)) \
            else PYTHON_PAIRS
        opts = opts.replace(pairs=source)
    opts = opts.validate()
    why = why_not(hm.spec, "patch", hm.config.model_type)
    if why:
        raise HeadscopeError(f"patching cannot serve the {hm.spec.family} family ({hm.name}): {why}")
    if isinstance(given, PairBatch):
        batch = given
        check_batch(batch, hm.tokenizer, hm.vocab_size, hm.max_positions)
    elif isinstance(given, list):
        batch = tokenize_pairs(hm.tokenizer, given[:opts.limit], hm.causal, PYTHON_PAIRS, pad_id=pad_of(hm.tokenizer),
                               max_positions=hm.max_positions)
    else:
        batch = load_pairs(hm.tokenizer, hm.causal, hm.vocab_size, pairs=opts.pairs, task=opts.task,
                           seed=opts.seed, limit=opts.limit, max_positions=hm.max_positions)
    receivers = None if opts.paths is None else path_receivers(opts.paths)
    group = None if opts.senders is None else head_list(opts.senders, "senders", "heads")
    if receivers is not None:  # before the scans
        check_receivers(hm, receivers)
        for h in group or []:
            check_head(hm, h, "sender")
    got = run_patching(hm, batch, metric=opts.metric, direction=opts.direction, positions=opts.positions,
                       methods=opts.methods, batch_size=opts.batch_size, copies=opts.copies,
                       settings=opts.intervals(),
                       paths=receivers, senders=group)
    got.record["provenance"] = provenance("patch", hm, pairs_fingerprint(batch), opts.with_only())
    return PatchResult(table=got.table, name=hm.name, record=PatchRecord.from_json(got.record), pairs=batch,
                       positions=got.positions, composition=got.composition, paths=got.paths)
