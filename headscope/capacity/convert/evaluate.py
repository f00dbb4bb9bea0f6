"""How a converted model compares: perplexity and KL to the original (through `headscope.eval.lm`), KV-cache bytes
(`kv_report`, the one report of bytes measured from a generation cache beside the formula, for gqa.json and mla.json).

Every NLL and KL figure is computed by `headscope.eval.lm` (`compare_lms` on `nll_sums` / `kl_sums`),
over the same prepared batches (`token_batches`), so the calibration KL of the grouping search, the
held-out KL in gqa.json and uptraining's distillation loss count the same positions the same way.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...data import Batch, batches, pad_id, prepare_tokens
from ...eval.lm import compare_lms
from ...models.adapter import HeadModel
from ...registry import Registry
from ..kv_bytes import kv_bytes_per_token, kv_cache_bytes


def token_batches(hm: HeadModel, data: Any, max_length: int, batch_size: int, limit: int | None) -> list[Batch]:
    """`data` (any form `prepare_tokens` accepts) as right-padded batches, passages of similar length together."""
    ids = prepare_tokens(hm, data, max_length, limit).ids
    return list(batches(ids, batch_size, pad_id(hm)))


def compare(reference: HeadModel, candidates: dict[str, HeadModel], data: Any, *, max_length: int = 64,
            batch_size: int = 8, limit: int | None = None, progress: bool = False) -> dict[str, dict[str, float]]:
    """One pass over `data`: perplexity of `reference` and of each candidate, and each candidate's mean
    per-token KL(reference || candidate) in nats (0 = same next-token distributions).

    Perplexity is exp of the mean next-token NLL over all real positions (the first token of a passage
    is not predicted). Returns {"reference": {"ppl", "tokens"}, name: {"ppl", "kl"}, ...}.
    """
    todo = token_batches(reference, data, max_length, batch_size, limit)
    return compare_lms(reference.model, {name: c.model for name, c in candidates.items()}, todo,
                       progress=progress)


def perplexity(hm: HeadModel, data: Any, **kw: Any) -> float:
    """Token-level perplexity (exp of the mean next-token NLL over all real positions) on `data`."""
    return compare(hm, {}, data, **kw)["reference"]["ppl"]


def kl_divergence(reference: HeadModel, model: HeadModel, data: Any, **kw: Any) -> float:
    """Mean per-token KL(reference || model) of next-token distributions on `data`, in nats."""
    return compare(reference, {"model": model}, data, **kw)["model"]["kl"]


# --- KV-cache bytes ------------------------------------------------------------------------------
def cache_bytes(cache: Any) -> int:
    """Bytes of all key and value tensors held by a transformers cache (e.g. DynamicCache)."""
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if t is not None:
                total += t.numel() * t.element_size()
    return int(total)


def measure_kv_bytes(hm: HeadModel, batch: int = 1, prompt_len: int = 16, new_tokens: int = 4,
                     seed: int = 0) -> tuple[int, int]:
    """KV-cache bytes after greedy generation of `new_tokens` from random prompts: (bytes, cached length)."""
    g = torch.Generator().manual_seed(seed)
    vocab = hm.vocab_size
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(hm.device)
    with torch.no_grad():
        out = hm.hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                                return_dict_in_generate=True, pad_token_id=pad_id(hm))
    # transformers 5 names the returned cache `cache` (older releases: `past_key_values`).
    cache = getattr(out, "cache", None) or out.past_key_values
    return cache_bytes(cache), int(cache.get_seq_length())


#: Per-token cache formulas of attention that caches something other than K/V heads, each registered under
#: the config attribute that marks such a model, its help the formula as the report names it. The MLA
#: package registers its latent cache here (this package cannot import it: mla imports convert).
CACHE_FORMULAS: Registry[Callable[[HeadModel, torch.dtype], int]] = Registry("KV-cache formula")
KV_HEADS_FORMULA = "headscope.capacity.kv_bytes.kv_cache_bytes"  # the formula of every K/V-heads model


def kv_report(hm: HeadModel, batch: int = 2, prompt_len: int = 16, new_tokens: int = 4, *,
              per_token: bool = False) -> dict[str, Any]:
    """KV-cache bytes measured from a real generation cache beside the formula, and whether they match.

    The formula is `headscope.capacity.kv_bytes.kv_cache_bytes` of the model's K/V heads, or the one
    registered in `CACHE_FORMULAS` for an attribute its config carries (MLA's latent cache): bytes per
    token x cached tokens x batch. `per_token` adds `bytes_per_token` and the formula's name (`formula`),
    which mla.json records (gqa.json does not)."""
    measured, seq_len = measure_kv_bytes(hm, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens)
    dtype = next(hm.model.parameters()).dtype
    entry = next((CACHE_FORMULAS.get(key) for key in CACHE_FORMULAS if getattr(hm.config, key, None)), None)
    if entry is None:
        name, bytes_per_token = KV_HEADS_FORMULA, kv_bytes_per_token(hm.config, dtype)
        calculated = kv_cache_bytes(hm.config, seq_len, batch=batch, dtype=dtype)
    else:
        name, bytes_per_token = entry.help, entry.fn(hm, dtype)
        calculated = bytes_per_token * seq_len * batch
    report: dict[str, Any] = {"measured": measured, "calculated": calculated}
    if per_token:
        report.update(bytes_per_token=bytes_per_token, formula=name)
    report.update(seq_len=seq_len, batch=batch, dtype=str(dtype).removeprefix("torch."), match=measured == calculated)
    return report
