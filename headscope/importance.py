"""Head importance: which heads matter for the task metric, by several criteria.

Every criterion is a HeadTable column ``importance_<method>``; convention: HIGHER = MORE IMPORTANT.
Heads already pruned by the current mask (``gates`` entry 0) get NaN in every column.

- ``ablation``: exact single-head zero-ablation: metric change when the head's output is zeroed,
  signed so that a worse metric is a positive importance (loss rise, or fidelity/accuracy drop).
- ``ablation_mean``: the same, but the head's output is replaced by its mean over the data
  (mean over real tokens of every passage), which keeps the head's constant contribution.
- ``gradient``: Michel et al. (2019): |dL/dg| summed over batches (absolute value of each
  batch's gradient, as in their code), then divided by each layer's L2 norm (unit norm per layer).
- ``gradient_raw``: the same sum, unnormalised, divided by the number of loss terms
  (predicted tokens for lm_loss, passages otherwise).
- ``taylor``: |g * dL_i/dg| per passage (L_i the passage's own mean loss), averaged over passages.
- ``ig``: integrated gradients along the gate path alpha * g, alpha 0 -> 1 (Hao et al. 2021's
  attention attribution applied to head gates), midpoint rule with ``ig_steps`` steps; the column is
  the attribution of the loss *decrease*, so the columns sum to L(all gates 0) - L(g) (completeness).
- ``entropy``: NEGATED mean attention entropy (nats): focused heads (low entropy) rank high.
- ``output_norm``: mean L2 norm of the head's contribution to the residual stream.

Losses: next-token cross-entropy for causal LMs, cross-entropy on the labels for classifiers.
For fidelity (encoders without a task head) the loss against the unpruned model is minimised at
the unpruned gates, so its gradient there is exactly zero; ``gradient`` and ``taylor`` then use the
Gauss-Newton surrogate L_i = <P u_i, e_i(g)> / |r_i| with a fixed random probe u_i ~ N(0, I) per
passage (seeded), e_i the mean-pooled embedding, r_i the reference embedding and P the projection
orthogonal to r_i: E[(dL_i/dg)^2] = |P de_i/dg|^2 / |r_i|^2, which is twice the second-order
prediction of the cosine loss 1 - cos(e_i, r_i) when the gate moves by one. ``ig`` uses 1 - cos
itself (its path starts far from the minimum, so it does not vanish).
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .analyze import pad_id, versions
from .data import batches
from .errors import HeadscopeError, did_you_mean
from .hooks import head_gates, on_head_outputs
from .metrics import (
    HIGHER_IS_BETTER,
    MetricResult,
    Prepared,
    Reference,
    RowMetric,
    _make_reference,
    accumulate,
    batch_targets,
    evaluate_prepared,
    final_hidden,
    finish,
    mean_pool,
    prepare,
    repeat_rows,
    resolve_metric,
    row_metric,
)
from .models.adapter import HeadModel
from .table import HeadTable

log = logging.getLogger(__name__)

METHODS = ("ablation", "ablation_mean", "gradient", "gradient_raw", "taylor", "ig", "entropy", "output_norm")
METHOD_HELP: dict[str, str] = {
    "ablation": "metric change when the head is zeroed (exact; prefix reused)",
    "ablation_mean": "metric change when the head's output is replaced by its data mean",
    "gradient": "|dL/dgate| summed over batches, unit L2 norm per layer (Michel et al. 2019)",
    "gradient_raw": "|dL/dgate| summed over batches, per loss term, unnormalised",
    "taylor": "|gate * dL_i/dgate| averaged over passages",
    "ig": "integrated gradients of the loss decrease along gates 0 -> 1 (sums to L(0) - L(g))",
    "entropy": "negated attention entropy, nats (focused heads rank high)",
    "output_norm": "norm of the head's contribution to the residual stream",
}
# Rows per forward pass when several ablations (or IG steps) share one pass via per-row gates.
ROWS_PER_PASS = 64


# --- arguments ------------------------------------------------------------------------------
def parse_methods(methods: str | Sequence[str]) -> list[str]:
    """Method names from a comma-separated string or a list; 'all' means every method."""
    items = methods.split(",") if isinstance(methods, str) else list(methods)
    out: list[str] = []
    for m in (s.strip() for s in items):
        if not m:
            continue
        if m == "all":
            out.extend(x for x in METHODS if x not in out)
            continue
        if m not in METHODS:
            raise HeadscopeError(f"unknown importance method {m!r}{did_you_mean(m, METHODS)}; "
                                 f"choose from {', '.join(METHODS)} (or 'all')")
        if m not in out:
            out.append(m)
    if not out:
        raise HeadscopeError(f"no importance method given; choose from {', '.join(METHODS)} (or 'all')")
    return out


def base_gates(hm: HeadModel, gates: torch.Tensor | None) -> torch.Tensor:
    """The current mask as a float `[L, H]` tensor on the model's device (ones when None)."""
    want = (hm.n_layers, hm.n_heads)
    # float64 models (finite-difference tests) get float64 gates; everything else float32.
    dtype = torch.float64 if next(hm.model.parameters()).dtype == torch.float64 else torch.float32
    if gates is None:
        return torch.ones(want, device=hm.device, dtype=dtype)
    g = torch.as_tensor(gates).to(dtype)
    if tuple(g.shape) != want:
        raise HeadscopeError(f"gates have shape {tuple(g.shape)}; expected [n_layers, n_heads] = {list(want)}")
    return g.detach().to(hm.device)


def _sign(metric: str) -> float:
    """+1 when a larger metric is worse (loss), -1 when larger is better: importance = sign * change."""
    return -1.0 if HIGHER_IS_BETTER[metric] else 1.0


# --- prefix reuse ---------------------------------------------------------------------------
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

    def make(layer: int):
        def hook(module, args, output):
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
        for b, old in zip(blocks, saved):
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
            out = out + replace[:, None, :, None].to(z.dtype) * means[layer].to(z.dtype)[None, None]
        return out

    with on_head_outputs(hm, apply, layers=touched):
        yield


def head_means(hm: HeadModel, prep: Prepared, base: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Mean output of every head over the real tokens of the data, under the base mask: `[L, H, d_head]`."""
    sums = torch.zeros(hm.n_layers, hm.n_heads, hm.d_head, dtype=torch.float64)
    count = 0.0
    mask_box: dict[str, torch.Tensor] = {}

    def keep(layer: int, z: torch.Tensor) -> None:
        m = mask_box["mask"].to(z.dtype)[:, :, None, None]
        sums[layer] += (z * m).sum((0, 1)).double().cpu()

    with torch.inference_mode(), ExitStack() as stack:
        stack.enter_context(head_gates(hm, base))
        stack.enter_context(on_head_outputs(hm, keep))  # registered after the gates: sees gated outputs
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            mask_box["mask"] = b.attention_mask.to(hm.device)
            final_hidden(hm, b.input_ids.to(hm.device), mask_box["mask"])
            count += float(b.attention_mask.sum())
    return (sums / max(count, 1.0)).float().to(hm.device)


def ablation_scan(hm: HeadModel, prep: Prepared, metric: str, *, gates: torch.Tensor | None = None,
                  reference: Reference | None = None, mean: bool = False, batch_size: int = 16,
                  per_pass: int | None = None, reuse_prefix: bool = True,
                  progress: bool = False) -> tuple[np.ndarray, MetricResult]:
    """The metric with each active head ablated in turn: `[L, H]` values (NaN for pruned heads), and the base.

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
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches * sum(map(len, active)), desc="ablation" + ("_mean" if mean else ""),
               unit="head", disable=not progress, leave=False)
    with torch.inference_mode():
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            B = ids.shape[0]
            tg = batch_targets(prep, reference if metric == "fidelity" else None, b.index, ids.shape[1], hm.device)
            tg["ref_tokens"] = None  # token-level extras are not ranked: skip their cost in every pass
            outs: dict[int, Any] = {}
            with head_gates(hm, base), capture_layer_outputs(hm, outs):
                accumulate(base_totals, row_metric(hm, metric, ids, mask, **tg))
            k_max = per_pass or max(1, ROWS_PER_PASS // B)
            for layer in range(L):
                for s in range(0, len(active[layer]), k_max):
                    heads = active[layer][s:s + k_max]
                    k = len(heads)
                    with ExitStack() as stack:
                        if reuse_prefix and layer > 0:
                            entering = _map_tensors(outs[layer - 1], lambda t: repeat_rows(t, k))
                            stack.enter_context(skip_prefix(hm, layer, entering))
                        stack.enter_context(row_ablation(hm, base, layer, heads, B, means))
                        rm = row_metric(hm, metric, repeat_rows(ids, k), repeat_rows(mask, k),
                                        **{n: repeat_rows(t, k) for n, t in tg.items()})
                    for i, h in enumerate(heads):
                        accumulate(totals[layer][h], rm, slice(i * B, (i + 1) * B))
                    bar.update(k)
    bar.close()
    values = np.full((L, H), np.nan)
    for layer in range(L):
        for h in active[layer]:
            values[layer, h] = finish(metric, totals[layer][h], prep.n_tokens).value
    return values, finish(metric, base_totals, prep.n_tokens)


# --- gradients ------------------------------------------------------------------------------
def _probe(index: Sequence[int], d: int, seed: int, device: torch.device) -> torch.Tensor:
    """A fixed N(0, I) probe per passage, independent of batching: `[rows, d]`."""
    rows = []
    for i in index:
        g = torch.Generator().manual_seed(1_000_003 * seed + int(i))
        rows.append(torch.randn(d, generator=g))
    return torch.stack(rows).to(device)


def loss_rows(hm: HeadModel, metric: str, ids: torch.Tensor, mask: torch.Tensor, tg: dict[str, Any],
              probe: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable per-row loss sums and their term counts (lower = better).

    lm_loss: summed next-token CE, predicted tokens; accuracy: CE on the label, 1; fidelity:
    1 - cosine to the reference, 1, or with `probe` the Gauss-Newton surrogate (module docstring).
    """
    if metric == "fidelity" and probe is not None:
        ref = tg["ref_pooled"]
        e = mean_pool(final_hidden(hm, ids, mask), mask)
        r_hat = ref / ref.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        v = probe - (probe * r_hat).sum(-1, keepdim=True) * r_hat  # orthogonal to the reference
        val = (v * e).sum(-1) / ref.norm(dim=-1).clamp_min(1e-12)
        return val.double(), torch.ones_like(val, dtype=torch.float64)
    rm: RowMetric = row_metric(hm, metric, ids, mask, **{**tg, "ref_tokens": None})
    if metric == "lm_loss":
        return rm.num, rm.den
    if metric == "accuracy":
        return rm.extra["cross_entropy"]
    return 1.0 - rm.num, rm.den


def gradient_scores(hm: HeadModel, prep: Prepared, metric: str, *, gates: torch.Tensor | None = None,
                    reference: Reference | None = None, batch_size: int = 16, seed: int = 0,
                    progress: bool = False) -> dict[str, np.ndarray]:
    """Raw gate gradients in one forward+backward per batch: `gradient_raw`, `gradient`, `taylor`."""
    base = base_gates(hm, gates)
    L, H = hm.n_layers, hm.n_heads
    raw = torch.zeros(L, H, dtype=torch.float64)
    taylor = torch.zeros(L, H, dtype=torch.float64)
    terms, passages = 0.0, 0
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    for b in tqdm(batches(prep.ids, batch_size, pad_id=pad_id(hm)), total=n_batches, desc="gradient",
                  unit="batch", disable=not progress, leave=False):
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        B = ids.shape[0]
        tg = batch_targets(prep, reference if metric == "fidelity" else None, b.index, ids.shape[1], hm.device)
        probe = _probe(b.index, hm.d_model, seed, hm.device) if metric == "fidelity" else None
        # Per-row gates: one backward yields every passage's own gradient (for Taylor).
        g = base.expand(B, L, H).clone().requires_grad_(True)
        with head_gates(hm, g):
            num, den = loss_rows(hm, metric, ids, mask, tg, probe)
        # autograd.grad w.r.t. the gates only: weight gradients are never computed.
        (grad,) = torch.autograd.grad(num.sum(), g)
        grad = grad.double().cpu()
        raw += grad.sum(0).abs()
        taylor += (base.double().cpu() * grad / den.detach().cpu()[:, None, None]).abs().sum(0)
        terms += float(den.sum())
        passages += B
    # Pruned heads still have a gradient (the effect of bringing them back); it is not theirs to
    # rank, so it is left out of the sums and of the per-layer norms.
    raw[(base == 0).cpu()] = 0.0
    raw_mean = raw / max(terms, 1.0)
    norm = raw.pow(2).sum(-1, keepdim=True).sqrt()
    normed = torch.where(norm > 0, raw / norm.clamp_min(1e-300), raw)
    return {"gradient_raw": raw_mean.numpy(), "gradient": normed.numpy(),
            "taylor": (taylor / max(passages, 1)).numpy()}


def ig_scores(hm: HeadModel, prep: Prepared, metric: str, *, gates: torch.Tensor | None = None,
              reference: Reference | None = None, batch_size: int = 16, steps: int = 16,
              progress: bool = False) -> np.ndarray:
    """Integrated gradients of the loss decrease along alpha * gates, alpha 0 -> 1 (midpoint rule)."""
    if steps < 1:
        raise HeadscopeError(f"ig_steps must be at least 1, got {steps}")
    base = base_gates(hm, gates)
    L, H = hm.n_layers, hm.n_heads
    attr = torch.zeros(L, H, dtype=torch.float64)
    terms = 0.0
    alphas = [(s + 0.5) / steps for s in range(steps)]
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches * steps, desc="ig", unit="step", disable=not progress, leave=False)
    for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        B = ids.shape[0]
        tg = batch_targets(prep, reference if metric == "fidelity" else None, b.index, ids.shape[1], hm.device)
        k_max = max(1, ROWS_PER_PASS // B)
        for s in range(0, steps, k_max):
            chunk = alphas[s:s + k_max]
            k = len(chunk)
            a = torch.tensor(chunk, device=hm.device).repeat_interleave(B)  # block i = alpha_i
            g = (a[:, None, None] * base[None]).requires_grad_(True)
            with head_gates(hm, g):
                num, den = loss_rows(hm, metric, repeat_rows(ids, k), repeat_rows(mask, k),
                                     {n: repeat_rows(t, k) for n, t in tg.items()})
            (grad,) = torch.autograd.grad(num.sum(), g)
            attr += grad.double().cpu().sum(0) / steps
            if s == 0:
                terms += float(den[:B].sum())
            bar.update(k)
    bar.close()
    # Attribution of L(g) - L(0) is g * integral of the gradient; we report the loss decrease.
    return (-(base.double().cpu() * attr) / max(terms, 1.0)).numpy()


def pattern_scores(hm: HeadModel, prep: Prepared, *, gates: torch.Tensor | None = None,
                   batch_size: int = 16) -> dict[str, np.ndarray]:
    """Cheap baselines from the foundation statistics: negated entropy and output norm."""
    from .analyze import analyze

    base = base_gates(hm, gates)
    with head_gates(hm, base):
        t = analyze(hm, prep.ids, max_length=prep.max_length, batch_size=batch_size)
    return {"entropy": -np.asarray(t["entropy"], float), "output_norm": np.asarray(t["output_norm"], float)}


# --- public API -----------------------------------------------------------------------------
def score(
    hm: HeadModel,
    data: Any,
    methods: str | Sequence[str] = ("gradient",),
    *,
    metric: str = "auto",
    gates: torch.Tensor | None = None,
    reference: Reference | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
    ig_steps: int = 16,
    seed: int = 0,
    limit: int | None = None,
    progress: bool = False,
) -> HeadTable:
    """Score every head by each method; one column `importance_<method>` each (higher = more important).

    `gates` is the current mask `[L, H]` (0 = already pruned: NaN in every column). Fidelity
    compares against `reference` (the unpruned model's outputs; built here when None).
    """
    chosen = parse_methods(methods)
    if batch_size < 1:
        raise HeadscopeError(f"batch_size must be at least 1, got {batch_size}")
    if ig_steps < 1:
        raise HeadscopeError(f"ig_steps must be at least 1, got {ig_steps}")
    if isinstance(data, Prepared):
        prep, metric = data, resolve_metric(hm, metric, data.labels is not None)
    else:
        prep, metric = prepare(hm, data, metric, max_length, limit)
    base = base_gates(hm, gates)
    if metric == "fidelity":
        if reference is None:
            reference = _make_reference(hm, prep, batch_size, progress)
        reference.check(prep)
    torch.manual_seed(seed)
    cols: dict[str, np.ndarray] = {}
    timings: dict[str, float] = {}
    base_result: MetricResult | None = None
    sign = _sign(metric)
    for method in chosen:
        if method in cols:
            continue  # computed together with an earlier method (one backward pass, one analyze run)
        t0 = time.perf_counter()
        before = set(cols)
        if method in ("ablation", "ablation_mean"):
            values, base_result = ablation_scan(hm, prep, metric, gates=base, reference=reference,
                                                mean=method == "ablation_mean", batch_size=batch_size,
                                                progress=progress)
            cols[method] = sign * (values - base_result.value)
        elif method in ("gradient", "gradient_raw", "taylor"):
            cols.update({k: v for k, v in gradient_scores(
                hm, prep, metric, gates=base, reference=reference, batch_size=batch_size, seed=seed,
                progress=progress).items() if k in chosen})
        elif method == "ig":
            cols["ig"] = ig_scores(hm, prep, metric, gates=base, reference=reference, batch_size=batch_size,
                                   steps=ig_steps, progress=progress)
        elif method in ("entropy", "output_norm"):
            cols.update({k: v for k, v in pattern_scores(hm, prep, gates=base, batch_size=batch_size).items()
                         if k in chosen})
        # Methods computed in one pass share one entry, e.g. "gradient+gradient_raw+taylor".
        timings["+".join(m for m in chosen if m in set(cols) - before)] = time.perf_counter() - t0
    if base_result is None:
        base_result = evaluate_prepared(hm, prep, metric, gates=base, reference=reference, batch_size=batch_size)
    pruned = (base == 0).cpu().numpy()
    columns = {}
    for method in chosen:
        v = np.array(cols[method], dtype=float)
        v[pruned] = np.nan
        columns[f"importance_{method}"] = v
    meta = {
        "model": hm.name, "model_source": hm.source, "model_type": hm.config.model_type,
        "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head,
        "causal": hm.causal, "data": prep.source, "passages": len(prep.ids), "tokens_seen": prep.n_tokens,
        "max_length": prep.max_length, "batch_size": batch_size, "seed": seed, "ig_steps": ig_steps,
        "metric": metric, "metric_value": base_result.value, "metric_details": base_result.details,
        "higher_is_better": base_result.higher_is_better, "methods": chosen,
        "pruned_heads": int(pruned.sum()), "convention": "higher importance = more important; pruned heads NaN",
        "seconds": timings, "versions": versions(),
    }
    return HeadTable(hm.n_layers, hm.n_heads, columns, meta)


def rank_correlations(table: HeadTable) -> "Any":
    """Spearman correlation between every pair of `importance_*` columns (pairwise over non-NaN heads)."""
    import pandas as pd

    names = [c for c in table.columns if c.startswith("importance_")]
    if not names:
        raise HeadscopeError(f"the table has no importance_* columns (columns: {', '.join(table.columns)}); "
                             f"run headscope score first")
    df = pd.DataFrame({n.removeprefix("importance_"): np.asarray(table[n], float).ravel() for n in names})
    return df.corr(method="spearman")


def layer_norms(column: np.ndarray) -> np.ndarray:
    """Per-layer L2 norm of a `[L, H]` column, ignoring NaN (pruned) heads."""
    return np.sqrt(np.nansum(np.asarray(column, float) ** 2, axis=-1))


__all__ = ["METHODS", "METHOD_HELP", "ablation_scan", "gradient_scores", "ig_scores", "parse_methods",
           "rank_correlations", "score", "skip_prefix", "capture_layer_outputs", "loss_rows", "layer_norms"]
