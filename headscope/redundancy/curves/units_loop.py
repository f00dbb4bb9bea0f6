"""The metric against the share of parameters removed, for units beyond heads, with optional recovery.

`unit_curve` scores the units once on the original model (one-shot, as ShortGPT and He et al. do for
layers), removes them in order of importance (least important first) and measures the metric on the
held-out data at each point:

- `attention` / `block`: whole sub-layers or blocks, least important first;
- `ffn`: FFN neurons ranked across all layers (at least one stays per layer);
- `mix`: attention sub-layers and FFN neurons, each in its own order, always taking next from the kind
  that has given up fewer parameters so far (so both give about half of what is removed).

A point is measured each time the removed units pass another `step` of all parameters, up to `fraction`
(units are never split, so a point may overshoot its step by part of one unit); the last point is the
most that fits under `fraction`, even when it falls short of a whole step.

With `recover_steps`, each point is recovered from the original weights with the units masked, through
the shared training loop (`curves.recovery.Recovery`: `train.Trainer`, the metric's recovery loss, i.e.
`eval.lm.distillation_loss` from the unpruned model for causal LMs). With `latency`, each point is also
pruned physically (`units.physical.prune_units`) and one forward pass over a fixed batch is timed against
the original's, the two in turn in each of `latency_repeats` repeats (the speedup is the median of the
per-repeat ratios), beside the FLOP-ideal speedup (matmul FLOPs of the two models on that batch).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .recovery import Recovery
from ...data import batches, pad_id
from ...errors import HeadscopeError, did_you_mean
from ...eval.evaluate import evaluate_prepared, make_reference, prepare
from ...eval.metrics import METRICS
from ...models.adapter import HeadModel
from ..pruning.heads import n_parameters
from ..pruning.masks import UnitMask, check_unit_kind, unit_masks
from ..pruning.units import prune_units, unit_parameters
from ..importance.units import ffn_scores, layer_scores

log = logging.getLogger(__name__)

CURVE_UNITS = ("attention", "block", "ffn", "mix")
DEFAULT_METHOD = {"attention": "ablation", "block": "block_influence", "ffn": "taylor", "mix": "ablation+taylor"}
# The importance methods each unit can be ordered by.
UNIT_METHODS = {"attention": ("ablation",), "block": ("block_influence", "ablation"), "ffn": ("taylor", "activation"),
                "mix": ("ablation+taylor", "ablation+activation")}


@dataclass
class UnitPoint:
    """One point of a unit curve."""

    step: int
    removed: list[str]  # units removed so far: "A3" (attention of layer 3), "B7" (block 7), "F2:n" (n neurons of layer 2)
    params_removed: int
    fraction_params: float
    metric: float
    drop: float
    metric_recovered: float | None = None
    drop_recovered: float | None = None
    latency_s: float | None = None
    speedup: float | None = None
    flop_speedup: float | None = None


@dataclass
class UnitCurve:
    """A unit curve, its scores and settings."""

    model: str
    unit: str
    method: str
    metric: str
    higher_is_better: bool
    n_parameters: int
    points: list[UnitPoint]
    scores: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    last_mask: UnitMask | None = field(default=None, repr=False)  # the units off at the last point
    recovered_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # its recovered weights

    def pruned_model(self, hm: HeadModel) -> HeadModel:
        """The physically pruned model at the last point (with its recovered weights when recovery ran)."""
        base = hm
        if self.recovered_state is not None:
            base = HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
            base.model.load_state_dict(self.recovered_state)
        return prune_units(base, self.last_mask or UnitMask())

    def records(self) -> list[dict[str, Any]]:
        """unit_curve.csv rows."""
        derived = METRICS.get(self.metric).derived
        out = []
        for p in self.points:
            rec: dict[str, Any] = {"step": p.step, "unit": self.unit, "fraction_params": p.fraction_params,
                                   "params_removed": p.params_removed, "metric": p.metric, "drop": p.drop}
            rec.update({name: fn(p.metric) for name, fn in derived.items()})
            rec.update({"metric_recovered": p.metric_recovered, "drop_recovered": p.drop_recovered})
            rec.update({f"{name}_recovered": (fn(p.metric_recovered) if p.metric_recovered is not None else None)
                        for name, fn in derived.items()})
            rec.update({"latency_s": p.latency_s, "speedup": p.speedup, "flop_speedup": p.flop_speedup,
                        "removed": " ".join(p.removed)})
            out.append(rec)
        return out

    def summary(self) -> dict[str, Any]:
        """What units.json holds (besides provenance)."""
        return {"model": self.model, "unit": self.unit, "method": self.method, "metric": self.metric,
                "higher_is_better": self.higher_is_better, "n_parameters": self.n_parameters,
                "baseline": self.points[0].metric, "points": [p.__dict__ for p in self.points],
                "scores": self.scores, **self.meta}


def check_curve_args(unit: str, fraction: float, step: float, recover_steps: int, method: str | None = None) -> None:
    """Refuse a bad unit, parameter cap, step or recovery count before any work."""
    if unit not in CURVE_UNITS:
        raise HeadscopeError(f"unknown unit {unit!r}{did_you_mean(unit, CURVE_UNITS)}; choose one of "
                             f"{', '.join(CURVE_UNITS)}")
    if not 0.0 < fraction < 1.0:
        raise HeadscopeError(f"fraction must be in (0, 1) (share of parameters to remove), got {fraction}")
    if not 0.0 < step < 1.0:
        raise HeadscopeError(f"step must be in (0, 1) (share of parameters per point), got {step}")
    if recover_steps < 0:
        raise HeadscopeError(f"recovery steps must be >= 0, got {recover_steps}")
    if method is not None and method not in UNIT_METHODS[unit]:
        raise HeadscopeError(f"unit {unit!r} is ordered by {' or '.join(UNIT_METHODS[unit])}, not {method!r}"
                             f"{did_you_mean(method, UNIT_METHODS[unit])}")


def check_fraction(hm: HeadModel, unit: str, fraction: float) -> None:
    """Refuse a block fraction that would remove every layer, or one below the smallest unit (before any
    scoring or file is written)."""
    total = n_parameters(hm)
    kinds = ("attention", "ffn") if unit == "mix" else (unit,)
    smallest_unit = min(unit_parameters(hm, k, l) for k in kinds for l in range(hm.n_layers))
    if smallest_unit / total > fraction:
        raise HeadscopeError(f"no {unit} unit fits in {fraction:.0%} of the parameters (the smallest holds "
                             f"{smallest_unit / total:.1%}); raise the fraction")
    if unit != "block":
        return
    blocks = sum(unit_parameters(hm, "block", l) for l in range(hm.n_layers))
    smallest = min(unit_parameters(hm, "block", l) for l in range(hm.n_layers))
    if fraction >= blocks / total - 1e-12:
        raise HeadscopeError(f"fraction {fraction:.0%} would remove every layer: the {hm.n_layers} blocks of "
                             f"{hm.name} hold {blocks / total:.1%} of its parameters; give a fraction below "
                             f"{(blocks - smallest) / total:.1%} (one block must stay)")


def _order(hm: HeadModel, unit: str, scores: dict[str, Any]) -> list[tuple[str, int, int | None, float]]:
    """Removal order as (kind, layer, neuron or None, parameters), least important first."""
    if unit in ("attention", "block"):
        s = np.asarray(scores[unit], float)
        return [(unit, int(l), None, unit_parameters(hm, unit, int(l))) for l in np.argsort(s, kind="stable")]
    items = []
    for layer, s in scores["ffn"].items():
        per = unit_parameters(hm, "ffn", layer)
        # The strongest neuron of each layer is never offered: a layer keeps at least one.
        keep_one = int(np.argmax(s))
        items += [(float(s[i]), "ffn", layer, i, per) for i in range(len(s)) if i != keep_one]
    items.sort(key=lambda t: t[0])
    ffn = [(k, l, i, p) for _, k, l, i, p in items]
    if unit == "ffn":
        return ffn
    attn = _order(hm, "attention", scores)
    out, a, f, pa, pf = [], 0, 0, 0.0, 0.0
    while a < len(attn) or f < len(ffn):  # mix: next from whichever kind has given fewer parameters
        if f >= len(ffn) or (a < len(attn) and pa <= pf):
            out.append(attn[a]); pa += attn[a][3]; a += 1
        else:
            out.append(ffn[f]); pf += ffn[f][3]; f += 1
    return out


def _mask(hm: HeadModel, taken: list[tuple[str, int, int | None, float]]) -> UnitMask:
    m = UnitMask()
    for kind, layer, neuron, _ in taken:
        if kind == "ffn":
            m.ffn.setdefault(layer, torch.ones(hm.ffn_size(layer)))[neuron] = 0.0
        else:
            t = getattr(m, kind)
            if t is None:
                t = torch.ones(hm.n_layers)
                setattr(m, kind, t)
            t[layer] = 0.0
    return m


def _names(taken: list[tuple[str, int, int | None, float]]) -> list[str]:
    out, ffn = [], {}
    for kind, layer, neuron, _ in taken:
        if kind == "ffn":
            ffn[layer] = ffn.get(layer, 0) + 1
        else:
            out.append(f"{'A' if kind == 'attention' else 'B'}{layer}")
    return out + [f"F{l}:{n}" for l, n in sorted(ffn.items())]


def matmul_flops(hm: HeadModel, n_tokens: int, seq: int) -> float:
    """Forward FLOPs of the model's projections (every Linear/Conv1D, the LM head included) and of attention
    scores and mixing (4 * seq * width per token and layer), for `n_tokens` tokens of length `seq`."""
    linear = 0
    for m in hm.model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, torch.nn.Parameter) and w.dim() == 2 and not isinstance(m, torch.nn.Embedding):
            linear += w.numel()
    head = hm.model.get_output_embeddings() if hasattr(hm.model, "get_output_embeddings") else None
    if head is not None and isinstance(hm.model.get_input_embeddings(), torch.nn.Embedding) and \
            head.weight is hm.model.get_input_embeddings().weight:
        linear += head.weight.numel()  # a tied LM head is one parameter but a full matmul
    width = sum(hm.heads_in_layer(l) * hm.d_head for l in range(hm.n_layers))
    return 2.0 * linear * n_tokens + 4.0 * seq * width * n_tokens


def time_forward(hm: HeadModel, ids: torch.Tensor, mask: torch.Tensor, repeats: int) -> float:
    """Median wall seconds of one forward pass over (ids, mask), after one warm-up."""
    out = []
    with torch.inference_mode():
        hm.model(input_ids=ids, attention_mask=mask, use_cache=False)
        for _ in range(repeats):
            t0 = time.perf_counter()
            hm.model(input_ids=ids, attention_mask=mask, use_cache=False)
            out.append(time.perf_counter() - t0)
    return float(np.median(out))


def time_speedup(base: HeadModel, small: HeadModel, ids: torch.Tensor, mask: torch.Tensor,
                 repeats: int) -> tuple[float, float]:
    """(median seconds of `small`'s forward, median of the per-repeat ratios base / small), the two timed in
    turn in every repeat after a warm-up each, so that drift and load hit both alike (a single-shot time of
    each, one after the other, is off by up to +-20% on a shared or virtual machine)."""
    times, ratios = [], []
    with torch.inference_mode():
        for m in (base, small):
            m.model(input_ids=ids, attention_mask=mask, use_cache=False)
        for _ in range(repeats):
            t0 = time.perf_counter()
            base.model(input_ids=ids, attention_mask=mask, use_cache=False)
            t1 = time.perf_counter()
            small.model(input_ids=ids, attention_mask=mask, use_cache=False)
            t2 = time.perf_counter()
            times.append(t2 - t1)
            ratios.append((t1 - t0) / (t2 - t1))
    return float(np.median(times)), float(np.median(ratios))


class _UnitRecovery(Recovery):
    """`Recovery` with unit masks instead of head gates while training."""

    def train_masked(self, mask: UnitMask, steps: int) -> float:
        with unit_masks(self.hm, mask):
            losses = self.trainer.run(steps, self._batch, self._loss, progress=self.progress)
        return float(np.mean(losses)) if losses else math.nan


def unit_curve(hm: HeadModel, data: Any, *, unit: str = "block", method: str | None = None,
               fraction: float = 0.5, step: float = 0.05, heldout: Any = None, metric: str = "auto",
               recover_steps: int = 0, recover_lr: float = 5e-5, max_length: int | None = None,
               batch_size: int = 16, seed: int = 0, latency: bool = False, latency_repeats: int = 5,
               progress: bool = False) -> UnitCurve:
    """Remove `unit`s least important first up to `fraction` of all parameters; the metric at each point."""
    check_curve_args(unit, fraction, step, recover_steps, method)
    for kind in (("attention", "ffn") if unit == "mix" else (unit,)):
        check_unit_kind(hm, kind)
    method = method or DEFAULT_METHOD[unit]
    check_fraction(hm, unit, fraction)
    torch.manual_seed(seed)
    prep, metric = prepare(hm, data, metric, max_length)
    evalprep = prep if heldout is None else prepare(hm, heldout, metric, max_length)[0]
    entry = METRICS.get(metric)
    ref = make_reference(hm, prep, batch_size=batch_size) if entry.needs_reference else None
    eval_ref = ref if heldout is None or ref is None else make_reference(hm, evalprep, batch_size=batch_size)
    t0 = time.perf_counter()
    scores: dict[str, Any] = {}
    layer_method, ffn_method = (method.split("+") + [method])[:2] if unit == "mix" else (method, method)
    if unit in ("attention", "block", "mix"):
        kind = "attention" if unit == "mix" else unit
        scores[kind] = layer_scores(hm, prep, metric, kind, layer_method, reference=ref, batch_size=batch_size,
                                    progress=progress)
    if unit in ("ffn", "mix"):
        if ffn_method not in ("taylor", "activation"):
            raise HeadscopeError(f"FFN neurons are scored by taylor or activation, not {ffn_method!r}")
        scores["ffn"] = ffn_scores(hm, prep, metric, reference=ref, batch_size=batch_size, seed=seed,
                                   progress=progress)[ffn_method]
    score_s = time.perf_counter() - t0
    order = _order(hm, unit, scores)
    total = n_parameters(hm)

    def measure(model: HeadModel, mask: UnitMask) -> float:
        with unit_masks(model, mask):
            return evaluate_prepared(model, evalprep, metric, reference=eval_ref, batch_size=batch_size).value

    lat_batch = None
    if latency:
        b = next(batches(evalprep.ids[:batch_size], batch_size, pad_id=pad_id(hm)))
        lat_batch = (b.input_ids.to(hm.device), b.attention_mask.to(hm.device))
        base_lat = time_forward(hm, *lat_batch, latency_repeats)
        base_flops = matmul_flops(hm, int(lat_batch[1].sum()), lat_batch[0].shape[1])
    base = measure(hm, UnitMask())
    recovered_state = None
    points = [UnitPoint(0, [], 0, 0.0, base, 0.0, base if recover_steps else None, 0.0 if recover_steps else None,
                        base_lat if latency else None, 1.0 if latency else None, 1.0 if latency else None)]
    # Cut points: each time the removed parameters pass another `step`.
    cuts, acc, next_cut, fits = [], 0.0, step, 0
    for i, (kind, _, _, p) in enumerate(order):
        if (acc + p) / total > fraction + 1e-12 or (unit == "block" and i + 1 >= hm.n_layers):
            break  # past the cap, or the last block (one always stays)
        acc += p
        fits = i + 1
        if acc / total >= next_cut - 1e-12:
            cuts.append(i + 1)
            while acc / total >= next_cut - 1e-12:
                next_cut += step
    if fits and (not cuts or cuts[-1] != fits):
        cuts.append(fits)  # the last point is the most that fits under the cap, even short of a whole step
    if not cuts and order:
        raise HeadscopeError(f"no {unit} unit fits in {fraction:.0%} of the parameters (the smallest holds "
                             f"{min(o[3] for o in order) / total:.1%}); raise the fraction")
    for k, n in enumerate(tqdm(cuts, desc=f"{unit} curve", disable=not progress), start=1):
        taken = order[:n]
        mask = _mask(hm, taken)
        removed = int(round(sum(t[3] for t in taken)))
        value = measure(hm, mask)
        pt = UnitPoint(k, _names(taken), removed, removed / total, value, entry.drop(base, value))
        if recover_steps:
            rec = _UnitRecovery(hm, prep, metric, ref, lr=recover_lr, batch_size=batch_size, seed=seed,
                                steps=recover_steps)
            rec.train_masked(mask, recover_steps)
            pt.metric_recovered = measure(rec.hm, mask)
            pt.drop_recovered = entry.drop(base, pt.metric_recovered)
            recovered_state = rec.hm.model.state_dict()  # the last point's recovered weights (for saving)
            del rec
        if latency:
            small = prune_units(hm, mask)
            pt.latency_s, pt.speedup = time_speedup(hm, small, *lat_batch, latency_repeats)
            pt.flop_speedup = base_flops / matmul_flops(small, int(lat_batch[1].sum()), lat_batch[0].shape[1])
            # Physically removed = counted: the parameter share is what the smaller model really lost.
            pt.params_removed = total - n_parameters(small)
            pt.fraction_params = pt.params_removed / total
            del small
        points.append(pt)
        log.info("%s: removed %s: %s %.4f", unit, pt.removed, metric, value)
    last_mask = _mask(hm, order[:cuts[-1]]) if cuts else UnitMask()
    return UnitCurve(hm.name, unit, method, metric, entry.higher_is_better, total, points,
                     {k: (v.tolist() if isinstance(v, np.ndarray) else {str(l): a.tolist() for l, a in v.items()})
                      for k, v in scores.items()},
                     meta={"data": prep.source, "heldout": evalprep.source if heldout is not None else "same as data",
                           "passages": len(prep.ids), "heldout_passages": len(evalprep.ids),
                           "max_length": prep.max_length, "fraction": fraction, "step": step, "seed": seed,
                           "recover_steps": recover_steps, "recover_lr": recover_lr if recover_steps else None,
                           "score_seconds": score_s, "n_layers": hm.n_layers},
                     last_mask=last_mask, recovered_state=recovered_state)


__all__ = ["CURVE_UNITS", "DEFAULT_METHOD", "UNIT_METHODS", "UnitCurve", "UnitPoint", "check_curve_args", "matmul_flops",
           "time_forward", "time_speedup", "unit_curve"]
