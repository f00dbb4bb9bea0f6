"""Importance of units beyond heads: attention sub-layers, blocks, FFN neurons (higher = more important).

- `block_influence`: ShortGPT's Block Influence, 1 - cos(block input, block output) averaged over real
  tokens; one forward pass.
- `layer_ablation`: exact ablation of each attention sub-layer or block (the metric change when it is
  switched off, signed so that a worse metric is positive). The layers before the ablated one are the same
  in every pass, so they run once per batch and only layers l..L-1 run per ablation
  (`importance.ablation.skip_prefix`): L + 1 forward passes per batch, of which the ablations cost
  L(L+1)/2 block evaluations instead of L^2 (`reuse_prefix=False` runs the naive loop, for the tests).
- `ffn_scores`: per FFN neuron, `taylor` = mean over passages of |a . dLoss/da| summed over the passage's
  tokens (the first-order estimate of the loss change when the neuron is zeroed, Molchanov et al. 2019 /
  LLM-Pruner's element-wise Taylor; gradients w.r.t. neuron gates only, one forward + backward per batch),
  and `activation` = mean |activation| over real tokens times the L2 norm of the neuron's column in the
  output projection (the size of what it writes, Wanda-style); both from the same passes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ...data import Tokens, batches, pad_id
from ...eval.evaluate import MetricResult, Reference, accumulate, evaluate_prepared, finish, make_reference, prepare
from ...eval.metrics import METRICS, row_metric
from ...models import layout
from ...models.adapter import HeadModel
from ..pruning.masks import UnitMask, check_unit_kind, unit_masks
from .ablation import _map_tensors, capture_layer_outputs, skip_prefix
from .criteria import CRITERIA, ScoreContext, base_gates, shares, targets, unit_methods
from .gradients import _probe, loss_rows


def block_influence(hm: HeadModel, prep: Tokens, *, batch_size: int = 16, progress: bool = False) -> np.ndarray:
    """Per block, 1 - mean over real tokens of cos(input, output): `[L]` (ShortGPT's BI; one pass)."""
    L = hm.n_layers
    sums = torch.zeros(L, dtype=torch.float64)
    count = 0.0
    box: dict[str, torch.Tensor] = {}

    def make(layer: int) -> Callable[[Any, tuple, dict, Any], None]:
        def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            x = args[0] if args else kwargs["hidden_states"]  # [batch, pos, d_model]
            y = output[0] if isinstance(output, tuple) else output
            cos = torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=-1)  # [batch, pos]
            sums[layer] += float((cos * box["mask"]).sum())

        return hook

    handles = [hm.layers[l].register_forward_hook(make(l), with_kwargs=True) for l in range(L)]
    try:
        with torch.inference_mode():
            for b in tqdm(batches(prep.ids, batch_size, pad_id=pad_id(hm)), desc="block influence",
                          disable=not progress, leave=False):
                box["mask"] = b.attention_mask.to(hm.device).double()
                hm.base_model(input_ids=b.input_ids.to(hm.device), attention_mask=b.attention_mask.to(hm.device),
                              use_cache=False)
                count += float(b.attention_mask.sum())
    finally:
        for h in handles:
            h.remove()
    return (1.0 - sums / max(count, 1.0)).numpy()


def _one_off(hm: HeadModel, unit: str, layer: int) -> UnitMask:
    off = torch.ones(hm.n_layers)
    off[layer] = 0.0
    return UnitMask(attention=off) if unit == "attention" else UnitMask(block=off)


def layer_ablation(hm: HeadModel, prep: Tokens, metric: str, unit: str, *, reference: Reference | None = None,
                   batch_size: int = 16, reuse_prefix: bool = True,
                   progress: bool = False) -> tuple[np.ndarray, MetricResult]:
    """The metric with each attention sub-layer (`unit="attention"`) or block (`"block"`) switched off in
    turn: `[L]` values, and the unablated result."""
    check_unit_kind(hm, unit)
    L = hm.n_layers
    totals = [{"value": [0.0, 0.0]} for _ in range(L)]
    base_totals: dict[str, list[float]] = {"value": [0.0, 0.0]}
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches * (L + 1), desc=f"{unit} ablation", unit="pass", disable=not progress, leave=False)
    with torch.inference_mode():
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            tg = targets(prep, metric, reference, b.index, ids.shape[1], hm.device)
            tg["ref_tokens"] = None  # token-level extras are not ranked
            outs: dict[int, Any] = {}
            with capture_layer_outputs(hm, outs):
                accumulate(base_totals, row_metric(hm, metric, ids, mask, **tg))
            bar.update(1)
            for layer in range(L):
                with ExitStack() as stack:
                    if reuse_prefix and layer > 0:
                        entering = _map_tensors(outs[layer - 1], lambda t: t)
                        stack.enter_context(skip_prefix(hm, layer, entering))
                    stack.enter_context(unit_masks(hm, _one_off(hm, unit, layer)))
                    accumulate(totals[layer], row_metric(hm, metric, ids, mask, **tg))
                bar.update(1)
    bar.close()
    values = np.array([finish(metric, totals[l], prep.n_tokens).value for l in range(L)])
    return values, finish(metric, base_totals, prep.n_tokens)


def ffn_scores(hm: HeadModel, prep: Tokens, metric: str, *, reference: Reference | None = None,
               batch_size: int = 16, seed: int = 0, progress: bool = False) -> dict[str, dict[int, np.ndarray]]:
    """Per layer, per FFN neuron: {"taylor": {layer: [I]}, "activation": {layer: [I]}} (see module docstring)."""
    check_unit_kind(hm, "ffn")
    L = hm.n_layers
    uses_probe = METRICS.get(metric).probe_loss is not None
    taylor = {l: torch.zeros(hm.ffn_size(l), dtype=torch.float64) for l in range(L)}
    act = {l: torch.zeros(hm.ffn_size(l), dtype=torch.float64) for l in range(L)}
    col_norm = {l: layout.linear_weight(hm.ffn_out(l), hm.spec.conv1d).detach().double().norm(dim=0).cpu()
                for l in range(L)}
    tokens, passages = 0.0, 0
    box: dict[str, torch.Tensor] = {}

    def make(layer: int) -> Callable[[Any, tuple], None]:
        def hook(module: Any, args: tuple) -> None:
            # [batch, pos, n_neurons] (already gated: the gates are ones)
            a = args[0].detach()
            act[layer] += (a.abs().double() * box["mask"][..., None]).sum((0, 1)).cpu()

        return hook

    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    for b in tqdm(batches(prep.ids, batch_size, pad_id=pad_id(hm)), total=n_batches, desc="ffn scores",
                  unit="batch", disable=not progress, leave=False):
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        B = ids.shape[0]
        box["mask"] = mask.double()
        tg = targets(prep, metric, reference, b.index, ids.shape[1], hm.device)
        probe = _probe(b.index, hm.d_model, seed, hm.device) if uses_probe else None
        gates = {l: torch.ones(B, hm.ffn_size(l), device=hm.device, requires_grad=True) for l in range(L)}
        handles = [hm.ffn_out(l).register_forward_pre_hook(make(l)) for l in range(L)]
        try:
            with unit_masks(hm, UnitMask(ffn=gates)):
                num, den = loss_rows(hm, metric, ids, mask, tg, probe)
        finally:
            for h in handles:
                h.remove()
        grads = torch.autograd.grad(num.sum(), [gates[l] for l in range(L)])
        for l, g in enumerate(grads):
            taylor[l] += (g.double().cpu() / den.detach().double().cpu()[:, None]).abs().sum(0)
        tokens += float(mask.sum())
        passages += B
    return {"taylor": {l: (taylor[l] / max(passages, 1)).numpy() for l in range(L)},
            "activation": {l: (act[l] / max(tokens, 1.0) * col_norm[l]).numpy() for l in range(L)}}



# --- the unit criteria, registered in CRITERIA by scope ----------------------------------------------
# block_influence first: the order blocks' criteria are listed (and scored by default) in
@CRITERIA.register("block_influence", scope="block", help="1 - cos(block input, block output) (ShortGPT)",
                   needs_gradient=False, cost="one forward pass per batch")
def block_influence_criterion(ctx: ScoreContext) -> np.ndarray:
    """`[L]`: ShortGPT's Block Influence of each block (`block_influence`)."""
    return block_influence(ctx.hm, ctx.prep, batch_size=ctx.batch_size, progress=ctx.progress)


@CRITERIA.register("ablation", scope=("attention", "block"), help="metric change when the unit is switched off "
                   "(exact; the layers before it run once per batch)", needs_gradient=False,
                   cost="L + 1 forward passes per batch (prefix reused)")
def unit_ablation(ctx: ScoreContext) -> np.ndarray:
    """`[L]`: the metric change when each attention sub-layer or block (`ctx.unit`) is switched off, signed so
    that a worse metric is a positive importance."""
    values, base = layer_ablation(ctx.hm, ctx.prep, ctx.metric, ctx.unit, reference=ctx.reference,
                                  batch_size=ctx.batch_size, progress=ctx.progress)
    ctx.base_result = base
    return ctx.sign * (values - base.value)


def _ffn(ctx: ScoreContext) -> dict[str, dict[int, np.ndarray]]:
    return ctx.shared("ffn-pass", lambda: ffn_scores(ctx.hm, ctx.prep, ctx.metric, reference=ctx.reference,
                                                     batch_size=ctx.batch_size, seed=ctx.seed,
                                                     progress=ctx.progress))


@CRITERIA.register("taylor", scope="ffn", help="|activation x dLoss/dactivation| per neuron (LLM-Pruner)",
                   needs_gradient=True, cost="one forward+backward per batch", shares="ffn-pass")
def ffn_taylor(ctx: ScoreContext) -> dict[int, np.ndarray]:
    """{layer: [I]}: first-order estimate of the loss change when each FFN neuron is zeroed (`ffn_scores`)."""
    return _ffn(ctx)["taylor"]


@CRITERIA.register("activation", scope="ffn", help="mean |activation| x the neuron's output-weight norm (Wanda-like)",
                   needs_gradient=True, cost="one forward+backward per batch (shared with taylor)", shares="ffn-pass")
def ffn_activation(ctx: ScoreContext) -> dict[int, np.ndarray]:
    """{layer: [I]}: mean |activation| over real tokens times the L2 norm of the neuron's output column."""
    return _ffn(ctx)["activation"]


def unit_scores(hm: HeadModel, prep: Tokens, metric: str, unit: str, methods: Sequence[str], *,
                reference: Reference | None = None, batch_size: int = 16, seed: int = 0,
                progress: bool = False) -> tuple[dict[str, Any], dict[str, float], ScoreContext]:
    """Each criterion of `methods` on every `unit`: ({method: scores}, {method(s): seconds}, the context).

    Criteria that share one computation (FFN taylor and activation) run it once and are timed together."""
    check_unit_kind(hm, unit)
    for m in methods:
        # an unknown criterion for this unit raises, with a did-you-mean
        CRITERIA.get(m, unit)
    ctx = ScoreContext(hm, prep, metric, base_gates(hm, None), reference, batch_size, seed=seed,
                       progress=progress, unit=unit)
    cols: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for m in methods:
        if m in cols:
            continue
        group = [x for x in methods if shares(CRITERIA.get(x, unit)) == shares(CRITERIA.get(m, unit))]
        t0 = time.perf_counter()
        for x in group:
            cols[x] = CRITERIA.get(x, unit).fn(ctx)
        seconds["+".join(group)] = time.perf_counter() - t0
    return cols, seconds, ctx


def score_units(hm: HeadModel, data: Any, unit: str, methods: Any = None, *, metric: str = "auto",
                max_length: int | None = None, batch_size: int = 16, seed: int = 0, limit: int | None = None,
                progress: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every attention sub-layer, block or FFN neuron scored by each method: (rows, meta).

    Rows are {unit, layer, index, importance_<method>...}; meta holds the metric, timings and the forward
    passes per batch (ablation: L + 1, the prefix reused).
    """
    check_unit_kind(hm, unit)
    chosen = list(unit_methods(unit)) if methods in (None, "", "all") else \
        [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    for m in chosen:
        CRITERIA.get(m, unit)
    prep, metric = (data, metric) if isinstance(data, Tokens) else prepare(hm, data, metric, max_length, limit)
    ref = make_reference(hm, prep, batch_size=batch_size) if METRICS.get(metric).needs_reference else None
    cols, seconds, _ = unit_scores(hm, prep, metric, unit, chosen, reference=ref, batch_size=batch_size, seed=seed,
                                   progress=progress)
    rows: list[dict[str, Any]] = []
    for layer in range(hm.n_layers):
        for i in range(hm.ffn_size(layer) if unit == "ffn" else 1):
            row: dict[str, Any] = {"unit": unit, "layer": layer, "index": i}
            for m in chosen:
                row[f"importance_{m}"] = float(cols[m][layer][i] if unit == "ffn" else cols[m][layer])
            rows.append(row)
    base = evaluate_prepared(hm, prep, metric, reference=ref, batch_size=batch_size)
    meta = {"model": hm.name, "unit": unit, "methods": chosen, "metric": metric, "metric_value": base.value,
            "data": prep.source, "passages": len(prep.ids), "tokens_seen": prep.n_tokens, "seconds": seconds,
            "forward_passes": {"ablation": hm.n_layers + 1, "block_influence": 1, "taylor": 1,
                               "activation": 1}}
    return rows, meta


__all__ = ["block_influence", "ffn_scores", "layer_ablation", "score_units", "unit_scores"]
