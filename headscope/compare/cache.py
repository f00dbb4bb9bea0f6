"""OTHER as BASE decoding through a head-aware KV cache (`--cache DIR`): `kvcache`'s choices judged like any model.

The cache is given as DuoAttention's pattern directory, what `kvcache --export-card` and `roles --long --export-card
... --card-format duo` write and what kvpress's DuoAttentionPress reads: `full_attention_heads.tsv` (tab-separated,
`[layers, KV heads]`, higher = keep the full KV) and `config.json` (`sink_size`, `recent_size`: what a streaming head
keeps). The `--keep-full` share of KV heads with the highest scores keep their whole KV (ties by position, first
first); the others keep `sink_size` first and `recent_size` most recent tokens (`capacity.kvcache.CachePlan`).
`--cache-reversed` keeps the lowest-scoring share instead: the same bytes, the pattern's choice turned upside down.

The cache may also be a `kvcache` run (its --out folder or its kvcache.json): OTHER then decodes through the cache
that run chose, its full KV heads as the chosen row holds them (`capacity.kvcache.plans`: by default the score's
choice at the run's first budget, `--cache-row` another row). Its plan is checked against the model's layers and KV
heads before any forward.

Every sequence an OTHER row reads then runs alone through a fresh `HeadAwareCache` (the prompt prefilled in one
forward, which `capacity/kvcache` tests equal to decoding it token by token), so each item's logits are what a
model decoding with that cache would produce.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import torch

from ..capacity.kvcache import CachePlan, HeadAwareCache, check_supported, head_aware_attention
from ..capacity.kvcache.choice import n_full_for
from ..capacity.kvcache.plans import check_plan_fits, is_report, plan_of_row, read_report, row_name, shipped_row
from ..errors import HeadscopeError
from ..io import inside
from ..models.adapter import HeadModel
from ..options import OptionError

PATTERN, CONFIG = "full_attention_heads.tsv", "config.json"


@dataclass(frozen=True)
class CachePattern:
    """A DuoAttention pattern: per-KV-head scores `[layers, KV heads]` and what streaming heads keep."""

    scores: np.ndarray
    sink: int
    window: int
    source: str

    def plan(self, hm: HeadModel, keep_full: float, reversed_: bool = False) -> CachePlan:
        """The cache keeping the `keep_full` share of KV heads in full: the highest scores (lowest, `reversed_`)."""
        L, G = self.scores.shape
        if (L, G) != (hm.n_layers, hm.n_kv_heads):
            raise HeadscopeError(f"{self.source} holds [{L}, {G}] scores, {hm.name} has {hm.n_layers} layers x "
                                 f"{hm.n_kv_heads} KV heads")
        flat = self.scores.ravel() * (-1.0 if reversed_ else 1.0)
        order = np.argsort(-flat, kind="stable")[:n_full_for(keep_full, flat.size)]
        full: list[list[int]] = [[] for _ in range(L)]
        for i in order:
            full[int(i) // G].append(int(i) % G)
        return CachePlan(tuple(tuple(sorted(f)) for f in full), G, hm.n_heads // G, self.sink, self.window)

    def record(self, plan: CachePlan, reversed_: bool) -> dict[str, Any]:
        return plan_record(plan, self.source, reversed_)


@dataclass(frozen=True)
class KvcacheChoice:
    """One row of a kvcache run's report: the cache that run measured, as OTHER decodes through it."""

    report: dict[str, Any]
    row: dict[str, Any]
    source: str

    def plan(self, hm: HeadModel, keep_full: float = 1.0, reversed_: bool = False) -> CachePlan:
        """The row's plan, refused when its layers or KV heads are not `hm`'s (the row holds its full heads:
        `keep_full` and `reversed_` take no part)."""
        plan = plan_of_row(self.report, self.row, self.source)
        check_plan_fits(plan, hm, f"{self.source} ({row_name(self.row)})")
        return plan

    def record(self, plan: CachePlan, reversed_: bool = False) -> dict[str, Any]:
        return plan_record(plan, self.source, reversed_, row=row_name(self.row))


def plan_record(plan: CachePlan, source: str, reversed_: bool = False, row: str | None = None) -> dict[str, Any]:
    """What compare.json's settings say about the cache OTHER decoded through."""
    return {"pattern": source, "row": row, "sink": plan.sink, "window": plan.window, "reversed": reversed_,
            "full_kv_heads": plan.n_full, "kv_heads": plan.n_layers * plan.n_kv_heads,
            "fraction_full": plan.fraction_full, "full": [list(f) for f in plan.full]}


def read_cache(path: str | Path, row: str | None = None, reversed_: bool = False) -> CachePattern | KvcacheChoice:
    """--cache read: a kvcache run (its folder or kvcache.json; `row` picks one of its rows) or a DuoAttention
    pattern directory; one line when it is neither or the options do not fit it."""
    if is_report(path):
        if reversed_:
            raise OptionError("cache_reversed", "turns a DuoAttention pattern's ranking upside down; a kvcache plan "
                                                "holds chosen heads, not a ranking: pick another of its rows with "
                                                "cache_row", also=("cache", "cache_row"))
        report, source = read_report(path)
        return KvcacheChoice(report, shipped_row(report, row, source), source)
    if row is not None:
        raise OptionError("cache_row", f"picks a row of a kvcache plan; '{path}' is no kvcache output folder nor "
                                       f"kvcache.json", also=("cache",))
    return read_pattern(path)


def read_pattern(path: str | Path) -> CachePattern:
    """A DuoAttention pattern directory (or its .tsv, with config.json beside it); one line when it is not one."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    # a pattern folder someone sent cannot point the read elsewhere: both files stay inside it
    tsv = inside(folder, PATTERN, str(folder), "give the pattern's own folder", fields=("cache",))
    cfg = inside(folder, CONFIG, str(folder), "give the pattern's own folder", fields=("cache",))
    if not tsv.is_file() or not cfg.is_file():
        raise OptionError("cache", f"'{path}' is no DuoAttention pattern: it needs {PATTERN} and {CONFIG} (what "
                                   f"kvcache's exported card holds), or give a kvcache output folder")
    try:
        scores = np.atleast_2d(np.loadtxt(tsv, delimiter="\t", dtype=np.float64))
        config = json.loads(cfg.read_text(encoding="utf-8"))
        sink, window = int(config["sink_size"]), int(config["recent_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # unreadable, not text, not numbers, keys missing
        raise OptionError("cache", f"'{path}': cannot read the pattern ({type(e).__name__}: {e})") from None
    if not np.isfinite(scores).all():
        raise OptionError("cache", f"'{tsv}' holds scores that are not finite numbers")
    return CachePattern(scores, sink, window, str(folder))


@contextmanager
def through_cache(hm: HeadModel, plan: CachePlan) -> Iterator[HeadModel]:
    """`hm` whose forward runs each sequence alone through a fresh head-aware cache (right padding dropped), while
    active; logits come back padded to the batch's width (zeros past each sequence)."""
    check_supported(hm)
    model = hm.model
    plain = model.forward

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, logits_to_keep: int = 0,
                **_: Any) -> Any:
        B, T = input_ids.shape
        lengths = attention_mask.sum(-1).tolist() if attention_mask is not None else [T] * B
        out = None
        for i, n in enumerate(int(x) for x in lengths):
            logits = plain(input_ids=input_ids[i:i + 1, :n], cache=HeadAwareCache(plan), use_cache=True).logits[0]
            if out is None:
                out = logits.new_zeros(B, T, logits.shape[-1])
            out[i, :n] = logits
        if out is None:
            raise HeadscopeError("a forward through the head-aware cache needs at least one sequence")
        return SimpleNamespace(logits=out[:, -logits_to_keep:] if logits_to_keep else out)

    model.forward = forward  # an instance attribute: nn.Module.__call__ reads it
    try:
        with head_aware_attention(hm):
            yield hm
    finally:
        del model.forward


__all__ = ["CachePattern", "KvcacheChoice", "plan_record", "read_cache", "read_pattern", "through_cache"]
