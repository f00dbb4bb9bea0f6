"""Long-range attention patterns, read one block of queries at a time (never a T x T map).

For every counted query q of a long window, three masses, each beside what a uniform head (equal
weight on every key q may see) would put on the same keys:

- `streaming_share`: weight on the sink (the first `sink` keys) plus the recent window (keys q - recent + 1 .. q):
  DuoAttention's split, where a head that keeps (nearly) all its weight there can drop the rest of its
  KV cache. Only queries that can see a key outside sink + recent are counted (for the others it is 1 by construction).
- `echo_far`: weight on earlier copies of q's token at least `far` tokens back (RazorAttention's echo heads).
- `induction_far`: weight on the tokens right after such copies (induction at long range).
  Only queries whose token has such a copy (at least `far` back, inside the keys they see) are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...models.adapter import HeadModel
from ...stats import COUNT

PATTERNS = ("streaming_share", "echo_far", "induction_far")


@dataclass(frozen=True)
class PatternSettings:
    """Where the streaming window lies and how far back a copy must be to count as long-range."""

    sink: int = 64  # DuoAttention's streaming heads keep 64 sink tokens ...
    recent: int = 256  # ... and the 256 most recent ones
    far: int = 256  # echo / induction targets at least this many tokens back


class PatternReducer:
    """Sums of the three masses and their uniform baselines per layer, over the windows fed to it."""

    def __init__(self, hm: HeadModel, settings: PatternSettings = PatternSettings()) -> None:
        self.hm, self.s = hm, settings
        L, H = hm.n_layers, hm.n_heads
        self.sums = {k: np.zeros((L, H)) for k in PATTERNS}
        self.base = {k: np.zeros(L) for k in PATTERNS}
        self.counts = {k: np.zeros(L) for k in PATTERNS}
        self.ids: torch.Tensor | None = None
        # each window's own sums (`<pattern>`, `<pattern>|count`, `<pattern>_uniform`): its per-window contribution
        self.window_rows: list[dict[str, np.ndarray]] = []
        self._masks: dict[tuple[int, int, int | None], tuple] = {}

    def set_window(self, ids: torch.Tensor, count_from: int, count_to: int) -> None:
        """The next forward's tokens `[pos]` (one window, batch 1) and the positions whose queries count."""
        self.ids, self.count_from, self.count_to = ids.to(self.hm.device), count_from, count_to
        self._masks = {}
        L, H = self.hm.n_layers, self.hm.n_heads
        row: dict[str, np.ndarray] = {}
        for k in PATTERNS:
            row[k], row[k + COUNT], row[k + "_uniform"] = np.zeros((L, H)), np.zeros(L), np.zeros(L)
        self.window_rows.append(row)

    def masks(self, q_start: int, n_q: int, n_k: int, window: int | None) -> tuple:
        """Key masks `[q_block, key]` of one block: visible, streaming set, echo and induction targets."""
        key = (q_start, n_q, window)
        ids = self.ids
        assert ids is not None, "set_window gives the window's tokens before its forward"
        if key not in self._masks:
            dev = ids.device
            q = torch.arange(q_start, q_start + n_q, device=dev)[:, None]  # [q, 1]
            k = torch.arange(n_k, device=dev)[None, :]  # [1, k]
            vis = k <= q
            if window is not None:
                vis &= (q - k) < window
            stream = vis & ((k < self.s.sink) | ((q - k) < self.s.recent))
            tok = ids[:n_k]
            same = tok[None, :] == ids[q_start:q_start + n_q][:, None]  # [q, k]: key holds q's token
            echo = same & vis & ((q - k) >= self.s.far)
            # key k follows a copy at k - 1 that lies at least `far` back; k itself must precede q
            after = torch.zeros_like(echo)
            after[:, 1:] = echo[:, :-1]
            induction = after & vis & (k < q)
            qpos = q[:, 0]
            counted = (qpos >= self.count_from) & (qpos < self.count_to)
            self._masks[key] = (vis, stream, echo, induction, counted)
        return self._masks[key]

    def __call__(self, layer: int, q_start: int, probs: torch.Tensor) -> None:
        """One block of one layer: `probs [1, head, q_block, key]`."""
        p = probs[0].float()  # [head, q, k]
        n_q, n_k = p.shape[1], p.shape[2]
        vis, stream, echo, induction, counted = self.masks(q_start, n_q, n_k, self.hm.sliding_window(layer))
        n_vis = vis.sum(-1).double()  # [q]
        for name, target, queries in (("streaming_share", stream, counted & (vis & ~stream).any(-1)),
                                      ("echo_far", echo, counted & echo.any(-1)),
                                      ("induction_far", induction, counted & induction.any(-1))):
            if not bool(queries.any()):
                continue
            t = target.float()
            mass = torch.einsum("hqk,qk->hq", p, t).double()  # [head, q]: per-query masses, summed in float64
            total = mass[:, queries].sum(-1).cpu().numpy()
            base = float((t.sum(-1).double() / n_vis)[queries].sum())
            self.sums[name][layer] += total
            self.base[name][layer] += base
            self.counts[name][layer] += int(queries.sum())
            if self.window_rows:
                row = self.window_rows[-1]
                row[name][layer] += total
                row[name + "_uniform"][layer] += base
                row[name + COUNT][layer] += int(queries.sum())

    def results(self) -> dict[str, np.ndarray]:
        """`<pattern>` and `<pattern>_uniform` `[n_layers, n_heads]`, means over counted queries (NaN: none)."""
        out = {}
        H = self.hm.n_heads
        with np.errstate(invalid="ignore", divide="ignore"):
            for name in PATTERNS:
                c = self.counts[name]
                out[name] = self.sums[name] / c[:, None]
                out[name + "_uniform"] = np.repeat((self.base[name] / c)[:, None], H, 1)
        return out

    def queries(self) -> dict[str, int]:
        """Counted queries per pattern (the same in every layer without sliding windows; the largest)."""
        return {name: int(self.counts[name].max()) for name in PATTERNS}
