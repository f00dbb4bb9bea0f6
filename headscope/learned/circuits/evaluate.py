"""The circuit evaluator: one forward per circuit and batch, as MIB's circuit track (Hanna et al.'s
`evaluate_graph`, intervention "patching") runs a circuit.

The clean text runs with every edge outside the circuit carrying its corrupt-run value: each receiver's input is

    x_r = (this run's residual entering r's norm) + sum over senders s whose edge s -> r is left out of
          (a_s,corrupt - a_s,this run)

so a kept edge passes what the sender computes in this very run (which may itself have changed upstream) and a
dropped one what it computed on the corrupt text. With no edge kept every receiver reads the corrupt residual
(the corrupt run); with every edge kept nothing changes (the clean run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...models.adapter import HeadModel
from ..causal.pairs import PairBatch
from ..causal.patching import chunks
from .graph import Graph
from .scores import capture, metric
from .wiring import wired


def circuit_forward(hm: HeadModel, graph: Graph, b: PairBatch, corrupt_out: torch.Tensor,
                    dropped: np.ndarray) -> torch.Tensor:
    """The metric `[pairs]` of the clean ids with the edges of `dropped` (`[senders, receivers]` bool) patched."""
    drop = torch.as_tensor(dropped & graph.edges, dtype=corrupt_out.dtype, device=corrupt_out.device)
    last = np.zeros(len(graph.receivers), dtype=np.int64)  # per receiver: 1 + the last sender it drops
    for r in range(len(graph.receivers)):
        hits = np.nonzero(dropped[:, r] & graph.edges[:, r])[0]
        last[r] = hits[-1] + 1 if hits.size else 0
    # [senders, pairs, pos, d_model]: corrupt - this run, as senders run
    diff = torch.zeros_like(corrupt_out)

    def sent(idx: list[int], out: torch.Tensor) -> None:
        diff[idx] = corrupt_out[idx] - out.to(diff.dtype)

    def deltas(rs: list[int], x: torch.Tensor) -> torch.Tensor | None:
        upto = int(last[rs].max())
        if upto == 0:
            return None
        d = torch.einsum("sr,sbtd->rbtd", drop[:upto, rs], diff[:upto])
        return d.to(x.device, x.dtype)

    with torch.no_grad(), wired(hm, graph, deltas, sent):
        return metric(hm, b, b.clean)


@dataclass
class CircuitRuns:
    """Per-pair metrics: clean (every edge), empty (no edge) `[pairs]` and each circuit's `[pairs, circuits]`."""

    clean: np.ndarray
    corrupt: np.ndarray
    empty: np.ndarray
    circuits: np.ndarray
    forwards: int


def evaluate_circuits(hm: HeadModel, graph: Graph, b: PairBatch, kept: list[np.ndarray], *, batch_size: int = 8,
                      progress: Callable[[int], None] | None = None) -> CircuitRuns:
    """Run every circuit (`kept`: bool `[edges]` each) on every pair, and the empty circuit."""
    hm.model.eval()
    every = np.ones(graph.n_edges, dtype=bool)
    dropped = [graph.mask(every & ~k) for k in kept]
    clean, corrupt, empty = (np.zeros(len(b)) for _ in range(3))
    circuits = np.zeros((len(b), len(kept)))
    forwards = 0
    for rows in chunks(len(b), batch_size):
        part = b.take(rows)
        corrupt_out, m_corrupt = capture(hm, graph, part, part.corrupt)
        with torch.no_grad():
            m_clean = metric(hm, part, part.clean)
        corrupt[rows], clean[rows] = m_corrupt.double().cpu().numpy(), m_clean.double().cpu().numpy()
        empty[rows] = circuit_forward(hm, graph, part, corrupt_out, graph.edges).double().cpu().numpy()
        forwards += 3
        for c, d in enumerate(dropped):
            circuits[rows, c] = circuit_forward(hm, graph, part, corrupt_out, d).double().cpu().numpy()
            forwards += 1
            if progress:
                progress(1)
    return CircuitRuns(clean, corrupt, empty, circuits, forwards)
