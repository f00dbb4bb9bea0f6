"""The one pruning-curve engine, for every unit kind: remove the least important units step by step and
measure the metric at each point.

`prune_curve` asks the unit's plan (`plans`) for the next point's units, switches everything removed so
far off (`pruning.masks.UnitMask`: head gates, attention sub-layers, blocks, FFN neurons), measures the
metric on the held-out passages, and repeats until the plan is done (`fraction`, the cap), or, with
`target_drop`, past the first point whose drop exceeds it. Head plans re-score before every point on the
original weights; layer plans score once. With `recover_steps` a copy of the model is fine-tuned at every point
(`recovery`): carried from point to point for heads (its metric is the `metric_recovered` column), or
from the original weights at each point for units beyond heads. With `latency` each point of a parameter
curve is also pruned physically and timed against the original (`latency`). With a checkpoint folder a
head curve is saved after every point (`checkpoint`) and a rerun resumes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from ...data import batches, pad_id
from ...errors import HeadscopeError, OptionError
from ...eval.evaluate import Reference, evaluate_prepared, make_reference, prepare, read_task_data
from ...eval.metrics import METRICS
from ...eval.wordsim import WORDSIM, wordsim_measure
from ...models.adapter import HeadModel
from ...table import head_name
from ...uncertainty import IntervalSettings
from ..curve_checks import check_args, check_target_drop
from ..options import PruneOptions
from ..protect import Protection, find_protected
from ..protect import check_model as check_protect
from ..pruning.heads import check_prunable, n_parameters
from ..pruning.masks import UnitMask, unit_masks
from ..pruning.units import prune_units
from ..unit_kinds import check_unit, default_unit, unit_kind
from .checkpoint import PARTIAL_JSON, resume, save_partial
from .intervals import point_intervals
from .latency import matmul_flops, time_forward, time_speedup
from .plans import HeadPlan, L0Plan, LayerPlan, PlanData, check_fraction, make_plan
from .points import CurvePoint, relative_drop, within_target
from .recovery import Recovery
from .results import CurveResult

log = logging.getLogger(__name__)

Extra = Callable[[HeadModel, torch.Tensor], float]
# forward passes timed per model at each point of a latency curve (the median ratio is kept)
LATENCY_REPEATS = 5


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class _Measure:
    """The metric of a model with units switched off, on the held-out passages."""

    evalprep: Any
    metric: str
    reference: Reference | None
    batch_size: int

    def __call__(self, model: HeadModel, mask: UnitMask, into: dict[str, list[float]] | None = None,
                 key: str = "") -> float:
        """The metric; with `into`, its per-passage numerators and denominators are stored there too."""
        with unit_masks(model, mask):
            res = evaluate_prepared(model, self.evalprep, self.metric, reference=self.reference,
                                    batch_size=self.batch_size)
        if into is not None and res.passages is not None:
            into[f"{key}num"] = res.passages["num"].tolist()
            into[f"{key}den"] = res.passages["den"].tolist()
        return res.value


@dataclass
class _Curve:
    """One run's moving parts: the plan, the measure, recovery, extras, latency and the points so far."""

    hm: HeadModel
    plan: HeadPlan | LayerPlan
    measure: _Measure
    recovery: Recovery | None
    # steps, lr, batch_size, seed, progress, and the data recovery trains on
    recover: dict[str, Any]
    extras: dict[str, Extra]
    extra_on_recovered: bool
    target_drop: float | None
    target_mode: bool
    latency: dict[str, Any] | None = None
    intervals: IntervalSettings = field(default_factory=IntervalSettings)
    points: list[CurvePoint] = field(default_factory=list)
    recovered_state: dict[str, torch.Tensor] | None = None
    recovered_n_removed: int | None = None
    # target mode: a point's recovered drop has passed the target (by its bound)
    past_target: bool = False
    # carried recovery's state at the last point within, and its n
    kept: tuple[dict[str, Any], int] | None = None

    def gates(self, mask: UnitMask) -> torch.Tensor:
        g = mask.head_gates(self.hm)
        return g if g is not None else torch.ones(self.hm.n_layers, self.hm.n_heads)

    def baseline(self) -> CurvePoint:
        empty = UnitMask()
        passages: dict[str, list[float]] = {}
        base = self.measure(self.hm, empty, passages)
        rec = self.recover["steps"] > 0
        ex = {k: fn(self.hm, self.gates(empty)) for k, fn in self.extras.items()}
        point = CurvePoint(0, 0, 0.0, base, 0.0, base if rec else None, 0.0 if rec else None, extra=ex,
                           extra_recovered=dict(ex) if rec and self.extra_on_recovered else {},
                           params_removed=0 if self.plan.scope != "heads" else None, passages=passages)
        if passages:
            point.bounds = point_intervals(self.measure.metric, passages, passages, self.intervals)
            if rec:  # the baseline is its own recovered model
                point.bounds.update({k.replace("metric", "metric_recovered").replace("drop", "drop_recovered"): v
                                     for k, v in list(point.bounds.items())})
        if self.latency is not None:
            point.latency_s, point.speedup, point.flop_speedup = self.latency["base_s"], 1.0, 1.0
        return point

    def stop(self) -> bool:
        """In target mode, past the first point whose (recovered) drop exceeds the target."""
        last = self.points[-1]
        track = last.drop_recovered if self.recover["steps"] else last.drop
        return self.target_mode and self.target_drop is not None and track is not None and track > self.target_drop

    def next_point(self) -> CurvePoint | None:
        units = self.plan.next_units()
        if units is None:
            return None
        mask = self.plan.mask()
        passages: dict[str, list[float]] = {}
        value = self.measure(self.hm, mask, passages)
        base = self.points[0].metric
        metric = self.measure.metric
        point = CurvePoint(len(self.points), self.plan.n_removed, self.plan.size_removed() / self.plan.total, value,
                           relative_drop(metric, base, value),
                           removed=self.plan.names(units),  # type: ignore[arg-type]  # units of this plan's own next_units
                           extra={k: fn(self.hm, self.gates(mask)) for k, fn in self.extras.items()},
                           params_removed=self.plan.params_removed(), passages=passages)
        state = self._recover(point, mask) if self.recover["steps"] else None
        if passages:
            base_passages = self.points[0].passages
            point.bounds = point_intervals(metric, base_passages, passages, self.intervals)
            if "rec_num" in passages:
                point.bounds.update(point_intervals(metric, base_passages, passages, self.intervals, "rec_"))
        if state is not None:
            self._keep(point, state)
        if self.latency is not None:
            self._time(point, mask)
        return point

    def _recover(self, point: CurvePoint, mask: UnitMask) -> dict[str, Any] | None:
        """Recover the point's model and measure it; in target mode, the training state from before (carried
        recovery) or the point's own weights (fresh recovery) for `_keep` to decide on once the point has its
        interval."""
        base, metric, steps = self.points[0].metric, self.measure.metric, self.recover["steps"]
        if self.recovery is None:  # fresh: recovered from the original weights at every point
            rec = Recovery(self.hm, self.recover["prep"], metric, self.recover["reference"], lr=self.recover["lr"],
                           batch_size=self.recover["batch_size"], seed=self.recover["seed"], steps=steps)
            rec.train(mask, steps)
            point.metric_recovered = self.measure(rec.hm, mask, point.passages, "rec_")
            point.drop_recovered = relative_drop(metric, base, point.metric_recovered)
            if self.target_mode:
                return rec.hm.model.state_dict()
            self.recovered_state, self.recovered_n_removed = rec.hm.model.state_dict(), point.n_removed
            return None
        before = self.recovery.snapshot() if self.target_mode else None
        self.recovery.train(mask, steps)
        point.metric_recovered = self.measure(self.recovery.hm, mask, point.passages, "rec_")
        point.drop_recovered = relative_drop(metric, base, point.metric_recovered)
        if self.extra_on_recovered:
            point.extra_recovered = {k: fn(self.recovery.hm, self.gates(mask)) for k, fn in self.extras.items()}
        self.recovery.n_removed = point.n_removed
        return before

    def _keep(self, point: CurvePoint, state: dict[str, Any]) -> None:
        """Target mode: keep the recovered weights of the last point before the first whose recovered drop passes
        the target, judged as every claim is (claims.py): by the upper bound of the drop's interval when the point
        has one, else by its point estimate. `state`: what `_recover` returned for this point."""
        assert self.target_drop is not None, "a state is kept only in target mode"
        if self.past_target:
            return
        if within_target(point, self.target_drop, recovered=True):
            if self.recovery is None:  # fresh recovery: this point's own weights
                self.recovered_state, self.recovered_n_removed = state, point.n_removed
            return
        self.past_target = True
        # carried: the state before this point's training is the last point's
        if self.recovery is not None:
            self.kept = (state, self.points[-1].n_removed)

    def _time(self, point: CurvePoint, mask: UnitMask) -> None:
        lat = self.latency
        assert lat is not None, "timed only when the run measures latency"
        small = prune_units(self.hm, mask)
        ids, attention_mask = lat["batch"]
        point.latency_s, point.speedup = time_speedup(self.hm, small, ids, attention_mask, lat["repeats"])
        point.flop_speedup = lat["base_flops"] / matmul_flops(small, lat["tokens"], lat["seq"])
        # Physically removed = counted: the parameter share is what the smaller model really lost.
        point.params_removed = int(self.plan.total) - n_parameters(small)
        point.fraction_removed = point.params_removed / self.plan.total


def _latency_setup(hm: HeadModel, evalprep: Any, batch_size: int, repeats: int) -> dict[str, Any]:
    b = next(batches(evalprep.ids[:batch_size], batch_size, pad_id=pad_id(hm)))
    ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
    tokens, seq = int(mask.sum()), ids.shape[1]
    return {"batch": (ids, mask), "repeats": repeats, "tokens": tokens, "seq": seq,
            "base_s": time_forward(hm, ids, mask, repeats), "base_flops": matmul_flops(hm, tokens, seq)}


def _check(hm: HeadModel, opts: PruneOptions, extras: dict[str, Extra]) -> tuple[str, str, str]:
    """(unit, method, scope) after every check that needs the model but no data (`opts` are validated)."""
    unit = opts.unit or default_unit(hm)
    kind = unit_kind(unit)
    method = opts.method or kind.default_method
    check_args(opts.fraction, opts.target_drop, opts.step, opts.recover_steps, method, unit)
    if opts.latency and kind.scope == "heads":
        raise HeadscopeError("latency is timed for units beyond heads (attention, block, ffn, mix); for head "
                             "curves see benchmarks/bench_prune.py")
    if kind.scope == "heads":
        check_prunable(hm)
    check_unit(hm, unit)
    if kind.scope != "heads":
        assert opts.fraction is not None, "check_args: a curve of units other than heads takes a fraction"
        check_fraction(hm, unit, opts.fraction)
    if extras and kind.scope != "heads":
        raise OptionError("wordsim", "(extra measures) are taken on head curves; unit curves record the metric")
    check_protect(hm, opts.protect)  # a capability the family cannot do: before any forward
    return unit, method, kind.scope


def _extras(opts: PruneOptions, extra: dict[str, Extra] | None) -> dict[str, Extra]:
    """The measures taken at every point: wordsim353 and simlex999 with `opts.wordsim`, then the caller's."""
    wordsim = {w: wordsim_measure(w) for w in WORDSIM} if opts.wordsim else {}
    return {**wordsim, **(extra or {})}


def prune_curve(hm: HeadModel, data: Any, options: PruneOptions | None = None, *, heldout: Any = None,
                checkpoint: str | Path | None = None, extra: dict[str, Extra] | None = None, progress: bool = True,
                **changes: Any) -> CurveResult:
    """Remove units of `hm` least important first, measuring the metric at each point (module docstring).

    `options` are `prune`'s (`PruneOptions`; keywords override single ones: `prune_curve(hm, texts,
    fraction=0.4, step=0.1)`): `unit` (default: head for MHA, slice for GQA) and the `method` that orders it
    (default: the unit's); head curves stop at `fraction` of the heads, or (with only `target_drop`) at the first
    point whose drop exceeds it; parameter curves at `fraction` of all parameters. `uniform` (head units): every
    point removes the same units from every layer, so the pruned model has one shape that a plain config states
    (`plans.HeadPlan`). Every point's metric and drop carry a confidence interval over the held-out passages,
    paired with the baseline (`ci`, `bootstrap`, `seed`; see `curves.intervals`); `l0_*` train the gates of
    `method="l0"`, whose training state is checkpointed too. The options naming files (`data`, `out`,
    `save_model`) are `prune`'s; `options.heldout` is read here when `heldout` is not given.

    What is not an option: `data`, the scoring passages (a TextSource, passages, a corpus name or file);
    `heldout`, the passages the metric is measured on (default: `data`); `checkpoint` (a folder): a head curve is
    saved after each point as `prune_curve.partial.json` and a rerun with the same settings resumes it; `extra`
    maps names to `fn(model, gates) -> float`, measured at every point of a head curve (with `wordsim`, wordsim353
    and simlex999 first), also on the recovered copy with `wordsim_recovered`. The input model is not modified.
    """
    opts = (options or PruneOptions()).replace(**changes).validate()
    extras = _extras(opts, extra)
    unit, method, scope = _check(hm, opts, extras)
    if heldout is None and opts.heldout:
        heldout = read_task_data(opts.heldout, opts.heldout_limit or opts.limit)
    seed, batch_size, recover_steps = opts.seed, opts.batch_size, opts.recover_steps
    protection = find_protected(hm, opts.protect, batch_size=batch_size, intervals=opts.intervals(),
                                progress=progress) if opts.protect else None
    torch.manual_seed(seed)
    prep, evalprep, metric, ref, eval_ref = _prepare(hm, data, heldout, opts)
    ckpt = Path(checkpoint) if checkpoint is not None and scope == "heads" else None
    criteria = {"l0": {"settings": opts.l0_settings(opts.fraction)}}
    protected = protection.head_set() if protection is not None else frozenset()
    plan_data = PlanData(hm=hm, prep=prep, metric=metric, reference=ref, batch_size=batch_size, seed=seed,
                         progress=progress, options=criteria, checkpoint=ckpt, protected=protected)
    plan = make_plan(plan_data, unit, scope, method, opts.fraction, opts.step, opts.uniform)
    carried = unit_kind(unit).recovery == "carried"
    recovery = Recovery(hm, prep, metric, ref, lr=opts.recover_lr, batch_size=batch_size, seed=seed,
                        steps=recover_steps, progress=progress) if recover_steps and carried else None
    recover = {"steps": recover_steps, "lr": opts.recover_lr, "batch_size": batch_size, "seed": seed, "prep": prep,
               "reference": ref}
    run = _Curve(hm, plan, _Measure(evalprep, metric, eval_ref, batch_size), recovery, recover, extras,
                 extra_on_recovered=opts.wordsim_recovered, target_drop=opts.target_drop,
                 target_mode=opts.target_drop is not None and scope == "heads",
                 latency=_latency_setup(hm, evalprep, batch_size, LATENCY_REPEATS) if opts.latency else None,
                 intervals=opts.intervals())
    settings = _settings(run, opts, method, unit, prep, evalprep)
    if ckpt is not None and (ckpt / PARTIAL_JSON).exists():
        run.points = resume(ckpt, settings, recovery)
        plan.resume([h for p in run.points for h in p.removed])  # type: ignore[union-attr]
    if not run.points:
        run.points.append(run.baseline())
    _walk(run, method, ckpt, settings, progress)
    meta = {"data": prep.source, "heldout": evalprep.source if heldout is not None else "same as data",
            "passages": len(prep.ids), "heldout_passages": len(evalprep.ids), "max_length": prep.max_length}
    result = _result(run, opts, unit, scope, method, metric, meta)
    result.intervals = run.intervals
    if scope == "heads":
        result.meta["uniform"] = opts.uniform
    if protection is not None:
        result.meta["protected"] = _protected(protection, run)
    return result


def _settings(run: _Curve, opts: PruneOptions, method: str, unit: str, prep: Any, evalprep: Any) -> dict[str, Any]:
    """What a checkpoint records of the run, and a rerun must match to resume it."""
    hm, plan = run.hm, run.plan
    protected = sorted(head_name(l, h) for l, h in plan.data.protected)
    return {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "method": method,
            "metric": run.measure.metric, "unit": unit, "step": opts.step, "recover_steps": opts.recover_steps,
            "recover_lr": opts.recover_lr, "seed": opts.seed, "batch_size": opts.batch_size,
            "data": _fingerprint(prep.ids), "heldout": _fingerprint(evalprep.ids),
            "extra": sorted(run.extras), "extra_on_recovered": opts.wordsim_recovered,
            **({"l0": plan.settings.record()} if isinstance(plan, L0Plan) else {}),
            **({"uniform": True} if opts.uniform else {}),
            **({"protect": list(opts.protect), "protected": protected} if opts.protect else {})}


def _protected(protection: Protection, run: _Curve) -> dict[str, Any]:
    """prune.json's `protected`: the heads, what kept each and how it was measured, and whether the curve stopped
    before its cap because only protected heads remained."""
    exhausted = isinstance(run.plan, HeadPlan) and run.plan.exhausted
    last = run.points[-1]
    return {**protection.record(), "stopped_early": exhausted,
            "stopped_at": {"n_removed": last.n_removed, "fraction_removed": last.fraction_removed} if exhausted
            else None}


def _prepare(hm: HeadModel, data: Any, heldout: Any, opts: PruneOptions) -> tuple[Any, Any, str, Any, Any]:
    """(scoring passages, held-out passages, the resolved metric, its reference on each)."""
    prep, metric = prepare(hm, data, opts.metric, opts.max_length)
    check_target_drop(metric, opts.target_drop)  # 'auto' is resolved only now; before any pruning
    evalprep = prep if heldout is None else prepare(hm, heldout, metric, opts.max_length)[0]
    needs_reference = METRICS.get(metric).needs_reference
    ref = make_reference(hm, prep, batch_size=opts.batch_size) if needs_reference else None
    eval_ref = ref if heldout is None or ref is None else make_reference(hm, evalprep, batch_size=opts.batch_size)
    return prep, evalprep, metric, ref, eval_ref


def _walk(run: _Curve, method: str, ckpt: Path | None, settings: dict[str, Any], progress: bool) -> None:
    """Take points until the plan is done or the target is passed; checkpoint after each."""
    plan = run.plan
    heads = isinstance(plan, HeadPlan)
    total = plan.stop_n if isinstance(plan, HeadPlan) else len(plan.cuts)
    bar = tqdm(total=total, initial=plan.n_removed if heads else 0,
               desc=f"prune ({method})" if heads else f"{plan.unit} curve", unit="head" if heads else "point",
               disable=not progress)
    try:
        while not run.stop():
            before = plan.n_removed
            point = run.next_point()
            if point is None:
                break
            run.points.append(point)
            bar.update(plan.n_removed - before if heads else 1)
            log.info("removed %s: %s %.4f (drop %.2f%%)", point.removed, run.measure.metric, point.metric,
                     100 * point.drop)
            if ckpt is not None:
                save_partial(ckpt, settings, run.points, run.recovery)
    finally:
        bar.close()


def _result(run: _Curve, opts: PruneOptions, unit: str, scope: str, method: str, metric: str,
            meta: dict[str, Any]) -> CurveResult:
    hm, plan, recover_steps = run.hm, run.plan, opts.recover_steps
    lr = opts.recover_lr if recover_steps else None
    if scope == "heads":
        meta.update({"step": opts.step, "fraction": opts.fraction, "seed": opts.seed, "recover_lr": lr,
                     "target_mode": run.target_mode})
    else:
        meta.update({"fraction": opts.fraction, "step": opts.step, "seed": opts.seed, "recover_steps": recover_steps,
                     "recover_lr": lr, "score_seconds": plan.score_seconds,  # type: ignore[union-attr]
                     "n_layers": hm.n_layers})
    target_drop = opts.target_drop
    result = CurveResult(model=hm.name, n_layers=hm.n_layers, n_heads=hm.n_heads, n_kv_heads=hm.n_kv_heads, unit=unit,
                         scope=scope, method=method, metric=metric,
                         higher_is_better=METRICS.get(metric).higher_is_better, points=run.points,
                         target_drop=target_drop if target_drop is not None else 0.01, recover_steps=recover_steps,
                         n_parameters=int(plan.total) if scope != "heads" else n_parameters(hm),
                         scores=plan.scores, meta=meta, last_mask=plan.mask() if scope != "heads" else None)
    if run.recovery is not None:
        # target mode went on past the last point within: back to that point's weights
        if run.kept is not None:
            run.recovery.restore(*run.kept)
        result.recovered_state = run.recovery.hm.model.state_dict()
        result.recovered_n_removed = run.recovery.n_removed
    elif run.recovered_state is not None:
        result.recovered_state, result.recovered_n_removed = run.recovered_state, run.recovered_n_removed
    return result


def unit_curve(hm: HeadModel, data: Any, *, unit: str = "block", method: str | None = None, fraction: float = 0.5,
               step: float = 0.05, progress: bool = False, **changes: Any) -> CurveResult:
    """`prune_curve` of a unit beyond heads (its name before the engines were one); `changes`: other options."""
    return prune_curve(hm, data, unit=unit, method=method, fraction=fraction, step=step, progress=progress,
                       **changes)


__all__ = ["LATENCY_REPEATS", "prune_curve", "unit_curve"]
