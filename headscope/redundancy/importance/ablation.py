"""Ablation: the metric with each head's output zeroed (or replaced by its mean), every head at once.

The layers before the ablated one are the same in every pass, so they run once per batch and only
layers l..L-1 run per ablation (`skip_prefix`); several ablations share one forward pass through
per-row gates (`row_ablation`). Both criteria are exact: tests compare them to the naive loop.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ...data import Tokens, batches, pad_id
from ...distributed import all_reduce_array, all_reduce_totals, is_main, owns
from ...eval.evaluate import MetricResult, Reference, accumulate, finish, repeat_rows
from ...eval.metrics import final_hidden, row_metric
from ...hooks import head_gates, on_head_outputs
from ...models.adapter import HeadModel
from ...uncertainty import Accumulator, PassageSums, Statistic, Sums
from .criteria import CRITERIA, ROWS_PER_PASS, ScoreContext, base_gates, targets


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return type(obj)(_map_tensors(o, fn) for o in obj) if not hasattr(obj, "_fields") else \
            type(obj)(*(_map_tensors(o, fn) for o in obj))
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    return obj


@contextmanager
def capture_layer_outputs(hm: HeadModel, store: dict[int, Any]) -> Iterator[None]:
    """Record each layer block's output object (detached) into `store[layer]`."""
    handles = []

    def make(layer: int) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            store[layer] = _map_tensors(output, lambda t: t.detach())

        return hook

    try:
        for layer in range(hm.n_layers):
            handles.append(hm.layers[layer].register_forward_hook(make(layer)))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def skip_prefix(hm: HeadModel, layer: int, entering: Any) -> Iterator[None]:
    """Run only layers >= `layer`: layers before it return `entering` (the output of layer - 1).

    Each earlier block's forward is replaced by a stub for the duration, so the model's own forward
    still builds masks, positions and rotary tables for the batch it is given, then hands
    `entering` to block `layer` exactly as it would hand it the real output; family-generic because
    it only touches `hm.layers`. `entering` must already have the batch's row count.
    """
    if layer == 0:
        yield
        return
    blocks = [hm.layers[j] for j in range(layer)]
    saved = [b.__dict__.get("forward") for b in blocks]

    def stub(*args: Any, **kwargs: Any) -> Any:
        return entering

    try:
        for b in blocks:
            b.forward = stub
        yield
    finally:
        for b, old in zip(blocks, saved, strict=True):
            if old is None:
                b.__dict__.pop("forward", None)
            else:
                b.forward = old


@contextmanager
def row_ablation(hm: HeadModel, base: torch.Tensor, layer: int, heads: Sequence[int], rows: int,
                 means: torch.Tensor | None = None) -> Iterator[None]:
    """Apply the base mask to every row, and ablate head `heads[i]` of `layer` in row block i.

    Block i holds rows [i*rows, (i+1)*rows). With `means` ([L, H, d_head]) the ablated head's
    output is replaced by its mean instead of zero.
    """
    k = len(heads)
    g_layer = base[layer].expand(k * rows, -1).clone()  # [k*rows, H]
    replace = torch.zeros_like(g_layer)
    for i, h in enumerate(heads):
        g_layer[i * rows:(i + 1) * rows, h] = 0.0
        replace[i * rows:(i + 1) * rows, h] = 1.0
    # Layers before `layer` are listed too (for the naive loop); under skip_prefix they never run.
    touched = [l for l in range(hm.n_layers) if l == layer or not bool((base[l] == 1).all())]

    def apply(l: int, z: torch.Tensor) -> torch.Tensor:
        if l != layer:
            g = base[l].expand(z.shape[0], -1)
            return z * g[:, None, :, None].to(z.dtype)
        out = z * g_layer[:, None, :, None].to(z.dtype)
        if means is not None:
            out = out + replace[:, None, :, None].to(z.dtype) * means[layer, :, :z.shape[-1]].to(z.dtype)[None, None]
        return out

    with on_head_outputs(hm, apply, layers=touched):
        yield


def head_means(hm: HeadModel, prep: Tokens, base: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Mean output of every head over the real tokens of the data, under the base mask: `[L, H, d_head]` (per-layer
    head_dim: the widest, each layer's first d_head_at(layer) entries used)."""
    width = max((hm.d_head_at(l) for l in range(hm.n_layers)), default=0)
    sums = torch.zeros(hm.n_layers, hm.n_heads, width, dtype=torch.float64)
    count = 0.0
    mask_box: dict[str, torch.Tensor] = {}

    def keep(layer: int, z: torch.Tensor) -> None:
        m = mask_box["mask"].to(z.dtype)[:, :, None, None]
        sums[layer, :, :z.shape[-1]] += (z * m).sum((0, 1)).double().cpu()

    with torch.inference_mode(), ExitStack() as stack:
        stack.enter_context(head_gates(hm, base))
        stack.enter_context(on_head_outputs(hm, keep))  # registered after the gates: sees gated outputs
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            mask_box["mask"] = b.attention_mask.to(hm.device)
            final_hidden(hm, b.input_ids.to(hm.device), mask_box["mask"])
            count += float(b.attention_mask.sum())
    return (sums / max(count, 1.0)).float().to(hm.device)


def ablation_scan(hm: HeadModel, prep: Tokens, metric: str, **kw: Any) -> tuple[np.ndarray, MetricResult]:
    """The metric with each active head ablated in turn: `[L, H]` values (NaN for pruned heads), and the base
    (see `ablation_passages`)."""
    values, base, _ = ablation_passages(hm, prep, metric, **kw)
    return values, base


def _ablation_statistic(sign: float, active: np.ndarray) -> Statistic:
    """The importance of each head: sign x (metric with the head off - metric with it on), same passages."""

    def stat(s: Sums) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            off = s["off_num"] / s["off_den"]
            on = (s["base_num"] / s["base_den"])[..., None, None]
        return np.where(active, sign * (off - on), np.nan)

    return stat


def ablation_passages(hm: HeadModel, prep: Tokens, metric: str, *, gates: torch.Tensor | None = None,
                      reference: Reference | None = None, mean: bool = False, batch_size: int = 16,
                      per_pass: int | None = None, reuse_prefix: bool = True,
                      progress: bool = False) -> tuple[np.ndarray, MetricResult, PassageSums]:
    """The metric with each active head ablated in turn: `[L, H]` values (NaN for pruned heads), the base, and
    the per-passage numerators and denominators behind both (`off_num`, `off_den` `[passages, L, H]`,
    `base_num`, `base_den` `[passages]`).

    With `reuse_prefix` the layers before the ablated one run once per batch (their output is
    cached from the unablated pass) and only layers l..L-1 run per ablation; `per_pass` ablations
    share one forward pass through per-row gates (default: as many as fit ROWS_PER_PASS rows).
    `reuse_prefix=False` runs the whole model per ablation (the naive loop, for comparison).
    """
    base = base_gates(hm, gates)
    means = head_means(hm, prep, base, batch_size) if mean else None
    L, H = hm.n_layers, hm.n_heads
    totals = [[{"value": [0.0, 0.0]} for _ in range(H)] for _ in range(L)]
    base_totals: dict[str, list[float]] = {"value": [0.0, 0.0]}
    active = [[h for h in range(H) if float(base[l, h]) != 0.0] for l in range(L)]
    per = Accumulator(len(prep.ids))
    for name, shape in (("off_num", (L, H)), ("off_den", (L, H)), ("base_num", ()), ("base_den", ())):
        per.declare(name, shape)
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches * sum(map(len, active)), desc="ablation" + ("_mean" if mean else ""),
               unit="head", disable=not (progress and is_main()), leave=False)
    n_pass = 0
    with torch.inference_mode():
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            B = ids.shape[0]
            tg = targets(prep, metric, reference, b.index, ids.shape[1], hm.device)
            # token-level extras are not ranked: skip their cost in every pass
            tg["ref_tokens"] = None
            outs: dict[int, Any] = {}
            with head_gates(hm, base), capture_layer_outputs(hm, outs):
                rm0 = row_metric(hm, metric, ids, mask, **tg)
            accumulate(base_totals, rm0)
            per.add("base_num", b.index, rm0.num.detach().double().cpu().numpy())
            per.add("base_den", b.index, rm0.den.detach().double().cpu().numpy())
            k_max = per_pass or max(1, ROWS_PER_PASS // B)
            for layer in range(L):
                for s in range(0, len(active[layer]), k_max):
                    heads = active[layer][s:s + k_max]
                    k = len(heads)
                    n_pass += 1
                    if not owns(n_pass - 1):  # torchrun / --workers: another rank runs this pass
                        bar.update(k)
                        continue
                    with ExitStack() as stack:
                        if reuse_prefix and layer > 0:
                            def grow(t: torch.Tensor, k: int = k) -> torch.Tensor:
                                return repeat_rows(t, k)

                            entering = _map_tensors(outs[layer - 1], grow)
                            stack.enter_context(skip_prefix(hm, layer, entering))
                        stack.enter_context(row_ablation(hm, base, layer, heads, B, means))
                        rm = row_metric(hm, metric, repeat_rows(ids, k), repeat_rows(mask, k),
                                        **{n: repeat_rows(t, k) for n, t in tg.items()})
                    num = rm.num.detach().double().cpu().numpy().reshape(k, B)
                    den = rm.den.detach().double().cpu().numpy().reshape(k, B)
                    for i, h in enumerate(heads):
                        accumulate(totals[layer][h], rm, slice(i * B, (i + 1) * B))
                        per.add("off_num", b.index, num[i], (layer, h))
                        per.add("off_den", b.index, den[i], (layer, h))
                    bar.update(k)
    bar.close()
    # each rank summed its own passes; the base pass ran on every rank
    totals = all_reduce_totals(totals)
    sums = per.result()
    sums = PassageSums({**sums.arrays, "off_num": all_reduce_array(sums["off_num"]),
                        "off_den": all_reduce_array(sums["off_den"])}, sums.passages_per_row)
    values = np.full((L, H), np.nan)
    for layer in range(L):
        for h in active[layer]:
            values[layer, h] = finish(metric, totals[layer][h], prep.n_tokens).value
    return values, finish(metric, base_totals, prep.n_tokens), sums


@CRITERIA.register("ablation", help="metric change when the head is zeroed (exact; prefix reused)",
                   needs_gradient=False, cost="layers l..L-1 once per head and batch (prefix reused)",
                   sharded=True)
def ablation(ctx: ScoreContext) -> np.ndarray:
    """Exact single-head zero-ablation: the metric change when the head's output is zeroed, signed so
    that a worse metric is a positive importance (loss rise, or fidelity/accuracy drop)."""
    _, base, sums = ablation_passages(ctx.hm, ctx.prep, ctx.metric, gates=ctx.gates, reference=ctx.reference,
                                      batch_size=ctx.batch_size, progress=ctx.progress)
    ctx.base_result = base
    return ctx.contribute("ablation", sums, _ablation_statistic(ctx.sign, (ctx.gates != 0).cpu().numpy()))


@CRITERIA.register("ablation_mean", help="metric change when the head's output is replaced by its data mean",
                   needs_gradient=False, cost="one pass for the means, then as ablation", sharded=True)
def ablation_mean(ctx: ScoreContext) -> np.ndarray:
    """As `ablation`, but the head's output is replaced by its mean over the data (mean over real
    tokens of every passage, under the current mask), which keeps the head's constant contribution."""
    _, base, sums = ablation_passages(ctx.hm, ctx.prep, ctx.metric, gates=ctx.gates, reference=ctx.reference,
                                      mean=True, batch_size=ctx.batch_size, progress=ctx.progress)
    ctx.base_result = base
    return ctx.contribute("ablation_mean", sums, _ablation_statistic(ctx.sign, (ctx.gates != 0).cpu().numpy()))


__all__ = [
    "ablation",
    "ablation_mean",
    "ablation_passages",
    "ablation_scan",
    "capture_layer_outputs",
    "head_means",
    "row_ablation",
    "skip_prefix",
]
