"""One comparison of KV caches on one model: the full cache, then per budget the head-aware cache with
full heads chosen by a score and the random control at equal bytes (kvcache.csv's rows)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ...errors import HeadscopeError, OptionError
from ...learned.longctx import build_haystack, long_roles
from ...learned.longctx.confidence import card_record
from ...learned.longctx.needle import DEPTHS, gum_sentences
from ...models.adapter import HeadModel
from ...uncertainty import IntervalSettings
from ..kv_formula import normalize_dtype
from .cache import CachePlan, check_supported
from .choice import Choice, choose_full, choose_random, choose_threshold, choose_top
from .evaluate import DEFAULT_CHUNK, evaluate_needles, evaluate_perplexity
from .paired import add_paired
from .uptrain import uptrain_head_aware

log = logging.getLogger(__name__)

# Seed offset of the haystacks that score heads, so the needles that evaluate a cache are other facts.
SCORE_SEED_OFFSET = 1000


@dataclass(frozen=True)
class Settings:
    """What every cache of one comparison shares."""

    sink: int = 4
    window: int = 256
    context: int = 2048
    budgets: tuple[float, ...] = (0.25,)
    # instead of budgets: KV heads with a query head scoring >= threshold
    threshold: float | None = None
    needles: int = 4
    chunk: int = DEFAULT_CHUNK
    random_control: bool = True
    seed: int = 0
    # steps of distillation under each score choice's masks (0: none); see uptrain.py
    uptrain: int = 0
    loss: str = "kd"
    lr: float = 1e-3
    intervals: IntervalSettings = IntervalSettings()  # the paired chosen-vs-random interval (paired.py)


def check_context(context: int, sink: int, window: int, max_positions: int | None = None) -> None:
    """Refuse a context the windowed heads would see whole (every cache would be the same) or past the model's."""
    if context <= sink + window:
        raise OptionError("context", f"{context} must exceed sink + window = {sink + window}: otherwise every "
                                     f"windowed head still sees every token and all caches are the same",
                          also=("sink", "window"))
    check_positions(context, max_positions)


def check_positions(context: int, max_positions: int | None) -> None:
    """Refuse a context past the model's positions (None: unbounded)."""
    if max_positions is not None and context > max_positions:
        raise OptionError("context", f"{context} exceeds the model's {max_positions} positions; use at most "
                                     f"{max_positions}")


def retrieval_scores(hm: HeadModel, context: int, haystacks: int, seed: int,
                     progress: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
    """Wu et al.'s retrieval score of every query head at `context` tokens (headscope.learned.longctx), on haystacks of
    other facts than the evaluation needles; over every haystack when the model answered none."""
    report = long_roles(hm, context, windows=0, haystacks=haystacks, seed=seed + SCORE_SEED_OFFSET, progress=progress)
    scores = np.asarray(report["scores"]["retrieval_score"], float)
    info = {"haystacks": haystacks, "answered": report["needles"]["succeeded"], "seed": seed + SCORE_SEED_OFFSET,
            "over": "answered haystacks", "ranking": card_record(report, "retrieval_score")}
    if np.isnan(scores).all():
        scores = np.asarray(report["scores"]["retrieval_score_all"], float)
        info["over"] = "every haystack (the model answered none)"
        info["ranking"] = card_record(report, "retrieval_score_all")
        log.warning("the model answered none of the %d scoring haystacks: retrieval scores over all of them", haystacks)
    return scores, info


def choices(hm: HeadModel, scores: np.ndarray | None, chosen_by: str, s: Settings) -> list[Choice]:
    """The full cache, then per budget (or the threshold) the score's choice and its random control."""
    out = [choose_full(hm.n_layers, hm.n_kv_heads, hm.group_size)]
    if scores is None:
        return out
    if scores.shape != (hm.n_layers, hm.n_heads):
        raise HeadscopeError(f"head scores of shape {scores.shape} do not fit {hm.name} ({hm.n_layers} layers x "
                             f"{hm.n_heads} heads)")
    picked = ([choose_threshold(scores, hm.n_kv_heads, s.threshold, chosen_by)] if s.threshold is not None else
              [choose_top(scores, hm.n_kv_heads, b, chosen_by, s.seed) for b in s.budgets])
    for i, c in enumerate(picked):
        out.append(c)
        if s.random_control:
            out.append(choose_random(hm.n_layers, hm.n_kv_heads, c.n_full, s.seed + i, c.budget))
    return out


def haystacks_for(hm: HeadModel, s: Settings) -> list[Any]:
    """The evaluation needles: `s.needles` haystacks of `s.context` tokens, depths in turn
    (headscope.learned.longctx)."""
    sents = gum_sentences()
    return [
        build_haystack(hm.tokenizer, s.context, DEPTHS[i % len(DEPTHS)], i, s.seed, sents) for i in range(s.needles)
    ]


def compare(hm: HeadModel, passages: Sequence[Sequence[int]], scores: np.ndarray | None, chosen_by: str, s: Settings,
            progress: bool = False, on_row: Callable[[dict[str, Any]], None] | None = None,
            train_batches: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """kvcache.csv's rows (plus `full_heads`, `riders`, `answers`, `bytes_stored` for the JSON); `on_row` sees
    each row as soon as its cache is evaluated (long runs). With `s.uptrain` steps, each score choice is
    followed by the same choice after uptraining (`uptrain.uptrain_head_aware` on `train_batches`), evaluated
    through the same cache."""
    check_supported(hm)
    if s.uptrain and not train_batches:
        raise HeadscopeError("uptraining needs training batches")
    param = next(hm.model.parameters())
    dtype, nbytes = normalize_dtype(param.dtype), param.element_size()
    hays = haystacks_for(hm, s) if s.needles else []
    rows: list[dict[str, Any]] = []
    full_measured = None

    def measure(model: HeadModel, c: Choice, plan: CachePlan, label: str, steps: int) -> dict[str, Any]:
        nonlocal full_measured
        ppl = evaluate_perplexity(model, plan, passages, s.chunk, progress, desc=f"perplexity ({label})")
        needles = (evaluate_needles(model, plan, hays, s.chunk, progress, desc=f"needles ({label})") if hays else
                   {"needle_accuracy": float("nan"), "needles": 0, "answers": []})
        measured = ppl["bytes_read"][-1]
        formula = plan.bytes_read(s.context, hm.d_head, nbytes)
        if any(b != formula for b in ppl["bytes_read"]):
            raise HeadscopeError(f"{label}: bytes read {ppl['bytes_read']} differ from the formula {formula}")
        full_measured = measured if c.method == "full" else full_measured
        row = {
            "method": c.method, "chosen_by": c.chosen_by, "budget": c.budget, "kv_fraction": plan.fraction_full,
            "full_kv_heads": plan.n_full, "windowed_kv_heads": plan.n_windowed,
            "windowed_query_heads": plan.n_windowed * hm.group_size, "sink": s.sink, "window": s.window,
            "context": s.context, "dtype": dtype, "kv_bytes_per_token": plan.bytes_per_token(hm.d_head, nbytes),
            "kv_bytes_formula": formula, "kv_bytes_measured": measured, "kv_ratio": measured / full_measured,
            "perplexity": ppl["perplexity"], "ppl_tokens": ppl["ppl_tokens"],
            "needle_accuracy": needles["needle_accuracy"], "needles": needles["needles"], "uptrain_steps": steps,
            "seed": s.seed,
            "full_heads": c.full_heads(), "riders": c.riders, "bytes_stored": ppl["bytes_stored"][-1],
            "answers": needles["answers"], "passage_nll": ppl["passage_nll"], "passage_tokens": ppl["passage_tokens"]}
        rows.append(row)
        if on_row is not None:
            on_row(row)
        return row

    for c in choices(hm, scores, chosen_by, s):
        plan: CachePlan = c.plan(hm.group_size, s.sink, s.window)
        label = c.method if c.method == "full" else f"{c.method} {c.budget:.0%}"
        measure(hm, c, plan, label, 0)
        if s.uptrain and c.method == "score":
            student, log_ = uptrain_head_aware(hm, plan, train_batches, s.uptrain, loss=s.loss, lr=s.lr,
                                               seed=s.seed, progress=progress)
            row = measure(student, c, plan, f"{label} uptrained", s.uptrain)
            row["uptrain"] = {"losses": log_.losses, "settings": log_.settings}
            del student
    add_paired(rows, s.intervals)
    return rows


__all__ = [
    "SCORE_SEED_OFFSET",
    "Settings",
    "check_context",
    "check_positions",
    "choices",
    "compare",
    "haystacks_for",
    "retrieval_scores",
]
