"""Circuits at every size and their faithfulness, as MIB's circuit track computes them (docs/circuits.md).

At each fraction f of FRACTIONS a circuit keeps k = int(f x total edges) edges: the top k by |score| (the
`curve`) or by signed score (the `curve_signed`), beside a random circuit of the same size (seeded). Each runs
through the evaluator, and

    faithfulness = (M(circuit) - M(empty)) / (M(full) - M(empty))

with M the mean over pairs (M(full): the clean run; M(empty): every edge patched). CMD is the area of
|1 - faithfulness| over the fractions of the |score| curve (trapezoids, x linear from 0.001 to 1; lower is
better), CPR the area under the signed curve (higher is better; it can exceed 1). Every figure's interval is a
bootstrap over pairs, the curves and both areas recomputed from the same resamples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...models.adapter import HeadModel
from ...uncertainty import IntervalSettings, PassageSums, bootstrap
from ..causal.pairs import PairBatch
from .evaluate import CircuitRuns, evaluate_circuits
from .graph import Graph

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SELECTIONS = ("abs", "signed", "random")


def sizes(total: int) -> list[int]:
    """Edges kept at each fraction: int(fraction x total)."""
    return [int(f * total) for f in FRACTIONS]


def top_k(scores: np.ndarray, k: int, signed: bool) -> np.ndarray:
    """Bool `[edges]`: the k edges of largest |score| (or largest signed score); ties by edge order."""
    key = scores if signed else np.abs(scores)
    keep = np.zeros(scores.size, dtype=bool)
    keep[np.argsort(-key, kind="stable")[:k]] = True
    return keep


def random_k(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    keep = np.zeros(n, dtype=bool)
    keep[rng.choice(n, size=k, replace=False)] = True
    return keep


def circuits_for(scores: np.ndarray, seed: int) -> list[np.ndarray]:
    """The circuits of the curve, in order: every size by |score|, then by signed score, then random."""
    rng = np.random.default_rng(seed)
    ks = sizes(scores.size)
    return ([top_k(scores, k, False) for k in ks] + [top_k(scores, k, True) for k in ks]
            + [random_k(scores.size, k, rng) for k in ks])


def area(y: np.ndarray) -> np.ndarray:
    """Trapezoid area of y `[..., fractions]` over FRACTIONS (x linear)."""
    x = np.asarray(FRACTIONS)
    return np.sum((y[..., 1:] + y[..., :-1]) / 2 * np.diff(x), axis=-1)


def _statistic(s: Any) -> np.ndarray:
    """Faithfulness of every circuit, then CMD and CPR: `[..., 3 x fractions + 2]`."""
    n = len(FRACTIONS)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = (s["c"] - s["e"][..., None]) / (s["f"] - s["e"])[..., None]
    cmd = area(np.abs(1 - f[..., :n]))
    cpr = area(f[..., n:2 * n])
    return np.concatenate([f, cmd[..., None], cpr[..., None]], axis=-1)


@dataclass
class Curves:
    """circuit.json's curves and areas, with the evaluator's runs."""

    record: dict[str, Any]
    runs: CircuitRuns


def faithfulness_curves(hm: HeadModel, graph: Graph, b: PairBatch, scores: np.ndarray, settings: IntervalSettings,
                        *, seed: int = 0, batch_size: int = 8,
                        progress: Callable[[int], None] | None = None) -> Curves:
    """Evaluate every circuit of the curve and return circuit.json's curve, curve_signed, cpr and cmd."""
    kept = circuits_for(scores, seed)
    runs = evaluate_circuits(hm, graph, b, kept, batch_size=batch_size, progress=progress)
    sums = PassageSums({"c": runs.circuits, "e": runs.empty, "f": runs.clean})
    iv = bootstrap(sums, _statistic, settings)
    n, ks = len(FRACTIONS), sizes(scores.size)

    def curve(at: int) -> list[dict[str, Any]]:
        return [{"edges": ks[i], "fraction": FRACTIONS[i], "faithfulness": float(iv.value[at + i]),
                 "faithfulness_lo": float(iv.lo[at + i]), "faithfulness_hi": float(iv.hi[at + i]),
                 "random": float(iv.value[2 * n + i]), "random_lo": float(iv.lo[2 * n + i]),
                 "random_hi": float(iv.hi[2 * n + i])} for i in range(n)]

    record = {"curve": curve(0), "curve_signed": curve(n),
              "cmd": float(iv.value[3 * n]), "cmd_lo": float(iv.lo[3 * n]), "cmd_hi": float(iv.hi[3 * n]),
              "cpr": float(iv.value[3 * n + 1]), "cpr_lo": float(iv.lo[3 * n + 1]), "cpr_hi": float(iv.hi[3 * n + 1])}
    return Curves(record, runs)
