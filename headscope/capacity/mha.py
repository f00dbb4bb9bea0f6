"""A reference multi-head attention module: MHA, GQA and MQA in one readable nn.Module.

`n_kv_heads` picks the layout: MHA when it equals `n_heads` (every query head has its own key and
value head), MQA when it is 1 (all query heads share one K/V head), GQA in between (query head `h`
reads K/V head `h // group_size`, the same adjacent grouping as LLaMA's `repeat_kv`). Optional
rotary position embeddings use LLaMA's rotate-half convention, so weights copied from a LLaMA
attention layer give the same output. The point is clarity and exact equivalence with the
references (PyTorch's SDPA and nn.MultiheadAttention, transformers' LlamaAttention), not speed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HeadscopeError
from .kv_formula import dtype_bits, kv_bytes

__all__ = ["MultiHeadAttention", "apply_rope", "rope_frequencies", "rotate_half"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Map the halves (x1, x2) of the last dimension to (-x2, x1), as LLaMA does."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_frequencies(d_head: int, theta: float = 10000.0, device: torch.device | str | None = None) -> torch.Tensor:
    """The d_head/2 inverse frequencies theta^(-2i/d_head) of rotary embeddings (LLaMA's default RoPE)."""
    if d_head % 2:
        raise HeadscopeError(f"rotary embeddings need an even d_head; got d_head={d_head}")
    return 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float32, device=device) / d_head))


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate `x` [batch, head, pos, d_head] by its `positions` ([pos] or [batch, pos]), LLaMA's rotate-half RoPE.

    Dimension i is paired with dimension i + d_head/2 (not 2i with 2i+1 as in the RoFormer paper);
    both conventions are the same rotation up to a fixed permutation of the q/k projection rows,
    but only this one matches LLaMA checkpoints as stored by transformers.
    """
    d_head = x.shape[-1]
    # Angles in float32 like transformers (so results match it bit for bit), float64 for float64 inputs.
    exact = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = rope_frequencies(d_head, theta, device=x.device).to(exact)  # [d_head/2]
    positions = positions.to(device=x.device, dtype=exact)
    if positions.dim() == 1:
        positions = positions[None]  # [1, pos]
    angles = positions[..., None] * inv_freq  # [batch, pos, d_head/2]
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # [batch, 1, pos, d_head]
    # cos/sin in float32, then cast, as transformers does, so half-precision runs match it too.
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


class MultiHeadAttention(nn.Module):
    """Multi-head attention with `n_heads` query heads sharing `n_kv_heads` key/value heads.

    q_proj: d_model -> n_heads*d_head; k_proj, v_proj: d_model -> n_kv_heads*d_head;
    o_proj: n_heads*d_head -> d_model. `d_head` defaults to d_model // n_heads but may be set on its own.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_head: int | None = None,
        bias: bool = False,
        rope: bool = False,
        rope_theta: float = 10000.0,
        causal: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model < 1 or n_heads < 1 or n_kv_heads < 1:
            raise HeadscopeError(
                f"d_model, n_heads and n_kv_heads must be positive; got d_model={d_model}, n_heads={n_heads}, "
                f"n_kv_heads={n_kv_heads}"
            )
        if n_heads % n_kv_heads:
            divisors = [g for g in range(1, n_heads + 1) if n_heads % g == 0]
            raise HeadscopeError(
                f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}; each KV head must serve the same "
                f"number of query heads. Choose n_kv_heads from {divisors}"
            )
        if d_head is None:
            if d_model % n_heads:
                raise HeadscopeError(
                    f"d_model={d_model} is not divisible by n_heads={n_heads}, so the default "
                    f"d_head = d_model // n_heads is not exact; pass d_head explicitly or choose n_heads dividing "
                    f"{d_model}"
                )
            d_head = d_model // n_heads
        if d_head < 1:
            raise HeadscopeError(f"d_head must be positive; got {d_head}")
        if rope and d_head % 2:
            raise HeadscopeError(
                f"rope=True needs an even d_head (it rotates pairs of dimensions); got d_head={d_head}")
        if not 0.0 <= dropout < 1.0:
            raise HeadscopeError(f"dropout must be in [0, 1); got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, n_kv_heads, d_head
        self.group_size = n_heads // n_kv_heads  # query heads per KV head
        self.bias, self.rope, self.rope_theta, self.causal, self.dropout = bias, rope, rope_theta, causal, dropout
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.o_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)

    @property
    def layout(self) -> str:
        """'MHA', 'GQA' or 'MQA'."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    def extra_repr(self) -> str:
        return (f"{self.layout}: d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"d_head={self.d_head}, rope={self.rope}, causal={self.causal}")

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend `x` [batch, pos, d_model] to itself; `attention_mask` [batch, pos] (1 = real token) hides
        padding keys.

        Returns the output [batch, pos, d_model], and the weights [batch, head, q, k] if `return_weights`.
        `positions` ([pos] or [batch, pos], default 0..pos-1) only matter with RoPE.
        A query with no allowed key (e.g. a left-padding query under a causal mask) gets all-zero
        weights and a zero attention output instead of NaN.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise HeadscopeError(f"x must be [batch, pos, d_model={self.d_model}]; got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        if attention_mask is not None and tuple(attention_mask.shape) != (B, T):
            raise HeadscopeError(
                f"attention_mask must be [batch, pos] = [{B}, {T}] with 1 for real tokens; got shape "
                f"{tuple(attention_mask.shape)}"
            )
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # [batch, head, pos, d_head]
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # [batch, kv_head, pos, d_head]
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # [batch, kv_head, pos, d_head]
        if self.rope:
            if positions is None:
                positions = torch.arange(T, device=x.device)
            q = apply_rope(q, positions, self.rope_theta)
            k = apply_rope(k, positions, self.rope_theta)
        # Share each K/V head with its group of adjacent query heads. Only the cache (k, v above) is small;
        # the attention itself still computes n_heads score matrices.
        k = k.repeat_interleave(self.group_size, dim=1)  # [batch, head, pos, d_head]
        v = v.repeat_interleave(self.group_size, dim=1)  # [batch, head, pos, d_head]

        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # [batch, head, q, k]
        allowed = self._allowed(B, T, attention_mask, x.device)  # [batch or 1, 1, q, k]
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        # Softmax in float32 (as LLaMA does) so half-precision weights still sum to 1.
        # Half-precision scores are widened for the softmax (as transformers does); float64 stays float64.
        wide = torch.float64 if scores.dtype == torch.float64 else torch.float32
        weights = F.softmax(scores, dim=-1, dtype=wide).to(q.dtype)  # [batch, head, q, k]
        if allowed is not None:
            # A row with no allowed key is NaN after softmax; every entry of such a row is disallowed,
            # so this zeroes it while leaving ordinary rows (already 0 on masked keys) unchanged.
            weights = weights.masked_fill(~allowed, 0.0)
        y = self.attn_dropout(weights) @ v  # [batch, head, q, d_head]
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)  # [batch, pos, head*d_head]: heads side by side
        out = self.o_proj(y)  # [batch, pos, d_model]
        return (out, weights) if return_weights else out

    def _allowed(
        self, B: int, T: int, attention_mask: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor | None:
        """Which (query, key) pairs may attend: [batch or 1, 1, q, k] bool, or None when all may."""
        allowed = None
        if self.causal:
            allowed = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]  # [1, 1, q, k]
        if attention_mask is not None:
            keys = attention_mask.to(device=device).bool()[:, None, None, :]  # [batch, 1, 1, k]
            allowed = keys if allowed is None else allowed & keys
        return allowed

    @property
    def n_params(self) -> int:
        """Number of parameters (weights and biases of the four projections)."""
        return sum(p.numel() for p in self.parameters())

    def flops(self, seq_len: int, batch: int = 1) -> int:
        """Forward FLOPs for `batch` sequences of `seq_len` tokens: 2 per multiply-accumulate of the matmuls.

        Counted: the q/k/v/o projections (2 * tokens * in * out each) and the two attention matmuls
        (Q K^T and weights @ V: 2 * seq_len^2 * d_head each, per query head and sequence). The full
        seq_len x seq_len matrices are counted even when causal, because this module (like most dense
        kernels) computes them and then masks. Not counted: biases, scaling, softmax, masking, RoPE,
        dropout (all O(seq_len^2) or O(seq_len * d) elementwise work, small next to the matmuls).
        GQA/MQA save only in the k/v projections here; the attention matmuls still run per query head.
        """
        if seq_len < 1 or batch < 1:
            raise HeadscopeError(f"seq_len and batch must be positive; got seq_len={seq_len}, batch={batch}")
        tokens = batch * seq_len
        proj = 2 * tokens * self.d_model * self.d_head * (2 * self.n_heads + 2 * self.n_kv_heads)  # q, o + k, v
        attn = 2 * 2 * batch * self.n_heads * seq_len * seq_len * self.d_head  # QK^T and weights @ V
        return proj + attn

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """Bytes this layer adds to a KV cache per token: 2 (K and V) * n_kv_heads * d_head * bytes(dtype)."""
        return kv_bytes(self.n_kv_heads, self.d_head, dtype_bits(dtype))
