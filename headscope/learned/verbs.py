"""Question 1's verbs as library functions: each takes a loaded model, the data and its Options, writes
nothing, and returns a result the CLI saves and prints (`headscope.options.Result`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import CLUSTERS_JSON, HEADS_CSV, HEADS_JSON, SIMILAR_PAIRS_CSV, SIMILARITY_NPZ
from ..data import read_texts
from ..io import atomic_write_text
from ..models.adapter import HeadModel
from ..options import Result
from ..provenance import provenance
from ..table import HeadTable, grid, to_jsonable
from ..uncertainty import IntervalSettings
from .analyze import analyze as analyze_table
from .options import AnalyzeOptions, SimilarOptions
from .similarity import LN2, Similarity, check_cka_memory, similarity


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
class SimilarResult(Result):
    """Head-to-head similarity: similar_pairs.csv (one row per pair, js ascending), similarity.npz (the full
    matrices) and clusters.json (near-duplicate groups)."""

    similarity: Similarity
    pairs: Any  # pandas DataFrame, with js_lo, js_hi for the --top pairs
    clusters: list[dict[str, Any]]
    record: dict[str, Any]  # clusters.json
    top: int  # the pairs printed (and given intervals)
    settings: IntervalSettings
    name: str
    files = (SIMILAR_PAIRS_CSV.name, SIMILARITY_NPZ.name, CLUSTERS_JSON.name)

    def to_pandas(self) -> Any:
        return self.pairs

    def write(self, folder: Path) -> None:
        atomic_write_text(folder / SIMILAR_PAIRS_CSV.name,
                          self.pairs.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
        self.similarity.to_npz(folder / SIMILARITY_NPZ.name)
        atomic_write_text(folder / CLUSTERS_JSON.name, json.dumps(self.record, indent=1, allow_nan=False) + "\n")

    def lines(self) -> list[str]:
        sim, pairs, settings, m = self.similarity, self.pairs, self.settings, self.similarity.meta
        js_max, cka_min = self.record["js_max"], self.record["cka_min"]
        out = [f"{self.name}: {m['n_layers']} layers x {m['n_heads']} heads = {sim.n} heads, {len(pairs)} pairs; "
               f"JS over {m['js_queries']} queries, CKA over {m['cka_tokens']} tokens from {m['data']}",
               f"js in nats (0 = same pattern, ln 2 = {LN2:.3f} = disjoint); cka, *_cos: 1 = same", ""]
        shown = pairs.head(self.top)
        cols = ["cka", "ov_angle_cos", "qk_angle_cos"]
        out.append(f"{'head_a':>7} {'head_b':>7} {'js [' + format(settings.level, '.0%') + ' interval]':>26} "
                   + " ".join(f"{c:>12}" for c in cols))
        for row in shown.itertuples(index=False):
            js = f"{row.js:.4f} [{row.js_lo:.4f}, {row.js_hi:.4f}]"
            out.append(f"{row.head_a:>7} {row.head_b:>7} {js:>26} "
                       + " ".join(f"{getattr(row, c):12.4f}" for c in cols))
        if self.top:
            out.append(f"js intervals: {settings.method} bootstrap over the {m['passages']} passages, {settings.B} "
                       f"resamples (CKA mixes passages in its minibatches: no interval)")
        out.append("")
        if self.clusters:
            out.append(f"near-duplicate clusters (every pair js <= {js_max:g}, cka >= {cka_min:g}):")
            for c in self.clusters:
                out.append(f"  {', '.join(c['heads'])}  (max js {c['max_js']:.4f}, min cka {c['min_cka']:.3f})")
        else:
            out.append(f"no near-duplicate clusters: no pair has js <= {js_max:g} and cka >= {cka_min:g} "
                       f"(loosen with --js-max / --cka-min)")
        return out


def similar(hm: HeadModel, data: Any = None, options: SimilarOptions | None = None, *, progress: bool = False,
            **changes: Any) -> SimilarResult:
    """`headscope similar` on a loaded model: every pair of heads compared (attention JS with intervals, output
    CKA, weight subspaces) and the near-duplicate clusters.

    `data`: a TextSource, passages, token-id lists, or a corpus name / file read with `options.limit`.
    Keywords override single options: `similar(hm, texts, js_max=0.1)`.
    """
    opts = (options or SimilarOptions()).replace(**changes).validate()
    source = _texts(data, opts.limit)
    if opts.cka == "exact":  # one head's block must fit: known once the model's shape is
        check_cka_memory(opts.cka_memory * 2**20, hm.n_layers * hm.n_heads, hm.d_head)
    sim = similarity(hm, source, max_length=opts.max_length, batch_size=opts.batch_size,
                     js_max_tokens=opts.js_max_tokens, seed=opts.seed, cka=opts.cka, cka_batch=opts.cka_batch,
                     cka_pool=opts.cka_pool, cka_memory=opts.cka_memory * 2**20, progress=progress)
    clusters = sim.clusters(opts.js_max, opts.cka_min)
    pairs = sim.pairs()
    settings = opts.intervals()
    top = min(opts.top, len(pairs))
    lo, hi = sim.js_intervals(list(zip(pairs["head_a"][:top], pairs["head_b"][:top], strict=True)), settings)
    at = list(pairs.columns).index("js") + 1
    pairs.insert(at, "js_lo", np.concatenate([lo, np.full(len(pairs) - top, np.nan)]))
    pairs.insert(at + 1, "js_hi", np.concatenate([hi, np.full(len(pairs) - top, np.nan)]))
    record = to_jsonable({
        "js_max": opts.js_max, "cka_min": opts.cka_min,
        "rule": "complete linkage: every pair inside a cluster has js <= js_max and cka >= cka_min",
        "clusters": clusters, "meta": sim.meta,
        "intervals": {**settings.record(), "pairs": top,
                      "of": "js of the --top pairs (similar_pairs.csv js_lo, js_hi)"},
        "provenance": provenance("similar", hm, source, opts.with_only())})
    return SimilarResult(similarity=sim, pairs=pairs, clusters=clusters, record=record, top=top, settings=settings,
                         name=hm.name)
