"""MHA/GQA -> MLA: partial RoPE, then a joint low-rank SVD of the keys' NoPE part and the values (MHA2MLA).

Per layer, with W_k (keys) and W_v (values) read through the adapter (`HeadModel.qkv_weights`):
- the key rows of each KV head's kept frequencies become `k_rope_proj` (cached, rotated, per KV head);
- the other key rows (NoPE) and all value rows are stacked, W_kv = [W_k_nope; W_v]
  `[kv * (2 d_head - rope_dims), d_model]`, and factored by a truncated SVD, W_kv ~ U_r S_r V_r^T:
  `kv_a_proj` = S_r^1/2 V_r^T (x -> latent, cached) and `kv_b_proj` = U_r S_r^1/2 (latent -> [k_nope; v]).
  Ji et al.'s SVD_joint: one factorisation for all KV heads of the layer and for K and V together.
At full rank (min of W_kv's two sides) and with every frequency kept, the model computes what it did.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import torch

from ...errors import HeadscopeError, OptionError
from ...models.adapter import HeadModel
from ...models.capabilities import supported_model_types_for, why_not
from ..convert.evaluate import CACHE_FORMULAS
from .modeling import MLA_CONFIG_KEY, MLAAttention, install_mla, rope_dim_index
from .rope import select_frequencies

#: model_type values MLA conversion supports, as their specs say (capabilities.why_not): LLaMA-like decoders with
#: separate q/k/v and full rotary embeddings in the rotate_half layout, no per-head q/k norms, no logit soft-capping.
SUPPORTED_MODEL_TYPES = supported_model_types_for("mla")


def full_rank(hm: HeadModel, rope_dims: int) -> int:
    """The rank of the joint factorisation that loses nothing: min(d_model, n_kv * (2 d_head - rope_dims))."""
    return min(hm.d_model, hm.n_kv_heads * (2 * hm.d_head - rope_dims))


def check_mla(hm: HeadModel, kv_rank: int, rope_dims: int | None, *, allow_full_rank: bool = False) -> int:
    """Raise a clear error for a model or settings MLA conversion cannot use; returns the rope dims used."""
    mt = hm.config.model_type
    rank = getattr(hm.config, "kv_lora_rank", None)
    if rank is not None:  # DeepSeek-V3 and kin: MLA already
        latent = int(rank) + int(getattr(hm.config, "qk_rope_head_dim", 0) or 0)
        raise HeadscopeError(f"{hm.name!r} ({hm.spec.family} family) already uses multi-head latent attention: its "
                             f"cache holds a latent of kv_lora_rank {rank} + qk_rope_head_dim = {latent} numbers per "
                             f"token and layer; MLA conversion turns MHA / GQA models into that (headscope kv "
                             f"{hm.name} gives its cache bytes)")
    why = why_not(hm.spec, "mla", mt)
    if why:
        raise HeadscopeError(f"MLA conversion supports model types {', '.join(SUPPORTED_MODEL_TYPES)} (LLaMA-like "
                             f"decoders with full RoPE); {hm.name!r} is {mt!r}, and the {hm.spec.family} family "
                             f"cannot serve it: {why}")
    if hm.pruned:
        raise HeadscopeError(f"{hm.name!r} is physically pruned; convert to MLA before pruning")
    if getattr(hm.config, MLA_CONFIG_KEY, None):
        raise HeadscopeError(f"{hm.name!r} is already an MLA model")
    d = hm.d_head
    rope_dims = default_rope_dims(hm) if rope_dims is None else int(rope_dims)
    if not (2 <= rope_dims <= d and rope_dims % 2 == 0):
        raise OptionError("rope_dims", f"must be an even number from 2 to d_head = {d} (each rotary frequency "
                                       f"rotates 2 dimensions); got {rope_dims}")
    top = full_rank(hm, rope_dims)
    if not isinstance(kv_rank, int) or kv_rank < 1 or kv_rank > top or (kv_rank == top and not allow_full_rank):
        raise OptionError(
            "kv_rank", f"must be from 1 to {top - 1}: the full rank of {hm.name}'s joint K/V factorisation with "
                       f"rope_dims={rope_dims} is {top} = min(d_model {hm.d_model}, {hm.n_kv_heads} KV heads x "
                       f"(2 x d_head {d} - {rope_dims})), which compresses nothing; got {kv_rank}", also=("rope_dims",))
    return rope_dims


def default_rope_dims(hm: HeadModel) -> int:
    """MHA2MLA's default: d_head / 16 frequencies kept per head (2 dimensions each), at least one."""
    return max(2, 2 * (hm.d_head // 16))


def mla_record(hm: HeadModel, kv_rank: int, frequencies: dict[str, list[list[int]]], selection: str) -> dict[str, Any]:
    """What `config.headscope_mla` holds: enough to rebuild the MLA modules before the weights load."""
    w = hm.qkv_weights(0)
    spec = hm.spec
    rel = spec.attention + "."
    for path in (spec.q_proj, spec.out_proj):
        if not path or not path.startswith(rel):
            raise HeadscopeError(f"the {spec.family} family's projections do not live in its attention module")
    return {"format": 1, "kv_rank": kv_rank, "rope_dims": 2 * len(frequencies["0"][0]), "selection": selection,
            "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head, "d_model": hm.d_model,
            "kv_bias": w.k_bias is not None, "layers_path": spec.layers, "attention_path": spec.attention,
            "q_path": spec.q_proj, "o_path": spec.out_proj, "frequencies": frequencies}


def _check_rotary(hm: HeadModel) -> None:
    """Refuse models whose rotary embedding does not cover the whole head (partial_rotary_factor < 1)."""
    rotary = getattr(hm.model.base_model, "rotary_emb", None)
    if rotary is None:
        raise HeadscopeError(f"{hm.name!r} has no rotary embedding module (rotary_emb); MLA conversion needs RoPE")
    x = torch.zeros(1, 1, 1, device=hm.device)
    cos, _ = rotary(x, torch.zeros(1, 1, dtype=torch.long, device=hm.device))
    if cos.shape[-1] != hm.d_head:
        raise HeadscopeError(f"{hm.name!r} rotates {cos.shape[-1]} of its {hm.d_head} head dimensions; MLA "
                             f"conversion supports full rotary embeddings only")


@torch.no_grad()
def convert_to_mla(hm: HeadModel, kv_rank: int, rope_dims: int | None = None, *, selection: str = "2-norm",
                   data: Any = None, allow_full_rank: bool = False, **calib: Any) -> HeadModel:
    """A copy of `hm` with MLA attention: `rope_dims` RoPE key dims per KV head and a rank-`kv_rank` latent.

    `selection="2-norm"` ranks frequencies on `data` (calibration text; `calib` passes max_length,
    batch_size, limit, progress), `"high"` keeps the fastest ones. `allow_full_rank` permits the rank that
    compresses nothing (for checking exactness). The input model is not changed.
    """
    rope_dims = check_mla(hm, kv_rank, rope_dims, allow_full_rank=allow_full_rank)
    _check_rotary(hm)
    freqs = select_frequencies(hm, rope_dims, selection, data, **calib)
    record = mla_record(hm, kv_rank, freqs, selection)
    weights = [hm.qkv_weights(layer) for layer in range(hm.n_layers)]
    model = copy.deepcopy(hm.model)
    install_mla(model, record)
    out = HeadModel(model=model, tokenizer=hm.tokenizer, name=f"{hm.name}-mla{kv_rank}", source=hm.source)
    setattr(model.config, MLA_CONFIG_KEY, record)
    d = hm.d_head
    for layer, w in enumerate(weights):
        att = cast(MLAAttention, out.attention(layer))  # install_mla put it there
        rope_rows, nope_rows = [], []
        for kv, f in enumerate(freqs[str(layer)]):
            r = rope_dim_index(f, d)
            rope_rows += [kv * d + i for i in r]
            nope_rows += [kv * d + i for i in range(d) if i not in set(r)]
        k, v = w.k.double(), w.v.double()
        w_kv = torch.cat([k[nope_rows], v])  # [kv * (nope + d_head), d_model]
        u, s, vh = torch.linalg.svd(w_kv, full_matrices=False)
        root = s[:kv_rank].sqrt()
        att.kv_a_proj.weight.copy_(root[:, None] * vh[:kv_rank])  # [rank, d_model]
        att.kv_b_proj.weight.copy_(u[:, :kv_rank] * root)  # [kv * (nope + d_head), rank]
        att.k_rope_proj.weight.copy_(w.k[rope_rows])
        if w.k_bias is not None:
            assert w.v_bias is not None, "K and V projections have biases together"
            att.k_rope_proj.bias.copy_(w.k_bias[rope_rows])
            att.kv_b_proj.bias.copy_(torch.cat([w.k_bias[nope_rows], w.v_bias]))
    return out


def mla_kv_bytes_per_token(record: dict[str, Any], n_layers: int, dtype: torch.dtype = torch.float32) -> int:
    """Cache bytes one token costs an MLA model: every layer's latent plus its RoPE key dims."""
    per_layer = record["kv_rank"] + record["n_kv_heads"] * record["rope_dims"]
    return n_layers * per_layer * torch.empty((), dtype=dtype).element_size()


@CACHE_FORMULAS.register(MLA_CONFIG_KEY, help="n_layers x (kv_rank + n_kv_heads x rope_dims) x bytes")
def mla_cache_bytes_per_token(hm: HeadModel, dtype: torch.dtype) -> int:
    """`mla_kv_bytes_per_token` of an MLA model: what `convert.evaluate.kv_report` sets beside its measured cache."""
    return mla_kv_bytes_per_token(getattr(hm.config, MLA_CONFIG_KEY), hm.n_layers, dtype)
