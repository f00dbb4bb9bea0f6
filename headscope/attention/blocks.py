"""Attention probabilities one block of queries at a time, and per-head statistics summed over blocks.

A block holds queries `[q_start, q_end)` against keys `[k_start, k_end)`: memory is O(block x T) per
head, never T x T. For causal layers the keys stop at the block's last query, and a sliding window
starts them at the first key the block's first query may see, so the masked-out triangle is never
computed. The probabilities are eager attention's, row for row: the same logits, scaling,
soft-capping and mask, so statistics summed over blocks equal those of the full map.

Consumers that only need per-query values (the statistics of `BlockStats`) take a faster path,
`fused_rows`: each block of queries walks its keys in tiles with an online softmax (running row maximum,
rescaled sums, as flash attention does), so memory is O(block x tile) whatever T, the probabilities are
never normalised or handed out, and one matmul per tile gives the layer's output together with the
attention-weighted sums the statistics need (`BlockRows`).

A learned sink logit per head (GPT-OSS's `sinks`, handed to attention functions as `s_aux`) joins every
row's softmax as one more column without a value: the keys' probabilities are eager's (they sum to one
minus the sink's mass), the layer's output is theirs @ V, and `sink_mass` (the statistic `sink_logit_mass`)
records the sink's share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from ..errors import HeadscopeError

# Keys per tile of `fused_rows`: logits take batch x heads x block x DEFAULT_TILE floats at a time.
DEFAULT_TILE = 1024
# Eager's fill value for masked logits: a row with no key left becomes uniform, not NaN.
_FLOOR = torch.finfo(torch.float32).min
# Key offsets whose weight BlockRows.near keeps for each query: previous token, itself, next token.
NEAR_OFFSETS = (-1, 0, 1)


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
    # [batch, head, q_block]: the learned sink's share (None: no sink)
    sink_mass: torch.Tensor | None = None

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


def check_block(block: int, what: str = "block size", unit: str = "queries", example: int = 128) -> int:
    """`block` as an int, or a clear error when it is not a positive number of `unit`."""
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise HeadscopeError(f"{what} must be a positive number of {unit}, got {block!r}; "
                             f"e.g. {example} (attention memory per head grows with it)")
    return block


def key_range(q_start: int, q_end: int, kv_length: int, causal: bool, window: int | None) -> tuple[int, int]:
    """Keys `[k_start, k_end)` that queries `[q_start, q_end)` may see at most (query i sees key j
    only if j <= i when causal, and |i - j| < window with a sliding window)."""
    if causal:
        k_end = min(q_end, kv_length)
    else:
        # a bidirectional window reaches window - 1 keys past the block's last query
        k_end = kv_length if window is None else min(kv_length, q_end + window - 1)
    k_start = max(0, q_start - window + 1) if window is not None else 0
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


def masked_logits(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, q_start: int, q_end: int,
                  k_start: int, k_end: int, *, scaling: float, softcap: float | None = None,
                  causal_without_mask: bool = False) -> torch.Tensor:
    """Eager attention's logits for queries `[q_start, q_end)` over keys `[k_start, k_end)`,
    `[batch, head, q_block, k_block]` float32: scaled, soft-capped, masked (masked keys get eager's fill
    value); see `block_attention` for the arguments."""
    scores = _logits(query[:, :, q_start:q_end].float(), key[:, :, k_start:k_end].float(), scaling)
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    if mask is not None:
        m = mask[:, :, q_start:q_end, k_start:k_end]
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, _FLOOR)
        else:
            scores.add_(m.to(scores.dtype))
    elif causal_without_mask and max(q_start + 1, k_start) < k_end:
        # Keys up to the block's first query are visible to all its queries: only the tail needs the triangle.
        c0 = max(q_start + 1, k_start)
        qpos = torch.arange(q_start, q_end, device=scores.device)
        kpos = torch.arange(c0, k_end, device=scores.device)
        scores[..., c0 - k_start:].masked_fill_(kpos[None, :] > qpos[:, None], _FLOOR)
    return scores


def block_attention(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, q_start: int, q_end: int,
                    k_start: int, k_end: int, *, scaling: float, softcap: float | None = None,
                    causal_without_mask: bool = False,
                    sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager attention's probabilities for queries `[q_start, q_end)` over keys `[k_start, k_end)`,
    with each row's entropy and largest weight.

    query `[batch, head, T, d_head]`, key `[batch, kv_head, T, d_head]` (after RoPE); `mask` is the 4D mask
    transformers built (`[batch, 1, T, T]`, bool True = attend, or additive float), or None, in which
    case `causal_without_mask` says whether a causal triangle applies (as sdpa's `is_causal`).
    Returns probs `[batch, head, q_block, k_block]` float32, entropy and max weight `[batch, head, q_block]`.
    With `sink` (`[head]` logits) the softmax has one more column, dropped: rows sum to 1 - the sink's mass, and
    the entropy is -sum_k p_k log p_k over the keys.
    """
    scores = masked_logits(query, key, mask, q_start, q_end, k_start, k_end, scaling=scaling, softcap=softcap,
                           causal_without_mask=causal_without_mask)
    if sink is not None:
        s = sink.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)  # [batch, head, q, 1]
        m = torch.maximum(scores.amax(dim=-1, keepdim=True), s)
        scores.sub_(m)
        e = torch.exp(scores)
        z = e.sum(dim=-1, keepdim=True) + torch.exp(s - m)  # the sink's column joins the sum
        probs = e / z
        # -sum_k p_k log p_k with log p_k = shifted_k - log z, and sum_k p_k = 1 - sink's mass
        entropy = torch.log(z[..., 0]) * probs.sum(-1) - torch.einsum("bhqk,bhqk->bhq", probs, scores)
        return probs, entropy, probs.amax(dim=-1)
    # Shifting each row by its maximum makes the largest shifted logit 0, so the largest weight is 1 / Z:
    # entropy = log Z - sum_k p_k * shifted_k needs no logarithm per key (xlogy would).
    scores.sub_(scores.amax(dim=-1, keepdim=True))
    probs = torch.softmax(scores, dim=-1)
    max_weight = probs.amax(dim=-1)
    entropy = -torch.log(max_weight) - torch.einsum("bhqk,bhqk->bhq", probs, scores)
    return probs, entropy, max_weight


@dataclass(frozen=True)
class BlockRows:
    """What one block of queries' attention gives per query, without the probabilities themselves.

    Every tensor is `[batch, head, q_block]` float32 unless said otherwise; row i is query `q_start + i`.
    `near[..., n]` is the weight on key `query + NEAR_OFFSETS[n]` (0 where that key is outside the
    sequence or invisible); `first` the weight on key 0; `weighted` `[batch, head, q_block, c]` the
    attention-weighted sums of the `c` key columns the consumer asked for.
    """

    layer: int
    q_start: int
    kv_length: int
    entropy: torch.Tensor  # nats
    max_weight: torch.Tensor
    mean_distance: torch.Tensor  # expected |query - key| in tokens
    near: torch.Tensor  # [batch, head, q_block, len(NEAR_OFFSETS)]
    first: torch.Tensor
    weighted: torch.Tensor  # [batch, head, q_block, c]
    # the learned sink's mass (None: the family has no sink, i.e. 0)
    sink: torch.Tensor | None = None

    @property
    def q_end(self) -> int:
        return self.q_start + self.entropy.shape[2]

    @property
    def last(self) -> bool:
        """Whether this is the layer's last block of queries in this forward pass."""
        return self.q_end == self.kv_length


def rows_from_block(block: AttentionBlock, columns: torch.Tensor) -> BlockRows:
    """`BlockRows` read from a block's probabilities; `columns` `[batch, T, c]` are the key columns."""
    p = block.probs.float()  # [batch, head, q, k]
    b, h, nq, _ = p.shape
    q0, q1, k0, k1 = block.q_start, block.q_end, block.k_start, block.k_end
    qpos = torch.arange(q0, q1, device=p.device)
    kpos = torch.arange(k0, k1, device=p.device)
    dist = (qpos[:, None] - kpos[None, :]).abs().float()  # [q, k]
    # a broadcast product reads p once in place; einsum would first copy p into a q-major layout
    mean_distance = (p * dist).sum(-1)
    near = p.new_zeros(b, h, nq, len(NEAR_OFFSETS))
    for n, offset in enumerate(NEAR_OFFSETS):
        # key = query + offset lies on the block's diagonal shifted by the difference of its starts
        shift = q0 - k0 + offset
        diag = torch.diagonal(p, offset=shift, dim1=-2, dim2=-1)  # [batch, head, n]: rows max(0, -shift) ..
        first_row = max(0, -shift)
        near[..., first_row:first_row + diag.shape[-1], n] = diag
    first = p[..., 0] if k0 == 0 else p.new_zeros(b, h, nq)  # key 0 lies outside a later block's window
    cols = columns[:, k0:k1].float()
    weighted = torch.bmm(p.reshape(b, h * nq, -1), cols).view(b, h, nq, cols.shape[-1])
    return BlockRows(layer=block.layer, q_start=q0, kv_length=block.kv_length, entropy=block.entropy,
                     max_weight=block.max_weight, mean_distance=mean_distance, near=near, first=first,
                     weighted=weighted, sink=block.sink_mass)


def key_side(value: torch.Tensor | None, columns: torch.Tensor, n_kv: int) -> torch.Tensor:
    """The matrix `fused_rows` multiplies each tile's weights by, `[batch * kv_head, T, C]` float32:
    the values (when the output is wanted), a column of ones (the softmax's sum), the key's position,
    then the consumer's key columns `[batch, T, c]` (the same for every KV head)."""
    b, t, _ = columns.shape
    parts = [] if value is None else [value.float()]  # [batch, kv_head, T, d_head]
    ones = columns.new_ones(b, n_kv, t, 1, dtype=torch.float32)
    pos = torch.arange(t, device=columns.device, dtype=torch.float32).view(1, 1, t, 1).expand(b, n_kv, t, 1)
    parts += [ones, pos, columns.float()[:, None].expand(b, n_kv, t, columns.shape[-1])]
    return torch.cat(parts, dim=-1).reshape(b * n_kv, t, -1)


def fused_rows(query: torch.Tensor, key: torch.Tensor, side: torch.Tensor, mask: torch.Tensor | None, *,
               layer: int, q_start: int, q_end: int, n_value: int, scaling: float, causal: bool,
               window: int | None, softcap: float | None = None, causal_without_mask: bool = False,
               tile: int = DEFAULT_TILE, sink: torch.Tensor | None = None) -> tuple[torch.Tensor | None, BlockRows]:
    """One block of queries' output and `BlockRows` in a single online-softmax walk over tiles of keys.

    query `[batch, head, T, d_head]`, key `[batch, kv_head, T, d_head]` (after RoPE), `side` from
    `key_side` (its first `n_value` columns the values, or none), mask as for `block_attention`.
    Per tile: the logits as eager computes them (`masked_logits`), the running row maximum m, weights
    e = exp(s - m) rescaled when m grows, and one matmul e @ side. At the end Z = sum e, the largest
    weight is 1 / Z, the entropy log Z - sum e (s - m) / Z (no logarithm per key), the output and the
    weighted sums are divided by Z. Memory: O(batch x heads x block x tile), whatever T.
    Returns the output block `[batch, head, q_block, n_value]` (None when `n_value` is 0) and the rows.
    """
    b, h, _, _ = query.shape
    kv, kv_length = key.shape[1], key.shape[2]
    nq, width = q_end - q_start, side.shape[-1]
    # query heads of one KV head, each with its block of queries: one matmul
    rows = (h // kv) * nq
    k_start, k_end = key_range(q_start, q_end, kv_length, causal, window)
    new = query.new_empty(0, dtype=torch.float32)
    m = new.new_full((b * kv, rows, 1), _FLOOR)  # running maximum logit per query
    acc = new.new_zeros(b * kv, rows, width)  # sum_k e_k * side_k
    ent = new.new_zeros(b * kv, rows, 1)  # sum_k e_k * (s_k - m)
    dist = None if causal else new.new_zeros(b, h, nq)  # sum_k e_k * |q - k| (not linear in k both ways)
    near = new.new_full((b, h, nq, len(NEAR_OFFSETS)), _FLOOR)  # logits of the near keys
    first = new.new_full((b, h, nq), _FLOOR)  # logit of key 0
    qpos = torch.arange(q_start, q_end, device=query.device)
    for k0 in range(k_start, k_end, tile):
        k1 = min(k0 + tile, k_end)
        s = masked_logits(query, key, mask, q_start, q_end, k0, k1, scaling=scaling, softcap=softcap,
                          causal_without_mask=causal_without_mask)  # [batch, head, q, k]
        for n, offset in enumerate(NEAR_OFFSETS):
            shift = q_start - k0 + offset
            diag = torch.diagonal(s, offset=shift, dim1=-2, dim2=-1)
            first_row = max(0, -shift)
            near[..., first_row:first_row + diag.shape[-1], n] = diag
        if k0 == 0:
            first.copy_(s[..., 0])
        flat = s.view(b * kv, rows, k1 - k0)
        m_new = torch.maximum(m, flat.amax(dim=-1, keepdim=True))
        # rescales what earlier tiles summed against the smaller maximum
        scale = torch.exp(m - m_new)
        flat.sub_(m_new)
        e = torch.exp(flat)
        # sum e (s - m_new) = scale * (sum e_old (s - m_old) + (m_old - m_new) * Z_old) + this tile's part
        # (scale * (m_old - m_new) first: a row that saw only masked keys so far has m_old = floor, scale 0)
        ent = (scale * ent + scale * (m - m_new) * acc[..., n_value:n_value + 1]
               + torch.linalg.vecdot(e, flat)[..., None])
        if dist is not None:
            kpos = torch.arange(k0, k1, device=query.device)
            d = (qpos[:, None] - kpos[None, :]).abs().float()  # [q, k]
            dist = scale.view(b, h, nq) * dist + (e.view(b, h, nq, -1) * d).sum(-1)
        acc.mul_(scale).baddbmm_(e, side[:, k0:k1])
        m = m_new
    view = (b, h, nq)
    sink_mass = None
    if sink is None:
        z = acc[..., n_value]  # [batch * kv_head, rows]
        inv = 1.0 / z
        entropy = torch.log(z) - ent[..., 0] * inv
        max_weight = inv.view(view)  # the largest shifted weight is exp(0) = 1
        mean_pos = acc[..., n_value + 1] * inv
    else:
        m, dist, inv, entropy, max_weight, sink_mass, mean_pos = _with_sink(sink, acc=acc, ent=ent, m=m, dist=dist,
                                                                            n_value=n_value, view=view, qpos=qpos)
    m_q = m.view(b, h, nq)
    inv_q = inv.view(view)
    # causal: |q - k| = q - k, so sum_k p_k (q - k) = q (1 - sink) - sum_k p_k k
    if dist is None:
        mean_distance = qpos.float() - mean_pos.view(view)
    else:
        mean_distance = dist * inv_q
    out = None if n_value == 0 else (acc[..., :n_value] * inv[..., None]).view(b, h, nq, n_value)
    weighted = (acc[..., n_value + 2:] * inv[..., None]).view(b, h, nq, width - n_value - 2)
    return out, BlockRows(layer=layer, q_start=q_start, kv_length=kv_length, entropy=entropy.view(view),
                          max_weight=max_weight, mean_distance=mean_distance,
                          near=torch.exp(near - m_q[..., None]) * inv_q[..., None],
                          first=torch.exp(first - m_q) * inv_q, weighted=weighted, sink=sink_mass)


def _with_sink(sink: torch.Tensor, acc: torch.Tensor, ent: torch.Tensor, m: torch.Tensor, dist: torch.Tensor | None,
               n_value: int, view: tuple[int, int, int], qpos: torch.Tensor) -> tuple:
    """`fused_rows`' normalisation when a sink logit per head joins the softmax as one more logit without a value:
    rescale the sums (`acc`, in place) to the larger maximum, add the sink's weight to Z. Returns the new running
    maximum and distance sums, 1 / Z, the entropy over the keys, the largest key weight, the sink's mass
    `[batch, head, q]` and the weighted mean key position (plus q x the sink's mass, for the causal distance)."""
    b, h, nq = view
    kv = acc.shape[0] // b
    s = sink.float().view(1, kv, h // kv, 1).expand(b, kv, h // kv, nq).reshape(b * kv, -1, 1)  # rows: (head, q)
    m_new = torch.maximum(m, s)
    scale = torch.exp(m - m_new)
    ent = scale * ent + scale * (m - m_new) * acc[..., n_value:n_value + 1]
    acc.mul_(scale)
    dist = None if dist is None else scale.view(view) * dist
    z_keys = acc[..., n_value]
    z = z_keys + torch.exp(s - m_new)[..., 0]
    inv = 1.0 / z
    kept = z_keys * inv  # the keys' share of the row, 1 - the sink's
    entropy = torch.log(z) * kept - ent[..., 0] * inv  # -sum_k p_k log p_k over the keys
    mean_pos = acc[..., n_value + 1] * inv + qpos.float().repeat(h // kv)[None] * (1.0 - kept)
    return m_new, dist, inv, entropy, (scale[..., 0] * inv).view(view), (1.0 - kept).view(view), mean_pos


def visible_outside(mask: torch.Tensor, q_start: int, q_end: int, k_start: int, k_end: int) -> bool:
    """Whether the 4D mask lets any query of the block see a key outside `[k_start, k_end)`."""
    rows = mask[:, :, q_start:q_end]
    seen = rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2
    return bool(seen[..., :k_start].any()) or bool(seen[..., k_end:].any())


def iter_blocks(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, *, layer: int, block: int,
                scaling: float, causal: bool, window: int | None, softcap: float | None = None,
                causal_without_mask: bool = False, sink: torch.Tensor | None = None) -> Iterator[AttentionBlock]:
    """One layer's attention as consecutive blocks of `block` queries, each over the keys it may see
    (`sink`: a learned logit per head in every row's softmax, see `block_attention`)."""
    t, kv_length = query.shape[2], key.shape[2]
    for q0 in range(0, t, block):
        q1 = min(q0 + block, t)
        k0, k1 = key_range(q0, q1, kv_length, causal, window)
        probs, entropy, max_weight = block_attention(query, key, mask, q0, q1, k0, k1, scaling=scaling,
                                                     softcap=softcap, causal_without_mask=causal_without_mask,
                                                     sink=sink)
        # the block holds every key its queries may see, so what the keys lack is the sink's share
        sink_mass = None if sink is None else (1.0 - probs.sum(-1)).clamp(min=0.0)
        yield AttentionBlock(layer=layer, q_start=q0, k_start=k0, probs=probs, kv_length=kv_length, entropy=entropy,
                             max_weight=max_weight, sink_mass=sink_mass)


def n_visible_keys(valid: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """Keys each query may attend to, `[batch, query]`: the row sums of `headscope.stats.allowed_keys`
    (query q sees real key k when q is real, k <= q if causal, |q - k| < window), from prefix counts."""
    b, t = valid.shape
    pos = torch.arange(t, device=valid.device)
    before = torch.nn.functional.pad(valid.long().cumsum(-1), (1, 0))  # [batch, T + 1]: real keys before index i
    if causal:
        hi = pos + 1
    else:
        hi = torch.full_like(pos, t) if window is None else (pos + window).clamp(max=t)
    lo = (pos - window + 1).clamp(min=0) if window is not None else torch.zeros_like(pos)
    return (before[:, hi] - before[:, lo]) * valid.long()


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum `[batch, head, query]` values over the queries `mask` `[batch, query]` selects -> `[batch, head]`
    (float64): one sum per passage, so every statistic can be resampled by passage."""
    return (values.double() * mask.double()[:, None, :]).sum(dim=2)


# Per-query values BlockStats keeps for a layer, in order; offsets of the key each diagonal statistic reads.
_ROWS = ("entropy", "mean_distance", "prev_token_mass", "self_mass", "next_token_mass", "first_token_mass",
         "special_mass", "punct_mass", "max_weight", "sink_logit_mass")
_DIAGONALS = {"prev_token_mass": -1, "self_mass": 0, "next_token_mass": 1}


class BlockStats:
    """`headscope.stats.reduce_attention`'s statistics of one layer, fed one block of queries at a time.

    `valid` `[batch, T]` marks real tokens; `special` / `punct` `[batch, T]` flag keys, and `columns()`
    gives them as the key columns each block's `BlockRows.weighted` must hold. Each block's
    per-query values go into `[batch, head, T]` rows (memory O(T), not T x T); after the layer's last
    block, `totals()` gives {name: (sums [batch, head] float64, counts [batch])} with the same masks as the full
map: one sum and count per passage.
    """

    def __init__(self, valid: torch.Tensor, special: torch.Tensor, punct: torch.Tensor, causal: bool,
                 window: int | None) -> None:
        self.valid = valid.bool()
        self.flags = torch.stack([special.float(), punct.float()], dim=-1)  # [batch, T, 2]: one matmul reads both
        self.causal, self.window = causal, window
        self.rows: torch.Tensor | None = None  # [statistic, batch, head, T]

    def columns(self) -> torch.Tensor:
        """Key columns whose attention-weighted sums `add` reads: special, punctuation `[batch, T, 2]`."""
        return self.flags

    def add(self, rows: "BlockRows") -> None:
        """Add one block's per-query values."""
        if self.rows is None:
            b, h, _ = rows.entropy.shape
            self.rows = rows.entropy.new_zeros(len(_ROWS), b, h, rows.kv_length)
        q0, q1 = rows.q_start, rows.q_end
        values = {"entropy": rows.entropy, "max_weight": rows.max_weight, "mean_distance": rows.mean_distance,
                  "first_token_mass": rows.first, "special_mass": rows.weighted[..., 0],
                  "punct_mass": rows.weighted[..., 1],
                  "sink_logit_mass": rows.entropy.new_zeros(()) if rows.sink is None else rows.sink}
        for name, offset in _DIAGONALS.items():
            values[name] = rows.near[..., NEAR_OFFSETS.index(offset)]
        for i, name in enumerate(_ROWS):
            self.rows[i, :, :, q0:q1].copy_(values[name])

    def totals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{statistic: (per-passage sums over queries `[batch, head]` float64, counts `[batch]`)} over every block
        added; then starts afresh."""
        if self.rows is None:
            return {}
        rows = dict(zip(_ROWS, self.rows, strict=True))
        self.rows = None
        valid = self.valid
        n_keys = n_visible_keys(valid, self.causal, self.window)  # [batch, q]
        qmask = n_keys > 0  # padded queries see nothing
        multi = n_keys > 1
        out = {name: (_masked_sum(rows[name], qmask), qmask.double().sum(-1))
               for name in ("entropy", "mean_distance", "first_token_mass", "special_mass", "punct_mass", "max_weight",
                            "sink_logit_mass")}
        log_n = torch.log(n_keys.clamp(min=2).double())
        out["entropy_norm"] = (_masked_sum(rows["entropy"].double() / log_n[:, None, :], multi), multi.double().sum(-1))
        t = valid.shape[1]
        for name, offset in _DIAGONALS.items():
            # the query and its key offset are both real, inside the sequence, and the key is visible
            ok = torch.zeros_like(valid)
            lo, hi = max(0, -offset), min(t, t - offset)
            ok[:, lo:hi] = valid[:, lo:hi] & valid[:, lo + offset:hi + offset]
            if (self.causal and offset > 0) or (self.window is not None and abs(offset) >= self.window):
                ok[:] = False
            out[name] = (_masked_sum(rows[name], ok), ok.double().sum(-1))
        return out
