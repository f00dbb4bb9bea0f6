"""Question 1's similarity: the most similar pairs, near-duplicate clusters and the full matrices
(similar_pairs.csv, clusters.json, similarity.npz)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ..artifacts import (
    CLUSTERS_JSON,
    SIMILAR_PAIRS_CSV,
    SIMILARITY_MATRICES,
    SIMILARITY_NPZ,
)
from ..errors import plural
from .sources import Part, Sources, clean

# The pairs named in the summary sentence, in this order.
SUMMARY_COLUMNS = ("js", "cka", "ov_angle_cos", "qk_angle_cos")
# Larger matrices (more heads than this) would make the page heavy; the file still has them.
MAX_MATRIX_HEADS = 600


def keep_pairs(rows: list[dict[str, Any]], top: int = 30, per_head: int = 3) -> list[dict[str, Any]]:
    """The `top` most similar pairs plus each head's `per_head` nearest (the file lists the most similar
    first), so every head can show its neighbours without embedding all n*(n-1)/2 pairs."""
    keep: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, r in enumerate(rows):
        a, b = str(r["head_a"]), str(r["head_b"])
        if i < top or seen.get(a, 0) < per_head or seen.get(b, 0) < per_head:
            keep.append(r)
            seen[a] = seen.get(a, 0) + 1
            seen[b] = seen.get(b, 0) + 1
    return keep


def quantised(a: np.ndarray) -> dict[str, Any]:
    """A matrix as uint8 steps between its min and max, base64 (enough for a heat map)."""
    lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
    q = np.rint((np.nan_to_num(a, nan=lo) - lo) / (hi - lo or 1.0) * 255).astype(np.uint8)
    return {"min": clean(lo), "max": clean(hi), "data": base64.b64encode(q.tobytes()).decode("ascii")}


def similarity_part(src: Sources, n_layers: int, n_heads: int) -> Part:
    """Pairs, clusters and matrices, with a sentence on the closest pair and the clusters."""
    part = Part()
    pairs = src.csv(SIMILAR_PAIRS_CSV.name)
    clusters = src.json(CLUSTERS_JSON.name)
    arrays = src.npz(SIMILARITY_NPZ.name)
    if arrays is not None and (int(arrays["n_layers"]), int(arrays["n_heads"])) != (n_layers, n_heads):
        src.fault(SIMILARITY_NPZ.name, f"is for {int(arrays['n_layers'])} layers x {int(arrays['n_heads'])} heads, "
                                       f"not this model's {n_layers} x {n_heads}")
        arrays = None
    if pairs is None and clusters is None and arrays is None:
        part.missing["similarity"] = src.note(SIMILAR_PAIRS_CSV.name, CLUSTERS_JSON.name, SIMILARITY_NPZ.name)
        return part
    sim: dict[str, Any] = {}
    if pairs is not None:
        sim["pairs_columns"] = pairs.columns
        sim["pairs"] = keep_pairs(pairs.rows)
        if pairs.rows:
            r = pairs.rows[0]
            nums = ", ".join(f"{c} {r[c]:.2f}" for c in SUMMARY_COLUMNS if isinstance(r[c], (int, float)))
            part.say("q1", f"The most similar pair is {r['head_a']} and {r['head_b']} ({nums}).")
    if clusters is not None:
        sim["clusters"] = [clean(c) for c in clusters["clusters"]]
        multi = [c for c in clusters["clusters"] if len(c["heads"]) > 1]
        part.say("q1", f"{plural(len(multi), 'redundancy cluster')} of near-duplicate heads "
                       f"({plural(sum(len(c['heads']) for c in multi), 'head')} in all)." if multi else
                       "No two heads are near-duplicates: every redundancy cluster holds one head.")
    if arrays is not None and n_layers * n_heads <= MAX_MATRIX_HEADS:
        sim["matrices"] = {m: quantised(np.asarray(arrays[m], float)) for m in SIMILARITY_MATRICES}
    part.data["similarity"] = sim
    return part
