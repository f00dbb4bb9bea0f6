"""Multi-head latent attention (MLA) for a converted LLaMA-like model, and `install_mla` to put it in place.

Self-contained on purpose (standard library, torch and transformers only): `headscope.capacity.mla.checkpoint`
copies this source verbatim into a converted checkpoint as its `trust_remote_code` loader, so the
saved model and headscope's own conversion run the same attention code.

Per token and layer the cache holds, instead of K and V of every KV head (2 * n_kv * d_head numbers):
- `kv_rank` numbers of the joint latent c = x W_down (keys' NoPE part and values are up-projected from it),
- `rope_dims` numbers per KV head: the key dimensions that keep their rotary embedding (already rotated).
Queries are unchanged, except that the dimensions whose key lost RoPE are not rotated either
(partial RoPE, Ji et al. 2025 "MHA2MLA"). Dimensions follow transformers' rotate_half convention: the
frequency f rotates dimensions f and f + d_head/2, so a kept frequency keeps both.

Two ways to attend, with the same result (`MLAAttention.decode`):
- naive: up-project K_nope and V of every cached token from the latent (`kv_b_proj`), then ordinary attention;
- absorbed (DeepSeek-V2): fold `kv_b_proj`'s key rows into the query, q_lat = W_bk^T q_nope, and attend in
  the latent space, score = q_rope . k_rope + q_lat . c; the weighted sum of latents is up-projected once per
  query by `kv_b_proj`'s value rows (softmax weights sum to 1, so the value bias is added once; the key bias
  adds the same number to every score of a query and cancels in the softmax). Nothing is computed per
  cached token except the two products with the cache itself.
"auto" (the default) attends absorbed when the keys outnumber the queries (decoding on a cache) and
naive for a forward over the whole sequence (prefill, training), where the up-projection is cheaper.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward, rotate_half

#: Config attribute holding the conversion record (kept frequencies, rank, module paths).
MLA_CONFIG_KEY = "headscope_mla"
#: How MLAAttention attends: absorbed when decoding on a cache ("auto"), always, or never.
DECODE_FORMS = ("auto", "absorbed", "naive")


def _get(root: nn.Module, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def rope_dim_index(frequencies: list[int], d_head: int) -> list[int]:
    """Head dimensions rotated by the kept frequencies: [f1, f2, ..., f1 + d/2, f2 + d/2, ...]."""
    f = sorted(int(x) for x in frequencies)
    return f + [x + d_head // 2 for x in f]


class MLAAttention(nn.Module):
    """Attention whose K/V come from a cached joint latent plus a few cached RoPE key dimensions."""

    def __init__(self, config: Any, layer_idx: int, q_proj: nn.Linear, o_proj: nn.Linear, n_kv_heads: int,
                 d_head: int, kv_rank: int, frequencies: list[list[int]], kv_bias: bool, sliding_window: int | None,
                 scaling: float, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = d_head
        d_model, n_heads = q_proj.in_features, q_proj.out_features // d_head
        self.num_heads, self.num_key_value_heads = n_heads, n_kv_heads
        self.num_key_value_groups = n_heads // n_kv_heads
        self.scaling = scaling
        self.attention_dropout = attention_dropout
        self.is_causal = True
        self.sliding_window = sliding_window
        self.kv_rank = kv_rank
        n_freq = {len(f) for f in frequencies}
        if len(frequencies) != n_kv_heads or len(n_freq) != 1:
            raise ValueError(f"layer {layer_idx}: need the same number of kept frequencies for each of the "
                             f"{n_kv_heads} KV heads, got {frequencies}")
        self.rope_dims = 2 * n_freq.pop()
        self.nope_dims = d_head - self.rope_dims
        g = n_kv_heads
        self.q_proj = q_proj  # the original query and output projections, unchanged
        self.kv_a_proj = nn.Linear(d_model, kv_rank, bias=False)  # x -> latent c (cached)
        self.k_rope_proj = nn.Linear(d_model, g * self.rope_dims, bias=kv_bias)  # x -> RoPE key dims (cached)
        self.kv_b_proj = nn.Linear(kv_rank, g * (self.nope_dims + d_head), bias=kv_bias)  # c -> [k_nope; v]
        self.o_proj = o_proj
        # Index lists, not buffers: transformers builds models on the meta device before loading weights,
        # where tensors made here would hold no data. `_indices` makes them on the input's device.
        rope_idx = [rope_dim_index(f, d_head) for f in frequencies]  # [kv][rope]
        nope_idx = [[i for i in range(d_head) if i not in set(r)] for r in rope_idx]  # [kv][nope]
        # Position of each head dimension in [rope dims; nope dims]: gathers K back into head order.
        self._rope_idx = rope_idx
        self._key_order = [sorted(range(d_head), key=(r + n).__getitem__)
                           for r, n in zip(rope_idx, nope_idx, strict=True)]
        self._q_rope = [[i in set(rope_idx[h // self.num_key_value_groups]) for i in range(d_head)]
                        for h in range(n_heads)]  # [heads][d_head]: which query dims are rotated
        self._nope_idx = nope_idx
        self._cache: dict[Any, tuple[torch.Tensor, ...]] = {}
        self.decode = "auto"  # one of DECODE_FORMS

    def _indices(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(rope_idx [kv, rope], key_order [kv, d_head], q_rope_mask [heads, d_head], nope_idx [kv, nope])."""
        if device not in self._cache:
            self._cache[device] = (torch.tensor(self._rope_idx, dtype=torch.long, device=device),
                                   torch.tensor(self._key_order, dtype=torch.long, device=device),
                                   torch.tensor(self._q_rope, dtype=torch.bool, device=device),
                                   torch.tensor(self._nope_idx, dtype=torch.long, device=device))
        return self._cache[device]

    def _absorbed(self, q: torch.Tensor, k_rope: torch.Tensor, latent: torch.Tensor, mask: Any) -> torch.Tensor:
        """Attention in the latent space: q [b, heads, t, d] (RoPE applied), k_rope [b, kv, s, rope],
        latent [b, 1, s, rank] -> per-head outputs [b, heads, t, d_head]."""
        b, n_heads, t, d = q.shape
        g, group, s, r = self.num_key_value_heads, self.num_key_value_groups, latent.shape[2], self.kv_rank
        rope_idx, _, _, nope_idx = self._indices(q.device)
        # [b, kv, group * t, d]: the query heads of a KV head, then positions
        qg = q.reshape(b, g, group * t, d)
        q_rope = qg.gather(-1, rope_idx[None, :, None, :].expand(b, g, group * t, -1))
        q_nope = qg.gather(-1, nope_idx[None, :, None, :].expand(b, g, group * t, -1))
        # [kv * nope + kv * d, rank]: key rows of each KV head, then value rows
        w = self.kv_b_proj.weight
        w_k = w[:g * self.nope_dims].view(g, self.nope_dims, r)
        w_v = w[g * self.nope_dims:].view(g, d, r)
        q_lat = torch.matmul(q_nope, w_k)  # [b, kv, group * t, rank]
        scores = torch.matmul(q_rope, k_rope.transpose(-1, -2))  # [b, kv, group * t, s]
        # every head reads the same latent: one product over all heads, the cache read once
        scores = scores + torch.matmul(q_lat.reshape(b, 1, n_heads * t, r), latent.transpose(-1, -2)).view_as(scores)
        scores = (scores * self.scaling).view(b, n_heads, t, s)
        # causal, the queries being the last t positions (sdpa's mask-free case)
        if mask is None and t > 1:
            mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
        if mask is not None:
            mask = mask[..., :s]
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        exact = q.dtype in (torch.float32, torch.float64)
        probs = torch.softmax(scores if exact else scores.float(), dim=-1).to(q.dtype)
        o_lat = torch.matmul(probs.view(b, 1, n_heads * t, s), latent).view(b, g, group * t, r)
        out = torch.matmul(o_lat, w_v.transpose(-1, -2))  # [b, kv, group * t, d]
        if self.kv_b_proj.bias is not None:
            out = out + self.kv_b_proj.bias[g * self.nope_dims:].view(g, 1, d)
        return out.view(b, n_heads, t, d)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None, cache: Any = None, **kwargs: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        else:
            kwargs.pop("past_key_values", None)
        b, t, _ = hidden_states.shape
        g, d = self.num_key_value_heads, self.head_dim
        if position_embeddings is None:
            raise ValueError("MLAAttention needs the decoder's rotary position_embeddings (cos, sin)")
        cos, sin = position_embeddings  # [batch, pos, d_head]
        rope_idx, key_order, q_rope_mask, _ = self._indices(hidden_states.device)
        q = self.q_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)  # [batch, head, pos, d_head]
        q_rot = q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
        q = torch.where(q_rope_mask[None, :, None, :], q_rot, q)

        k_rope = self.k_rope_proj(hidden_states).view(b, t, g, self.rope_dims).transpose(1, 2)  # [batch, kv, pos, rope]
        # cos/sin of each KV head's kept dimensions; the rope dims are ordered [f..., f + d/2 ...], so
        # rotate_half over them pairs f with f + d/2 exactly as over the full head.
        cos_k = cos[:, None, :, :].expand(b, g, t, d).gather(-1, rope_idx[None, :, None, :].expand(b, g, t, -1))
        sin_k = sin[:, None, :, :].expand(b, g, t, d).gather(-1, rope_idx[None, :, None, :].expand(b, g, t, -1))
        k_rope = k_rope * cos_k + rotate_half(k_rope) * sin_k
        latent = self.kv_a_proj(hidden_states).unsqueeze(1)  # [batch, 1, pos, kv_rank]
        # the cache holds only these two: rank + kv * rope_dims numbers per token
        if cache is not None:
            k_rope, latent = cache.update(k_rope, latent, self.layer_idx, kwargs=kwargs)
        s = latent.shape[2]
        absorb = self.decode == "absorbed" or (self.decode == "auto" and s > t)
        if absorb and not self.training and (attention_mask is None or isinstance(attention_mask, torch.Tensor)):
            out = self._absorbed(q, k_rope, latent, attention_mask).transpose(1, 2).reshape(b, t, -1)
            return self.o_proj(out), None
        kv = self.kv_b_proj(latent[:, 0])  # [batch, pos', kv * (nope + d_head)]
        k_nope = kv[..., :g * self.nope_dims].view(b, s, g, self.nope_dims).transpose(1, 2)
        v = kv[..., g * self.nope_dims:].view(b, s, g, d).transpose(1, 2)  # [batch, kv, pos', d_head]
        k = torch.cat([k_rope, k_nope], -1).gather(-1, key_order[None, :, None, :].expand(b, g, s, d))

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                    eager_attention_forward)
        out, weights = attention_interface(self, q, k, v, attention_mask,
                                           dropout=0.0 if not self.training else self.attention_dropout,
                                           scaling=self.scaling, sliding_window=self.sliding_window, **kwargs)
        out = out.reshape(b, t, -1).contiguous()
        return self.o_proj(out), weights


def install_mla(model: nn.Module, record: dict[str, Any]) -> None:
    """Replace every layer's attention module of `model` by an MLAAttention shaped by `record`, in place.

    The new modules' weights are left as initialised (a checkpoint load or the conversion fills them);
    `record` is what `headscope.capacity.mla.convert` stores in `config.headscope_mla`.
    """
    layers = _get(cast(nn.Module, model.base_model), record["layers_path"])
    parent_path, _, leaf = record["attention_path"].rpartition(".")
    for layer, block in enumerate(layers):
        old = _get(block, record["attention_path"])
        parent = _get(block, parent_path) if parent_path else block
        window = getattr(old, "sliding_window", getattr(model.config, "sliding_window", None))
        new = MLAAttention(model.config, layer, q_proj=_get(block, record["q_path"]),
                           o_proj=_get(block, record["o_path"]), n_kv_heads=record["n_kv_heads"],
                           d_head=record["d_head"], kv_rank=record["kv_rank"],
                           frequencies=record["frequencies"][str(layer)], kv_bias=record["kv_bias"],
                           sliding_window=window, scaling=float(old.scaling),
                           attention_dropout=float(getattr(old, "attention_dropout", 0.0)))
        p = next(old.parameters())
        # a new module trains by default; keep the model's mode (eval: absorbed decoding)
        new.train(old.training)
        setattr(parent, leaf, new.to(device=p.device, dtype=p.dtype))


def set_decode(model: nn.Module, form: str) -> None:
    """Make every MLAAttention of `model` attend `form`-wise: "auto", "absorbed" or "naive" (DECODE_FORMS)."""
    if form not in DECODE_FORMS:
        raise ValueError(f"MLA decode form {form!r} is not one of {', '.join(DECODE_FORMS)}")
    found = [m for m in model.modules() if isinstance(m, MLAAttention)]
    if not found:
        raise ValueError(f"{type(model).__name__} has no MLAAttention module; convert it to MLA first")
    for m in found:
        m.decode = form
