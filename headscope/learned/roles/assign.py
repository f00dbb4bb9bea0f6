"""Assigning roles to heads: every pass's scores, the registry's rules, and what roles.json holds.

`roles()` runs the passes (text, induction, treebank, coreference), `decide` applies every
short-range rule of the registry (`catalogue.py`) and `census` lists each role's heads, best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ...data import Sentence, pad_id, read_conllu, resolve_max_length
from ...distributed import is_main, run_on_main
from ...errors import HeadscopeError
from ...models.adapter import HeadModel
from ...table import HeadTable, head_name, parse_head
from ...uncertainty import IntervalSettings
from ..analyze import table_from_stats
from ..coref import COREF_ACCURACY, CorefCounts, Document, coreference_accuracy, read_documents
from ..syntax import RELATIONS, DependencyCounts, best_accuracy, dependency_accuracy
from .confidence import (
    RoleIntervals,
    add_member,
    heads_map,
    reached,
    role_intervals,
    scores_in,
    split_roles,
    stability_of,
)
from .induction import INDUCTION_SCORES, induction_sums, scores_of, special_frame
from .registry import Thresholds, census_of, judge, key, report_scores, resolve, role_columns
from .text import text_pass, text_scores, text_sums


# --- what the passes read ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TreebankSource:
    """A treebank read once (`read_treebank`): its name as given and its sentences."""

    name: str
    sentences: list[Sentence]


@dataclass(frozen=True)
class CorefSource:
    """A coreference file read once (`read_coref`): its name as given, its documents and mention counts."""

    name: str
    documents: list[Document]
    info: dict[str, int] = field(default_factory=dict)


def read_treebank(path: str | Path) -> TreebankSource:
    """Read a CoNLL-U treebank (or a built-in one: `ewt-test`) for the syntactic roles; refused when no
    sentence is well formed (before any model loads)."""
    sentences = read_conllu(path)
    if not sentences:
        raise HeadscopeError(f"treebank {str(path)!r} holds no well-formed sentence (the warnings above say which "
                             f"lines are malformed); give a CoNLL-U file whose HEAD column points inside each "
                             f"sentence, or a built-in treebank (ewt-test, gum-test)")
    return TreebankSource(str(path), sentences)


def read_coref(path: str | Path) -> CorefSource:
    """Read a CorefUD CoNLL-U file (or `gum-test`) for the coreference role."""
    docs, info = read_documents(path)
    return CorefSource(str(path), docs, info)


def _treebank(treebank: str | Path | Sequence[Sentence] | TreebankSource | None,
              limit: int | None) -> TreebankSource | None:
    """The treebank's first `limit` sentences, read if it is a name or path; refused when empty."""
    if treebank is None:
        return None
    if isinstance(treebank, (str, Path)):
        tb = read_treebank(treebank)
    elif isinstance(treebank, TreebankSource):
        tb = treebank
    else:
        tb = TreebankSource("sentences", list(treebank))  # already-read sentences (e.g. filtered or combined files)
    tb = TreebankSource(tb.name, tb.sentences[:limit])
    if not tb.sentences:
        raise HeadscopeError(f"treebank {tb.name!r} holds no sentences")
    return tb


def _coref(coref: str | Path | CorefSource | None, limit: int | None) -> CorefSource | None:
    """The coreference documents holding the first `limit` sentences, read if `coref` is a name or path."""
    if coref is None:
        return None
    co = coref if isinstance(coref, CorefSource) else read_coref(coref)
    return co if limit is None else CorefSource(co.name, _limit_docs(co.documents, limit), co.info)


def _limit_docs(docs: list, limit: int) -> list:
    """The documents holding the first `limit` sentences (the last one cut)."""
    out, left = [], limit
    for d in docs:
        if left <= 0:
            break
        out.append(type(d)(d.doc_id, d.sentences[:left], d.mentions[:left]))
        left -= len(d.sentences)
    return out


# --- scores from the treebank and coreference passes -----------------------------------------------
def syntax_scores(syntax: dict[str, Any], shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The syntactic family's inputs per relation (`syntax` as roles.json's `syntax.relations`):
    `syntax_<rel>` (the better direction), its fixed-offset `_baseline` and arc `_count`; the nine
    RELATIONS the treebank lacks are NaN (roles.csv has a column for each)."""
    out: dict[str, np.ndarray] = {}
    for rel in (*syntax, *(r for r in RELATIONS if r not in syntax)):
        r = syntax.get(rel)
        out[f"syntax_{rel}"] = (np.maximum(np.array(r["dep_to_head"], float), np.array(r["head_to_dep"], float))
                                if r else np.full(shape, np.nan))
        out[f"syntax_{rel}_baseline"] = np.full(shape, r["baseline"] if r else np.nan)
        out[f"syntax_{rel}_count"] = np.full(shape, r["count"] if r else 0)
    return out


def coref_scores(coref: dict[str, Any], shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The coreference role's inputs (`coref` as roles.json's `coreference`): accuracy, the better of
    the nearest-mention and same-head-word baselines, and the anaphors scored."""
    acc = np.array(coref["accuracy"], float).reshape(shape)
    best = max(coref["nearest_mention_baseline"], coref["same_head_word_baseline"])
    return {"coref_accuracy": acc, "coref_accuracy_baseline": np.full_like(acc, best),
            "coref_anaphors": np.full(shape, coref.get("anaphors") or 0)}


# --- decisions ---------------------------------------------------------------------------------------
def decide(scores: dict[str, np.ndarray], th: Thresholds, syntax: dict[str, Any] | None = None,
           coref: dict[str, Any] | None = None) -> np.ndarray:
    """Role names per head (`[n_layers, n_heads]` object array of lists): every short-range rule of the
    registry on `scores` (and on `syntax` / `coref` results, when given as dicts)."""
    shape = next(iter(scores.values())).shape
    inputs = dict(scores)
    if syntax:
        inputs.update(syntax_scores(syntax, shape))
    if coref:
        inputs.update(coref_scores(coref, shape))
    held = judge("short", inputs, th)
    roles = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        roles[idx] = list(held.get(idx, []))
    return roles


def census(role_lists: np.ndarray, scores: dict[str, np.ndarray]) -> dict[str, list[dict[str, Any]]]:
    """Role -> heads holding it with their score and baseline, best first."""
    return census_of(((idx, role_lists[idx]) for idx in np.ndindex(role_lists.shape)), scores)


# --- the census --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RoleSettings:
    """How `roles` reads and decides: batches, the induction pass, the thresholds, intervals and until-stable.

    `headscope roles` builds it from its RolesOptions (whose long-range and card fields `roles` does not read).
    `limit` keeps the first N passages / sentences of each input. The induction pass reads `n_sequences`
    random token sequences, each repeated once after `repeat_length` tokens; coreference reads `coref_context`
    sentences before each anaphor. `intervals`: level, resamples, method, seed (None: 95%, 1,000, BCa,
    `seed`). With `until_stable` the text passages are read `chunk` at a time until every text role score's
    ranking reaches that split-half stability (Spearman-Brown), capped by `limit`.
    """

    max_length: int | None = None
    batch_size: int = 16
    limit: int | None = None
    seed: int = 0
    repeat_length: int = 24
    n_sequences: int = 32
    coref_context: int = 3
    thresholds: Thresholds | None = None
    intervals: IntervalSettings | None = None
    until_stable: float | None = None
    chunk: int = 32


def roles(hm: HeadModel, data: Any = None, settings: RoleSettings | None = None, *,
          treebank: str | Path | Sequence[Sentence] | TreebankSource | None = None,
          coref: str | Path | CorefSource | None = None, progress: bool = False) -> HeadTable:
    """Role census of `hm`: analyze's statistics plus role scores with their intervals, a `roles` column
    (roles whose rule passes on the score's conservative bound), an `uncertain_roles` column (roles whose
    point estimate passes but whose bound does not) and, in `meta['roles']`, every score, interval, held
    share, baseline and threshold (what roles.json holds; `confidence.py` states the rule).

    `data` as for `analyze` (default: the built-in sample; a TextSource already read is used as it
    is); `treebank` a CoNLL-U file, a list of `Sentence` or a `TreebankSource` for syntactic roles;
    `coref` a CorefUD CoNLL-U file (e.g. GUM) or a `CorefSource` for coreference. `settings` say how
    (default `RoleSettings()`).
    """
    settings = settings or RoleSettings()
    seed, batch_size, limit = settings.seed, settings.batch_size, settings.limit
    th = settings.thresholds or Thresholds()
    intervals = settings.intervals or IntervalSettings(seed=seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    max_len = resolve_max_length(hm, settings.max_length)
    # Read the treebank and coreference files before any slow work, so bad input fails fast.
    tb, co = _treebank(treebank, limit), _coref(coref, limit)

    stats, role_stats, info = text_pass(hm, data, max_len, batch_size, limit, progress,
                                        until_stable=settings.until_stable,
                                        stable=_stable_check(settings.until_stable, seed), chunk=settings.chunk)
    base = table_from_stats(hm, stats, {**info, "batch_size": batch_size, "seed": seed}, intervals)
    scores = text_scores(stats.means(), role_stats.means())
    # The passes below are not split across ranks (a fixed synthetic pass; per-relation and per-anaphor
    # argmax counts): rank 0 runs them alone and sends the result to every rank.
    ind = run_on_main(lambda: induction_sums(hm, settings.n_sequences, settings.repeat_length, seed, batch_size))
    scores.update(scores_of(ind, INDUCTION_SCORES))
    shape = (hm.n_layers, hm.n_heads)
    syntax, dep = _syntax_pass(hm, tb, max_len, batch_size, progress) if tb is not None else (None, None)
    if syntax is not None:
        scores.update(syntax_scores(syntax["relations"], shape))
    coref_dict, cc = _coref_pass(hm, co, max_len, batch_size, settings.coref_context, progress) \
        if co is not None else (None, None)
    if coref_dict is not None:
        scores.update(coref_scores(coref_dict, shape))
    text = text_sums(stats, role_stats)
    iv = role_intervals([g for g in (text, ind) if g is not None], th, intervals)
    if dep is not None and syntax is not None:
        _syntax_bounds(iv, dep, syntax["relations"], th, intervals, shape)
    if cc is not None and coref_dict is not None:
        _coref_bounds(iv, cc, coref_dict, scores, th, intervals)
    columns, decided = _decided(scores, iv, th, intervals, shape)
    report = {
        "model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "causal": hm.causal,
        "thresholds": th.as_dict(),
        "text": {**info, "first_token": "special token ([CLS]/BOS)" if info["first_token_is_special"]
                 else "first ordinary token: the tokenizer adds no BOS, so the sink is position 0"},
        "induction": {"sequences": settings.n_sequences, "repeat_length": settings.repeat_length, "seed": seed,
                      "special_prefix": special_frame(hm)[0]},
        **decided,
        "stability": {**(stability_of(text, scores_in(text), seed) if text is not None else {}),
                      **stability_of(ind, scores_in(ind), seed)},
        "syntax": syntax,
        "coreference": coref_dict,
    }
    return base.with_columns(columns, meta={"roles": report})


def _stable_check(target: float | None, seed: int) -> Any:
    """--until-stable's test after each chunk: whether every text role score's ranking reached `target`."""

    def stable(stats: Any, role_stats: Any) -> tuple[bool, dict[str, float]]:
        sums = text_sums(stats, role_stats)
        if sums is None or target is None:
            return False, {}
        return reached(stability_of(sums, scores_in(sums), seed), target)

    return stable


def _syntax_bounds(iv: RoleIntervals, dep: DependencyCounts, relations: dict[str, Any], th: Thresholds,
                   settings: IntervalSettings, shape: tuple[int, int]) -> None:
    """Each relation's accuracy interval over sentences (into `relations[rel]` as accuracy_lo/_hi, the better
    direction's) and the syntactic role's decision on its bound."""
    for rel, r in relations.items():
        sums = dep.relation_sums(rel)
        if sums is None:
            continue
        lo, hi = add_member(iv, "syntactic", rel, sums=sums, stat=best_accuracy(rel),
                            baseline=np.full(shape, r["baseline"]), th=th, settings=settings)
        r["accuracy_lo"], r["accuracy_hi"] = lo.tolist(), hi.tolist()
        r["sentence_rows"] = sums.rows


def _coref_bounds(iv: RoleIntervals, cc: CorefCounts, coref: dict[str, Any], scores: dict[str, np.ndarray],
                  th: Thresholds, settings: IntervalSettings) -> None:
    """The antecedent accuracy's interval over windows (into `coref` as accuracy_lo/_hi) and the coreference
    role's decision on its bound."""
    sums = cc.window_sums()
    if sums is None or not cc.total:
        return
    lo, hi = add_member(iv, "coreference", None, sums=sums, stat=COREF_ACCURACY,
                        baseline=scores["coref_accuracy_baseline"], th=th, settings=settings)
    coref["accuracy_lo"], coref["accuracy_hi"], coref["window_rows"] = lo.tolist(), hi.tolist(), sums.rows


def _decided(scores: dict[str, np.ndarray], iv: RoleIntervals, th: Thresholds, settings: IntervalSettings,
             shape: tuple[int, int]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """roles.csv's role columns (with bounds) and roles.json's scores, intervals, held shares, roles and census:
    roles decided on their conservative bounds where the scores have intervals (`confidence.py`)."""
    point = judge("short", scores, th)
    sure = judge("short", {**scores, **iv.conservative}, th)
    assigned, uncertain = split_roles(point, sure, iv.roles)

    def col(held: dict[tuple[int, int], list[str]]) -> np.ndarray:
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = ";".join(held.get(idx, []))
        return out

    columns: dict[str, np.ndarray] = {"roles": col(assigned), "uncertain_roles": col(uncertain)}
    for c in role_columns("short", scores):
        columns[c] = scores[c]
        columns.update(iv.columns([c]))
    report_part, baselines = report_scores("short", scores)
    census_ = census_of(((idx, assigned.get(idx, [])) for idx in np.ndindex(shape)), scores)
    for role_, heads in census_.items():
        found = resolve(role_)
        score_name = key(found[0].score, found[1]) if found else None
        score_name = score_name if score_name in iv.bounds else None
        for e in heads:
            l, h = parse_head(e["head"])
            if role_ in iv.held_share:
                e["held_share"] = float(iv.held_share[role_][l, h])
            if score_name is not None:
                lo, hi = iv.bounds[score_name]
                e["lo"], e["hi"] = float(lo[l, h]), float(hi[l, h])
    every = sorted({r for v in point.values() for r in v})
    decided = {
        "scores": report_part, "baselines": baselines, "intervals": settings.record(),
        "score_intervals": {n: {"lo": lo, "hi": hi, "rows": iv.rows[n]} for n, (lo, hi) in iv.bounds.items()},
        "held_share": iv.held_share,
        "decided_on": {r: "bound" if r in iv.roles else "estimate" for r in every},
        "roles": {head_name(l, h): assigned.get((l, h), []) for l in range(shape[0]) for h in range(shape[1])},
        "uncertain": heads_map(uncertain), "uncertain_heads": len(uncertain),
        "census": census_,
    }
    return columns, decided


def _syntax_pass(hm: HeadModel, tb: TreebankSource, max_len: int, batch_size: int,
                 progress: bool) -> tuple[dict[str, Any], DependencyCounts]:
    """roles.json's `syntax`: dependency accuracy per relation (Clark et al. 2019) and what was read."""
    bar = tqdm(total=len(tb.sentences), desc="roles: treebank", unit="sent", disable=not progress or not is_main(),
               leave=False)
    pid = pad_id(hm)
    try:
        dep = run_on_main(lambda: dependency_accuracy(hm, tb.sentences, max_len, batch_size, pid, bar))
    finally:
        bar.close()
    info = {"treebank": tb.name, "sentences": dep.sentences, "skipped_long": dep.skipped_long,
            "merged_tokens": dep.merged_tokens, "unaligned_words": dep.unaligned_words}
    return {"info": info, "relations": dep.to_dict(min_count=1)}, dep


def _coref_pass(hm: HeadModel, co: CorefSource, max_len: int, batch_size: int, context: int,
                progress: bool) -> tuple[dict[str, Any], CorefCounts]:
    """roles.json's `coreference`: antecedent accuracy per head, its baselines, and what was read."""
    bar = tqdm(desc="roles: coreference", unit="window", disable=not progress or not is_main(), leave=False)
    pid = pad_id(hm)
    try:
        cc, items_info = run_on_main(
            lambda: coreference_accuracy(hm, co.documents, max_len, batch_size, pid, context, bar))
    finally:
        bar.close()
    return {**cc.to_dict(), "file": co.name, **co.info, **items_info, "context_sentences": context}, cc


def syntax_rows(syntax: dict[str, Any] | None) -> list[dict[str, Any]]:
    """syntax.csv rows from roles.json's `syntax` (None: no treebank): one per head and relation, then one
    offset-baseline row per relation."""
    syn = (syntax or {}).get("relations") or {}
    rows = []
    for rel, r in syn.items():
        d2h, h2d = np.array(r["dep_to_head"], float), np.array(r["head_to_dep"], float)
        lo, hi = (np.array(r[k], float) if k in r else np.full(d2h.shape, np.nan)
                  for k in ("accuracy_lo", "accuracy_hi"))
        for l in range(d2h.shape[0]):
            for h in range(d2h.shape[1]):
                rows.append({"kind": "head", "layer": l, "head": h, "relation": rel, "count": r["count"],
                             "dep_to_head": d2h[l, h], "head_to_dep": h2d[l, h],
                             "accuracy": max(d2h[l, h], h2d[l, h]), "accuracy_lo": lo[l, h], "accuracy_hi": hi[l, h],
                             "baseline_offset": ""})
    for rel, r in syn.items():
        rows.append({"kind": "offset_baseline", "layer": "", "head": "", "relation": rel, "count": r["count"],
                     "dep_to_head": r["baseline"], "head_to_dep": r["baseline"], "accuracy": r["baseline"],
                     "accuracy_lo": "", "accuracy_hi": "", "baseline_offset": r["baseline_offset"]})
    return rows
