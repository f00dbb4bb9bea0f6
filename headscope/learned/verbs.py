"""Question 1's verbs as library functions: each takes a loaded model, the data and its Options, writes
nothing, and returns a result the CLI saves and prints (`headscope.options.Result`)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import (
    CLUSTERS_JSON,
    HEADS_CSV,
    HEADS_JSON,
    ROLES_CSV,
    ROLES_JSON,
    SIMILAR_PAIRS_CSV,
    SIMILARITY_NPZ,
    SYNTAX_CSV,
    write_csv,
)
from ..data import read_texts
from ..distributed import is_main, local
from ..heads import Head
from ..io import atomic_write_text
from ..models.adapter import HeadModel
from ..options import Result, check_data
from ..provenance import provenance
from ..table import HeadTable, grid, parse_head, to_jsonable
from ..uncertainty import IntervalSettings
from .analyze import analyze as analyze_table
from .longctx import check_long_model, long_roles
from .longctx.confidence import card_warning
from .options import AnalyzeOptions, RolesOptions, SimilarOptions
from .records import ClustersRecord, RolesReport
from .roles import RoleSettings, read_coref, read_treebank, role_columns, syntax_rows
from .roles import roles as roles_table
from .similarity import LN2, Similarity, SimilaritySettings, check_cka_memory, similarity
from .syntax import RELATIONS


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
                out.append(f"  {label:<20}" + ", ".join(f"{Head(l, h)} {v:.2f} [{lo[l, h]:.2f}, {hi[l, h]:.2f}]"
                                                        for l, h, v in top))
        iv = m["intervals"]
        out += ["", f"[lo, hi]: {iv['level']:.0%} intervals, {iv['method']} bootstrap over the {m['passages']} "
                    f"passages ({iv['B']} resamples); split-half stability of each statistic's ranking in heads.json"]
        return out


def analyze(hm: HeadModel, data: Any = None, options: AnalyzeOptions | None = None, *, progress: bool = False,
            **changes: Any) -> AnalyzeResult:
    """`headscope analyze` on a loaded model: per-head attention statistics with intervals.

    `data`: a TextSource, passages, token-id lists, or a corpus name / file read with `options.limit` (None:
    `options.data`). Keywords override single options: `analyze(hm, texts, limit=64)`.
    """
    check_data(data)
    opts = (options or AnalyzeOptions()).replace(**changes).validate()
    source = _texts(opts.data if data is None else data, opts.limit)
    table = analyze_table(hm, source, max_length=opts.max_length, batch_size=opts.batch_size, seed=opts.seed,
                          progress=progress, intervals=opts.intervals())
    table = table.with_columns(meta={"provenance": provenance("analyze", hm, source, opts.with_only())})
    return AnalyzeResult(table=table, name=hm.name)



@dataclass
class RolesData:
    """What `roles` reads besides the model, read once: the passages and the treebank, coreference data and long
    text its options name."""

    source: Any
    treebank: Any = None
    coref: Any = None
    long_text: Any = None


def read_roles_data(options: RolesOptions, data: Any = None) -> RolesData:
    """Every source `roles` reads, read here (so bad input fails before the model loads); `data`: the passages
    as `roles` takes them, else `options.data`."""
    long_text: Any = options.long_data
    if options.long is not None and options.long_windows:
        long_text = read_texts(options.long_data)
    source = _texts(options.data if data is None else data, options.limit)
    treebank = read_treebank(options.treebank) if options.treebank else None
    coref = read_coref(options.coref) if options.coref else None
    return RolesData(source, treebank, coref, long_text)


@dataclass
class RolesResult(TableResult):
    """The role census: roles.csv (analyze's statistics and a `roles` column), roles.json (every score, baseline
    and threshold) and syntax.csv (with a treebank)."""

    report: RolesReport  # roles.json
    name: str
    n_layers: int
    n_heads: int
    # said under the long-range census when a head card was made (`with_card`)
    card_note: str = ""
    rows: list[dict[str, Any]] = dataclasses.field(init=False, default_factory=list)  # syntax.csv

    def __post_init__(self) -> None:
        self.rows = syntax_rows(self.report.syntax)
        self.files = (ROLES_CSV.name, ROLES_JSON.name) + ((SYNTAX_CSV.name,) if self.rows else ())

    def write(self, folder: Path) -> None:
        self.table.to_csv(folder / ROLES_CSV.name)
        atomic_write_text(folder / ROLES_JSON.name,
                          json.dumps(to_jsonable(self.report.to_json()), indent=1, allow_nan=False) + "\n")
        if self.rows:
            write_csv(folder, SYNTAX_CSV, self.rows)

    def with_card(self, record: dict[str, Any], note: str) -> RolesResult:
        """This result with a head card's record in roles.json's `long_context` (the card itself is written by
        `headscope.export.cards`)."""
        report = dataclasses.replace(self.report, long_context={**(self.report.long_context or {}), "card": record})
        return dataclasses.replace(self, report=report, card_note=note)

    def lines(self) -> list[str]:
        report = self.report
        t = report.text
        out = [f"{self.name}: {self.n_layers} layers x {self.n_heads} heads, {t.passages} passages from "
               f"{t.data}; first token: {t.first_token}"]
        out += _census_lines(report)
        syn = (report.syntax or {}).get("relations")
        if syn and report.syntax is not None:
            info = report.syntax["info"]
            out.append(f"\nsyntax ({info['sentences']} sentences, {info['skipped_long']} too long, "
                       f"{info['unaligned_words']} unaligned words): best head per relation vs best fixed offset")
            out.append(f"  {'relation':<10} {'arcs':>6}  {'head':<6} {'acc [95% interval]':<18}  {'direction':<11}  "
                       f"{'offset':>6} {'acc':>5}")
            others = [r for r in syn if r not in RELATIONS and syn[r]["count"] >= 100]
            for rel in [r for r in RELATIONS if r in syn] + others:
                r = syn[rel]
                out.append(f"  {rel:<10} {r['count']:>6}  {r['best_head']:<6} {_acc(r, r['best_head']):<18}  "
                           f"{r['best_direction']:<11}  {r['baseline_offset']:>+6d} {_f(r['baseline']):>5}")
        c = report.coreference
        if c:
            out.append(f"\ncoreference ({c['anaphors']} anaphors): best head {c['best_head']} "
                       f"{_acc(c, c['best_head'])}, nearest mention {_f(c['nearest_mention_baseline'])}, "
                       f"same head word {_f(c['same_head_word_baseline'])}, "
                       f"chance {_f(c['chance'])}")
        lc = report.long_context
        if lc:
            out += _long_lines(lc)
            if self.card_note:
                out.append(f"  head card: {self.card_note}")
            config = (lc.get("card") or {}).get("config")
            warning = card_warning(config) if config is not None else None
            if warning:
                out.append(f"  {warning}")
        return out


def roles(hm: HeadModel, data: Any = None, options: RolesOptions | None = None, *, progress: bool = False,
          **changes: Any) -> RolesResult:
    """`headscope roles` on a loaded model: every head scored for each role beside a baseline, the heads that
    pass named; with `long=N` the long-range roles too (on rank 0 alone when the scan is distributed).

    `data`: a TextSource, passages, token-id lists, a corpus name / file read with `options.limit` (None:
    `options.data`), or a `RolesData` already read. Keywords override single options:
    `roles(hm, texts, treebank="ewt-test")`.
    A head card (`--export-card`) is written by `headscope.export.cards` from the result's long-range record.
    """
    check_data(data)
    opts = (options or RolesOptions()).replace(**changes).validate()
    read = data if isinstance(data, RolesData) else read_roles_data(opts, data)
    # the model's positions and kind are known now: refuse before the short-text pass
    if opts.long is not None:
        check_long_model(hm, opts.long)
    settings = RoleSettings(max_length=opts.max_length, batch_size=opts.batch_size, limit=opts.limit, seed=opts.seed,
                            intervals=opts.intervals(), until_stable=opts.until_stable)
    table = roles_table(hm, read.source, settings, treebank=read.treebank, coref=read.coref, progress=progress)
    report = {**table.meta["roles"], "provenance": provenance("roles", hm, read.source, opts.with_only())}
    if opts.long is not None and is_main():
        # not split across ranks (per-window maxima and needle answers): rank 0 alone
        with local():
            lr = long_roles(hm, opts.long, data=read.long_text, stride=opts.stride, windows=opts.long_windows,
                            haystacks=opts.haystacks, block=opts.block, seed=opts.seed, progress=progress,
                            checked=True, intervals=opts.intervals(), until_stable=opts.until_stable)
        table, report = merge_long(table, report, lr)
    return RolesResult(table=table, report=RolesReport.from_json(report), name=hm.name, n_layers=hm.n_layers,
                       n_heads=hm.n_heads)


def _f(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _acc(r: dict[str, Any], head: str) -> str:
    """The best head's accuracy with its interval over sentences (windows), where roles.json has one."""
    acc = float(r["best_accuracy"])
    if "accuracy_lo" not in r:
        return _f(acc)
    l, h = parse_head(head)
    return f"{_f(acc)} [{_f(float(r['accuracy_lo'][l][h]))}, {_f(float(r['accuracy_hi'][l][h]))}]"


def _entry(e: dict[str, Any]) -> str:
    """`L0H3 0.91 [0.88, 0.93]/0.12`: a census head's score, its interval where it has one, and its baseline."""
    bounds = f" [{_f(e['lo'])}, {_f(e['hi'])}]" if "lo" in e else ""
    return f"{e['head']} {_f(e['score'])}{bounds}/{_f(e['baseline'])}"


def _census_lines(report: RolesReport) -> list[str]:
    """The census with intervals, how many heads are uncertain, the scores' stability and --until-stable."""
    iv, t = report.intervals, report.text
    out = [f"\nrole census (score [{iv.level:.0%} interval] / baseline: the uniform head's, the best fixed "
           f"offset's, or the best coreference baseline's); a role is assigned where its rule passes on the "
           f"interval's conservative bound"]
    for role, heads in report.census.items():
        shown = ", ".join(_entry(e) for e in heads[:8])
        more = f" (+{len(heads) - 8} more)" if len(heads) > 8 else ""
        out.append(f"  {role:<22} {len(heads):>3}  {shown}{more}")
    if not report.census:
        out.append("  no head passes any role's decision rule on its bound")
    n = report.uncertain_heads
    if n:
        counts: dict[str, int] = {}
        for names in report.uncertain.values():
            for r in names:
                counts[r] = counts.get(r, 0) + 1
        detail = ", ".join(f"{r} {c}" for r, c in sorted(counts.items(), key=lambda kv: -kv[1]))
        out.append(f"  uncertain: {n} head(s) pass a rule on the point estimate but not on its bound ({detail}); "
                   f"roles.csv's uncertain_roles names them")
    else:
        out.append("  uncertain: no head (every role passing on its point estimate passes on its bound too)")
    out.append(f"  intervals: {iv.method} bootstrap, {iv.B} resamples of the {t.passages} passages "
               f"(induction: of the {report.induction['sequences']} sequences), seed {iv.seed}")
    stab = {k: v for k, v in report.stability.items() if isinstance(v.get("spearman_brown"), float)
            and math.isfinite(v["spearman_brown"])}
    if stab:
        worst = min(stab, key=lambda k: stab[k]["spearman_brown"])
        out.append(f"  stability: split-half Spearman-Brown of the role scores' rankings from "
                   f"{min(v['spearman_brown'] for v in stab.values()):.2f} ({worst}) to "
                   f"{max(v['spearman_brown'] for v in stab.values()):.2f}; every score's in roles.json")
    u = t.until_stable
    if u:
        state = "reached" if u["reached"] else "NOT reached"
        now = min(u["stability"].values()) if u["stability"] else math.nan
        out.append(f"  --until-stable {u['target']}: {state} with {u['passages']} of the {u['available']} passages "
                   f"available (lowest text-score stability {_f(now)})"
                   + ("" if u["reached"] else "; raise --limit or give more data"))
    return out


def merge_long(table: HeadTable, report: dict[str, Any], lr: dict[str, Any]) -> tuple[HeadTable, dict[str, Any]]:
    """roles.csv gains the long-range score columns and roles; roles.json their census and `long_context`."""
    shape = (table.n_layers, table.n_heads)
    bounds = (lr.get("uncertainty") or {}).get("bounds", {})
    cols: dict[str, np.ndarray] = {}
    # every long-range score with its interval (NaN: under 2 haystacks/windows)
    for name in role_columns("long"):
        cols[name] = np.asarray(lr["scores"][name], float) if name in lr["scores"] else np.full(shape, np.nan)
        for side in ("lo", "hi"):
            cols[f"{name}_{side}"] = np.asarray(bounds[name][side], float) if name in bounds else np.full(shape, np.nan)
    role_col = np.array(table["roles"], dtype=object).reshape(shape)
    roles_map = dict(report["roles"])
    for head, names in lr["roles"].items():
        l, h = parse_head(head)
        role_col[l, h] = ";".join([r for r in str(role_col[l, h]).split(";") if r] + names)
        roles_map[head] = list(roles_map.get(head, [])) + names
    table = table.with_columns({"roles": role_col, **cols})
    report = {**report, "roles": roles_map, "census": {**report["census"], **lr["census"]}, "long_context": lr}
    return table, report


def _long_lines(lc: dict[str, Any]) -> list[str]:
    """The long-range census, needle accuracy and the windows scored."""
    out = [f"\nlong-range roles at {lc['length']} tokens (score/baseline)"]
    t = lc.get("text")
    if t:
        out.append(f"  text: {t['windows']} window(s) of {t['data']}, {t['counted_tokens']} queries counted; "
                   f"streaming = sink {t['sink']} + recent {t['recent']}, echo/induction at distance >= {t['far']}")
    n = lc.get("needles")
    if n:
        out.append(f"  needles: {len(n['haystacks'])} haystack(s), answered exactly {n['needle_accuracy']:.2f}, "
                   f"answer tokens right {n['token_accuracy']:.2f}; retrieval score over the {n['succeeded']} "
                   f"answered")
    stab = (lc.get("uncertainty") or {}).get("stability", {})
    if stab:
        out.append("  split-half stability of the rankings (Spearman-Brown): " + ", ".join(
            f"{k} {_f(v['spearman_brown'])} ({v['passages']} {'haystacks' if k.startswith('retrieval') else 'windows'})"
            for k, v in stab.items()) + "; intervals in roles.csv (<score>_lo/_hi)")
    u = lc.get("until_stable")
    if u:
        out.append(f"  --until-stable {u['target']}: {u['haystacks']} of up to {u['haystacks_cap']} haystacks, "
                   f"{u['windows']} of up to {u['windows_cap']} windows")
    for role, heads in lc["census"].items():
        shown = ", ".join(f"{e['head']} {_f(e['score'])}/{_f(e['baseline'])}" for e in heads[:8])
        more = f" (+{len(heads) - 8} more)" if len(heads) > 8 else ""
        out.append(f"  {role:<22} {len(heads):>3}  {shown}{more}")
    if not lc["census"]:
        out.append("  no head passes a long-range role's rule")
    return out


@dataclass
class SimilarResult(Result):
    """Head-to-head similarity: similar_pairs.csv (one row per pair, js ascending), similarity.npz (the full
    matrices) and clusters.json (near-duplicate groups)."""

    similarity: Similarity
    pairs: Any  # pandas DataFrame, with js_lo, js_hi for the --top pairs
    record: ClustersRecord  # clusters.json
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
        atomic_write_text(folder / CLUSTERS_JSON.name,
                          json.dumps(self.record.to_json(), indent=1, allow_nan=False) + "\n")

    def lines(self) -> list[str]:
        sim, pairs, settings, m = self.similarity, self.pairs, self.settings, self.similarity.meta
        js_max, cka_min, clusters = self.record.js_max, self.record.cka_min, self.record.clusters
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
        if clusters:
            out.append(f"near-duplicate clusters (every pair js <= {js_max:g}, cka >= {cka_min:g}):")
            for c in clusters:
                out.append(f"  {', '.join(c.heads)}  (max js {c.max_js:.4f}, min cka {c.min_cka:.3f})")
        else:
            out.append(f"no near-duplicate clusters: no pair has js <= {js_max:g} and cka >= {cka_min:g} "
                       f"(loosen with --js-max / --cka-min)")
        return out


def similar(hm: HeadModel, data: Any = None, options: SimilarOptions | None = None, *, progress: bool = False,
            **changes: Any) -> SimilarResult:
    """`headscope similar` on a loaded model: every pair of heads compared (attention JS with intervals, output
    CKA, weight subspaces) and the near-duplicate clusters.

    `data`: a TextSource, passages, token-id lists, or a corpus name / file read with `options.limit` (None:
    `options.data`). Keywords override single options: `similar(hm, texts, js_max=0.1)`.
    """
    check_data(data)
    opts = (options or SimilarOptions()).replace(**changes).validate()
    source = _texts(opts.data if data is None else data, opts.limit)
    # one head's block must fit: known once the model's shape is
    if opts.cka == "exact":
        check_cka_memory(opts.cka_memory * 2**20, hm.n_layers * hm.n_heads, hm.d_head)
    measured = SimilaritySettings(max_length=opts.max_length, batch_size=opts.batch_size,
                                  js_max_tokens=opts.js_max_tokens, seed=opts.seed, cka=opts.cka,
                                  cka_batch=opts.cka_batch, cka_pool=opts.cka_pool,
                                  cka_memory=opts.cka_memory * 2**20)
    sim = similarity(hm, source, measured, progress=progress)
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
    return SimilarResult(similarity=sim, pairs=pairs, record=ClustersRecord.from_json(record), top=top,
                         settings=settings, name=hm.name)
