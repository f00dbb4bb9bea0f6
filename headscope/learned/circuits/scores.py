"""Edge scores, as MIB's circuit track computes them with Hanna et al.'s EAP-IG code (docs/circuits.md).

    EAP:     score(s -> r) = sum over positions and d_model of (a_s,corrupt - a_s,clean) . d(-M)/d(input of r)

with the gradient taken on the clean run (one forward and one backward per batch). EAP-IG ("inputs" variant):
the same difference times the gradient averaged over m runs whose embeddings are
e_corrupt + alpha (e_clean - e_corrupt), alpha = k/m for k = 0 .. m-1. M is logit(answer) - logit(wrong) at the
last real position; a score is positive when patching that edge alone with the corrupt run lowers M. Each pair
has its own score (its metric depends on its own inputs only), so the mean over pairs gets a bootstrap interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...models.adapter import HeadModel
from ...uncertainty import IntervalSettings, PassageSums, bootstrap
from ..causal.pairs import PairBatch
from ..causal.patching import chunks, logits_at, metric_values
from .graph import Graph
from .wiring import wired

METHODS = ("eap", "eap-ig")
_EDGE_BLOCK = 8192  # edges bootstrapped at once (memory: B x block doubles)


def metric(hm: HeadModel, b: PairBatch, ids: torch.Tensor) -> torch.Tensor:
    """logit(answer) - logit(wrong) of each pair `[pairs]` at its last real position."""
    return metric_values(logits_at(hm, ids, b.mask, b.position), b.answer, b.wrong, "logit_diff")


def capture(hm: HeadModel, graph: Graph, b: PairBatch, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sender's output `[senders, pairs, pos, d_model]` on `ids`, and the metric `[pairs]`."""
    store: dict[int, torch.Tensor] = {}

    def sent(idx: list[int], out: torch.Tensor) -> None:
        for i, o in zip(idx, out, strict=True):
            store[i] = o.detach()

    with torch.no_grad(), wired(hm, graph, lambda r, x: None, sent):
        m = metric(hm, b, ids)
    return torch.stack([store[i] for i in range(len(graph.senders))]), m


def receiver_gradients(hm: HeadModel, graph: Graph, b: PairBatch, embeddings: torch.Tensor | None) -> torch.Tensor:
    """d(-sum of M)/d(input of r) for every receiver `[receivers, pairs, pos, d_model]`, on the clean ids (with
    layer 0's input replaced by `embeddings` when given)."""
    leaves: list[tuple[list[int], torch.Tensor]] = []

    def deltas(rs: list[int], x: torch.Tensor) -> torch.Tensor:
        leaf = torch.zeros(len(rs), *x.shape, dtype=x.dtype, device=x.device, requires_grad=True)
        leaves.append((rs, leaf))
        return leaf

    with torch.enable_grad(), wired(hm, graph, deltas, lambda i, o: None, embeddings):
        loss = -metric(hm, b, b.clean).sum()
        grads = torch.autograd.grad(loss, [leaf for _, leaf in leaves], allow_unused=True)
    out = torch.zeros(len(graph.receivers), *leaves[0][1].shape[1:])
    for (rs, _leaf), g in zip(leaves, grads, strict=True):
        if g is not None:
            out[rs] = g.detach().float().cpu()
    return out


@dataclass
class ScoreRuns:
    """Per-pair edge scores `[pairs, edges]` and the clean and corrupt metrics `[pairs]`."""

    scores: np.ndarray
    clean: np.ndarray
    corrupt: np.ndarray
    forwards: int
    backwards: int

    def interval(self, settings: IntervalSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each edge's mean score over pairs with its bootstrap interval (blocks of edges, the same resamples)."""
        value, lo, hi = (np.zeros(self.scores.shape[1]) for _ in range(3))
        for cols in chunks(self.scores.shape[1], _EDGE_BLOCK):
            sums = PassageSums({"v": self.scores[:, cols], "n": np.ones(len(self.scores))})
            iv = bootstrap(sums, lambda t: t["v"] / np.asarray(t["n"])[..., None], settings)
            value[cols], lo[cols], hi[cols] = iv.value, iv.lo, iv.hi
        return value, lo, hi


def edge_scores(hm: HeadModel, graph: Graph, b: PairBatch, *, method: str = "eap-ig", steps: int = 5,
                batch_size: int = 8, progress: Callable[[int], None] | None = None) -> ScoreRuns:
    """Every edge's score for every pair: EAP (gradient on the clean run) or EAP-IG (inputs, `steps` runs)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    alphas = [1.0] if method == "eap" else [k / steps for k in range(steps)]
    scores = np.zeros((len(b), graph.n_edges))
    clean, corrupt = np.zeros(len(b)), np.zeros(len(b))
    forwards = backwards = 0
    hm.model.eval()
    for rows in chunks(len(b), batch_size):
        part = b.take(rows)
        out_clean, m_clean = capture(hm, graph, part, part.clean)
        out_corrupt, m_corrupt = capture(hm, graph, part, part.corrupt)
        forwards += 2
        clean[rows], corrupt[rows] = m_clean.double().cpu().numpy(), m_corrupt.double().cpu().numpy()
        e_clean, e_corrupt = out_clean[0], out_corrupt[0]
        grad = torch.zeros(len(graph.receivers), *e_clean.shape)
        for a in alphas:
            emb = None if a == 1.0 else e_corrupt + a * (e_clean - e_corrupt)
            grad += receiver_gradients(hm, graph, part, emb)
            forwards += 1
            backwards += 1
        grad /= len(alphas)
        diff = (out_corrupt - out_clean).float().cpu()  # [senders, pairs, pos, d_model]
        n = diff.shape[1]
        left = diff.permute(1, 0, 2, 3).reshape(n, len(graph.senders), -1)  # [pairs, senders, pos * d_model]
        right = grad.permute(1, 2, 3, 0).reshape(n, -1, len(graph.receivers))  # [pairs, pos * d_model, receivers]
        full = torch.bmm(left, right)  # [pairs, senders, receivers]
        scores[rows] = full[:, graph.sender_of, graph.receiver_of].double().numpy()
        if progress:
            progress(rows.stop - rows.start)
    return ScoreRuns(scores, clean, corrupt, forwards, backwards)
