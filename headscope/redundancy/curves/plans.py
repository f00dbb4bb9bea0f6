"""What each point of a curve removes: a plan per unit kind, behind one small interface.

A plan proposes the units of the next point (`next_units`), knows what is off so far (`mask`) and names
units for the files (`names`). Two plans serve every kind in `unit_kinds.UNITS`:

- `HeadPlan` (head, slice, group; iterative): before every point the remaining heads are scored again on
  the original weights with the removed heads gated off, and the lowest-scoring units go until the point
  holds `step` of all heads. In an MHA model a unit is one head; in a GQA model a unit is one query head
  from every KV group of a layer (`slice`: the least important remaining head of each group, scored by
  their sum) or one whole KV group (`group`): `pruning.heads.prune_heads` can remove either, while a
  single query head of a group would break `repeat_kv`.
  With `uniform` (`prune --uniform`) each point instead removes one unit from every layer (its least
  important), so every layer keeps the same number of query heads (and, for slices, every KV group the same
  number; for groups, the same number of whole KV groups): a plain config states that shape. A fraction no
  whole number of rounds meets is rounded down (`uniform_stop`).
- `LayerPlan` (attention, block, ffn, mix; one-shot): the units are scored once on the unpruned model and
  removed least important first; a point is taken each time the removed parameters pass another `step`
  of all parameters, up to `fraction` (units are never split, so a point may overshoot its step by part of
  one unit); the last point is the most that fits under `fraction`, even short of a whole step. `ffn`
  ranks neurons across all layers (the strongest of each layer is never offered: a layer keeps one);
  `mix` takes next from whichever of attention sub-layers and FFN neurons has given fewer parameters.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data import Tokens
from ...errors import HeadscopeError, OptionError
from ...eval.evaluate import Reference
from ...models.adapter import HeadModel
from ...table import head_name, parse_head
from .. import importance
from ..importance.l0 import GateTraining, L0Settings
from ..importance.units import unit_scores
from ..pruning.heads import n_parameters, pruned_gates
from ..pruning.masks import UnitMask
from ..pruning.units import unit_parameters
from .checkpoint import L0_STATE

Unit = tuple[str, int, int | None, float]  # (kind, layer, neuron or head or None, size)


@dataclass
class PlanData:
    """What a plan scores on: the model, the prepared passages, the metric and its reference."""

    hm: HeadModel
    prep: Tokens
    metric: str
    reference: Reference | None
    batch_size: int
    seed: int
    progress: bool
    options: dict[str, Any] = field(default_factory=dict)  # criterion settings, e.g. {"l0": {"settings": ...}}
    # a resumable run's folder (learned plans keep their training state there)
    checkpoint: Path | None = None
    protected: frozenset[tuple[int, int]] = frozenset()  # heads never removed (`prune --protect`; head plans)


# --- heads ------------------------------------------------------------------------------------------
def candidate_units(hm: HeadModel, scores: np.ndarray, removed: set[tuple[int, int]], unit: str,
                    protected: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[float, list[tuple[int, int]]]]:
    """Removable units among the remaining heads as (score, heads), lowest score first.

    Within a layer the units are listed in the order they would go, so taking the k lowest of
    all layers never skips a unit whose removal another one depends on. A `protected` head is in no unit: a head
    unit skips it, a KV group holding it is not offered, and a slice takes the least important unprotected head of
    every group (a layer offers no more slices once one of its groups has only protected heads left).
    """
    g, n_kv = hm.group_size, hm.n_kv_heads
    if unit == "slice" and g == 1:
        unit = "head"
    units: list[tuple[float, list[tuple[int, int]]]] = []
    for layer in range(hm.n_layers):
        alive = [h for h in range(hm.n_heads) if (layer, h) not in removed]
        free = [h for h in alive if (layer, h) not in protected]
        if unit == "head":
            units += [(float(scores[layer, h]), [(layer, h)]) for h in free]
        elif unit == "group":
            for k in range(n_kv):
                members = [h for h in alive if h // g == k]
                if members and all(h in free for h in members):
                    units.append((float(np.sum(scores[layer, members])), [(layer, h) for h in members]))
        else:
            # slice: the i-th least important remaining unprotected head of every surviving group
            surviving = [k for k in range(n_kv) if any(h // g == k for h in alive)]
            groups = [sorted((h for h in free if h // g == k), key=lambda h: scores[layer, h]) for k in surviving]
            depth = min((len(grp) for grp in groups), default=0)
            total = 0.0
            for i in range(depth):
                heads = [(layer, grp[i]) for grp in groups]
                # Cumulative score: a deeper slice can only go after the shallower ones.
                total += float(sum(scores[layer, h] for _, h in heads))
                units.append((total, heads))
    units.sort(key=lambda u: u[0])
    return units


def uniform_round(hm: HeadModel, unit: str) -> int:
    """Heads one uniform round removes from every layer: 1 (head), one per KV group (slice), a group's (group)."""
    if unit == "group":
        return hm.group_size
    return hm.n_kv_heads if unit == "slice" and hm.group_size > 1 else 1


def uniform_stop(hm: HeadModel, unit: str, fraction: float) -> int:
    """Heads a uniform curve removes at most for `fraction`: whole rounds, rounded down (never past the fraction)."""
    u = uniform_round(hm, unit)
    rounds = int(math.floor(fraction * hm.n_heads / u + 1e-9))
    if rounds < 1:
        raise OptionError("fraction", f"{fraction:g} is less than one round: uniform removes {u} of the {hm.n_heads} "
                                      f"heads of every layer at a time ({unit}s); give at least {u / hm.n_heads:.3f}",
                          also=("uniform",))
    return min(rounds, hm.n_heads // u - 1) * u * hm.n_layers  # every layer keeps one round


class HeadPlan:
    """Iterative head removal: re-scored before every point (module docstring). With `uniform`, every point
    removes the same units from every layer (its least important ones), so each point's model has one shape."""

    scope = "heads"

    def __init__(self, data: PlanData, unit: str, method: str, fraction: float | None, step: float,
                 uniform: bool = False) -> None:
        hm = data.hm
        self.data, self.unit, self.method, self.uniform = data, unit, method, uniform
        self.total = hm.n_layers * hm.n_heads
        cap = fraction if fraction is not None else 0.95
        if uniform:
            u = uniform_round(hm, unit)
            self.stop_n = uniform_stop(hm, unit, cap)
            self.per_step = max(1, int(round(step * hm.n_heads / u))) * u * hm.n_layers
        else:
            self.stop_n = int(math.floor(cap * self.total + 1e-9))
            self.per_step = max(1, int(round(step * self.total)))
        self.removed: list[tuple[int, int]] = []
        self.scores: dict[str, Any] = {}
        # no unit was left to offer before the cap: only protected heads remain
        self.exhausted = False

    @property
    def n_removed(self) -> int:
        return len(self.removed)

    def size_removed(self) -> float:
        return float(len(self.removed))

    def resume(self, names: list[str]) -> None:
        """Continue after the heads `names` (in removal order) of a saved run."""
        self.removed = [parse_head(n) for n in names]

    def next_units(self) -> list[tuple[int, int]] | None:
        """The heads of the next point, or None when the cap is reached (or the next unit would pass it)."""
        if len(self.removed) >= self.stop_n:
            return None
        scores = self.head_scores()
        chosen = self._uniform(scores) if self.uniform else self._free(scores)
        if not chosen:
            return None
        self.removed += chosen
        return chosen

    def _free(self, scores: np.ndarray) -> list[tuple[int, int]]:
        """The lowest-scoring units of all layers, up to one step."""
        chosen: list[tuple[int, int]] = []
        units = candidate_units(self.data.hm, scores, set(self.removed), self.unit, self.data.protected)
        self.exhausted = not units
        for _, heads in units:
            if len(self.removed) + len(chosen) + len(heads) > self.stop_n:
                break
            chosen += heads
            if len(chosen) >= self.per_step:
                break
        return chosen

    def _uniform(self, scores: np.ndarray) -> list[tuple[int, int]]:
        """Rounds of one unit from every layer (each layer's lowest-scoring one), up to one step; none once a layer
        has no unit left to offer (only protected heads remain there)."""
        chosen: list[tuple[int, int]] = []
        layers = range(self.data.hm.n_layers)
        while len(chosen) < self.per_step and len(self.removed) + len(chosen) < self.stop_n:
            units = candidate_units(self.data.hm, scores, set(self.removed) | set(chosen), self.unit,
                                    self.data.protected)
            lowest = [next((heads for _, heads in units if heads[0][0] == layer), None) for layer in layers]
            if any(heads is None for heads in lowest):
                self.exhausted = True
                break
            chosen += [h for heads in lowest if heads is not None for h in heads]
        return chosen

    def head_scores(self) -> np.ndarray:
        """The remaining heads scored again on the original weights, the removed ones gated off `[L, H]`."""
        d = self.data
        gates = pruned_gates(d.hm, self.removed) if self.removed else None
        settings = importance.ScoreSettings(methods=(self.method,), metric=d.metric, batch_size=d.batch_size)
        table = importance.score(d.hm, d.prep, settings, gates=gates, reference=d.reference)
        # A live head without a score (NaN) is never picked: unknown is not "unimportant".
        return np.nan_to_num(np.asarray(table[f"importance_{self.method}"], dtype=float), nan=np.inf)

    def mask(self) -> UnitMask:
        return UnitMask(heads=pruned_gates(self.data.hm, self.removed))

    def names(self, units: list[tuple[int, int]]) -> list[str]:
        return [head_name(l, h) for l, h in units]

    def params_removed(self) -> int | None:
        return None


class L0Plan(HeadPlan):
    """Learned head removal (`--method l0`): hard-concrete gates trained once, by distillation, to close
    `fraction` of the units (or under a penalty); heads then go in order of their probability of staying open,
    so the mask at `fraction` is the learned one, made exact (the fraction's lowest-P(open) units).

    GQA: with unit `group` there is one gate per KV group (a whole group closes); with `slice` one gate per
    query head, and the units taken are slices (the least-open remaining head of every group of a layer), so
    every group keeps the same number of query heads and the pruned model loads.
    """

    def __init__(self, data: PlanData, unit: str, method: str, fraction: float | None, step: float,
                 uniform: bool = False) -> None:
        super().__init__(data, unit, method, fraction, step, uniform)
        settings = data.options.get("l0", {}).get("settings")
        if settings is None:
            if fraction is None:
                raise HeadscopeError("pruning by l0 needs a fraction (the share the gates are trained to close) or "
                                     "an L0 penalty (l0_penalty)", fields=("l0_penalty",))
            settings = L0Settings(target=fraction)
        self.settings = settings
        self.per = "group" if unit == "group" else "head"
        self.open_probability: np.ndarray | None = None

    def head_scores(self) -> np.ndarray:
        """P(open) of every head after gate training (trained on the first call; resumed from the checkpoint)."""
        if self.open_probability is None:
            d = self.data
            run = GateTraining(d.hm, d.prep, d.metric, d.reference, self.settings, per=self.per,
                               batch_size=d.batch_size, seed=d.seed, progress=d.progress)
            run.run(d.checkpoint / L0_STATE if d.checkpoint is not None else None)
            self.open_probability = run.open_probability()
            self.scores = {"l0": run.record(), "open_probability": self.open_probability.tolist()}
        return self.open_probability


# --- units beyond heads -------------------------------------------------------------------------
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


def removal_order(hm: HeadModel, unit: str, scores: dict[str, Any]) -> list[Unit]:
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
    ffn: list[Unit] = [(k, l, i, p) for _, k, l, i, p in items]
    if unit == "ffn":
        return ffn
    attn = removal_order(hm, "attention", scores)
    out, a, f, pa, pf = [], 0, 0, 0.0, 0.0
    while a < len(attn) or f < len(ffn):  # mix: next from whichever kind has given fewer parameters
        if f >= len(ffn) or (a < len(attn) and pa <= pf):
            out.append(attn[a])
            pa += attn[a][3]
            a += 1
        else:
            out.append(ffn[f])
            pf += ffn[f][3]
            f += 1
    return out


def cut_points(order: list[Unit], total: float, fraction: float, step: float, n_layers: int, unit: str) -> list[int]:
    """How many units of `order` each point has removed: each time the removed parameters pass another
    `step`, then the most that fits under `fraction` (one block always stays)."""
    cuts, acc, next_cut, fits = [], 0.0, step, 0
    for i, (_, _, _, p) in enumerate(order):
        if (acc + p) / total > fraction + 1e-12 or (unit == "block" and i + 1 >= n_layers):
            break  # past the cap, or the last block (one always stays)
        acc += p
        fits = i + 1
        if acc / total >= next_cut - 1e-12:
            cuts.append(i + 1)
            while acc / total >= next_cut - 1e-12:
                next_cut += step
    if fits and (not cuts or cuts[-1] != fits):
        # the last point is the most that fits under the cap, even short of a whole step
        cuts.append(fits)
    if not cuts and order:
        raise HeadscopeError(f"no {unit} unit fits in {fraction:.0%} of the parameters (the smallest holds "
                             f"{min(o[3] for o in order) / total:.1%}); raise the fraction")
    return cuts


def unit_mask(hm: HeadModel, taken: list[Unit]) -> UnitMask:
    """The mask that switches the units `taken` off."""
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


def unit_names(taken: list[Unit]) -> list[str]:
    """A3 = attention of layer 3, B7 = block 7 (in removal order), then F2:n = n FFN neurons of layer 2."""
    out: list[str] = []
    ffn: dict[int, int] = {}
    for kind, layer, _, _ in taken:
        if kind == "ffn":
            ffn[layer] = ffn.get(layer, 0) + 1
        else:
            out.append(f"{'A' if kind == 'attention' else 'B'}{layer}")
    return out + [f"F{l}:{n}" for l, n in sorted(ffn.items())]


class LayerPlan:
    """One-shot removal of attention sub-layers, blocks or FFN neurons (module docstring)."""

    scope = "parameters"

    def __init__(self, data: PlanData, unit: str, method: str, fraction: float, step: float) -> None:
        hm = data.hm
        self.data, self.unit, self.method = data, unit, method
        t0 = time.perf_counter()
        self.raw_scores = self._score()
        self.score_seconds = time.perf_counter() - t0
        self.order = removal_order(hm, unit, self.raw_scores)
        self.total = float(n_parameters(hm))
        self.cuts = cut_points(self.order, self.total, fraction, step, hm.n_layers, unit)
        self.taken = 0  # units of `order` removed so far
        self.scores = {k: (v.tolist() if isinstance(v, np.ndarray) else {str(l): a.tolist() for l, a in v.items()})
                       for k, v in self.raw_scores.items()}

    def _score(self) -> dict[str, Any]:
        d = self.data
        kinds = ("attention", "ffn") if self.unit == "mix" else (self.unit,)
        methods = self.method.split("+") if self.unit == "mix" else [self.method]
        out: dict[str, Any] = {}
        for kind, m in zip(kinds, methods, strict=True):
            cols, _, _ = unit_scores(d.hm, d.prep, d.metric, kind, [m], reference=d.reference,
                                     batch_size=d.batch_size, seed=d.seed, progress=d.progress)
            out[kind] = cols[m]
        return out

    @property
    def n_removed(self) -> int:
        return self.taken

    def size_removed(self) -> float:
        return float(sum(u[3] for u in self.order[:self.taken]))

    def next_units(self) -> list[Unit] | None:
        """The units of the next cut point, or None after the last."""
        later = [c for c in self.cuts if c > self.taken]
        if not later:
            return None
        units = self.order[self.taken:later[0]]
        self.taken = later[0]
        return units

    def mask(self) -> UnitMask:
        return unit_mask(self.data.hm, self.order[:self.taken])

    def names(self, units: list[Unit]) -> list[str]:
        return unit_names(units)

    def params_removed(self) -> int | None:
        return int(round(self.size_removed()))


def make_plan(data: PlanData, unit: str, scope: str, method: str, fraction: float | None,
              step: float, uniform: bool = False) -> HeadPlan | LayerPlan:
    """The plan of `unit` (its scope from `unit_kinds.UNITS`); `uniform` only for head units."""
    if scope == "heads" and method == "l0":
        return L0Plan(data, unit, method, fraction, step, uniform)
    if scope == "heads":
        return HeadPlan(data, unit, method, fraction, step, uniform)
    if uniform:
        raise OptionError("uniform", f"is for head units (head, slice, group), not unit={unit}", also=("unit",))
    if fraction is None:
        raise HeadscopeError(f"unit {unit!r} needs a fraction: the share of all parameters to remove (e.g. 0.3)")
    return LayerPlan(data, unit, method, fraction, step)


__all__ = ["HeadPlan", "L0Plan", "LayerPlan", "PlanData", "candidate_units", "check_fraction", "cut_points",
           "make_plan", "removal_order", "uniform_round", "uniform_stop", "unit_mask", "unit_names"]
