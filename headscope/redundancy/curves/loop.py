"""Iterative pruning curves: remove the least important heads step by step, measuring the metric at each point.

`prune_curve` scores every remaining head (with gates of 0 on the heads already removed), removes the
lowest-scoring units (`units`), measures the metric, and repeats. Scoring always runs on the original
weights, so the order of removal does not depend on recovery. With `recover_steps`, a copy of the
model is fine-tuned between steps (`recovery`); that copy carries its training from step to step, and
its metric is the `metric_recovered` column. With a checkpoint folder the curve is saved after every
point (`checkpoint`) and a rerun resumes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import importance
from ...errors import HeadscopeError
from ...eval.evaluate import evaluate_prepared, make_reference, prepare
from ...eval.metrics import METRICS
from ..importance import CRITERIA
from ...models.adapter import HeadModel
from ..pruning.heads import check_prunable, pruned_gates
from ...table import head_name
from .checkpoint import PARTIAL_JSON, resume, save_partial
from .recovery import Recovery
from .results import CurveRow, PruneResult, relative_drop
from .head_units import candidate_units, check_unit, default_unit

log = logging.getLogger(__name__)


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_args(fraction: float | None, target_drop: float | None, step: float, recover_steps: int,
               method: str) -> None:
    """Raise a clear error on a bad fraction, target drop, step, recovery count or method."""
    CRITERIA.get(method)  # an unknown name raises, with a did-you-mean
    if fraction is not None and not 0.0 <= fraction < 1.0:
        raise HeadscopeError(f"fraction must be in [0, 1) (share of heads to remove), got {fraction}; "
                             f"e.g. 0.4 removes 40% of the heads")
    if target_drop is not None and not (target_drop >= 0.0 and math.isfinite(target_drop)):
        raise HeadscopeError(f"target drop must be a non-negative share, got {target_drop}; e.g. 0.01 for 1%")
    if not 0.0 < step < 1.0:
        raise HeadscopeError(f"step must be in (0, 1) (share of heads removed per step), got {step}; e.g. 0.05")
    if recover_steps < 0:
        raise HeadscopeError(f"recovery steps must be >= 0, got {recover_steps}")
    if fraction is None and target_drop is None:
        raise HeadscopeError("give a fraction of heads to remove (e.g. 0.4) or a target drop (e.g. 0.01 for 1%)")


def check_target_drop(metric: str, target_drop: float | None) -> None:
    """Refuse a target drop a bounded metric cannot reach (e.g. 200% of fidelity, a cosine)."""
    bound = METRICS.get(metric).max_drop
    if target_drop is not None and bound is not None and target_drop >= bound:
        raise HeadscopeError(f"target drop {target_drop:.0%} cannot be reached with metric {metric!r}: its largest "
                             f"possible drop is {bound:.0%}; give a target drop below it, e.g. 1% or 5%")


def prune_curve(
    hm: HeadModel,
    data: Any,
    *,
    method: str = "gradient",
    fraction: float | None = None,
    target_drop: float | None = None,
    step: float = 0.05,
    recover_steps: int = 0,
    recover_lr: float = 5e-5,
    heldout: Any = None,
    metric: str = "auto",
    unit: str | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
    checkpoint: str | Path | None = None,
    extra: dict[str, Callable[[HeadModel, torch.Tensor], float]] | None = None,
    extra_on_recovered: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> PruneResult:
    """Iteratively remove the least important heads of `hm`, re-scoring after each step.

    Stops at `fraction` of the heads, or (with only `target_drop`) at the first point whose drop
    exceeds it. Scores on `data`, measures on `heldout` (default: `data`). With `checkpoint` (a
    folder), the curve is saved after each step as `prune_curve.partial.json` and a rerun with the
    same settings resumes from it. `extra` maps names to `fn(model, gates) -> float`, measured
    at every point (e.g. `eval.wordsim.wordsim_measure("simlex999")`), also on the recovered copy with
    `extra_on_recovered`. The input model is not modified.
    """
    check_args(fraction, target_drop, step, recover_steps, method)
    check_prunable(hm)
    unit = unit or default_unit(hm)
    check_unit(hm, unit)
    torch.manual_seed(seed)
    total = hm.n_layers * hm.n_heads
    cap = fraction if fraction is not None else 0.95
    stop_n = int(math.floor(cap * total + 1e-9))
    per_step = max(1, int(round(step * total)))

    prep, metric = prepare(hm, data, metric, max_length)
    check_target_drop(metric, target_drop)  # 'auto' is resolved only now; before any pruning
    evalprep = prep if heldout is None else prepare(hm, heldout, metric, max_length)[0]
    entry = METRICS.get(metric)
    higher = entry.higher_is_better
    ref = make_reference(hm, prep, batch_size=batch_size) if entry.needs_reference else None
    eval_ref = ref if heldout is None or not entry.needs_reference else \
        make_reference(hm, evalprep, batch_size=batch_size)
    settings = {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "method": method,
                "metric": metric, "unit": unit, "step": step, "recover_steps": recover_steps,
                "recover_lr": recover_lr, "seed": seed, "batch_size": batch_size,
                "data": _fingerprint(prep.ids), "heldout": _fingerprint(evalprep.ids)}

    def measure(model: HeadModel, gates: torch.Tensor) -> float:
        return evaluate_prepared(model, evalprep, metric, gates=gates, reference=eval_ref,
                                 batch_size=batch_size).value

    extras = dict(extra or {})
    settings["extra"] = sorted(extras)
    settings["extra_on_recovered"] = extra_on_recovered
    rows: list[CurveRow] = []
    removed: list[tuple[int, int]] = []
    recovery = Recovery(hm, prep, metric, ref, lr=recover_lr, batch_size=batch_size, seed=seed,
                        steps=recover_steps, progress=progress) if recover_steps else None
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and (ckpt / PARTIAL_JSON).exists():
        rows, removed = resume(ckpt, settings, recovery)
    if not rows:
        ones = torch.ones(hm.n_layers, hm.n_heads)
        base = measure(hm, ones)
        ex = {k: fn(hm, ones) for k, fn in extras.items()}
        rows.append(CurveRow(0, 0, 0.0, base, 0.0, base if recovery else None, 0.0 if recovery else None,
                             extra=ex, extra_recovered=dict(ex) if recovery and extra_on_recovered else {}))
    base = rows[0].metric
    target_mode = fraction is None and target_drop is not None
    bar = tqdm(total=stop_n, initial=len(removed), desc=f"prune ({method})", unit="head", disable=not progress)
    try:
        while len(removed) < stop_n:
            last = rows[-1]
            track = last.drop_recovered if recovery is not None else last.drop
            if fraction is None and target_drop is not None and track is not None and track > target_drop:
                break
            gates = pruned_gates(hm, removed) if removed else None
            table = importance.score(hm, prep, methods=(method,), metric=metric, gates=gates, reference=ref,
                                     batch_size=batch_size)
            # A live head without a score (NaN) is never picked: unknown is not "unimportant".
            scores = np.nan_to_num(np.asarray(table[f"importance_{method}"], dtype=float), nan=np.inf)
            units = candidate_units(hm, scores, set(removed), unit)
            chosen: list[tuple[int, int]] = []
            for _, heads in units:
                if len(removed) + len(chosen) + len(heads) > stop_n:
                    break
                chosen += heads
                if len(chosen) >= per_step:
                    break
            if not chosen:  # the next unit would overshoot the cap
                break
            removed += chosen
            gates = pruned_gates(hm, removed)
            value = measure(hm, gates)
            row = CurveRow(len(rows), len(removed), len(removed) / total, value,
                           relative_drop(metric, base, value), removed=[head_name(l, h) for l, h in chosen],
                           extra={k: fn(hm, gates) for k, fn in extras.items()})
            if recovery is not None:
                before = recovery.snapshot() if target_mode else None
                recovery.train(gates, recover_steps)
                rv = measure(recovery.hm, gates)
                row.metric_recovered, row.drop_recovered = rv, relative_drop(metric, base, rv)
                if extra_on_recovered:
                    row.extra_recovered = {k: fn(recovery.hm, gates) for k, fn in extras.items()}
                if target_mode and row.drop_recovered > target_drop:
                    # Past the target: the model worth keeping is the one of the previous point.
                    recovery.restore(before, rows[-1].n_removed)
                else:
                    recovery.n_removed = row.n_removed
            rows.append(row)
            bar.update(len(chosen))
            log.info("removed %d/%d heads: %s %.4f (drop %.2f%%)", len(removed), total, metric, value, 100 * row.drop)
            if ckpt is not None:
                save_partial(ckpt, settings, rows, recovery)
    finally:
        bar.close()
    result = PruneResult(hm.name, hm.n_layers, hm.n_heads, hm.n_kv_heads, method, metric, higher, unit, rows,
                         target_drop if target_drop is not None else 0.01, recover_steps,
                         meta={"data": prep.source, "heldout": evalprep.source if heldout is not None else "same as data",
                               "passages": len(prep.ids), "heldout_passages": len(evalprep.ids),
                               "max_length": prep.max_length, "step": step, "fraction": fraction, "seed": seed,
                               "recover_lr": recover_lr if recover_steps else None})
    if recovery is not None:
        result.recovered_state = recovery.hm.model.state_dict()
        result.recovered_n_removed = recovery.n_removed
    return result


__all__ = ["check_args", "prune_curve"]
