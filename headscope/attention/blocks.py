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
    `entropy` and `max_weight` (`[batch, head, q_block]`) are each row's, computed on the way from the
    logits (one pass fewer than from the probabilities, and as exact).
    """

    layer: int
    q_start: int
    k_start: int
    probs: torch.Tensor  # [batch, head, q_block, k_block] float32
    kv_length: int  # keys in the whole sequence
    entropy: torch.Tensor  # [batch, head, q_block] nats
    max_weight: torch.Tensor  # [batch, head, q_block]

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
    kv, nk = key.shape[1], key.shape[2]
    # Grouping the queries of one KV head into one matmul reads each key head once (no repeat_kv copy);
    # baddbmm scales inside the product instead of in a second pass over the block.
    q = query.reshape(b * kv, (h // kv) * nq, d)  # [batch * kv_head, group * q, d_head]
    k = key.reshape(b * kv, nk, d).transpose(1, 2)  # [batch * kv_head, d_head, k]
    scores = torch.baddbmm(q.new_empty(b * kv, q.shape[1], nk), q, k, beta=0.0, alpha=scaling)
    return scores.view(b, h, nq, nk)


def block_attention(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, q_start: int, q_end: int,
                    k_start: int, k_end: int, *, scaling: float, softcap: float | None = None,
                    causal_without_mask: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager attention's probabilities for queries `[q_start, q_end)` over keys `[k_start, k_end)`,
    with each row's entropy and largest weight.

    query `[batch, head, T, d_head]`, key `[batch, kv_head, T, d_head]` (after RoPE); `mask` is the 4D mask
    transformers built (`[batch, 1, T, T]`, bool True = attend, or additive float), or None, in which
    case `causal_without_mask` says whether a causal triangle applies (as sdpa's `is_causal`).
    Returns probs `[batch, head, q_block, k_block]` float32, entropy and max weight `[batch, head, q_block]`.
    """
    q = query[:, :, q_start:q_end].float()
    k = key[:, :, k_start:k_end].float()
    scores = _logits(q, k, scaling)  # [batch, head, q_block, k_block], ours to change in place
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    floor = torch.finfo(scores.dtype).min  # eager's fill value: a row with no key left becomes uniform, not NaN
    if mask is not None:
        m = mask[:, :, q_start:q_end, k_start:k_end]
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, floor)
        else:
            scores.add_(m.to(scores.dtype))
    elif causal_without_mask and max(q_start + 1, k_start) < k_end:
        # Keys up to the block's first query are visible to all its queries: only the tail needs the triangle.
        c0 = max(q_start + 1, k_start)
        qpos = torch.arange(q_start, q_end, device=scores.device)
        kpos = torch.arange(c0, k_end, device=scores.device)
        scores[..., c0 - k_start:].masked_fill_(kpos[None, :] > qpos[:, None], floor)
    # Shifting each row by its maximum makes the largest shifted logit 0, so the largest weight is 1 / Z:
    # entropy = log Z - sum_k p_k * shifted_k needs no logarithm per key (xlogy would).
    scores.sub_(scores.amax(dim=-1, keepdim=True))
    probs = torch.softmax(scores, dim=-1)
    max_weight = probs.amax(dim=-1)
    entropy = -torch.log(max_weight) - torch.einsum("bhqk,bhqk->bhq", probs, scores)
    return probs, entropy, max_weight


def visible_outside(mask: torch.Tensor, q_start: int, q_end: int, k_start: int, k_end: int) -> bool:
    """Whether the 4D mask lets any query of the block see a key outside `[k_start, k_end)`."""
    rows = mask[:, :, q_start:q_end]
    seen = rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2
    return bool(seen[..., :k_start].any()) or bool(seen[..., k_end:].any())


def iter_blocks(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, *, layer: int, block: int,
                scaling: float, causal: bool, window: int | None, softcap: float | None = None,
                causal_without_mask: bool = False) -> Iterator[AttentionBlock]:
    """One layer's attention as consecutive blocks of `block` queries, each over the keys it may see."""
    t, kv_length = query.shape[2], key.shape[2]
    for q0 in range(0, t, block):
        q1 = min(q0 + block, t)
        k0, k1 = key_range(q0, q1, kv_length, causal, window)
        probs, entropy, max_weight = block_attention(query, key, mask, q0, q1, k0, k1, scaling=scaling,
                                                     softcap=softcap, causal_without_mask=causal_without_mask)
        yield AttentionBlock(layer, q0, k0, probs, kv_length, entropy, max_weight)


def n_visible_keys(valid: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """Keys each query may attend to, `[batch, query]`: the row sums of `headscope.stats.allowed_keys`
    (query q sees real key k when q is real, k <= q if causal, q - k < window), from prefix counts."""
    b, t = valid.shape
    pos = torch.arange(t, device=valid.device)
    before = torch.nn.functional.pad(valid.long().cumsum(-1), (1, 0))  # [batch, T + 1]: real keys before index i
    hi = pos + 1 if causal else torch.full_like(pos, t)
    lo = (pos - window + 1).clamp(min=0) if window is not None else torch.zeros_like(pos)
    return (before[:, hi] - before[:, lo]) * valid.long()


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum `[batch, head, query]` values over the queries `mask` `[batch, query]` selects -> `[head]` (float64)."""
    return (values.double() * mask.double()[:, None, :]).sum(dim=(0, 2))


# Per-query values BlockStats keeps for a layer, in order; offsets of the key each diagonal statistic reads.
_ROWS = ("entropy", "mean_distance", "prev_token_mass", "self_mass", "next_token_mass", "first_token_mass",
         "special_mass", "punct_mass", "max_weight")
_DIAGONALS = {"prev_token_mass": -1, "self_mass": 0, "next_token_mass": 1}


class BlockStats:
    """`headscope.stats.reduce_attention`'s statistics of one layer, fed one block of queries at a time.

    `valid` `[batch, T]` marks real tokens; `special` / `punct` `[batch, T]` flag keys. Each block's
    per-query values go into `[batch, head, T]` rows (memory O(T), not T x T); after the layer's last
    block, `totals()` gives {name: (sum [head] float64, count)} with the same masks as the full map.
    """

    def __init__(self, valid: torch.Tensor, special: torch.Tensor, punct: torch.Tensor, causal: bool,
                 window: int | None) -> None:
        self.valid = valid.bool()
        self.flags = torch.stack([special.float(), punct.float()], dim=-1)  # [batch, T, 2]: one matmul reads both
        self.causal, self.window = causal, window
        self.rows: torch.Tensor | None = None  # [statistic, batch, head, T]

    def add(self, block: AttentionBlock) -> None:
        """Add one block's per-query values."""
        p = block.probs.float()  # [batch, head, q, k]
        b, h, nq, _ = p.shape
        q0, q1, k0, k1 = block.q_start, block.q_end, block.k_start, block.k_end
        if self.rows is None:
            self.rows = p.new_zeros(len(_ROWS), b, h, block.kv_length)
        rows = {name: self.rows[i, :, :, q0:q1] for i, name in enumerate(_ROWS)}  # views [batch, head, q]
        rows["entropy"].copy_(block.entropy)
        rows["max_weight"].copy_(block.max_weight)
        qpos = torch.arange(q0, q1, device=p.device)
        kpos = torch.arange(k0, k1, device=p.device)
        dist = (qpos[:, None] - kpos[None, :]).abs().float()  # [q, k]
        # a broadcast product reads p once in place; einsum would first copy p into a q-major layout
        rows["mean_distance"].copy_((p * dist).sum(-1))
        for name, offset in _DIAGONALS.items():
            # key = query + offset lies on the block's diagonal shifted by the difference of its starts
            shift = q0 - k0 + offset
            diag = torch.diagonal(p, offset=shift, dim1=-2, dim2=-1)  # [batch, head, n]: rows max(0, -shift) ..
            first_row = max(0, -shift)
            rows[name][..., first_row:first_row + diag.shape[-1]].copy_(diag)
        if k0 == 0:  # key 0 lies outside a later block's window: its weight there is 0
            rows["first_token_mass"].copy_(p[..., 0])
        masses = torch.bmm(p.reshape(b, h * nq, -1), self.flags[:, k0:k1]).view(b, h, nq, 2)  # [batch, head, q, 2]
        rows["special_mass"].copy_(masses[..., 0])
        rows["punct_mass"].copy_(masses[..., 1])

    def totals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{statistic: (sum over queries `[head]` float64, count)} over every block added; then starts afresh."""
        if self.rows is None:
            return {}
        rows = dict(zip(_ROWS, self.rows))
        self.rows = None
        valid = self.valid
        n_keys = n_visible_keys(valid, self.causal, self.window)  # [batch, q]
        qmask = n_keys > 0  # padded queries see nothing
        multi = n_keys > 1
        out = {name: (_masked_sum(rows[name], qmask), qmask.double().sum())
               for name in ("entropy", "mean_distance", "first_token_mass", "special_mass", "punct_mass", "max_weight")}
        log_n = torch.log(n_keys.clamp(min=2).double())
        out["entropy_norm"] = (_masked_sum(rows["entropy"].double() / log_n[:, None, :], multi), multi.double().sum())
        t = valid.shape[1]
        for name, offset in _DIAGONALS.items():
            # the query and its key offset are both real, inside the sequence, and the key is visible
            ok = torch.zeros_like(valid)
            lo, hi = max(0, -offset), min(t, t - offset)
            ok[:, lo:hi] = valid[:, lo:hi] & valid[:, lo + offset:hi + offset]
            if (self.causal and offset > 0) or (self.window is not None and -offset >= self.window):
                ok[:] = False
            out[name] = (_masked_sum(rows[name], ok), ok.double().sum())
        return out
