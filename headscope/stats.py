"""Streaming per-head attention statistics.

Per batch and per layer the attention map `[batch, head, query, key]` is reduced at once to
per-head sums and counts, then dropped: memory does not grow with the data. Every statistic is a
(sum, count) pair, so results from batches, files or processes merge by adding.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from .attention.blocks import DEFAULT_TILE, BlockRows, BlockStats, check_block
from .attention.kernel import DEFAULT_BLOCK, stats_kernel
from .data import TokenClasses
from .hooks import on_attention_weights, on_head_outputs
from .models.adapter import HeadModel
from .uncertainty import Accumulator, PassageSums, Statistic, ratio

# Column name -> what it means (README documents the same list).
STATISTICS: dict[str, str] = {
    "entropy": "attention entropy of a query's distribution over keys, nats",
    "entropy_norm": "entropy / log(number of keys the query may attend to); 1 = uniform "
                    "(queries with one key left out)",
    "mean_distance": "expected |query - key| distance in tokens",
    "prev_token_mass": "weight on the previous token (queries with one)",
    "next_token_mass": "weight on the next token (encoders; NaN for causal models, which cannot see it)",
    "self_mass": "weight on the query's own position",
    "first_token_mass": "weight on position 0 ([CLS] / BOS / first token: the 'sink')",
    "special_mass": "weight on the tokenizer's special tokens ([CLS], [SEP], BOS, EOS, ...)",
    "punct_mass": "weight on punctuation tokens",
    "max_weight": "largest single weight of a query's distribution",
    "sink_logit_mass": "weight on the learned per-head sink logit, which joins the softmax without a value (GPT-OSS); "
                 "the keys' weights sum to 1 minus it; 0 for families without one",
    "output_norm": "L2 norm of the head's contribution to the residual stream (its output through W_O, no bias)",
}


@dataclass
class HeadStats:
    """Sums and counts per statistic, each `[n_layers, n_heads]` float64; merge by adding.

    With `track_passages(n)` the same sums and counts are also kept per passage (`passage_sums()`:
    `[passages, n_layers, n_heads]` each, see `headscope.uncertainty`), so every statistic's mean has a
    bootstrap interval and a split-half stability; the passage of each row is the index the caller gives
    `add` (its position in the data), whatever the batching.
    """

    n_layers: int
    n_heads: int
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: int = 0
    passages: int = 0
    per_passage: Accumulator | None = field(default=None, repr=False)

    def track_passages(self, n_passages: int) -> "HeadStats":
        """Keep per-passage sums and counts for passages 0 .. n_passages - 1 from now on; returns self."""
        self.per_passage = Accumulator(n_passages)
        return self

    def add(self, name: str, layer: int, total: torch.Tensor, count: torch.Tensor | float,
            heads: list[int] | None = None, rows: Sequence[int] | None = None) -> None:
        """Add one layer's sums: `total` `[n_heads]`, or `[batch, n_heads]` per passage with `rows` naming the
        passages (their indices in the data); `count` a scalar, `[n_heads]`, `[batch]` or `[batch, n_heads]`.
        `heads` names the heads the sums belong to when the layer has fewer (physical pruning)."""
        cols = slice(None) if heads is None else heads
        if name not in self.sums:
            self.sums[name] = np.zeros((self.n_layers, self.n_heads))
            self.counts[name] = np.zeros((self.n_layers, self.n_heads))
        t = total.detach().double().cpu().numpy()
        c = count.detach().double().cpu().numpy() if isinstance(count, torch.Tensor) else np.asarray(float(count))
        if t.ndim == 2:  # per passage: [batch, heads]
            c = np.broadcast_to(c[:, None] if c.ndim == 1 else c, t.shape)
            if self.per_passage is not None and rows is not None:
                self._add_rows(name, layer, cols, t, c, rows)
            t, c = t.sum(0), c.sum(0)
        self.sums[name][layer, cols] += t
        self.counts[name][layer, cols] += c

    def _add_rows(self, name: str, layer: int, cols: slice | list[int], t: np.ndarray, c: np.ndarray,
                  rows: Sequence[int]) -> None:
        acc = self.per_passage
        assert acc is not None, "called only while per-passage sums are tracked"
        for key, values in ((name, t), (f"{name}{COUNT}", c)):
            acc.declare(key, (self.n_layers, self.n_heads))
            full = np.zeros((len(values), self.n_heads))
            full[:, cols] = values
            acc.add(key, rows, full, (layer,))

    def passage_sums(self) -> PassageSums | None:
        """Per-passage sums (`name`) and counts (`name` + COUNT), `[rows, n_layers, n_heads]`; None when not tracked."""
        return self.per_passage.result() if self.per_passage is not None else None

    def merge(self, other: "HeadStats") -> "HeadStats":
        """A new HeadStats holding both; neither input changes (per-passage sums are not merged)."""
        if (other.n_layers, other.n_heads) != (self.n_layers, self.n_heads):
            raise ValueError(
                f"cannot merge statistics of {other.n_layers}x{other.n_heads} heads into {self.n_layers}x{self.n_heads}"
            )
        out = HeadStats(self.n_layers, self.n_heads, tokens=self.tokens + other.tokens,
                        passages=self.passages + other.passages)
        for name in sorted(set(self.sums) | set(other.sums)):
            zero = np.zeros((self.n_layers, self.n_heads))
            out.sums[name] = self.sums.get(name, zero) + other.sums.get(name, zero)
            out.counts[name] = self.counts.get(name, zero) + other.counts.get(name, zero)
        return out

    def names(self) -> list[str]:
        """Statistic names in STATISTICS order, then any others."""
        return [n for n in STATISTICS if n in self.sums] + [n for n in self.sums if n not in STATISTICS]

    def means(self) -> dict[str, np.ndarray]:
        """Each statistic's mean (NaN where nothing was counted), in STATISTICS order."""
        out = {}
        for n in self.names():
            with np.errstate(invalid="ignore", divide="ignore"):
                out[n] = np.where(self.counts[n] > 0, self.sums[n] / np.maximum(self.counts[n], 1e-300), np.nan)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "tokens": self.tokens, "passages": self.passages,
                "sums": {k: v.tolist() for k, v in self.sums.items()},
                "counts": {k: v.tolist() for k, v in self.counts.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadStats":
        return cls(d["n_layers"], d["n_heads"], {k: np.array(v, dtype=float) for k, v in d["sums"].items()},
                   {k: np.array(v, dtype=float) for k, v in d["counts"].items()}, d["tokens"], d["passages"])


# Suffix of a statistic's per-passage count in `HeadStats.passage_sums()`.
COUNT = "|count"


def statistic_of(name: str) -> Statistic:
    """The mean of statistic `name` as a statistic of per-passage sums (for `uncertainty.bootstrap`)."""
    return ratio(name, f"{name}{COUNT}")


def allowed_keys(attention_mask: torch.Tensor, causal: bool, window: int | None = None,
                 queries: tuple[int, int] | None = None) -> torch.Tensor:
    """Which keys each query may attend to, `[batch, query, key]` bool (right padding assumed); with a sliding
    `window`, keys with |query - key| < window (causal: key <= query as well).

    `queries=(start, end)` gives only those rows, `[batch, end - start, key]` (a block of queries: no T x T).
    """
    valid = attention_mask.bool()  # [batch, pos]
    t = valid.shape[1]
    q0, q1 = queries if queries is not None else (0, t)
    allowed = valid[:, None, :] & valid[:, q0:q1, None]
    qpos = torch.arange(q0, q1, device=valid.device)
    kpos = torch.arange(t, device=valid.device)
    if causal:
        allowed = allowed & (kpos[None, :] <= qpos[:, None])
    # |q - k|: a bidirectional window reaches both ways (a causal one only back)
    if window is not None:
        allowed = allowed & ((qpos[:, None] - kpos[None, :]).abs() < window)
    return allowed


def _masked_sum(values: torch.Tensor, qmask: torch.Tensor) -> torch.Tensor:
    """Sum `[batch, head, query]` values over valid queries -> `[batch, head]` (float64): one sum per passage."""
    return (values.double() * qmask[:, None, :]).sum(dim=2)


def reduce_attention(stats: HeadStats, layer: int, probs: torch.Tensor, allowed: torch.Tensor,
                     special: torch.Tensor, punct: torch.Tensor, heads: list[int] | None = None,
                     rows: Sequence[int] | None = None, sink: bool = False) -> None:
    """Reduce one layer's attention `[batch, head, query, key]` into `stats` (per passage: `rows` names them).

    `allowed` is `[batch, query, key]`; `special` / `punct` flag keys `[batch, key]`. With `sink` (the family has
    a learned sink logit per head) the rows sum to 1 minus the sink's mass, which `sink_logit_mass` records.
    """
    def add(name: str, total: torch.Tensor, count: torch.Tensor) -> None:
        stats.add(name, layer, total, count, heads, rows)

    p = probs.float()
    b, h, t, _ = p.shape
    n_keys = allowed.sum(-1)  # [batch, query]
    qmask = (n_keys > 0).double()  # padded queries see nothing
    n_q = qmask.sum(-1)
    pos = torch.arange(t, device=p.device)

    ent = -torch.special.xlogy(p, p).sum(-1)  # [batch, head, query]
    add("entropy", _masked_sum(ent, qmask), n_q)
    multi = (n_keys > 1).double()
    log_n = torch.log(n_keys.clamp(min=2).double())
    add("entropy_norm", _masked_sum(ent.double() / log_n[:, None, :], multi), multi.sum(-1))

    dist = (pos[:, None] - pos[None, :]).abs().float()  # [query, key]
    add("mean_distance", _masked_sum(torch.einsum("bhqk,qk->bhq", p, dist), qmask), n_q)

    for name, offset in (("prev_token_mass", -1), ("self_mass", 0), ("next_token_mass", 1)):
        diag = torch.diagonal(p, offset=offset, dim1=-2, dim2=-1)  # [batch, head, t - |offset|]
        ok = torch.diagonal(allowed, offset=offset, dim1=-2, dim2=-1).double()  # [batch, t - |offset|]
        add(name, _masked_sum(diag, ok), ok.sum(-1))

    add("first_token_mass", _masked_sum(p[..., 0], qmask), n_q)
    add("special_mass", _masked_sum(torch.einsum("bhqk,bk->bhq", p, special.float()), qmask), n_q)
    add("punct_mass", _masked_sum(torch.einsum("bhqk,bk->bhq", p, punct.float()), qmask), n_q)
    add("max_weight", _masked_sum(p.amax(-1), qmask), n_q)
    sink_mass = (1.0 - p.sum(-1)).clamp(min=0.0) if sink else p.new_zeros(b, h, t)
    add("sink_logit_mass", _masked_sum(sink_mass, qmask), n_q)


def output_gram(hm: HeadModel, layer: int) -> torch.Tensor:
    """Per-head Gram matrices `W_h^T W_h`, `[head, d_head, d_head]`, so ||W_h z|| = sqrt(z^T G z)."""
    w = hm.out_weight(layer).detach().float()  # [d_model, head * d_head]
    wh = w.view(w.shape[0], -1, hm.d_head_at(layer)).transpose(0, 1)  # [head, d_model, d_head]
    return wh.transpose(1, 2) @ wh


def reduce_outputs(stats: HeadStats, layer: int, z: torch.Tensor, gram: torch.Tensor, valid: torch.Tensor,
                   heads: list[int] | None = None, rows: Sequence[int] | None = None) -> None:
    """Add the output-norm sums of one layer: z `[batch, pos, head, d_head]`, valid `[batch, pos]`."""
    z = z.detach().float()
    sq = torch.einsum("bthd,hde,bthe->bht", z, gram, z).clamp(min=0)  # [batch, head, pos]
    m = valid.double()
    stats.add("output_norm", layer, _masked_sum(sq.sqrt(), m), m.sum(-1), heads, rows)


@contextmanager
def collect_stats(hm: HeadModel, stats: HeadStats, token_flags: TokenClasses) -> Iterator["StatsSession"]:
    """While active, every forward pass of `hm.model` adds its statistics to `stats`.

    Before each forward, call `session.set_batch(attention_mask, input_ids)` so the hooks know
    which positions are padding and which tokens are special or punctuation.
    """
    session = StatsSession(hm, stats, token_flags)
    with ExitStack() as stack:
        stack.enter_context(on_attention_weights(hm, session.on_attention))
        stack.enter_context(on_head_outputs(hm, session.on_outputs))
        yield session


class StatsSession:
    """Hook callbacks that turn each layer's attention and head outputs into sums."""

    _context = "collect_stats"  # named in the error when set_batch was not called

    def __init__(self, hm: HeadModel, stats: HeadStats, flags: TokenClasses) -> None:
        self.hm, self.stats, self.flags = hm, stats, flags
        self.grams = [output_gram(hm, layer) if hm.heads_in_layer(layer) else None for layer in range(hm.n_layers)]
        self.heads = [None if hm.heads_in_layer(l) == hm.n_heads else hm.kept_heads(l) for l in range(hm.n_layers)]
        self._allowed: dict[int | None, torch.Tensor] = {}
        self.mask: torch.Tensor | None = None
        self.rows: list[int] | None = None

    def set_batch(self, attention_mask: torch.Tensor, input_ids: torch.Tensor,
                  passages: Sequence[int] | None = None) -> None:
        """The next forward's padding mask and token ids `[batch, pos]`, and which passages (indices in the
        data) its rows are, for per-passage sums."""
        self.rows = list(passages) if passages is not None else None
        dev = self.hm.device
        self.mask = attention_mask.to(dev)
        ids = input_ids.to(self.flags.special.device)
        self.special = self.flags.special[ids].to(dev) & self.mask.bool()
        self.punct = self.flags.punct[ids].to(dev) & self.mask.bool()
        self._allowed = {}
        self.stats.tokens += int(self.mask.sum())
        self.stats.passages += int(self.mask.shape[0])

    def _batch_mask(self) -> torch.Tensor:
        """The current batch's attention mask; an error when `set_batch` was not called first."""
        if self.mask is None:
            raise RuntimeError(f"{self._context}: call session.set_batch(...) before each forward pass")
        return self.mask

    def _allowed_for(self, layer: int) -> torch.Tensor:
        window = self.hm.sliding_window(layer)
        if window not in self._allowed:
            self._allowed[window] = allowed_keys(self._batch_mask(), self.hm.causal, window)
        return self._allowed[window]

    def on_attention(self, layer: int, probs: torch.Tensor) -> None:
        self._batch_mask()  # set_batch must have come first
        with torch.no_grad():
            reduce_attention(self.stats, layer, probs, allowed=self._allowed_for(layer), special=self.special,
                             punct=self.punct, heads=self.heads[layer], rows=self.rows, sink=self.hm.has_sinks)

    def on_outputs(self, layer: int, z: torch.Tensor) -> None:
        gram = self.grams[layer]
        # a layer without heads (on_head_outputs skips those anyway)
        if gram is None:
            return None
        with torch.no_grad():
            reduce_outputs(self.stats, layer, z, gram, self._batch_mask(), self.heads[layer], self.rows)
        return None


@contextmanager
def collect_stats_kernel(hm: HeadModel, stats: HeadStats, token_flags: TokenClasses,
                         block: int = DEFAULT_BLOCK, output: str = "sdpa",
                         tile: int = DEFAULT_TILE) -> Iterator["KernelStatsSession"]:
    """`collect_stats` through the statistics kernel: sdpa computes the model, the attention
    statistics come in blocks of `block` queries, each walking its keys in tiles of `tile` with an
    online softmax (memory O(block x tile) per head whatever T; no T x T map, no probabilities).

    Same sums and counts as `collect_stats`; call `session.set_batch(...)` before each forward.
    `output="blocks"` computes each layer's output from the same blocks (eager's output, no sdpa call).
    """
    check_block(block)
    session = KernelStatsSession(hm, stats, token_flags)
    with ExitStack() as stack:
        kernel = stack.enter_context(stats_kernel(hm, block, output, tile))
        stack.enter_context(kernel.rows_consumer(session.on_rows, session.columns))
        stack.enter_context(on_head_outputs(hm, session.on_outputs))
        yield session


class KernelStatsSession(StatsSession):
    """StatsSession fed by the kernel's blocks: sums per layer are added once its last block arrives."""

    _context = "collect_stats_kernel"

    def __init__(self, hm: HeadModel, stats: HeadStats, flags: TokenClasses) -> None:
        super().__init__(hm, stats, flags)
        self._acc: dict[int, BlockStats] = {}

    def set_batch(self, attention_mask: torch.Tensor, input_ids: torch.Tensor,
                  passages: Sequence[int] | None = None) -> None:
        super().set_batch(attention_mask, input_ids, passages)
        self._acc = {}

    def _layer_stats(self, layer: int) -> BlockStats:
        mask = self._batch_mask()
        if layer not in self._acc:
            self._acc[layer] = BlockStats(mask, self.special, self.punct, self.hm.causal,
                                          self.hm.sliding_window(layer))
        return self._acc[layer]

    def columns(self, layer: int) -> torch.Tensor:
        """The key columns this layer's statistics weigh (special, punctuation), `[batch, T, 2]`."""
        return self._layer_stats(layer).columns()

    def on_rows(self, rows: BlockRows) -> None:
        mask = self._batch_mask()
        if tuple(mask.shape) != (rows.entropy.shape[0], rows.kv_length):
            raise RuntimeError(f"collect_stats_kernel: set_batch got a mask of shape {tuple(mask.shape)} but the "
                               f"forward pass has batch {rows.entropy.shape[0]} x {rows.kv_length} tokens")
        layer = rows.layer
        acc = self._layer_stats(layer)
        acc.add(rows)
        if rows.last:
            for name, (total, count) in acc.totals().items():
                self.stats.add(name, layer, total, count, self.heads[layer], self.rows)
            del self._acc[layer]
