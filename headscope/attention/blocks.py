"""Attention probabilities one block of queries at a time, and per-head statistics summed over blocks.

A block holds queries `[q_start, q_end)` against keys `[k_start, k_end)`: memory is O(block x T) per
head, never T x T. For causal layers the keys stop at the block's last query, and a sliding window
starts them at the first key the block's first query may see, so the masked-out triangle is never
computed. The probabilities are eager attention's, row for row: the same logits, scaling,
soft-capping and mask, so statistics summed over blocks equal those of the full map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from ..errors import HeadscopeError


@dataclass(frozen=True)
class AttentionBlock:
    """One layer's attention probabilities for a block of queries, `probs [batch, head, q_block, k_block]`.

    Row i is query `q_start + i`, column j is key `k_start + j`; keys outside the block get weight 0.
    A query that may see no key at all (padding outside every real key's window) gets a uniform row
    over the block's keys, where eager spreads it over all T: such rows carry no information.
    """

    layer: int
    q_start: int
    k_start: int
    probs: torch.Tensor  # [batch, head, q_block, k_block] float32
    kv_length: int  # keys in the whole sequence

    @property
    def q_end(self) -> int:
        return self.q_start + self.probs.shape[2]

    @property
    def k_end(self) -> int:
        return self.k_start + self.probs.shape[3]

    @property
    def last(self) -> bool:
        """Whether this is the layer's last block of queries in this forward pass."""
        return self.q_end == self.kv_length

    def full_probs(self) -> torch.Tensor:
        """The block's rows over all keys, `[batch, head, q_block, kv_length]` (zeros outside the block)."""
        pad = (self.k_start, self.kv_length - self.k_end)
        return self.probs if pad == (0, 0) else torch.nn.functional.pad(self.probs, pad)


def check_block(block: int) -> int:
    """`block` as an int, or a clear error when it is not a positive number of queries."""
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise HeadscopeError(f"block size must be a positive number of queries, got {block!r}; "
                             f"e.g. 128 (memory per head grows as block x sequence length)")
    return block


def key_range(q_start: int, q_end: int, kv_length: int, causal: bool, window: int | None) -> tuple[int, int]:
    """Keys `[k_start, k_end)` that queries `[q_start, q_end)` may see at most (query i sees key j
    only if j <= i when causal, and i - j < window with a sliding window)."""
    k_end = min(q_end, kv_length) if causal else kv_length
    k_start = max(0, q_start - window + 1) if (window is not None and causal) else 0
    return k_start, k_end


def _logits(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """Scaled logits of a block, `[batch, head, q, k]`; query heads share key heads in order (GQA)."""
    b, h, nq, d = query.shape
    kv = key.shape[1]
    # Grouping the queries of one KV head into one matmul reads each key head once (no repeat_kv copy).
    q = query.reshape(b, kv, (h // kv) * nq, d)  # [batch, kv_head, group * q, d_head]
    scores = torch.matmul(q, key.transpose(-1, -2))  # [batch, kv_head, group * q, k]
    return scores.view(b, h, nq, key.shape[2]) * scaling


def block_probs(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, q_start: int, q_end: int,
                k_start: int, k_end: int, *, scaling: float, softcap: float | None = None,
                causal_without_mask: bool = False) -> torch.Tensor:
    """Eager attention's probabilities for queries `[q_start, q_end)` over keys `[k_start, k_end)`.

    query `[batch, head, T, d_head]`, key `[batch, kv_head, T, d_head]` (after RoPE); `mask` is the 4D mask
    transformers built (`[batch, 1, T, T]`, bool True = attend, or additive float), or None, in which
    case `causal_without_mask` says whether a causal triangle applies (as sdpa's `is_causal`).
    Returns `[batch, head, q_block, k_block]` float32.
    """
    q = query[:, :, q_start:q_end].float()
    k = key[:, :, k_start:k_end].float()
    scores = _logits(q, k, scaling)  # [batch, head, q_block, k_block]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    floor = torch.finfo(scores.dtype).min  # eager's fill value: a row with no key left becomes uniform, not NaN
    if mask is not None:
        m = mask[:, :, q_start:q_end, k_start:k_end]
        scores = torch.where(m, scores, floor) if m.dtype == torch.bool else scores + m.to(scores.dtype)
    elif causal_without_mask:
        qpos = torch.arange(q_start, q_end, device=scores.device)
        kpos = torch.arange(k_start, k_end, device=scores.device)
        scores = torch.where(kpos[None, :] <= qpos[:, None], scores, floor)
    return torch.softmax(scores, dim=-1)


def visible_outside(mask: torch.Tensor, q_start: int, q_end: int, k_start: int, k_end: int) -> bool:
    """Whether the 4D mask lets any query of the block see a key outside `[k_start, k_end)`."""
    rows = mask[:, :, q_start:q_end]
    seen = rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2
    return bool(seen[..., :k_start].any()) or bool(seen[..., k_end:].any())


def allowed_block(valid: torch.Tensor, q_start: int, q_end: int, k_start: int, k_end: int, causal: bool,
                  window: int | None) -> torch.Tensor:
    """`headscope.stats.allowed_keys` restricted to a block: `[batch, q_block, k_block]` bool."""
    qpos = torch.arange(q_start, q_end, device=valid.device)
    kpos = torch.arange(k_start, k_end, device=valid.device)
    allowed = valid[:, None, k_start:k_end] & valid[:, q_start:q_end, None]
    if causal:
        allowed = allowed & (kpos[None, :] <= qpos[:, None])
    if window is not None:
        allowed = allowed & ((qpos[:, None] - kpos[None, :]) < window)
    return allowed


def iter_blocks(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, *, block: int, scaling: float,
                causal: bool, window: int | None, softcap: float | None = None,
                causal_without_mask: bool = False) -> Iterator[tuple[int, int, torch.Tensor]]:
    """`(q_start, k_start, probs [batch, head, q_block, k_block])` for consecutive blocks of `block` queries."""
    t, kv_length = query.shape[2], key.shape[2]
    for q0 in range(0, t, block):
        q1 = min(q0 + block, t)
        k0, k1 = key_range(q0, q1, kv_length, causal, window)
        yield q0, k0, block_probs(query, key, mask, q0, q1, k0, k1, scaling=scaling, softcap=softcap,
                                  causal_without_mask=causal_without_mask)


def _masked_sum(values: torch.Tensor, qmask: torch.Tensor) -> torch.Tensor:
    """Sum `[batch, head, query]` values over valid queries -> `[head]` (float64)."""
    return (values.double() * qmask[:, None, :]).sum(dim=(0, 2))


class BlockStats:
    """Sums and counts of `headscope.stats.reduce_attention`'s statistics, one block of queries at a time.

    `valid` `[batch, T]` marks real tokens; `special` / `punct` `[batch, T]` flag keys. Add every block of
    one layer's forward, then read `totals()`: {name: (sum [head] float64, count)}.
    """

    def __init__(self, valid: torch.Tensor, special: torch.Tensor, punct: torch.Tensor, causal: bool,
                 window: int | None) -> None:
        self.valid, self.special, self.punct = valid.bool(), special, punct
        self.causal, self.window = causal, window
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def _add(self, name: str, total: torch.Tensor, count: torch.Tensor) -> None:
        if name in self.sums:
            self.sums[name] = self.sums[name] + total
            self.counts[name] = self.counts[name] + count
        else:
            self.sums[name], self.counts[name] = total, count

    def add(self, q_start: int, k_start: int, probs: torch.Tensor) -> None:
        """Add one block `probs [batch, head, q_block, k_block]` whose first query / key are given."""
        p = probs.float()
        _, _, nq, nk = p.shape
        q_end, k_end = q_start + nq, k_start + nk
        allowed = allowed_block(self.valid, q_start, q_end, k_start, k_end, self.causal, self.window)  # [batch, q, k]
        n_keys = allowed.sum(-1)  # [batch, q]: every key a query may see lies inside the block's key range
        qmask = (n_keys > 0).double()  # padded queries see nothing
        n_q = qmask.sum()

        ent = -torch.special.xlogy(p, p).sum(-1)  # [batch, head, q]
        self._add("entropy", _masked_sum(ent, qmask), n_q)
        multi = (n_keys > 1).double()
        log_n = torch.log(n_keys.clamp(min=2).double())
        self._add("entropy_norm", _masked_sum(ent.double() / log_n[:, None, :], multi), multi.sum())

        qpos = torch.arange(q_start, q_end, device=p.device)
        kpos = torch.arange(k_start, k_end, device=p.device)
        dist = (qpos[:, None] - kpos[None, :]).abs().float()  # [q, k]
        self._add("mean_distance", _masked_sum(torch.einsum("bhqk,qk->bhq", p, dist), qmask), n_q)

        for name, offset in (("prev_token_mass", -1), ("self_mass", 0), ("next_token_mass", 1)):
            # key = query + offset sits on the block's diagonal shifted by the blocks' start difference
            diag_offset = q_start - k_start + offset
            diag = torch.diagonal(p, offset=diag_offset, dim1=-2, dim2=-1)  # [batch, head, n]
            ok = torch.diagonal(allowed, offset=diag_offset, dim1=-2, dim2=-1).double()  # [batch, n], same cells
            self._add(name, _masked_sum(diag, ok), ok.sum())

        first = p[..., 0] if k_start == 0 else p.new_zeros(p.shape[:3])  # key 0 lies outside a later window
        self._add("first_token_mass", _masked_sum(first, qmask), n_q)
        special = self.special[:, k_start:k_end].float()
        punct = self.punct[:, k_start:k_end].float()
        self._add("special_mass", _masked_sum(torch.einsum("bhqk,bk->bhq", p, special), qmask), n_q)
        self._add("punct_mass", _masked_sum(torch.einsum("bhqk,bk->bhq", p, punct), qmask), n_q)
        self._add("max_weight", _masked_sum(p.amax(-1), qmask), n_q)

    def totals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{statistic: (sum over added blocks `[head]` float64, count)}; then starts afresh."""
        out = {name: (self.sums[name], self.counts[name]) for name in self.sums}
        self.sums, self.counts = {}, {}
        return out
