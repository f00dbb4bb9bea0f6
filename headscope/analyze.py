"""`analyze`: stream data through a model and return per-head attention statistics."""

from __future__ import annotations

import logging
import platform
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from . import __version__
from .data import SAMPLE, TextSource, TokenClasses, batches, read_texts, tokenize
from .errors import HeadscopeError
from .models.adapter import HeadModel
from .stats import HeadStats, collect_stats
from .table import HeadTable

log = logging.getLogger(__name__)

Data = "str | Path | TextSource | Sequence[str] | Sequence[Sequence[int]] | None"


def resolve_max_length(hm: HeadModel, max_length: int | None) -> int:
    """The user's max length capped at the model's positions (default: 128, or fewer if the model has fewer)."""
    limit = hm.max_positions
    if max_length is not None and max_length < 2:
        raise HeadscopeError(f"--max-length must be at least 2 tokens, got {max_length}")
    want = max_length or 128
    if limit is not None and want > limit:
        if max_length is not None:
            log.warning("--max-length %d exceeds the model's %d positions; using %d", want, limit, limit)
        want = limit
    return want


def prepare_tokens(hm: HeadModel, data: Any, max_length: int, limit: int | None = None,
                   by_words: bool = False) -> tuple[list[list[int]], str, int, TextSource | None, Any]:
    """Turn any accepted data form into token-id lists: (ids, source, n_truncated, texts, word_ids)."""
    if data is not None and not isinstance(data, (str, Path, TextSource)) and len(data) and \
            not isinstance(data[0], str):
        ids = [list(map(int, t)) for t in data][:limit]
        if not ids or any(len(t) == 0 for t in ids):
            raise HeadscopeError("token-id data must hold at least one non-empty sequence")
        long = [len(t) for t in ids if len(t) > max_length]
        if long:
            log.warning("%d sequence(s) were longer than %d tokens and were truncated", len(long), max_length)
        return [t[:max_length] for t in ids], "token-ids", len(long), None, None
    if isinstance(data, (str, Path)) or data is None:
        source = read_texts(data, limit)
    elif isinstance(data, TextSource):
        source = data if limit is None else TextSource(data.texts[:limit], data.source,
                                                       data.sentences[:limit] if data.sentences else None)
    else:
        texts = [t for t in data if t.strip()][:limit]
        if not texts:
            raise HeadscopeError("no text to analyse: the list is empty or holds only blank strings")
        source = TextSource(texts, "in-memory")
    if hm.tokenizer is None:
        raise HeadscopeError("this model has no tokenizer: pass token ids (a list of lists of ints) instead of text")
    ids, word_ids, truncated = tokenize(hm.tokenizer, source, max_length, by_words=by_words)
    return ids, source.source, truncated, source, word_ids


def pad_id(hm: HeadModel) -> int:
    """A padding id (any id works: padded positions are masked out)."""
    tok = hm.tokenizer
    for cand in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None),
                 getattr(hm.config, "pad_token_id", None)):
        if isinstance(cand, int):
            return cand
    return 0


def token_classes(hm: HeadModel) -> TokenClasses:
    """Special/punctuation flags for the model's vocabulary (all False without a tokenizer)."""
    vocab = int(hm.model.get_input_embeddings().num_embeddings)
    if hm.tokenizer is None:
        return TokenClasses.none(vocab)
    return TokenClasses.from_tokenizer(hm.tokenizer, vocab)


def run_stats(hm: HeadModel, ids: list[list[int]], batch_size: int, progress: bool = False) -> HeadStats:
    """Stream token-id sequences through the model in batches and return the summed statistics."""
    stats = HeadStats(hm.n_layers, hm.n_heads)
    flags = token_classes(hm)
    n_batches = (len(ids) + batch_size - 1) // batch_size
    bar = tqdm(total=n_batches, desc="analyze", unit="batch", disable=not progress, leave=False)
    try:
        with collect_stats(hm, stats, flags) as session, torch.inference_mode():
            for batch in batches(ids, batch_size, pad_id=pad_id(hm)):
                session.set_batch(batch.attention_mask, batch.input_ids)
                hm.model(**batch.model_inputs(hm.device), use_cache=False)
                bar.update(1)
    finally:
        bar.close()
    return stats


def versions() -> dict[str, str]:
    import transformers

    return {"headscope": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def analyze(
    hm: HeadModel,
    data: Any = None,
    *,
    max_length: int | None = None,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> HeadTable:
    """Per-head attention statistics of `hm` over `data` (default: the built-in English sample).

    `data` is a path (.txt / .jsonl / .conllu), a TextSource, a list of strings, or a list of
    token-id lists. Returns a HeadTable whose columns are listed in `headscope.stats.STATISTICS`.
    """
    torch.manual_seed(seed)
    np.random.seed(seed)
    max_len = resolve_max_length(hm, max_length)
    ids, source, truncated, _, _ = prepare_tokens(hm, data, max_len, limit)
    stats = run_stats(hm, ids, batch_size, progress)
    return table_from_stats(hm, stats, {
        "data": source, "passages": len(ids), "truncated": truncated, "max_length": max_len,
        "batch_size": batch_size, "seed": seed,
    })


def table_from_stats(hm: HeadModel, stats: HeadStats, meta: dict[str, Any]) -> HeadTable:
    """A HeadTable of the statistics' means, with model facts, versions and the raw sums in meta."""
    return HeadTable(hm.n_layers, hm.n_heads, stats.means(), {
        "model": hm.name, "model_source": hm.source, "model_type": hm.config.model_type,
        "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head,
        "causal": hm.causal, "tokens_seen": stats.tokens, **meta, "versions": versions(),
        "stats": stats.to_dict(),
    })
