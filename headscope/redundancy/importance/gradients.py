"""Gradient criteria: derivatives of the metric's loss with respect to the head gates.

One forward and one backward pass per batch give every passage's gate gradient at once (per-row
gates `[B, L, H]`), from which `gradient`, `gradient_raw` and `taylor` are all read; integrated
gradients take `ig_steps` such passes along the path from all gates 0 to the current gates. Weight
gradients are never computed: `torch.autograd.grad` is taken with respect to the gates only.

Losses (lower = better) come from the metric's registry entry (`loss`): next-token cross-entropy for
causal LMs, cross-entropy on the labels for classifiers, 1 - cosine to the unpruned model for
fidelity. Fidelity's loss is minimised at the unpruned gates, so its gradient there is exactly zero;
`gradient` and `taylor` then follow the entry's `probe_loss`, a Gauss-Newton surrogate with a fixed
random probe per passage (seeded; see `headscope.eval.metrics`). `ig` uses 1 - cosine itself (its
path starts far from the minimum, so it does not vanish).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ...data import Tokens, batches, pad_id
from ...errors import HeadscopeError
from ...eval.evaluate import Reference, repeat_rows
from ...eval.metrics import METRICS, row_metric
from ...hooks import head_gates
from ...models.adapter import HeadModel
from .criteria import CRITERIA, ROWS_PER_PASS, ScoreContext, base_gates, targets


def _probe(index: Sequence[int], d: int, seed: int, device: torch.device) -> torch.Tensor:
    """A fixed N(0, I) probe per passage, independent of batching: `[rows, d]`."""
    rows = []
    for i in index:
        g = torch.Generator().manual_seed(1_000_003 * seed + int(i))
        rows.append(torch.randn(d, generator=g))
    return torch.stack(rows).to(device)


def loss_rows(hm: HeadModel, metric: str, ids: torch.Tensor, mask: torch.Tensor, tg: dict[str, Any],
              probe: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable per-row loss sums and their term counts (lower = better): the metric entry's
    `loss`, or with `probe` its `probe_loss` (module docstring)."""
    entry = METRICS.get(metric)
    if probe is not None:
        return entry.probe_loss(hm, ids, mask, tg["ref_pooled"], probe)
    rm = row_metric(hm, metric, ids, mask, **{**tg, "ref_tokens": None})
    return entry.loss(rm)


def gradient_scores(hm: HeadModel, prep: Tokens, metric: str, *, gates: torch.Tensor | None = None,
                    reference: Reference | None = None, batch_size: int = 16, seed: int = 0,
                    progress: bool = False) -> dict[str, np.ndarray]:
    """Raw gate gradients in one forward+backward per batch: `gradient_raw`, `gradient`, `taylor`."""
    base = base_gates(hm, gates)
    uses_probe = METRICS.get(metric).probe_loss is not None
    L, H = hm.n_layers, hm.n_heads
    raw = torch.zeros(L, H, dtype=torch.float64)
    taylor = torch.zeros(L, H, dtype=torch.float64)
    terms, passages = 0.0, 0
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    for b in tqdm(batches(prep.ids, batch_size, pad_id=pad_id(hm)), total=n_batches, desc="gradient",
                  unit="batch", disable=not progress, leave=False):
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        B = ids.shape[0]
        tg = targets(prep, metric, reference, b.index, ids.shape[1], hm.device)
        probe = _probe(b.index, hm.d_model, seed, hm.device) if uses_probe else None
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


def ig_scores(hm: HeadModel, prep: Tokens, metric: str, *, gates: torch.Tensor | None = None,
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
        tg = targets(prep, metric, reference, b.index, ids.shape[1], hm.device)
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


def _gate_gradients(ctx: ScoreContext) -> dict[str, np.ndarray]:
    return ctx.shared("gate-gradients", lambda: gradient_scores(
        ctx.hm, ctx.prep, ctx.metric, gates=ctx.gates, reference=ctx.reference, batch_size=ctx.batch_size,
        seed=ctx.seed, progress=ctx.progress))


@CRITERIA.register("gradient", help="|dL/dgate| summed over batches, unit L2 norm per layer (Michel et al. 2019)",
                   needs_gradient=True, cost="one forward+backward per batch", shares="gate-gradients")
def gradient(ctx: ScoreContext) -> np.ndarray:
    """Michel et al. (2019): |dL/dg| summed over batches (absolute value of each batch's gradient, as in
    their code), then divided by each layer's L2 norm (unit norm per layer)."""
    return _gate_gradients(ctx)["gradient"]


@CRITERIA.register("gradient_raw", help="|dL/dgate| summed over batches, per loss term, unnormalised",
                   needs_gradient=True, cost="one forward+backward per batch", shares="gate-gradients")
def gradient_raw(ctx: ScoreContext) -> np.ndarray:
    """The sum behind `gradient`, unnormalised, divided by the number of loss terms (predicted tokens
    for lm_loss, passages otherwise)."""
    return _gate_gradients(ctx)["gradient_raw"]


@CRITERIA.register("taylor", help="|gate * dL_i/dgate| averaged over passages",
                   needs_gradient=True, cost="one forward+backward per batch", shares="gate-gradients")
def taylor(ctx: ScoreContext) -> np.ndarray:
    """|g * dL_i/dg| per passage (L_i the passage's own mean loss), averaged over passages."""
    return _gate_gradients(ctx)["taylor"]


@CRITERIA.register("ig", help="integrated gradients of the loss decrease along gates 0 -> 1 (sums to L(0) - L(g))",
                   needs_gradient=True, cost="ig_steps forward+backward passes per batch")
def ig(ctx: ScoreContext) -> np.ndarray:
    """Integrated gradients along the gate path alpha * g, alpha 0 -> 1 (Hao et al. 2021's attention
    attribution applied to head gates), midpoint rule with `ig_steps` steps; the column is the
    attribution of the loss *decrease*, so the columns sum to L(all gates 0) - L(g) (completeness)."""
    return ig_scores(ctx.hm, ctx.prep, ctx.metric, gates=ctx.gates, reference=ctx.reference,
                     batch_size=ctx.batch_size, steps=ctx.ig_steps, progress=ctx.progress)


__all__ = ["gradient", "gradient_raw", "gradient_scores", "ig", "ig_scores", "loss_rows", "taylor"]
