"""Question 1's verbs as library functions: each takes a loaded model, the data and its Options, writes
nothing, and returns a result the CLI saves and prints (`headscope.options.Result`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import (
    COMPOSITION_NPZ,
    HEADS_CSV,
    HEADS_JSON,
    PATCHING_CSV,
    PATCHING_JSON,
    PATCHING_POSITIONS_CSV,
)
from ..data import read_texts
from ..io import atomic_write_bytes, atomic_write_text, csv_text
from ..models.adapter import HeadModel
from ..options import Result
from ..provenance import provenance
from ..table import HeadTable, grid
from ..uncertainty import Interval
from .analyze import analyze as analyze_table
from .causal.composition import npz_bytes
from .causal.pairs import PairBatch, load_pairs
from .causal.run import dumps, pairs_fingerprint, positions_rows, run_patching
from .options import AnalyzeOptions, PatchOptions


def _texts(data: Any, limit: int | None) -> Any:
    """Data as given (a TextSource, passages, token ids), or read when it names a corpus or a file."""
    return read_texts(data, limit) if data is None or isinstance(data, (str, Path)) else data


@dataclass
class TableResult(Result):
    """A result whose main record is one HeadTable."""

    table: HeadTable

    def to_pandas(self) -> Any:
        return self.table.to_pandas()


@dataclass
class AnalyzeResult(TableResult):
    """Per-head attention statistics: heads.csv and heads.json."""

    name: str
    files = (HEADS_CSV.name, HEADS_JSON.name)

    def write(self, folder: Path) -> None:
        self.table.to_csv(folder / HEADS_CSV.name)
        self.table.to_json(folder / HEADS_JSON.name)

    def lines(self) -> list[str]:
        table, m = self.table, self.table.meta
        out = [f"{self.name}: {m['n_layers']} layers x {m['n_heads']} heads ({m['n_kv_heads']} KV), "
               f"{m['passages']} passages, {m['tokens_seen']} tokens from {m['data']}"]
        for col, title in (("entropy_norm", "normalised entropy: 1 = uniform, 0 = one key"),
                           ("mean_distance", "mean attention distance, tokens"),
                           ("first_token_mass", "mass on the first token (sink)")):
            out += ["", grid(table, col, title)]
        out += ["", "most notable heads:"]
        for col, label in (("prev_token_mass", "previous token"), ("self_mass", "self"),
                           ("next_token_mass", "next token"), ("first_token_mass", "first token / sink"),
                           ("special_mass", "special tokens"), ("punct_mass", "punctuation")):
            top = [t for t in table.top(col, 3) if t[2] == t[2]]
            if top:
                lo, hi = table[f"{col}_lo"], table[f"{col}_hi"]
                out.append(f"  {label:<20}" + ", ".join(f"L{l}H{h} {v:.2f} [{lo[l, h]:.2f}, {hi[l, h]:.2f}]"
                                                        for l, h, v in top))
        iv = m["intervals"]
        out += ["", f"[lo, hi]: {iv['level']:.0%} intervals, {iv['method']} bootstrap over the {m['passages']} "
                    f"passages ({iv['B']} resamples); split-half stability of each statistic's ranking in heads.json"]
        return out


def analyze(hm: HeadModel, data: Any = None, options: AnalyzeOptions | None = None, *, progress: bool = False,
            **changes: Any) -> AnalyzeResult:
    """`headscope analyze` on a loaded model: per-head attention statistics with intervals.

    `data`: a TextSource, passages, token-id lists, or a corpus name / file read with `options.limit`.
    Keywords override single options: `analyze(hm, texts, limit=64)`.
    """
    opts = (options or AnalyzeOptions()).replace(**changes).validate()
    source = _texts(data, opts.limit)
    table = analyze_table(hm, source, max_length=opts.max_length, batch_size=opts.batch_size, seed=opts.seed,
                          progress=progress, intervals=opts.intervals())
    table = table.with_columns(meta={"provenance": provenance("analyze", hm, source, opts.with_only())})
    return AnalyzeResult(table=table, name=hm.name)



@dataclass
class PatchResult(TableResult):
    """Activation patching: patching.csv, patching.json (and patching_positions.csv with --positions each)."""

    name: str
    record: dict[str, Any]
    pairs: PairBatch
    positions: Interval | None = None
    composition: dict[str, np.ndarray] | None = None

    @property
    def files(self) -> tuple[str, ...]:  # type: ignore[override]
        extra = (PATCHING_POSITIONS_CSV.name,) if self.positions is not None else ()
        comp = (COMPOSITION_NPZ.name,) if self.composition is not None else ()
        return (PATCHING_CSV.name, PATCHING_JSON.name, *extra, *comp)

    def write(self, folder: Path) -> None:
        self.table.to_csv(folder / PATCHING_CSV.name)
        atomic_write_text(folder / PATCHING_JSON.name, dumps(self.record))
        if self.positions is not None:
            atomic_write_text(folder / PATCHING_POSITIONS_CSV.name, csv_text(positions_rows(self.positions,
                                                                                             self.pairs)))
        if self.composition is not None:
            meta = {"model": self.name, "axes": ["sender layer", "sender head", "receiver layer", "receiver head"]}
            atomic_write_bytes(folder / COMPOSITION_NPZ.name, npz_bytes(self.composition, meta))

    def lines(self) -> list[str]:
        r, t = self.record, self.table
        mc, mx = r["M_clean"], r["M_corrupt"]
        out = [f"{self.name}: {len(self.pairs)} pairs from {self.pairs.source}"
               + (f" ({self.pairs.skipped} left out: the tokenizer cannot hold them)" if self.pairs.skipped else ""),
               f"{r['metric']}: M(clean) {mc['value']:.3f} [{mc['lo']:.3f}, {mc['hi']:.3f}], "
               f"M(corrupt) {mx['value']:.3f} [{mx['lo']:.3f}, {mx['hi']:.3f}]; {r['direction']}"]
        for col, title in (("effect", "exact effect (1 = restores the clean metric)"),
                           ("attribution", "attribution patching (first-order estimate)")):
            if col in t.columns:
                out += ["", grid(t, col, title), "", f"top heads by |{col}|:"]
                size = np.abs(np.nan_to_num(t[col], nan=0.0))
                for l, h, _ in t.with_columns({"_abs": size}).top("_abs", 5):
                    out.append(f"  L{l}H{h} {t[col][l, h]:+.3f} [{t[f'{col}_lo'][l, h]:+.3f}, "
                               f"{t[f'{col}_hi'][l, h]:+.3f}]")
        if "agreement" in r:
            a = r["agreement"]
            worst = ", ".join(f"L{d['layer']}H{d['head']} ({d['exact']:+.2f} vs {d['attribution']:+.2f})"
                              for d in a["most_different"][:3])
            out += ["", f"attribution vs exact: Spearman {a['spearman']:.3f} over {a['heads']} heads; most "
                        f"different: {worst}"]
        if isinstance(r.get("composition"), dict):
            top = ", ".join(f"{p['sender']}->{p['receiver']} {p['score']:.2f}" for p in r["composition"]["k"][:3])
            out += [f"strongest K-composition (Elhage et al. 2021): {top}"]
        iv = r["intervals"]
        out += ["", f"[lo, hi]: {iv['level']:.0%} intervals, {iv['method']} bootstrap over the {len(self.pairs)} "
                    f"pairs ({iv['B']} resamples)"]
        return out


def patch(hm: HeadModel, pairs: Any = None, options: PatchOptions | None = None, **changes: Any) -> PatchResult:
    """`headscope patch` on a loaded model: each head's causal effect on clean/corrupt prompt pairs.

    `pairs`: a PairBatch, or a JSONL path (else `options.pairs`, or the built-in `options.task`).
    Keywords override single options: `patch(hm, task="ioi", methods=("attribution",))`.
    """
    opts = (options or PatchOptions()).replace(**changes)
    if isinstance(pairs, (str, Path, PairBatch)):  # the pairs given here stand for --pairs
        opts = opts.replace(pairs=pairs.source if isinstance(pairs, PairBatch) else str(pairs), task=None)
    opts = opts.validate()
    if isinstance(pairs, PairBatch):
        batch = pairs
    else:
        batch = load_pairs(hm.tokenizer, hm.causal, hm.vocab_size, pairs=opts.pairs, task=opts.task,
                           seed=opts.seed, limit=opts.limit)
    got = run_patching(hm, batch, metric=opts.metric, direction=opts.direction, positions=opts.positions,
                       methods=opts.methods, batch_size=opts.batch_size, copies=opts.copies,
                       settings=opts.intervals())
    got.record["provenance"] = provenance("patch", hm, pairs_fingerprint(batch), opts.with_only())
    return PatchResult(table=got.table, name=hm.name, record=got.record, pairs=batch, positions=got.positions,
                       composition=got.composition)
