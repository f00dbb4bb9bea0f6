"""Attribution patching (Nanda 2023; Syed et al. 2023): the first-order estimate of exact activation patching.

For each pair and head, (z_source - z_base) . dM/dz on the base run (the corrupt run when denoising), summed over
the head's positions and dimensions: one forward and one backward per chunk of pairs for every head at once. The
gradient is taken through a zero tensor added to each layer's head outputs, so it carries every later path (later
heads' attention included) exactly as the model computes it. Estimates enter the same effect normalisation and
bootstrap as exact patching (`patching.Runs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...hooks import capture_head_outputs, on_head_outputs
from ...models.adapter import HeadModel
from ...uncertainty import spearman
from .pairs import PairBatch
from .patching import Runs, base_and_source, chunks, run_metric


def attribution_scan(hm: HeadModel, b: PairBatch, *, metric: str = "logit_diff", direction: str = "denoising",
                     batch_size: int = 16) -> Runs:
    """First-order patched metric per pair and head `[pairs, layers, heads]` (NaN where no head), as `Runs`."""
    patched = np.full((len(b), hm.n_layers, hm.n_heads), np.nan)
    clean, corrupt = np.zeros(len(b)), np.zeros(len(b))
    forwards = 0
    for rows in chunks(len(b), batch_size):
        part = b.take(rows)
        base, src_ids = base_and_source(part, direction)
        source: dict[int, torch.Tensor] = {}
        with torch.no_grad(), capture_head_outputs(hm, source):
            m_src = run_metric(hm, part, src_ids, metric)
        m_base, seen, grads = _gradients(hm, part, base, metric)
        forwards += 2
        for l, g in grads.items():
            diff = (source[l] - seen[l]).to(g.dtype) * part.mask.to(g.device)[:, :, None, None]
            est = (diff * g).sum(dim=(1, 3)).double().cpu().numpy()  # [pairs, kept heads]
            patched[rows, l, hm.kept_heads(l)] = est + m_base.detach().double().cpu().numpy()[:, None]
        (clean if direction == "denoising" else corrupt)[rows] = m_src.double().cpu().numpy()
        (corrupt if direction == "denoising" else clean)[rows] = m_base.detach().double().cpu().numpy()
    return Runs(clean, corrupt, patched, direction, forwards)


def _gradients(hm: HeadModel, b: PairBatch, ids: torch.Tensor, metric: str) -> tuple[
        torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """The metric on `ids`, each layer's head outputs there and the metric's gradient with respect to them."""
    deltas: dict[int, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}

    def add_delta(layer: int, z: torch.Tensor) -> torch.Tensor:
        d = torch.zeros_like(z, requires_grad=True)
        deltas[layer], seen[layer] = d, z.detach()
        return z + d

    with torch.enable_grad(), on_head_outputs(hm, add_delta):
        m = run_metric(hm, b, ids, metric)
        layers = sorted(deltas)
        got = torch.autograd.grad(m.sum(), [deltas[l] for l in layers], allow_unused=True)
    # a layer the metric does not depend on has no gradient: zero
    grads = {l: torch.zeros_like(seen[l]) if g is None else g for l, g in zip(layers, got, strict=True)}
    return m, seen, grads


def agreement(exact: np.ndarray, attribution: np.ndarray, top: int = 5) -> dict[str, Any]:
    """Spearman between exact and attribution effects over heads, and the heads where they differ most."""
    ok = ~(np.isnan(exact) | np.isnan(attribution))
    r = spearman(exact[ok], attribution[ok]) if ok.sum() > 2 else float("nan")
    gap = np.where(ok, np.abs(exact - attribution), -np.inf)
    order = np.argsort(-gap, axis=None)[:min(top, int(ok.sum()))]
    worst = [{"layer": int(l), "head": int(h), "exact": float(exact[l, h]), "attribution": float(attribution[l, h])}
             for l, h in (np.unravel_index(i, exact.shape) for i in order)]
    return {"spearman": float(r), "heads": int(ok.sum()), "most_different": worst}
