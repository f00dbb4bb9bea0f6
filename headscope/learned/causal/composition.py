"""Q, K and V composition scores between heads of different layers (Elhage et al. 2021), MHA, MQA and GQA alike.

In the residual basis (column vectors), head A's OV circuit is `W_O^A W_V^A` and head B's QK circuit
`W_Q^B^T W_K^B`. A sender A of an earlier layer composes with a receiver B through B's queries, keys or values:

    Q: ||(W_Q^B^T W_K^B)^T W_O^A W_V^A||_F / (||W_Q^B^T W_K^B||_F ||W_O^A W_V^A||_F)
    K: ||(W_Q^B^T W_K^B)   W_O^A W_V^A||_F / (same)
    V: ||(W_O^B W_V^B)     W_O^A W_V^A||_F / (||W_O^B W_V^B||_F ||W_O^A W_V^A||_F)

Every matrix is a product `L^T R` of two `[d_head, d_model]` factors, so each norm is a trace of d_head x d_head
matrices (`||L1^T C R2||_F^2 = tr(C^T L1 L1^T C R2 R2^T)`) and no d_model x d_model matrix is formed. A query head
uses its KV group's key and value weights (`group_size` query heads share one KV head). Norm weights between the
heads are not folded in, and no random-matrix baseline is subtracted: scores compare heads of one model.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import HeadscopeError
from ...models.adapter import HeadModel

KINDS = ("q", "k", "v")


@dataclass
class HeadFactors:
    """One layer's per-query-head factors `[heads, d_head, d_model]`, float64: W_Q, W_K and W_V of its KV group,
    and W_O^T (the head's columns of the output projection, transposed)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    heads: list[int]


def factors(hm: HeadModel, layer: int) -> HeadFactors:
    """The layer's factors, each query head paired with its KV head."""
    kept = hm.kept_heads(layer)
    d, D = hm.d_head, hm.d_model
    w = hm.qkv_weights(layer)
    kv_ids = hm.kv_heads_in_layer(layer)
    group = [kv_ids.index(h // hm.group_size) for h in kept]
    q = w.q.detach().double().view(len(kept), d, D)
    k = w.k.detach().double().view(len(kv_ids), d, D)[group]
    v = w.v.detach().double().view(len(kv_ids), d, D)[group]
    o = hm.out_weight(layer).detach().double().view(D, len(kept), d).permute(1, 2, 0)
    return HeadFactors(q.cpu(), k.cpu(), v.cpu(), o.cpu(), kept)


def _gram(x: torch.Tensor) -> torch.Tensor:
    return x @ x.transpose(-1, -2)  # [heads, d, d]


def _norm_sq(l_gram: torch.Tensor, r_gram: torch.Tensor) -> torch.Tensor:
    """||L^T R||_F^2 = tr(L L^T R R^T) for each head."""
    return (l_gram * r_gram.transpose(-1, -2)).sum((-1, -2))


def _product_norm_sq(l1: torch.Tensor, r1: torch.Tensor, l2: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """||(L1^T R1)(L2^T R2)||_F^2 for every receiver b (L1, R1) and sender a (L2, R2): `[receivers, senders]`."""
    c = torch.einsum("bim,ajm->baij", r1, l2)  # R1 L2^T, [b, a, d, d]
    g1, g2 = _gram(l1), _gram(r2)  # [b, d, d], [a, d, d]
    inner = torch.einsum("bakj,bki,bail->bajl", c, g1, c)  # C^T G1 C
    return (inner * g2[None].transpose(-1, -2)).sum((-1, -2))


def composition(hm: HeadModel) -> dict[str, np.ndarray]:
    """Scores `{q, k, v: [sender layer, sender head, receiver layer, receiver head]}`, NaN unless the receiver's
    layer comes after the sender's (and both heads exist)."""
    if hm.n_layers < 2:
        raise HeadscopeError(f"composition needs heads in two layers; {hm.name} has {hm.n_layers} layer")
    L, H = hm.n_layers, hm.n_heads
    out = {k: np.full((L, H, L, H), np.nan) for k in KINDS}
    layers = [l for l in range(L) if hm.heads_in_layer(l)]
    f = {l: factors(hm, l) for l in layers}
    ov_sq = {l: _norm_sq(_gram(f[l].o), _gram(f[l].v)) for l in layers}
    qk_sq = {l: _norm_sq(_gram(f[l].q), _gram(f[l].k)) for l in layers}
    for a in layers:
        sa = f[a]
        for b in (l for l in layers if l > a):
            sb = f[b]
            pairs = {"q": (sb.k, sb.q, qk_sq[b]), "k": (sb.q, sb.k, qk_sq[b]), "v": (sb.o, sb.v, ov_sq[b])}
            for kind, (l1, r1, den_b) in pairs.items():
                num = _product_norm_sq(l1, r1, sa.o, sa.v)  # [receivers, senders]
                score = torch.sqrt(num.clamp_min(0) / (den_b[:, None] * ov_sq[a][None, :]))
                out[kind][np.ix_([a], sa.heads, [b], sb.heads)] = score.T.numpy()[None, :, None, :]
    return out


def top_pairs(scores: np.ndarray, k: int = 10) -> list[tuple[int, int, int, int, float]]:
    """The k highest-scoring (sender layer, sender head, receiver layer, receiver head, score)."""
    flat = np.where(np.isnan(scores), -np.inf, scores).ravel()
    order = np.argsort(-flat)[:k]
    out = []
    for i in order:
        if np.isfinite(flat[i]):
            a, b, c, d = (int(x) for x in np.unravel_index(i, scores.shape))
            out.append((a, b, c, d, float(flat[i])))
    return out


def npz_bytes(scores: dict[str, np.ndarray], meta: Mapping[str, Any]) -> bytes:
    """composition.npz: q, k, v `[sender layer, sender head, receiver layer, receiver head]` and meta (JSON text),
    written with fixed zip timestamps so that the same scores give the same bytes."""
    buf = io.BytesIO()
    arrays = {**{k: v.astype(np.float64) for k, v in scores.items()}, "meta": np.array(json.dumps(meta, default=str))}
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
    return buf.getvalue()
