"""Question 1, as circuits (circuit.json, edges.csv): the faithfulness curve of the top edges with its band beside
random circuits of the same sizes, and the circuit at the smallest size reaching faithfulness 0.8, drawn by layer.

Names read from edges.csv are drawn only when they have the declared shape (`input`, `L3H2`, `MLP3`; receivers
`L3H2.q`, `L3G1.k`, `L3G1.v`, `MLP3`, `logits`); everything else is shown as text.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .. import plots
from ..artifacts import CIRCUIT_JSON, EDGES_CSV
from ..heads import Head, KVGroup, read_node
from .causal import fmt, index, num
from .sources import Part, Sources, data_url

__all__ = ["PLOT_NAMES", "circuit_part"]

TITLE = "Circuits: the edges that carry the task"
GRAPH_TITLE = "The smallest circuit reaching faithfulness 0.8"
THRESHOLD = 0.8
MOST_DRAWN = 300  # edges drawn at most (the strongest of the circuit)
PLOT_NAMES = {"curve": "report-faithfulness.png", "graph": "report-circuit.png"}
# a layer's MLP node; head and KV-group nodes are read by `heads.read_node`
MLP = re.compile(r"MLP(\d{1,4})")


def sender_at(name: Any, n_heads: int) -> tuple[float, float] | None:
    """Where a sender sits in the drawing: x the layer (embeddings -1, an MLP half a layer on), y the head (MLPs
    below the heads); None for a name of another shape."""
    if name == "input":
        return -1.0, n_heads / 2
    head = Head.read(name)
    if head is not None:
        return float(head.layer), float(head.head)
    m = MLP.fullmatch(name) if isinstance(name, str) else None
    return None if m is None else (float(m.group(1)) + 0.5, float(n_heads))


def receiver_at(name: Any, n_layers: int, n_heads: int, group: int) -> tuple[tuple[float, float], str] | None:
    """A receiver's place (a KV group's keys and values at the middle of its query heads) and kind."""
    if name == "logits":
        return (float(n_layers), n_heads / 2), "logits"
    node = read_node(name)
    if node is not None:
        unit, via = node
        if isinstance(unit, Head) and via == "q":
            return (float(unit.layer), float(unit.head)), "q"
        if isinstance(unit, KVGroup) and via in ("k", "v"):
            return (float(unit.layer), unit.kv_head * group + (group - 1) / 2), via
        return None
    m = MLP.fullmatch(name) if isinstance(name, str) else None
    return None if m is None else ((float(m.group(1)) + 0.5, float(n_heads)), "mlp")


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def curve_rows(curve: list[Any]) -> list[dict[str, Any]]:
    return [{"fraction": f"{num(p.get('fraction')):.1%}", "edges": index(p.get("edges")),
             "faithfulness": fmt(p.get("faithfulness"), p.get("faithfulness_lo"), p.get("faithfulness_hi")),
             "random": fmt(p.get("random"), p.get("random_lo"), p.get("random_hi"))}
            for p in curve if isinstance(p, dict)]


def circuit_part(src: Sources, figs: dict[str, bytes] | None = None) -> Part:
    """Two panels at the end of question 1: the faithfulness curve (table and figure) and the smallest circuit
    reaching 0.8. Absent without circuit.json."""
    part = Part()
    meta = src.json(CIRCUIT_JSON.name)
    if meta is None:
        if CIRCUIT_JSON.name in src.problems:
            part.panel("q1", TITLE, note=src.note(CIRCUIT_JSON.name))
        return part
    curve = [p for p in meta.get("curve") or [] if isinstance(p, dict)]
    if not curve:
        src.fault(CIRCUIT_JSON.name, "holds no curve")
        part.panel("q1", TITLE, note=src.note(CIRCUIT_JSON.name))
        return part
    pairs = _dict(meta.get("pairs"))
    n = index(pairs.get("n"))
    count = "an unknown number of" if n is None else str(n)
    iv = _dict(meta.get("intervals"))
    text = [f"Edge scores by `{meta.get('method')}` on {meta.get('total_edges')} edges of the model's graph "
            f"(embeddings, heads and MLPs into each head's query, each KV group's keys and values, each MLP and the "
            f"logits), {count} pairs from `{pairs.get('source')}`. Circuits of the top edges by |score| at each size; "
            f"faithfulness (M(circuit) - M(empty)) / (M(full) - M(empty)), beside a random circuit of the same size.",
            f"CMD {fmt(meta.get('cmd'), meta.get('cmd_lo'), meta.get('cmd_hi'))} (area of |1 - faithfulness|, lower "
            f"is better); CPR {fmt(meta.get('cpr'), meta.get('cpr_lo'), meta.get('cpr_hi'))} (area under the signed "
            f"curve, higher is better); [lo, hi]: {num(iv.get('level')):.0%} {iv.get('method', '')} bootstrap "
            f"intervals over the {count} pairs (docs/circuits.md)."]
    png = plots.faithfulness_curve(curve, f"faithfulness of circuits ({count} pairs)")
    if figs is not None:
        figs[PLOT_NAMES["curve"]] = png
        part.plots.append(PLOT_NAMES["curve"])
    reach = next((p for p in curve if num(p.get("faithfulness")) >= THRESHOLD), None)
    if reach is not None:
        part.say("q1", f"A circuit of {index(reach.get('edges'))} edges ({num(reach.get('fraction')):.1%} of the "
                       f"graph) reaches faithfulness {fmt(reach.get('faithfulness'), reach.get('faithfulness_lo'), reach.get('faithfulness_hi'))} "  # noqa: E501
                       f"({count} pairs; random edges of that size: {fmt(reach.get('random'), bounds=False)}).")
    rows = curve_rows(curve)
    part.panel("q1", TITLE, list(rows[0]), rows, text=text, plot=data_url(png))
    graph_panel(part, src, meta, reach, figs)
    return part


def graph_panel(part: Part, src: Sources, meta: dict[str, Any], reach: dict[str, Any] | None,
                figs: dict[str, bytes] | None) -> None:
    """The circuit at the smallest size reaching THRESHOLD: its strongest MOST_DRAWN edges by |score|, drawn."""
    if reach is None:
        part.panel("q1", GRAPH_TITLE, note=f"no circuit size of circuit.json reaches faithfulness {THRESHOLD}")
        return
    table = src.csv(EDGES_CSV.name)
    g = _dict(meta.get("graph"))
    L, H, G = index(g.get("n_layers")), index(g.get("n_heads")), index(g.get("n_kv_heads"))
    k = index(reach.get("edges"))
    if table is None or not L or not H or not G or not k:
        part.panel("q1", GRAPH_TITLE, note=src.note(EDGES_CSV.name) if table is None else
                   "circuit.json does not say the graph's layers, heads and KV heads")
        return
    ranked = sorted((r for r in table.rows if not math.isnan(num(r.get("score")))), key=lambda r: -abs(num(r["score"])))
    edges = []
    for r in ranked[:min(k, MOST_DRAWN)]:
        s, got = sender_at(r.get("sender"), H), receiver_at(r.get("receiver"), L, H, max(1, H // G))
        if s is not None and got is not None:
            edges.append({"sender": s, "receiver": got[0], "kind": got[1], "value": num(r["score"])})
    if not edges:
        part.panel("q1", GRAPH_TITLE, note=f"{EDGES_CSV.name} holds no edges of the declared names")
        return
    shown = f"its {len(edges)} strongest edges" if len(edges) < k else f"its {k} edges"
    png = plots.circuit_graph(edges, L, H, f"{k} edges ({num(reach.get('fraction')):.1%}): {shown}")
    if figs is not None:
        figs[PLOT_NAMES["graph"]] = png
        part.plots.append(PLOT_NAMES["graph"])
    rows = [{"#": i, "sender": str(r["sender"]), "receiver": str(r["receiver"]),
             "score": fmt(r["score"], r.get("score_lo"), r.get("score_hi"))} for i, r in enumerate(ranked[:10], 1)]
    part.panel("q1", GRAPH_TITLE, list(rows[0]) if rows else [], rows, plot=data_url(png),
               text=[f"The top {k} edges by |score| reach faithfulness {fmt(reach.get('faithfulness'), reach.get('faithfulness_lo'), reach.get('faithfulness_hi'))}; "  # noqa: E501
                     f"drawn: {shown} (line width and shade: |score|; colour: the receiver's input; dashed: negative). "
                     "Table: the ten strongest edges with their intervals over pairs."])
