"""Head-to-head similarity: attention-pattern JS divergence, output CKA, weight-subspace angles.

Every matrix is `[N, N]` over all N = n_layers * n_heads heads, head index `layer * n_heads + head`.

- `js`: Jensen-Shannon divergence (natural log, so in [0, ln 2]) between two heads' attention
  distributions for the same query on the same tokens, averaged over the selected queries.
- `cka`: linear CKA (Kornblith et al. 2019) of the heads' contributions to the residual stream
  (z_h through the head's slice of W_O); `cka_z`: the same on the raw head outputs z_h.
- `ov_*_cos`, `qk_*_cos`: mean cosine of the principal angles between the heads' OV and QK
  subspaces (1 = the same subspace, 0 = orthogonal).

Data is streamed: per batch, every layer's attention arrives from the statistics kernel in blocks
of queries (never a T x T map), reduced at once to the entries of the selected queries; JS needs
every head's row of the same query together, so those entries and the head outputs of one batch are
held until the forward ends, then reduced to sums (JS sums; per-minibatch unbiased HSIC for CKA,
or with `cka="exact"` a centred cross-covariance of all head outputs; the estimators are in `cka.py`)
and dropped.
"""

from __future__ import annotations

import io
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..attention import DEFAULT_BLOCK, check_block
from ..data import batches, pad_id, prepare_tokens, resolve_max_length
from ..errors import HeadscopeError, OptionError
from ..hooks import on_attention_blocks, on_head_outputs
from ..io import atomic_write_bytes
from ..models.adapter import HeadModel
from ..table import head_name, parse_head
from ..uncertainty import Accumulator, IntervalSettings, PassageSums
from ..version import versions

# The CKA estimators live in cka.py; their names stay importable from here (the API and `similar` use them).
from .cka import (  # noqa: F401
    # one chunk size for every pairwise computation (JS, subspaces, CKA)
    _CHUNK,
    CKA_ESTIMATORS,
    DEFAULT_CKA_BATCH,
    DEFAULT_CKA_MEMORY,
    DEFAULT_CKA_POOL,
    MinibatchCKA,
    SpilledExactCKA,
    StreamingCKA,
    check_cka_batch,
    check_cka_memory,
    hsic1_linear,
    linear_cka,
)
from .js import JS_ROWS, js_divergence, pair_intervals, pairwise_js_sums, split_rows  # noqa: F401 (js_divergence: the API's)

log = logging.getLogger(__name__)

LN2 = math.log(2.0)

# Pair metrics in the order similar_pairs.csv writes them, with what each means.
METRICS: dict[str, str] = {
    "js": "Jensen-Shannon divergence of the two heads' attention distributions, nats, mean over queries; "
          "0 = identical patterns, ln 2 = 0.693 = disjoint",
    "cka": "linear CKA of the heads' contributions to the residual stream (output through W_O); 1 = same up to "
           "rotation and scale",
    "ov_angle_cos": "mean cosine of the principal angles between the OV circuits' subspaces (read and write "
                    "together); 1 = same subspaces",
    "qk_angle_cos": "mean cosine of the principal angles between the QK circuits' subspaces (query side and key "
                    "side together)",
    "cka_z": "linear CKA of the raw head outputs z (before W_O)",
    "ov_read_cos": "OV read side: row space of W_V (what the head reads from the residual stream)",
    "ov_write_cos": "OV write side: column space of W_O's head slice (where the head writes)",
    "qk_query_cos": "QK query side: row space of W_Q (what queries read)",
    "qk_key_cos": "QK key side: row space of W_K (what keys read)",
}

# Default near-duplicate thresholds (see docs/similarity.md for how they were chosen).
DEFAULT_JS_MAX = 0.05
DEFAULT_CKA_MIN = 0.8

# --- weights ------------------------------------------------------------------------------------
@dataclass
class LayerWeights:
    """One layer's attention weights per head, Linear layout (out = W x)."""

    q: torch.Tensor  # [n_heads, d_head, d_model]
    k: torch.Tensor  # [n_kv_heads, d_head, d_model]
    v: torch.Tensor  # [n_kv_heads, d_head, d_model]
    o: torch.Tensor  # [n_heads, d_model, d_head]


def layer_weights(hm: HeadModel, layer: int) -> LayerWeights:
    """Per-head Q/K/V/O weights of `layer`, read through the adapter (fused Conv1D c_attn included)."""
    H, G, d, D = hm.n_heads, hm.n_kv_heads, hm.d_head, hm.d_model
    if hm.heads_in_layer(layer) != H:
        raise HeadscopeError(f"layer {layer} has {hm.heads_in_layer(layer)} heads but the model declares {H}; "
                             f"similarity needs every layer to keep all its heads (not a physically pruned model)")
    w = hm.qkv_weights(layer)  # Linear layout: q [H * d, D], k and v [G * d, D]
    o = hm.out_weight(layer).detach()  # [D, H * d]
    return LayerWeights(w.q.reshape(H, d, D), w.k.reshape(G, d, D), w.v.reshape(G, d, D),
                        o.reshape(D, H, d).permute(1, 0, 2))


def _orthonormal(a: torch.Tensor, rtol: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal bases of the column spaces of `a [..., D, r]`, columns past the rank zeroed, and the ranks."""
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    keep = s > rtol * s[..., :1].clamp_min(torch.finfo(s.dtype).tiny)
    return u * keep[..., None, :], keep.sum(-1)


def principal_cosines(a: Any, b: Any, rtol: float = 1e-6) -> np.ndarray:
    """Cosines of the principal angles between the column spaces of `a [D, ra]` and `b [D, rb]`, largest first."""
    ta = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    tb = torch.as_tensor(np.asarray(b), dtype=torch.float64)
    if ta.dim() != 2 or tb.dim() != 2 or ta.shape[0] != tb.shape[0]:
        raise HeadscopeError(f"principal angles need two matrices with the same number of rows; "
                             f"got shapes {tuple(ta.shape)} and {tuple(tb.shape)}")
    qa, ra = _orthonormal(ta, rtol)
    qb, rb = _orthonormal(tb, rtol)
    s = torch.linalg.svdvals(qa.T @ qb).clamp(0.0, 1.0)
    return s[: int(min(ra, rb))].numpy()


def _pairwise_mean_cos(bases: torch.Tensor, ranks: torch.Tensor) -> np.ndarray:
    """Mean principal-angle cosine between every pair of subspaces; `bases [N, D, r]` (zeroed past rank).

    The cosines are the singular values of Qa^T Qb; their sum (the nuclear norm) comes from the
    eigenvalues of G^T G (cos^2), cheaper than an SVD per pair. Zeroed columns add zero cosines, so
    the sum is over min(rank_a, rank_b) angles. Only the upper triangle is computed.
    """
    n, dim, r = bases.shape
    out = torch.zeros(n, n, dtype=torch.float64)
    rows = max(1, _CHUNK // max(1, n * r * r))
    for i0 in range(0, n, rows):
        g = torch.einsum("idr,jds->ijrs", bases[i0:i0 + rows], bases[i0:])  # [c, N - i0, r, r]
        cos2 = torch.linalg.eigvalsh(g.transpose(-1, -2) @ g).clamp(0.0, 1.0)
        out[i0:i0 + rows, i0:] = cos2.sqrt().sum(-1)
    out = torch.triu(out) + torch.triu(out, 1).T
    denom = torch.minimum(ranks[:, None], ranks[None, :]).to(torch.float64)
    res = (out / denom.clamp_min(1)).numpy()
    res[denom.numpy() == 0] = np.nan
    return res


def _subspace_similarity(factors: torch.Tensor, owner: torch.Tensor | None = None) -> np.ndarray:
    """`[N, N]` mean principal-angle cosines between the column spaces of `factors [U, D, r]`;
    `owner [N]` maps each head to its factor (GQA: query heads share their KV head's factor)."""
    bases, ranks = _orthonormal(factors.detach().double().cpu())  # small; the pairwise loop runs on CPU
    sim = _pairwise_mean_cos(bases, ranks)
    return sim if owner is None else sim[np.ix_(owner.numpy(), owner.numpy())]


def weight_similarity(hm: HeadModel) -> dict[str, np.ndarray]:
    """Principal-angle similarity of every pair of heads' OV and QK subspaces, `[N, N]` each.

    The OV circuit of head h, W_O^h W_V^g (g = its KV head), is a d_model x d_model map of rank
    <= d_head: it reads from the row space of W_V^g and writes into the column space of W_O^h
    (exactly the circuit's row and column spaces when both factors have full rank d_head). The QK
    circuit W_Q^h^T W_K^g reads queries from the row space of W_Q^h and keys from that of W_K^g.
    Query heads sharing a KV head (GQA) share W_V and W_K, so their OV read side and QK key side
    are the same subspace (cos 1) by construction; only the write and query sides tell them apart.
    """
    o, q, k, v = [], [], [], []
    for layer in range(hm.n_layers):
        w = layer_weights(hm, layer)
        o.append(w.o)  # [H, D, d]: columns span where the head writes
        q.append(w.q.transpose(-1, -2))  # [H, D, d]: columns span what queries read
        k.append(w.k.transpose(-1, -2))  # [G, D, d]
        v.append(w.v.transpose(-1, -2))  # [G, D, d]
    heads = torch.arange(hm.n_layers * hm.n_heads)
    kv_owner = (heads // hm.n_heads) * hm.n_kv_heads + (heads % hm.n_heads) // hm.group_size
    out = {"ov_write_cos": _subspace_similarity(torch.cat(o)),
           "ov_read_cos": _subspace_similarity(torch.cat(v), kv_owner),
           "qk_query_cos": _subspace_similarity(torch.cat(q)),
           "qk_key_cos": _subspace_similarity(torch.cat(k), kv_owner)}
    out["ov_angle_cos"] = (out["ov_write_cos"] + out["ov_read_cos"]) / 2
    out["qk_angle_cos"] = (out["qk_query_cos"] + out["qk_key_cos"]) / 2
    return out


# --- Jensen-Shannon ---------------------------------------------------------------------------------
def check_thresholds(js_max: float, cka_min: float) -> None:
    """Raise a clear error unless 0 < js_max <= ln 2 and 0 <= cka_min < 1."""
    if not 0 < js_max <= LN2 or not 0 <= cka_min < 1:
        raise HeadscopeError(f"near-duplicate thresholds need 0 < js_max <= ln 2 = {LN2:.3f} and "
                             f"0 <= cka_min < 1; got js_max={js_max}, cka_min={cka_min}")


# --- the result -------------------------------------------------------------------------------------
@dataclass
class Similarity:
    """Pairwise head similarity matrices `[N, N]` (head index layer * n_heads + head) plus metadata."""

    n_layers: int
    n_heads: int
    matrices: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    js_rows: PassageSums | None = field(default=None, repr=False)  # per-passage JS sums (`js_intervals`)

    @property
    def n(self) -> int:
        return self.n_layers * self.n_heads

    def head_names(self) -> list[str]:
        """`L0H0, L0H1, ...` in index order."""
        return [head_name(i // self.n_heads, i % self.n_heads) for i in range(self.n)]

    def index(self, head: str | tuple[int, int]) -> int:
        """Matrix index of a head given as `L3H7` or `(3, 7)`."""
        layer, h = parse_head(head) if isinstance(head, str) else head
        if not (0 <= layer < self.n_layers and 0 <= h < self.n_heads):
            raise HeadscopeError(f"head {head_name(layer, h)} does not exist in a {self.n_layers} x "
                                 f"{self.n_heads} model")
        return layer * self.n_heads + h

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.matrices[name]
        except KeyError:
            raise KeyError(f"no similarity matrix {name!r}; have {', '.join(self.matrices)}") from None

    def pair(self, a: str | tuple[int, int], b: str | tuple[int, int]) -> dict[str, float]:
        """Every metric of one pair of heads."""
        i, j = self.index(a), self.index(b)
        return {name: float(m[i, j]) for name, m in self.matrices.items()}

    def pairs(self) -> Any:
        """A pandas DataFrame, one row per unordered pair: head_a, head_b, the metrics, same_layer; js ascending."""
        import pandas as pd  # only for this table; pandas costs ~0.5 s to import

        names = self.head_names()
        iu, ju = np.triu_indices(self.n, k=1)
        cols: dict[str, Any] = {"head_a": [names[i] for i in iu], "head_b": [names[j] for j in ju]}
        for name in [m for m in METRICS if m in self.matrices] + [m for m in self.matrices if m not in METRICS]:
            cols[name] = self.matrices[name][iu, ju]
        cols["same_layer"] = (iu // self.n_heads == ju // self.n_heads).astype(int)
        df = pd.DataFrame(cols)
        keys = [k for k in ("js", "cka") if k in df.columns]
        if keys:
            df = df.sort_values(keys, ascending=[True, False][: len(keys)], kind="stable", na_position="last")
        return df.reset_index(drop=True)

    def js_intervals(self, pairs: Any, settings: IntervalSettings) -> tuple[np.ndarray, np.ndarray]:
        """The bootstrap interval over passages of the js of each pair `[(head_a, head_b), ...]` (NaN without
        per-passage sums, e.g. a similarity.npz read back)."""
        return pair_intervals(self.js_rows, [(self.index(a), self.index(b)) for a, b in pairs], settings)

    def clusters(self, js_max: float = DEFAULT_JS_MAX, cka_min: float = DEFAULT_CKA_MIN) -> list[dict[str, Any]]:
        """Groups of near-duplicate heads: complete-linkage clusters in which EVERY pair has
        js <= js_max and cka >= cka_min (pairs with NaN never qualify). Clusters of 2+ heads only."""
        from scipy.cluster.hierarchy import fcluster, linkage  # scipy only for clustering (slow to import)
        from scipy.spatial.distance import squareform

        check_thresholds(js_max, cka_min)
        js, cka = self["js"], self["cka"]
        # Scaled so that 1 is the edge of both thresholds: d <= 1 iff the pair qualifies on both.
        with np.errstate(invalid="ignore"):
            d = np.maximum(js / js_max, (1 - cka) / (1 - cka_min))
        d = np.where(np.isnan(d), 1e6, np.maximum(d, 0.0))
        np.fill_diagonal(d, 0.0)
        d = (d + d.T) / 2
        if self.n < 2:
            return []
        labels = fcluster(linkage(squareform(d, checks=False), method="complete"), t=1.0, criterion="distance")
        names = self.head_names()
        out: list[dict[str, Any]] = []
        for lab in np.unique(labels):
            idx = np.flatnonzero(labels == lab)
            if len(idx) < 2:
                continue
            sub = np.ix_(idx, idx)
            iu = np.triu_indices(len(idx), k=1)
            out.append({"heads": [names[i] for i in idx], "size": int(len(idx)),
                        "max_js": float(js[sub][iu].max()), "mean_js": float(js[sub][iu].mean()),
                        "min_cka": float(cka[sub][iu].min()), "mean_cka": float(cka[sub][iu].mean())})
        out.sort(key=lambda c: (-c["size"], c["mean_js"]))
        return out

    def to_npz(self, path: Any = None) -> bytes:
        """similarity.npz: every matrix, the head names and the metadata (JSON); written atomically if `path`."""
        buf = io.BytesIO()
        matrices: dict[str, Any] = {k: v.astype(np.float64) for k, v in self.matrices.items()}
        np.savez_compressed(buf, heads=np.array(self.head_names()), n_layers=self.n_layers, n_heads=self.n_heads,
                            meta=np.array(json.dumps(self.meta, default=str)), **matrices)
        data = buf.getvalue()
        if path is not None:
            atomic_write_bytes(path, data)
        return data

    @classmethod
    def from_npz(cls, path: Any) -> "Similarity":
        """Read a similarity.npz written by `to_npz`."""
        with np.load(path, allow_pickle=False) as z:
            skip = {"heads", "n_layers", "n_heads", "meta"}
            return cls(int(z["n_layers"]), int(z["n_heads"]), {k: z[k] for k in z.files if k not in skip},
                       json.loads(str(z["meta"])))


# --- streaming over data ----------------------------------------------------------------------------
def _query_selection(ids: list[list[int]], causal: bool, max_tokens: int | None, seed: int) -> list[np.ndarray]:
    """Per passage, a bool array of the query positions JS uses.

    Causal models skip position 0: with one visible key every head's distribution there is the same
    one-hot, which would pull every JS toward 0. With `max_tokens`, a seeded uniform sample of them.
    """
    sel = [np.arange(len(t)) >= (1 if causal else 0) for t in ids]
    total = int(sum(s.sum() for s in sel))
    if total == 0:
        raise HeadscopeError("no query tokens to compare: causal models need passages of at least 2 tokens")
    if max_tokens is not None:
        if max_tokens < 1:
            raise OptionError("js_max_tokens", f"must be at least 1, got {max_tokens}")
        if max_tokens < total:
            keep = np.zeros(total, dtype=bool)
            keep[np.random.default_rng(seed).choice(total, size=max_tokens, replace=False)] = True
            flat_pos = 0
            for s in sel:
                where = np.flatnonzero(s)
                s[where] = keep[flat_pos:flat_pos + len(where)]
                flat_pos += len(where)
    return sel


class _Stream:
    """One pass over the data: the hooks (`keep_block`, `keep_z`), the JS sums and the CKA estimator."""

    def __init__(self, hm: HeadModel, selection: list[np.ndarray], r: torch.Tensor, cka: str, cka_batch: int,
                 cka_pool: int, cka_memory: int, seed: int) -> None:
        self.hm, self.selection, self.r = hm, selection, r
        self.cka_batch, self.cka_pool, self.cka_memory = cka_batch, cka_pool, cka_memory
        self.n_layers, self.device, n = hm.n_layers, hm.device, hm.n_layers * hm.n_heads
        self.js_sum = torch.zeros(n, n, dtype=torch.float64, device=self.device)
        self.n_queries, self.n_tokens = 0, 0
        self.estimator: SpilledExactCKA | MinibatchCKA
        if cka == "exact":
            self.estimator = SpilledExactCKA(n, hm.d_head, cka_memory, device=self.device)
        else:
            self.estimator = MinibatchCKA(n, hm.d_head, cka_batch, {"cka": r.to(self.device), "cka_z": None},
                                          pool=cka_pool, seed=seed, device=self.device)
        self.maps: dict[int, list[torch.Tensor]] = {}
        self.row_counts: dict[int, list[torch.Tensor]] = {}  # layer -> per block, entries of each batch row
        self.js_rows = Accumulator(len(selection), max_rows=JS_ROWS)  # per-passage JS sums and queries
        self.js_rows.declare("js", (n, n))
        self.js_rows.declare("js|count", ())
        self.outputs: dict[int, torch.Tensor] = {}
        self.cur: dict[str, torch.Tensor] = {}

    def keep_block(self, layer: int, q_start: int, probs: torch.Tensor) -> None:
        """Keep only the selected (query, key) entries of probs `[batch, head, q_block, key]` -> `[head, entries]`."""
        q_end = q_start + probs.shape[2]
        entries = self.cur["queries"][:, q_start:q_end, None] & self.cur["tokens"][:, None, :]  # [B, q_block, K]
        if self.hm.causal:
            qpos = torch.arange(q_start, q_end, device=entries.device)
            entries = entries & (torch.arange(entries.shape[2], device=entries.device)[None, :] <= qpos[:, None])
        entries = entries.to(probs.device)
        # layers of a dispatched model may sit on other devices: gather on hm.device
        if bool(entries.any()):
            self.maps.setdefault(layer, []).append(probs.permute(1, 0, 2, 3)[:, entries].to(self.device))
            self.row_counts.setdefault(layer, []).append(entries.sum((1, 2)).cpu())

    def keep_z(self, layer: int, z: torch.Tensor) -> None:
        """Keep the head outputs of the non-padding tokens, `[tokens, head, d_head]`."""
        self.outputs[layer] = z[self.cur["tokens"].to(z.device)].to(self.device)

    def add(self, batch: Any) -> None:
        """Run one batch through the model and fold its attention and head outputs into the sums."""
        n_layers, device = self.n_layers, self.device
        valid = batch.attention_mask.bool().to(device)  # [B, P]
        queries = torch.zeros_like(valid)
        for row, i in enumerate(batch.index):
            queries[row, : len(self.selection[i])] = torch.from_numpy(self.selection[i])
        self.cur["queries"], self.cur["tokens"] = queries, valid
        self.hm.model(**batch.model_inputs(device), use_cache=False)
        if len(self.outputs) != n_layers:
            raise HeadscopeError(f"captured head outputs for {len(self.outputs)} of {n_layers} layers; "
                                 f"the model's forward skipped some layers")
        if bool(queries.any()):
            if len(self.maps) != n_layers:
                raise HeadscopeError(f"captured attention for {len(self.maps)} of {n_layers} layers; "
                                     f"the model's forward skipped some layers")
            # every layer's blocks arrive in the same (block, batch, query, key) order; each passage's entries
            # are scored apart, so its JS sum can be resampled (the totals are their sum)
            entries = torch.cat([torch.cat(self.maps[l], dim=1) for l in range(n_layers)])
            for row, idx in enumerate(split_rows(self.row_counts[0], len(batch.index))):
                if len(idx):
                    js = pairwise_js_sums(entries[:, idx])
                    self.js_sum += js
                    self.js_rows.add("js", [batch.index[row]], js.cpu().numpy()[None])
        self.js_rows.add("js|count", list(batch.index), queries.sum(1).cpu().numpy().astype(float))
        self.n_queries += int(queries.sum())
        self.maps.clear()
        self.row_counts.clear()
        feats = torch.cat([self.outputs[l] for l in range(n_layers)], dim=1)  # [tokens, N, d_head]
        self.estimator.update(feats)
        self.n_tokens += int(valid.sum())
        self.outputs.clear()

    def close(self) -> None:
        """Release the exact estimator's spill file (the minibatch one holds nothing to release)."""
        if isinstance(self.estimator, SpilledExactCKA):
            self.estimator.close()

    def ckas(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The CKA matrices and their metadata; closes the exact estimator (minibatch: counts its own tokens)."""
        if isinstance(self.estimator, SpilledExactCKA):
            try:
                matrices = self.estimator.ckas({"cka": self.r, "cka_z": None})
            finally:
                self.estimator.close()
            return matrices, {"cka_estimator": "exact", "cka_memory": self.cka_memory,
                              "cka_blocks": -(-self.js_sum.shape[0] // self.estimator.block)}
        matrices = self.estimator.cka()  # first: it adds the pool's last minibatch
        self.n_tokens = self.estimator.count
        return matrices, {"cka_estimator": "minibatch unbiased HSIC", "cka_batch": self.cka_batch,
                          "cka_pool": self.cka_pool, "cka_minibatches": self.estimator.minibatches}


@dataclass(frozen=True, kw_only=True)
class SimilaritySettings:
    """How `similarity` reads and measures. `js_max_tokens` caps the query tokens JS is averaged over (a seeded
    uniform sample), for big models; CKA always uses every non-padding token. `cka="minibatch"` estimates CKA
    minibatch by minibatch (`MinibatchCKA`: `cka_batch` tokens drawn from a pool of `cka_pool`; memory
    O(heads x cka_batch^2)); `cka="exact"` computes the full-data CKA of the `(heads x d_head)^2`
    cross-covariance (`SpilledExactCKA`: head outputs spilled to the temporary folder, at most `cka_memory`
    bytes of it in memory at once). Attention maps come from the statistics kernel in blocks of `block`
    queries. `weights=False` skips the weight-space angles."""

    max_length: int | None = None
    batch_size: int = 16
    limit: int | None = None
    js_max_tokens: int | None = None
    seed: int = 0
    weights: bool = True
    cka: str = "minibatch"
    cka_batch: int = DEFAULT_CKA_BATCH
    cka_pool: int = DEFAULT_CKA_POOL
    cka_memory: int = DEFAULT_CKA_MEMORY
    block: int = DEFAULT_BLOCK


def similarity(hm: HeadModel, data: Any = None, settings: SimilaritySettings | None = None, *,
               progress: bool = False) -> Similarity:
    """Pairwise similarity of all heads of `hm` over `data` (default: the built-in English sample), measured
    as `settings` say (default `SimilaritySettings()`). `data` takes the same forms as `headscope.analyze`."""
    settings = settings or SimilaritySettings()
    batch_size, seed, cka, block = settings.batch_size, settings.seed, settings.cka, settings.block
    why = hm.spec.refusal("similar")
    if why:
        raise HeadscopeError(f"head similarity cannot serve the {hm.spec.family} family: {why}")
    if cka not in CKA_ESTIMATORS:
        raise HeadscopeError(f"CKA estimator {cka!r} is not one of {', '.join(CKA_ESTIMATORS)}")
    check_cka_batch(settings.cka_batch)
    check_block(block)
    max_len = resolve_max_length(hm, settings.max_length)
    tokens = prepare_tokens(hm, data, max_len, settings.limit)
    ids, source, truncated = tokens.ids, tokens.source, tokens.truncated
    for layer in range(hm.n_layers):
        if hm.heads_in_layer(layer) != hm.n_heads:
            raise HeadscopeError(f"layer {layer} has {hm.heads_in_layer(layer)} heads, not {hm.n_heads}; "
                                 f"similarity needs an unpruned model")
    selection = _query_selection(ids, hm.causal, settings.js_max_tokens, seed)
    n_layers, n_heads = hm.n_layers, hm.n_heads
    r = torch.cat([torch.linalg.qr(layer_weights(hm, l).o.double())[1] for l in range(n_layers)])  # [N, d, d]
    stream = _Stream(hm=hm, selection=selection, r=r, cka=cka, cka_batch=settings.cka_batch,
                     cka_pool=settings.cka_pool, cka_memory=settings.cka_memory, seed=seed)
    n_batches = (len(ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches, desc="similar", unit="batch", disable=not progress, leave=False)
    try:
        with (on_attention_blocks(hm, stream.keep_block, block), on_head_outputs(hm, stream.keep_z),
              torch.inference_mode()):
            for batch in batches(ids, batch_size, pad_id=pad_id(hm)):
                stream.add(batch)
                bar.update(1)
    except BaseException:
        stream.close()
        raise
    finally:
        bar.close()

    cka_matrices, cka_meta = stream.ckas()
    matrices = {"js": (stream.js_sum / max(stream.n_queries, 1)).cpu().numpy(), **cka_matrices}
    if settings.weights:
        matrices.update(weight_similarity(hm))
    meta = {"model": hm.name, "model_source": hm.source, "model_type": hm.config.model_type,
            "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head,
            "causal": hm.causal, "data": source, "passages": len(ids), "truncated": truncated,
            "max_length": max_len, "batch_size": batch_size, "js_queries": stream.n_queries,
            "cka_tokens": stream.n_tokens, **cka_meta, "js_max_tokens": settings.js_max_tokens, "seed": seed,
            "js_log_base": "e", "versions": versions()}
    return Similarity(n_layers, n_heads, matrices, meta, stream.js_rows.result())
