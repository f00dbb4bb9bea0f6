"""The short compare every compressing verb ends with: what `prune --save-model`, `gqa`, `mla` and `kvcache` broke.

`check(base, other)` runs `compare` on a few rows sized to add seconds on the built-in models, not minutes: the rows
the family supports among DECODER_ROWS or ENCODER_ROWS, each left out with a note where the model cannot do it (a
tokenizer without the task's words, haystacks past its positions). `check_cache(hm, plan, ...)` judges a head-aware
KV cache the same way: OTHER is the input model decoding through `plan`, on rows long enough for the cache to matter
(a text shorter than sink + window reads every token whatever the plan: the short pair tasks cannot change);
`check_kvcache(hm, result, texts)` picks the plan a kvcache run would ship and checks it.

The verbs' commands call these (capacity/ and redundancy/ sit below compare/ and cannot); `check_lines` is what they
print: one line per lost capability and a summary line.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..capacity.kvcache import CachePlan
from ..capacity.kvcache.evaluate import long_passages_ids
from ..capacity.kvcache.plans import plan_of_row, row_name, shipped_row
from ..capacity.kvcache_verb import KvcacheResult
from ..models.adapter import HeadModel
from .options import CompareOptions
from .verb import CompareResult, compare

# The rows and their sizes (docs/compare.md, "Every compressing verb checks what it broke", measures their cost).
DECODER_ROWS = ("lm", "induction", "ioi", "retrieval")
ENCODER_ROWS = ("fidelity", "masked")
# held-out passages of the lm (decoders) or fidelity (encoders) row: compare's default corpus
PASSAGES = 16
MAX_LENGTH = 64  # tokens per such passage
ITEMS = 16  # pairs per pair task (induction, ioi, masked)
# tokens per needle haystack of the retrieval row (less where the model has fewer positions)
LONG = 256
# needle haystacks of the retrieval row, one per depth (0.1, 0.35, 0.6, 0.85)
HAYSTACKS = 4
# the shortest haystack compare builds (CompareOptions.long)
MIN_LONG = 64

# Through a head-aware cache: perplexity on passages of the run's --context tokens (the first CACHE_PASSAGES of its
# long text that hold them) and needle retrieval at the same length.
CACHE_ROWS = ("lm", "retrieval")
CACHE_PASSAGES = 4


def _options(base: HeadModel, other: HeadModel, **sizes: Any) -> CompareOptions:
    """compare's options for a check (validated); `sizes` override the defaults above."""
    rows = DECODER_ROWS if base.causal else ENCODER_ROWS
    settings: dict[str, Any] = {"tasks": rows, "limit": PASSAGES, "max_length": MAX_LENGTH, "items": ITEMS,
                                "long": LONG, "haystacks": HAYSTACKS, **sizes}
    # a small model: passages and haystacks within its positions
    if base.max_positions is not None:
        settings["long"] = min(settings["long"], base.max_positions)
        settings["max_length"] = min(settings["max_length"], base.max_positions)
    if settings["long"] < MIN_LONG:  # too few positions for a needle haystack: no retrieval row
        settings["tasks"] = tuple(t for t in settings["tasks"] if t != "retrieval")
        settings["long"] = MIN_LONG
    return CompareOptions(base=base.name, other=other.name, **settings).validate()


def check(base: HeadModel, other: HeadModel, *, data: Any = None, seed: int = 0, **sizes: Any) -> CompareResult:
    """What `other` (a pruned or converted copy of `base`) lost against `base` on the check's rows and sizes.

    `data`: the lm / fidelity row's passages (default: compare's built-in corpus); `sizes`: CompareOptions fields
    replacing the check's (`items=8`). Rows the model cannot measure are left out with a note."""
    return compare(base, other, _options(base, other, seed=seed, **sizes), data=data, lenient=True)


def check_cache(hm: HeadModel, plan: CachePlan, context: int, texts: Sequence[str], *, plan_from: str,
                seed: int = 0, **sizes: Any) -> CompareResult:
    """What `hm` decoding through `plan` lost against `hm` with its full cache: perplexity on the first
    CACHE_PASSAGES of `texts` that hold `context` tokens (their first `context` tokens) and needle retrieval at
    `context` tokens. `plan_from`: where the plan came from, for compare.json."""
    passages = long_passages_ids(hm.tokenizer, texts, context, CACHE_PASSAGES)
    tasks = CACHE_ROWS if context >= MIN_LONG else ("lm",)
    opts = _options(hm, hm, **{"tasks": tasks, "limit": CACHE_PASSAGES, "max_length": context, "long": context,
                               "seed": seed, **sizes})
    return compare(hm, hm, opts, data=passages, plan=plan, plan_from=plan_from, lenient=True)


def check_kvcache(hm: HeadModel, result: KvcacheResult, texts: Sequence[str]) -> CompareResult:
    """`kvcache`'s check: `check_cache` on the row a user would ship (`capacity.kvcache.plans.shipped_row`: the
    score's choice at the run's first budget), through the plan that row was measured with, at the run's context."""
    report = result.report.to_json()  # kvcache.json's own form, as `compare --cache` reads it
    row = shipped_row(report)
    plan = plan_of_row(report, row)
    o = result.options
    return check_cache(hm, plan, o.context, texts, plan_from=f"{o.out} (row {row_name(row)})", seed=o.seed)


def check_lines(result: CompareResult) -> list[str]:
    """One line per lost capability, then a summary: how many rows each verdict holds, and the notes."""
    lost = [c for c in result.changes if c.verdict == "lost"]
    out = [f"check: lost {c.sentence()}" for c in lost]
    by: dict[str, list[str]] = {}
    for c in result.changes:
        by.setdefault(c.verdict, []).append(c.capability)
    said = "; ".join(f"{verdict}: {', '.join(names)}" for verdict, names in by.items())
    tol = result.record.settings.tolerance
    seconds = sum(sum(r["seconds"].values()) for r in result.record.rows.values())
    out.append(f"check against {result.base_name} (tolerance {tol:.0%}): {len(lost)} of {len(result.changes)} "
               f"capabilities lost ({said}); {seconds:.1f} s of forwards; compare.csv has the intervals")
    out += [f"check: note: {n}" for n in result.record.notes]
    return out


__all__ = ["CACHE_PASSAGES", "CACHE_ROWS", "DECODER_ROWS", "ENCODER_ROWS", "HAYSTACKS", "ITEMS", "LONG",
           "MAX_LENGTH", "PASSAGES", "check", "check_cache", "check_kvcache", "check_lines"]
