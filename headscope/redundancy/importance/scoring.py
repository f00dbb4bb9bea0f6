"""`score`: every head by each chosen criterion, as one HeadTable; and the criteria's rank agreement."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ...data import Tokens
from ...distributed import is_main, run_on_main
from ...errors import HeadscopeError, OptionError
from ...eval.evaluate import MetricResult, Reference, evaluate_prepared, ids_fingerprint, make_reference, prepare
from ...eval.metrics import METRICS, resolve_metric
from ...models.adapter import HeadModel
from ...table import HeadTable
from ...uncertainty import (
    MIN_STABLE_PASSAGES,
    IntervalSettings,
    PassageSums,
    Statistic,
    check_until_stable,
    chunk_spans,
    interval_from,
    jackknife,
    replicates,
    spearman,
    spearman_rows,
    split_half,
)
from ...version import versions
from .criteria import CRITERIA, ScoreContext, base_gates, parse_methods, shares


def _take(prep: Tokens, lo: int, hi: int) -> Tokens:
    """Passages lo..hi-1 of `prep`, as their own prepared data (labels and word ids follow)."""
    return Tokens(prep.ids[lo:hi], prep.source, prep.max_length, 0, None,
                  prep.word_ids[lo:hi] if prep.word_ids is not None else None,
                  prep.labels[lo:hi] if prep.labels is not None else None)


def _take_reference(ref: Reference | None, prep: Tokens, lo: int, hi: int) -> Reference | None:
    if ref is None:
        return None
    return Reference(ref.pooled[lo:hi], ref.tokens[lo:hi], ref.lengths[lo:hi], ids_fingerprint(prep.ids[lo:hi]))


@dataclass
class _Run:
    """What scoring has gathered so far: each criterion's per-passage contributions and its statistic."""

    parts: dict[str, list[PassageSums]] = field(default_factory=dict)
    statistic: dict[str, Statistic] = field(default_factory=dict)
    direct: dict[str, np.ndarray] = field(default_factory=dict)  # criteria that report no contributions
    timings: dict[str, float] = field(default_factory=dict)
    learned: dict[str, dict[str, Any]] = field(default_factory=dict)  # learned criteria: their training record
    base_result: MetricResult | None = None

    def add(self, ctx: ScoreContext) -> None:
        for m, (sums, stat) in ctx.contributions.items():
            self.parts.setdefault(m, []).append(sums)
            self.statistic[m] = stat
        self.base_result = ctx.base_result

    def sums(self, method: str) -> PassageSums:
        return PassageSums.concat(self.parts[method])


def _score_chunk(run: _Run, ctx: ScoreContext, chosen: list[str]) -> None:
    """Every chosen criterion on one chunk of passages (criteria sharing a computation run it once)."""
    done: set[str] = set()
    for method in chosen:
        if method in done:
            continue
        # Criteria sharing one computation are timed as one entry, e.g. "gradient+gradient_raw+taylor".
        group = [m for m in chosen if shares(CRITERIA.get(m)) == shares(CRITERIA.get(method))]
        t0 = time.perf_counter()
        # torchrun / --workers: `sharded` criteria split their work, the others run on rank 0
        for m in group:
            fn = CRITERIA.get(m).fn
            value = np.array(fn(ctx) if CRITERIA.get(m).meta.get("sharded") else run_on_main(partial(fn, ctx)),
                             dtype=float)
            if m not in ctx.contributions:
                run.direct[m] = value
            done.add(m)
        key = "+".join(group)
        run.timings[key] = run.timings.get(key, 0.0) + time.perf_counter() - t0
    run.add(ctx)


def _stable_enough(run: _Run, chosen: list[str], target: float, seed: int) -> tuple[bool, dict[str, float]]:
    """Whether every criterion's split-half stability (Spearman-Brown) reaches `target`; the values."""
    got = {m: split_half(run.sums(m), run.statistic[m], seed=seed).spearman_brown for m in chosen if m in run.parts}
    return bool(got) and all(v >= target for v in got.values()), got


@dataclass(frozen=True, kw_only=True)
class ScoreSettings:
    """How `score` scores: which criteria, on which metric, in which batches, with which intervals.

    `headscope score` builds it from its ScoreOptions; pruning curves and tasks, which score below the verb,
    build their own. `methods` are names in `CRITERIA` (comma-separated, a list, or 'all'). `limit` keeps the
    first passages of data given by name. `intervals`: level, resamples, method, seed (None: 95%, 1,000, BCa,
    `seed`). `until_stable`, a split-half stability in (0, 1): passages are scored `chunk` at a time until every
    criterion's ranking reaches it. `criterion_settings` holds settings of single criteria, e.g.
    {"l0": {"settings": L0Settings(...)}}.
    """

    methods: str | Sequence[str] = ("gradient",)
    metric: str = "auto"
    max_length: int | None = None
    batch_size: int = 16
    ig_steps: int = 16
    seed: int = 0
    limit: int | None = None
    intervals: IntervalSettings | None = None
    until_stable: float | None = None
    chunk: int = 32
    criterion_settings: Mapping[str, Any] = field(default_factory=dict)


def score(hm: HeadModel, data: Any, settings: ScoreSettings | None = None, *, gates: torch.Tensor | None = None,
          reference: Reference | None = None, progress: bool = False) -> HeadTable:
    """Score every head by each criterion; one column `importance_<method>` each (higher = more important),
    followed by its confidence interval's bounds `importance_<method>_lo` / `_hi`.

    `settings` say how (default `ScoreSettings()`: gradient). `gates` is the current mask `[L, H]` (0 = already
    pruned: NaN in every column). Fidelity compares against `reference` (the unpruned model's outputs; built
    here when None). With `settings.until_stable` passages are scored in chunks until every criterion's
    ranking reaches it (Spearman-Brown of the split-half Spearman), or the data (`limit`) runs out;
    meta['until_stable'] says which. meta['stability'] holds each ranking's split-half stability,
    meta['rank_correlations'] each pair's Spearman with its interval. A learned criterion (e.g. `l0`) writes
    NaN bounds and says why in meta['learned'].
    """
    settings = settings or ScoreSettings()
    chosen = parse_methods(settings.methods)
    batch_size, seed, until_stable = settings.batch_size, settings.seed, settings.until_stable
    if batch_size < 1:
        raise HeadscopeError(f"batch_size must be at least 1, got {batch_size}")
    if settings.ig_steps < 1:
        raise HeadscopeError(f"ig_steps must be at least 1, got {settings.ig_steps}")
    if isinstance(data, Tokens):
        prep, metric = data, resolve_metric(hm, settings.metric, data.labels is not None)
    else:
        prep, metric = prepare(hm, data, settings.metric, settings.max_length, settings.limit)
    check_until_stable(until_stable, len(prep.ids))
    learned = [m for m in chosen if CRITERIA.get(m).meta.get("learned")]
    if until_stable is not None and learned:
        raise OptionError("until_stable", f"needs per-passage criteria; {', '.join(learned)} is learned over all "
                                          f"passages at once: score it without until_stable", also=("until_stable",))
    intervals = settings.intervals or IntervalSettings(seed=seed)
    base = base_gates(hm, gates)
    if METRICS.get(metric).needs_reference:
        if reference is None:
            reference = make_reference(hm, prep, batch_size=batch_size, progress=progress)
        reference.check(prep)
    torch.manual_seed(seed)
    run, used, reached = _Run(), 0, None
    bar = tqdm(total=len(prep.ids), desc="score until stable", unit="passage",
               disable=until_stable is None or not progress or not is_main(), leave=False)
    for lo, hi in chunk_spans(len(prep.ids), until_stable, settings.chunk):
        part = _take(prep, lo, hi) if (lo, hi) != (0, len(prep.ids)) else prep
        ref = _take_reference(reference, prep, lo, hi) if part is not prep else reference
        ctx = ScoreContext(hm, part, metric, base, reference=ref, batch_size=batch_size, ig_steps=settings.ig_steps,
                           seed=seed, progress=progress, options=dict(settings.criterion_settings))
        _score_chunk(run, ctx, chosen)
        run.learned.update({m: {"interval": CRITERIA.get(m).meta["interval"], **ctx.options.get(f"{m}_record", {})}
                            for m in learned})
        used = hi
        bar.update(hi - lo)
        if until_stable is not None:
            reached, now = _stable_enough(run, chosen, until_stable, seed)
            bar.set_postfix({m: f"{v:.2f}" for m, v in now.items()})
            if reached:
                break
    bar.close()
    final = prep if used == len(prep.ids) else _take(prep, 0, used)
    final_ref = reference if final is prep else _take_reference(reference, prep, 0, used)
    base_result = run.base_result if final is prep and run.base_result is not None else \
        evaluate_prepared(hm, final, metric, gates=base, reference=final_ref, batch_size=batch_size)
    until = {"target": until_stable, "reached": reached, "passages": used,
             "available": len(prep.ids)} if until_stable is not None else None
    return _table(hm, run, chosen, base, final, metric=metric, base_result=base_result, settings=settings,
                  intervals=intervals, until=until)


def _table(hm: HeadModel, run: _Run, chosen: list[str], base: torch.Tensor, prep: Tokens, *, metric: str,
           base_result: MetricResult, settings: ScoreSettings, intervals: IntervalSettings,
           until: dict[str, Any] | None) -> HeadTable:
    """The importance table: each criterion's column and interval bounds, stability and correlations in meta."""
    pruned = (base == 0).cpu().numpy()
    absent = np.zeros_like(pruned)
    # layers without softmax heads (Qwen3.5's linear attention): no importance
    absent[hm.headless_layers] = True
    columns: dict[str, np.ndarray] = {}
    stability: dict[str, Any] = {}
    reps: dict[str, tuple[np.ndarray, np.ndarray | None, int]] = {}
    for method in chosen:
        if method in run.parts:
            sums, stat = run.sums(method), run.statistic[method]
            v = np.asarray(stat(sums.total()), float)
            r = replicates(sums, stat, intervals.B, intervals.seed) if sums.rows >= 2 else np.empty((0, *v.shape))
            j = jackknife(sums, stat) if intervals.method == "bca" and sums.rows >= 2 else None
            iv = interval_from(v, r, j, sums.rows, intervals)
            if CRITERIA.get(method).meta.get("per_batch") is None:
                reps[method] = (r, j, sums.rows)
            stability[method] = split_half(sums, stat, seed=intervals.seed).record()
            lo, hi = iv.lo.copy(), iv.hi.copy()
        else:
            v, lo, hi = run.direct[method], np.full(pruned.shape, np.nan), np.full(pruned.shape, np.nan)
        if v.shape != pruned.shape:
            raise HeadscopeError(f"importance criterion {method!r} returned shape {v.shape}; "
                                 f"expected [n_layers, n_heads] = {list(pruned.shape)}")
        for arr in (v, lo, hi):
            if arr is not None:
                arr[pruned | absent] = np.nan
        columns[f"importance_{method}"] = v
        if lo is not None and hi is not None:
            columns[f"importance_{method}_lo"], columns[f"importance_{method}_hi"] = lo, hi
    meta = {
        "model": hm.name, "model_source": hm.source, "model_type": hm.config.model_type,
        "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head_record,
        "causal": hm.causal, "data": prep.source, "passages": len(prep.ids), "tokens_seen": prep.n_tokens,
        "max_length": prep.max_length, "batch_size": settings.batch_size, "seed": settings.seed,
        "ig_steps": settings.ig_steps,
        "metric": metric, "metric_value": base_result.value, "metric_details": base_result.details,
        "higher_is_better": base_result.higher_is_better, "methods": chosen,
        "pruned_heads": int(pruned.sum()), "convention": "higher importance = more important; pruned heads NaN",
        "seconds": run.timings, "intervals": intervals.record(), "stability": stability,
        "rank_correlations": _correlation_intervals(columns, reps, pruned, intervals),
        **({"until_stable": until} if until is not None else {}),
        **({"learned": run.learned} if run.learned else {}), "versions": versions(),
    }
    return HeadTable(hm.n_layers, hm.n_heads, columns, meta)


def _correlation_intervals(columns: dict[str, np.ndarray], reps: dict[str, tuple[np.ndarray, np.ndarray | None, int]],
                           pruned: np.ndarray, settings: IntervalSettings) -> list[dict[str, Any]]:
    """Each pair of per-passage criteria: Spearman over the live heads, with its interval from the same
    resamples of the passages (paired)."""
    out = []
    names = [m for m in reps if reps[m][2] >= 2]
    live = ~pruned.ravel()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (ra, ja, n), (rb, jb, _) = reps[a], reps[b]
            va, vb = columns[f"importance_{a}"].ravel(), columns[f"importance_{b}"].ravel()
            ok = live & np.isfinite(va) & np.isfinite(vb)
            value = spearman(va[ok], vb[ok])
            def flat(x: np.ndarray, ok: np.ndarray = ok) -> np.ndarray:  # replicates/jackknife rows -> live heads
                return x.reshape(len(x), -1)[:, ok]

            r = spearman_rows(flat(ra), flat(rb))
            j = spearman_rows(flat(ja), flat(jb)) if ja is not None and jb is not None else None
            iv = interval_from(np.asarray(value), r, j, n, settings)
            out.append({"a": a, "b": b, "spearman": value, "lo": float(iv.lo), "hi": float(iv.hi)})
    return out


def rank_correlations(table: HeadTable) -> Any:
    """Spearman correlation between every pair of `importance_*` columns (pairwise over non-NaN heads)."""
    import pandas as pd  # pandas takes ~0.5 s to import; only this summary needs it

    names = [c for c in table.columns if c.startswith("importance_") and not c.endswith(("_lo", "_hi"))]
    if not names:
        raise HeadscopeError(f"the table has no importance_* columns (columns: {', '.join(table.columns)}); "
                             f"run headscope score first")
    df = pd.DataFrame({n.removeprefix("importance_"): np.asarray(table[n], float).ravel() for n in names})
    return df.corr(method="spearman")


def layer_norms(column: np.ndarray) -> np.ndarray:
    """Per-layer L2 norm of a `[L, H]` column, ignoring NaN (pruned) heads."""
    return np.sqrt(np.nansum(np.asarray(column, float) ** 2, axis=-1))


__all__ = ["MIN_STABLE_PASSAGES", "ScoreSettings", "check_until_stable", "layer_norms", "rank_correlations",
           "score"]
