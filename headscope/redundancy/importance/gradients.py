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
from ...uncertainty import Accumulator, PassageSums, Statistic, Sums
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


def _per_layer_unit_norm(pruned: np.ndarray) -> Statistic:
    """Michel et al.'s normalisation of a mean |gradient| `[.., L, H]`: each layer to unit L2 norm, the pruned
    heads (their gradient is the effect of bringing them back, not theirs to rank) left out as 0."""

    def stat(s: Sums) -> np.ndarray:
        v = np.where(pruned, 0.0, s["abs_grad"] / np.maximum(s["passages"], 1e-300)[..., None, None])
        norm = np.sqrt((v ** 2).sum(-1, keepdims=True))
        return np.where(norm > 0, v / np.where(norm > 0, norm, 1.0), v)

    return stat


def _batch_norm(pruned: np.ndarray) -> Statistic:
    """`gradient_batch`: the summed |batch gradient| per layer at unit L2 norm (a row is a batch)."""

    def stat(s: Sums) -> np.ndarray:
        v = np.where(pruned, 0.0, s["abs_batch_grad"])
        norm = np.sqrt((v ** 2).sum(-1, keepdims=True))
        return np.where(norm > 0, v / np.where(norm > 0, norm, 1.0), v)

    return stat


def _mean_of(name: str, pruned: np.ndarray) -> Statistic:
    def stat(s: Sums) -> np.ndarray:
        return np.where(pruned, 0.0, s[name] / np.maximum(s["passages"], 1e-300)[..., None, None])

    return stat


def gradient_scores(hm: HeadModel, prep: Tokens, metric: str, **kw: Any) -> dict[str, np.ndarray]:
    """The columns of `gradient_contributions`: {criterion: [L, H]}."""
    return {k: np.asarray(stat(sums.total()), float) for k, (sums, stat) in
            gradient_contributions(hm, prep, metric, **kw).items()}


def gradient_contributions(hm: HeadModel, prep: Tokens, metric: str, *, gates: torch.Tensor | None = None,
                           reference: Reference | None = None, batch_size: int = 16, seed: int = 0,
                           progress: bool = False) -> dict[str, tuple[PassageSums, Statistic]]:
    """Gate gradients in one forward+backward per batch, as per-passage contributions and the statistic of
    each criterion: `gradient` and `gradient_raw` (mean over passages of |dL_i/dgate|, L_i the passage's mean
    loss; `gradient` at unit norm per layer), `taylor` (mean of |gate * dL_i/dgate|) and `gradient_batch`
    (|dL/dgate| of each batch summed, Michel et al.'s code; a row is a batch, so it changes with batching)."""
    base = base_gates(hm, gates)
    uses_probe = METRICS.get(metric).probe_loss is not None
    L, H = hm.n_layers, hm.n_heads
    per = Accumulator(len(prep.ids))
    for name, shape in (("abs_grad", (L, H)), ("taylor", (L, H)), ("passages", ())):
        per.declare(name, shape)
    batch_rows: list[np.ndarray] = []
    n_batches = (len(prep.ids) + batch_size - 1) // batch_size
    base_cpu = base.double().cpu()
    for b in tqdm(batches(prep.ids, batch_size, pad_id=pad_id(hm)), total=n_batches, desc="gradient",
                  unit="batch", disable=not progress, leave=False):
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        B = ids.shape[0]
        tg = targets(prep, metric, reference, b.index, ids.shape[1], hm.device)
        probe = _probe(b.index, hm.d_model, seed, hm.device) if uses_probe else None
        # Per-row gates: one backward yields every passage's own gradient.
        g = base.expand(B, L, H).clone().requires_grad_(True)
        with head_gates(hm, g):
            num, den = loss_rows(hm, metric, ids, mask, tg, probe)
        # autograd.grad w.r.t. the gates only: weight gradients are never computed.
        (grad,) = torch.autograd.grad(num.sum(), g)
        grad = grad.double().cpu()
        own = grad / den.detach().double().cpu()[:, None, None]  # d(passage mean loss)/d gate, [B, L, H]
        per.add("abs_grad", b.index, own.abs().numpy())
        per.add("taylor", b.index, (base_cpu * own).abs().numpy())
        per.add("passages", b.index, np.ones(B))
        batch_rows.append(grad.sum(0).abs().numpy())
    pruned = (base == 0).cpu().numpy()
    sums = per.result()
    batch_sums = PassageSums({"abs_batch_grad": np.stack(batch_rows) if batch_rows else np.zeros((0, L, H))})
    return {"gradient": (sums.select(["abs_grad", "passages"]), _per_layer_unit_norm(pruned)),
            "gradient_raw": (sums.select(["abs_grad", "passages"]), _mean_of("abs_grad", pruned)),
            "taylor": (sums.select(["taylor", "passages"]), _mean_of("taylor", pruned)),
            "gradient_batch": (batch_sums, _batch_norm(pruned))}


def _ig_statistic(s: Sums) -> np.ndarray:
    """IG's column: the summed attribution of the loss decrease per loss term."""
    return s["attribution"] / np.maximum(s["terms"], 1.0)[..., None, None]


def ig_scores(hm: HeadModel, prep: Tokens, metric: str, **kw: Any) -> np.ndarray:
    """The column of `ig_contributions`: `[L, H]`."""
    sums, stat = ig_contributions(hm, prep, metric, **kw)
    return np.asarray(stat(sums.total()), float)


def ig_contributions(hm: HeadModel, prep: Tokens, metric: str, *, gates: torch.Tensor | None = None,
                     reference: Reference | None = None, batch_size: int = 16, steps: int = 16,
                     progress: bool = False) -> tuple[PassageSums, Statistic]:
    """Integrated gradients of the loss decrease along alpha * gates, alpha 0 -> 1 (midpoint rule), as
    per-passage attributions and loss terms with the statistic that gives the column."""
    if steps < 1:
        raise HeadscopeError(f"ig_steps must be at least 1, got {steps}")
    base = base_gates(hm, gates)
    L, H = hm.n_layers, hm.n_heads
    per = Accumulator(len(prep.ids))
    per.declare("attribution", (L, H))
    per.declare("terms", ())
    base_cpu = base.double().cpu()
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
            # rows: block i holds alpha_i for every passage; each passage's gradient summed over its alphas
            per_row = grad.double().cpu().view(k, B, L, H).sum(0) / steps
            # Attribution of L(g) - L(0) is g * integral of the gradient; we report the loss decrease.
            per.add("attribution", b.index, (-(base_cpu * per_row)).numpy())
            if s == 0:
                per.add("terms", b.index, den[:B].detach().double().cpu().numpy())
            bar.update(k)
    bar.close()
    return per.result(), _ig_statistic




def _gate_gradients(ctx: ScoreContext) -> dict[str, tuple[PassageSums, Statistic]]:
    return ctx.shared("gate-gradients", lambda: gradient_contributions(
        ctx.hm, ctx.prep, ctx.metric, gates=ctx.gates, reference=ctx.reference, batch_size=ctx.batch_size,
        seed=ctx.seed, progress=ctx.progress))


@CRITERIA.register("gradient", help="E over passages of |dL_i/dgate|, unit L2 norm per layer (Michel et al. 2019)",
                   needs_gradient=True, cost="one forward+backward per batch", shares="gate-gradients")
def gradient(ctx: ScoreContext) -> np.ndarray:
    """Michel et al. (2019)'s definition, E_x |dL(x)/dg|: the mean over passages of the absolute gradient of
    the passage's mean loss with respect to the head's gate, then divided by each layer's L2 norm (unit norm
    per layer). Per passage, so it does not change with the batch size (their code sums |dL/dg| of each
    batch instead: `gradient_batch`)."""
    return ctx.contribute("gradient", *_gate_gradients(ctx)["gradient"])


@CRITERIA.register("gradient_raw", help="E over passages of |dL_i/dgate|, unnormalised",
                   needs_gradient=True, cost="one forward+backward per batch", shares="gate-gradients")
def gradient_raw(ctx: ScoreContext) -> np.ndarray:
    """The mean behind `gradient`, before the per-layer normalisation."""
    return ctx.contribute("gradient_raw", *_gate_gradients(ctx)["gradient_raw"])


@CRITERIA.register("gradient_batch", help="|dL/dgate| of each batch summed, unit norm per layer (Michel et al.'s "
                   "code; changes with --batch-size)", needs_gradient=True, cost="one forward+backward per batch",
                   shares="gate-gradients", per_batch=True)
def gradient_batch(ctx: ScoreContext) -> np.ndarray:
    """Michel et al.'s code: the absolute value of each BATCH's summed gate gradient, summed over batches and
    normalised per layer. Defined over batches, it changes with --batch-size (at 64 PTB passages its
    split-half Spearman on MiniLM was 0.29 at batch 16, against 0.81 per passage); its interval resamples
    batches."""
    return ctx.contribute("gradient_batch", *_gate_gradients(ctx)["gradient_batch"])


@CRITERIA.register("taylor", help="|gate * dL_i/dgate| averaged over passages",
                   needs_gradient=True, cost="one forward+backward per batch", shares="gate-gradients")
def taylor(ctx: ScoreContext) -> np.ndarray:
    """|g * dL_i/dg| per passage (L_i the passage's own mean loss), averaged over passages."""
    return ctx.contribute("taylor", *_gate_gradients(ctx)["taylor"])


@CRITERIA.register("ig", help="integrated gradients of the loss decrease along gates 0 -> 1 (sums to L(0) - L(g))",
                   needs_gradient=True, cost="ig_steps forward+backward passes per batch")
def ig(ctx: ScoreContext) -> np.ndarray:
    """Integrated gradients along the gate path alpha * g, alpha 0 -> 1 (Hao et al. 2021's attention
    attribution applied to head gates), midpoint rule with `ig_steps` steps; the column is the
    attribution of the loss *decrease*, so the columns sum to L(all gates 0) - L(g) (completeness)."""
    return ctx.contribute(
        "ig",
        *ig_contributions(
            ctx.hm,
            ctx.prep,
            ctx.metric,
            gates=ctx.gates,
            reference=ctx.reference,
            batch_size=ctx.batch_size,
            steps=ctx.ig_steps,
            progress=ctx.progress,
        ),
    )


__all__ = ["gradient", "gradient_batch", "gradient_contributions", "gradient_raw", "gradient_scores", "ig",
           "ig_contributions", "ig_scores", "loss_rows", "taylor"]
