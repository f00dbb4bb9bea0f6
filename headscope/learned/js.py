"""Jensen-Shannon divergence between heads' attention, summed per passage so every pair's js has an interval.

`pairwise_js_sums` sums JS(head i, head j) over the selected queries of a block of entries; `similar` calls it
once per passage (`split_rows` finds each passage's entries in a batch), keeps the sums per passage in at most
`JS_ROWS` rows (fixed groups of consecutive passages past that: a block bootstrap; memory JS_ROWS x heads² x 8
bytes, 37 MB for SmolLM2's 270 heads), and `pair_intervals` resamples them (headscope.uncertainty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..uncertainty import IntervalSettings, PassageSums, bootstrap, ratio
from .cka import _CHUNK

JS_ROWS = 64


def js_divergence(p: Any, q: Any) -> float:
    """Jensen-Shannon divergence of two distributions, natural log (0 .. ln 2)."""
    p = torch.as_tensor(np.asarray(p), dtype=torch.float64)
    q = torch.as_tensor(np.asarray(q), dtype=torch.float64)
    m = (p + q) / 2
    return float(0.5 * (torch.special.xlogy(p, p / m).nansum() + torch.special.xlogy(q, q / m).nansum()))


def pairwise_js_sums(probs: torch.Tensor) -> torch.Tensor:
    """Sum over queries of JS(head i, head j) for every pair: `probs [N, M]` holds, for each head, the
    weights of every (query, key) entry of the selected queries (entries of one query together sum to 1).

    JS(p, q) = 1/2 sum_k [p log p + q log q - (p+q) log((p+q)/2)]; the sum over all entries is the
    sum of per-query divergences. Elementwise work runs in float32 (float64 inputs stay float64) in
    cache-sized chunks; every sum is accumulated in float64 (measured error < 1e-8 per query).
    """
    work = torch.float64 if probs.dtype == torch.float64 else torch.float32
    p = probs.to(work)
    # log(0 + tiny) is finite, so 0 * log(..) = 0 without xlogy's cost
    tiny = torch.finfo(work).tiny
    n, m = p.shape
    f = (p * torch.log(p + tiny)).sum(-1, dtype=torch.float64)  # [N]
    cross = torch.zeros(n, n, dtype=torch.float64, device=p.device)
    mc = min(m, max(256, _CHUNK // max(n, 1)))
    for m0 in range(0, m, mc):
        pm = p[:, m0:m0 + mc]
        rows = max(1, _CHUNK // max(1, n * pm.shape[1]))
        for i0 in range(0, n, rows):
            s = pm[i0:i0 + rows, None, :] + pm[None, i0:, :]  # [c, N - i0, mc]
            cross[i0:i0 + rows, i0:] += (s * torch.log(s * 0.5 + tiny)).sum(-1, dtype=torch.float64)
    upper = torch.triu(0.5 * (f[:, None] + f[None, :] - cross))
    js = upper + torch.triu(upper, 1).T
    # rounding can leave -1e-17 where the patterns are identical
    return js.clamp_min(0.0)


def split_rows(block_counts: Sequence[torch.Tensor], n_rows: int) -> list[torch.Tensor]:
    """Each batch row's entry indices in the concatenation of blocks whose per-row entry counts are
    `block_counts` (one `[batch]` tensor per block; a block's entries run row by row)."""
    out: list[list[torch.Tensor]] = [[] for _ in range(n_rows)]
    start = 0
    for counts in block_counts:
        c = counts.long()
        ends = torch.cumsum(c, 0)
        for r in range(n_rows):
            n = int(c[r])
            if n:
                out[r].append(torch.arange(start + int(ends[r]) - n, start + int(ends[r])))
        start += int(ends[-1]) if len(ends) else 0
    return [torch.cat(p) if p else torch.zeros(0, dtype=torch.long) for p in out]


def pair_intervals(rows: PassageSums | None, pairs: Sequence[tuple[int, int]],
                   settings: IntervalSettings) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap interval over passages of the mean js (summed js / queries) of each pair of matrix indices."""
    if rows is None or not pairs:
        nan = np.full(len(pairs), np.nan)
        return nan, nan.copy()
    i, j = (np.array(x, dtype=int) for x in zip(*pairs, strict=True))
    sums = PassageSums({"js": rows["js"][:, i, j], "js|count": np.repeat(rows["js|count"][:, None], len(pairs), 1)},
                       rows.passages_per_row)
    iv = bootstrap(sums, ratio("js", "js|count"), settings)
    return iv.lo, iv.hi


__all__ = ["JS_ROWS", "js_divergence", "pair_intervals", "pairwise_js_sums", "split_rows"]
