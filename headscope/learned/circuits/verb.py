"""`headscope circuit` as a library function: edge scores (EAP or EAP-IG) on the GQA-native graph, and circuits
at every size with their faithfulness, CMD and CPR; writes nothing until the result is saved."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ...artifacts import CIRCUIT_JSON, EDGES_CSV
from ...io import atomic_write_text, csv_text
from ...models.adapter import HeadModel
from ...options import Result
from ...options.record import Estimate, IntervalsUsed, Record
from ...provenance import provenance
from ...table import to_jsonable
from ...uncertainty import IntervalSettings, PassageSums, bootstrap, mean_of
from ..causal.pairs import PairBatch, load_pairs
from ..causal.run import pairs_fingerprint
from ..options import CircuitOptions
from .faithfulness import FRACTIONS, faithfulness_curves
from .graph import Graph, build_graph, check_model
from .scores import edge_scores


@dataclass
class CurvePoint(Record):
    """A circuit of the top `fraction` of edges by |score|: its faithfulness, and a random circuit's."""

    fraction: float
    edges: int
    faithfulness: float
    faithfulness_lo: float
    faithfulness_hi: float
    random: float


@dataclass
class CircuitRecord(Record):
    """circuit.json: the faithfulness curve, CMD and CPR with intervals, the metric on clean and corrupt prompts;
    the graph, forwards, seconds and pairs are kept as they came."""

    curve: list[CurvePoint]
    cmd: float  # circuit-model difference: lower is better
    cmd_lo: float
    cmd_hi: float
    cpr: float  # circuit performance ratio: higher is better
    cpr_lo: float
    cpr_hi: float
    total_edges: int
    method: str
    ig_steps: int | None  # EAP-IG's steps; None for EAP
    M_clean: Estimate
    M_corrupt: Estimate
    intervals: IntervalsUsed
    provenance: dict[str, Any]


@dataclass
class CircuitResult(Result):
    """Edge scores (edges.csv) and the faithfulness of circuits at every size (circuit.json)."""

    name: str
    graph: Graph
    score: np.ndarray  # [edges] mean over pairs
    score_lo: np.ndarray
    score_hi: np.ndarray
    per_pair: np.ndarray  # [pairs, edges]
    record: CircuitRecord
    pairs: PairBatch
    files: tuple[str, ...] = (EDGES_CSV.name, CIRCUIT_JSON.name)

    def edge_rows(self) -> list[dict[str, Any]]:
        """edges.csv's rows, in graph order."""
        return [{"sender": s, "receiver": r, "score": float(v), "score_lo": float(lo), "score_hi": float(hi)}
                for (s, r), v, lo, hi in zip(self.graph.edge_names(), self.score, self.score_lo, self.score_hi,
                                             strict=True)]

    def to_pandas(self) -> Any:
        import pandas as pd  # only for this table; pandas costs ~0.5 s to import

        return pd.DataFrame(self.edge_rows())

    def write(self, folder: Path) -> None:
        atomic_write_text(folder / EDGES_CSV.name, csv_text(self.edge_rows()))
        atomic_write_text(folder / CIRCUIT_JSON.name,
                          json.dumps(to_jsonable(self.record.to_json()), indent=1, allow_nan=False) + "\n")

    def lines(self) -> list[str]:
        r = self.record
        mc, mx = r.M_clean, r.M_corrupt
        out = [f"{self.name}: {len(self.pairs)} pairs from {self.pairs.source}; {r.method}"
               + (f" ({r.ig_steps} steps)" if r.method == "eap-ig" else "")
               + f" on {r.total_edges:,} edges ({len(self.graph.senders)} senders, "
                 f"{len(self.graph.receivers)} receivers)",
               f"logit difference: M(clean) {mc.value:.3f} [{mc.lo:.3f}, {mc.hi:.3f}], "
               f"M(corrupt) {mx.value:.3f} [{mx.lo:.3f}, {mx.hi:.3f}]", "", "strongest edges by |score|:"]
        names = self.graph.edge_names()
        for i in np.argsort(-np.abs(self.score), kind="stable")[:8]:
            out.append(f"  {names[i][0]} -> {names[i][1]} {self.score[i]:+.3f} [{self.score_lo[i]:+.3f}, "
                       f"{self.score_hi[i]:+.3f}]")
        out += ["", "faithfulness (top edges by |score|; random circuit of the same size):"]
        for p in r.curve:
            out.append(f"  {p.fraction:>6.1%} {p.edges:>7,} edges: {p.faithfulness:+.3f} "
                       f"[{p.faithfulness_lo:+.3f}, {p.faithfulness_hi:+.3f}]  random {p.random:+.3f}")
        out += ["", f"CMD {r.cmd:.3f} [{r.cmd_lo:.3f}, {r.cmd_hi:.3f}] (lower is better), "
                    f"CPR {r.cpr:.3f} [{r.cpr_lo:.3f}, {r.cpr_hi:.3f}] (higher is better)"]
        iv = r.intervals
        out.append(f"[lo, hi]: {iv.level:.0%} intervals, {iv.method} bootstrap over the {len(self.pairs)} "
                   f"pairs ({iv.B} resamples)")
        return out


def _mean(values: np.ndarray, settings: IntervalSettings) -> dict[str, float]:
    iv = bootstrap(PassageSums({"v": values, "n": np.ones(len(values))}), mean_of("v", "n"), settings)
    return {"value": float(iv.value), "lo": float(iv.lo), "hi": float(iv.hi)}


def circuit(hm: HeadModel, pairs: Any = None, options: CircuitOptions | None = None,
            **changes: Any) -> CircuitResult:
    """`headscope circuit` on a loaded model: every edge's score and the faithfulness of circuits at every size.

    `pairs`: a PairBatch, or a JSONL path (else `options.pairs`, or the built-in `options.task`).
    Keywords override single options: `circuit(hm, task="ioi", method="eap")`.
    """
    opts = (options or CircuitOptions()).replace(**changes)
    if isinstance(pairs, (str, Path, PairBatch)):
        opts = opts.replace(pairs=pairs.source if isinstance(pairs, PairBatch) else str(pairs), task=None)
    opts = opts.validate()
    check_model(hm)  # before the pairs are read and any forward runs
    batch = pairs if isinstance(pairs, PairBatch) else load_pairs(
        hm.tokenizer, hm.causal, hm.vocab_size, pairs=opts.pairs, task=opts.task, seed=opts.seed, limit=opts.limit)
    graph = build_graph(hm)
    settings = opts.intervals()
    t0 = time.perf_counter()
    with tqdm(total=len(batch), desc=opts.method, unit="pair", disable=None, leave=False) as bar:
        runs = edge_scores(hm, graph, batch, method=opts.method, steps=opts.ig_steps, batch_size=opts.batch_size,
                           progress=bar.update)
    t1 = time.perf_counter()
    value, lo, hi = runs.interval(settings)
    t2 = time.perf_counter()
    n_circuits = 3 * len(FRACTIONS) * -(-len(batch) // opts.batch_size)
    with tqdm(total=n_circuits, desc="circuits", unit="circuit", disable=None, leave=False) as bar:
        curves = faithfulness_curves(hm, graph, batch, value, settings, seed=opts.seed, batch_size=opts.batch_size,
                                     progress=bar.update)
    t3 = time.perf_counter()
    record: dict[str, Any] = {
        **curves.record, "total_edges": graph.n_edges, "method": opts.method,
        "ig_steps": opts.ig_steps if opts.method == "eap-ig" else None,
        "metric": "logit(answer) - logit(wrong) at the last real position, mean over pairs",
        "graph": {"senders": len(graph.senders), "receivers": len(graph.receivers),
                  "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads,
                  "convention": "senders input, L<l>H<h>, MLP<l>; receivers L<l>H<h>.q, L<l>G<g>.k/.v (KV groups), "
                                "MLP<l>, logits; an edge from every sender to every receiver after it"},
        "M_clean": _mean(runs.clean, settings), "M_corrupt": _mean(runs.corrupt, settings),
        "M_empty": _mean(curves.runs.empty, settings),
        "forwards": {"scores": runs.forwards, "backwards": runs.backwards, "curves": curves.runs.forwards},
        "seconds": {"scores": t1 - t0, "intervals": t2 - t1, "curves": t3 - t2},
        "pairs": batch.record(), "intervals": {**settings.record(), "resampled": "pairs, with replacement"}}
    record["provenance"] = provenance("circuit", hm, pairs_fingerprint(batch), opts.with_only())
    return CircuitResult(name=hm.name, graph=graph, score=value, score_lo=lo, score_hi=hi, per_pair=runs.scores,
                         record=CircuitRecord.from_json(record), pairs=batch)
