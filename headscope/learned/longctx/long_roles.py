"""Long-range roles of every head: retrieval, streaming, echo and induction at long context.

Two streamed passes, both through `hooks.on_attention_blocks` (blocks of queries, never T x T):

1. windows of `length` tokens over long text (default `gum-long`; `stride` as in
   `headscope.data.prepare.prepare_windows`, every position counted once): streaming share, echo and
   induction at distance >= `far` (`patterns.PatternReducer`);
2. needle-in-a-haystack sequences of `length` tokens at several depths: Wu et al.'s retrieval score and
   the model's own needle accuracy (`needle`).

`decide_long` names the heads that pass each long-range role's rule: the role registry's
(`headscope.learned.roles.catalogue`; score >= threshold and >= `min_ratio` x its baseline; streaming:
>= `streaming_margin` above it), as `headscope.learned.roles.decide` does for the short-range roles.
Head cards for KV tools are written by `headscope.export.cards`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ...attention import DEFAULT_BLOCK, check_block
from ...data.prepare import prepare_windows
from ...errors import HeadscopeError, OptionError
from ...hooks import on_attention_blocks
from ...models.adapter import HeadModel
from ...table import head_name
from ...uncertainty import IntervalSettings
from ..roles.registry import LongThresholds, census_of, judge, of_scope, report_scores
from .confidence import long_intervals, needle_sums, reached, window_sums
from .needle import DEPTHS, RetrievalCounter, answer_logits, build_haystack, gum_sentences
from .patterns import PATTERNS, PatternReducer, PatternSettings

log = logging.getLogger(__name__)

# The scores the long-range roles read (registry order): roles.csv's long-range columns.
LONG_SCORES = tuple(e.score for e in of_scope("long"))


def check_long_args(hm: HeadModel | None, length: int, haystacks: int, windows: int, stride: int | None,
                    block: int) -> None:
    """Refuse bad long-context options (before any work when `hm` is None: what needs no model)."""
    check_block(block)
    for name, v, least in (("long", length, 64), ("haystacks", haystacks, 0), ("long_windows", windows, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise OptionError(name, f"must be an integer of at least {least}; got {v!r}")
    if haystacks == 0 and windows == 0:
        raise OptionError("haystacks", "0 and long_windows=0 leave nothing to measure; give at least one",
                          also=("long_windows",))
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= length):
        raise OptionError("stride", f"must be between 1 and long ({length}); got {stride!r}", also=("long",))
    if hm is not None:
        check_long_model(hm, length)


def check_long_model(hm: HeadModel, length: int) -> None:
    """Refuse a model the long-range roles cannot be measured on at `length` tokens."""
    if not hm.causal:
        raise HeadscopeError(f"long-range roles are measured on decoders (causal LMs); {hm.name} is an encoder")
    if hm.max_positions is not None and length > hm.max_positions:
        raise OptionError("long", f"{length} exceeds {hm.name}'s {hm.max_positions} positions "
                                  f"(max_position_embeddings); use at most {hm.max_positions}")


def pattern_pass(hm: HeadModel, length: int, data: Any, stride: int | None, windows: int, settings: PatternSettings,
                 block: int, progress: bool, until_stable: float | None = None,
                 seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Streaming / echo / induction scores over the first `windows` windows of `data` (with `until_stable`:
    fewer, once every pattern's ranking is that stable over the windows read). `info["unit_sums"]`: each
    window's sums (`confidence.window_sums`)."""
    wins, source = prepare_windows(hm, data, length, stride)
    wins = wins[:windows]
    reducer = PatternReducer(hm, settings)
    bar = tqdm(total=len(wins), desc=f"roles: long text ({length})", unit="window", disable=not progress, leave=False)
    try:
        with on_attention_blocks(hm, reducer, block), torch.inference_mode():
            for w in wins:
                ids = torch.tensor([w.ids], device=hm.device)
                reducer.set_window(ids[0], w.count_from, w.count_to)
                hm.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
                bar.update(1)
                if until_stable is not None and reached(window_sums(reducer.window_rows, PATTERNS, hm.n_heads),
                                                        PATTERNS, until_stable, seed):
                    break
    finally:
        bar.close()
    wins = wins[:len(reducer.window_rows)]
    info = {"data": source.source, "windows": len(wins), "tokens": sum(len(w.ids) for w in wins),
            "counted_tokens": sum(w.count_to - w.count_from for w in wins),
            "window_starts": [[w.passage, w.start] for w in wins], "stride": stride,
            "counted_queries": reducer.queries(), **asdict(settings),
            "unit_sums": window_sums(reducer.window_rows, PATTERNS, hm.n_heads)}
    return reducer.results(), info


def needle_pass(hm: HeadModel, length: int, haystacks: int, depths: tuple[float, ...], seed: int, block: int,
                progress: bool, until_stable: float | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Retrieval scores over `haystacks` needle sequences, depths taken in turn; the model's accuracy (with
    `until_stable`: fewer, once the retrieval ranking over the answered ones is that stable).
    `info["unit_sums"]`: each answered haystack's sums (`confidence.needle_sums`)."""
    if hm.tokenizer is None:
        raise HeadscopeError("the needle test builds text: the model needs a tokenizer")
    sents = gum_sentences()
    per_hay, rows, chance = [], [], []
    bar = tqdm(total=haystacks, desc=f"roles: needles ({length})", unit="haystack", disable=not progress, leave=False)
    try:
        for i in range(haystacks):
            hay = build_haystack(hm.tokenizer, length, depths[i % len(depths)], i, seed, sents)
            counter = RetrievalCounter(hm, hay)
            ids = torch.tensor([hay.ids], device=hm.device)
            a0, a1 = hay.answer
            with on_attention_blocks(hm, counter, block), torch.inference_mode():
                _, logits = answer_logits(hm, ids, a0 - 1)
            pred = logits[: a1 - a0].argmax(-1).cpu()
            right = (pred == torch.tensor(hay.ids[a0:a1])).double()
            acc = float(right.mean())
            # greedy decoding follows the teacher-forced steps only up to the first wrong token
            prefix = int(right.cumprod(0).sum())
            per_hay.append(counter.hits.copy())
            chance.append(counter.chance())
            rows.append({"depth": hay.depth, "tokens": len(hay.ids), "needle": list(hay.needle),
                         "answer": list(hay.answer), "fact": hay.fact, "answer_text": hay.answer_text,
                         "predicted": hm.tokenizer.decode(pred.tolist()), "token_accuracy": acc,
                         "greedy_prefix": prefix, "exact": bool(right.all()),
                         "succeeded": prefix / len(right) > 0.5, "chance": chance[-1]})
            bar.update(1)
            if until_stable is not None and reached(
                    needle_sums(np.stack(per_hay), chance, [j for j, r in enumerate(rows) if r["succeeded"]]),
                    ("retrieval_score",), until_stable, seed):
                break
    finally:
        bar.close()
    ok = [i for i, r in enumerate(rows) if r["succeeded"]]
    shape = (hm.n_layers, hm.n_heads)
    stack = np.stack(per_hay) if per_hay else np.zeros((0, *shape))
    scores = {
        "retrieval_score": stack[ok].mean(0) if ok else np.full(shape, np.nan),
        "retrieval_score_uniform": np.full(shape, float(np.mean([chance[i] for i in ok])) if ok else np.nan),
        "retrieval_score_all": stack.mean(0) if per_hay else np.full(shape, np.nan),
    }
    info = {"haystacks": rows, "succeeded": len(ok),
            "needle_accuracy": float(np.mean([r["exact"] for r in rows])) if rows else None,
            "token_accuracy": float(np.mean([r["token_accuracy"] for r in rows])) if rows else None,
            "per_haystack": stack, "unit_sums": needle_sums(stack, chance, ok)}
    return scores, info


def decide_long(scores: dict[str, np.ndarray], th: LongThresholds) -> dict[tuple[int, int], list[str]]:
    """(layer, head) -> long-range roles whose rule (the registry's) it passes."""
    return judge("long", scores, th)


def long_roles(hm: HeadModel, length: int, *, data: Any = "gum-long", stride: int | None = None, windows: int = 2,
               haystacks: int = 4, depths: tuple[float, ...] = DEPTHS, settings: PatternSettings = PatternSettings(),
               thresholds: LongThresholds | None = None, block: int = DEFAULT_BLOCK, seed: int = 0,
               progress: bool = False, checked: bool = False, intervals: IntervalSettings | None = None,
               until_stable: float | None = None) -> dict[str, Any]:
    """Long-range role scores, baselines, roles and census of `hm` at `length` tokens (roles.json's `long_context`).

    `data`: long text as `prepare_windows` takes it (a name, a path, or a TextSource already read).
    `checked`: the options already passed `check_long_args` (the verb checks them before loading the
    model); only what needs the model is checked here. `intervals`: how `uncertainty` (every score's bounds
    over haystacks / windows, the rankings' split-half stability) is computed; `until_stable`: each pass
    stops once its rankings are that stable (`confidence`)."""
    th = thresholds or LongThresholds()
    if checked:
        check_long_model(hm, length)
    else:
        check_long_args(hm, length, haystacks, windows, stride, block)
    scores: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {"length": length, "block": block, "thresholds": th.as_dict()}
    groups = []
    if windows:
        s, info = pattern_pass(hm, length, data, stride=stride, windows=windows, settings=settings, block=block,
                               progress=progress, until_stable=until_stable, seed=seed)
        scores.update(s)
        groups.append(info.pop("unit_sums"))
        report["text"] = info
    if haystacks:
        s, info = needle_pass(hm, length, haystacks, depths=depths, seed=seed, block=block, progress=progress,
                              until_stable=until_stable)
        scores.update(s)
        groups.append(info.pop("unit_sums"))
        report["needles"] = info
    report["uncertainty"] = long_intervals(groups, th, intervals or IntervalSettings(seed=seed), seed)
    if until_stable is not None:
        report["until_stable"] = {"target": until_stable, "haystacks": len(report.get("needles", {}).get(
            "haystacks", [])), "haystacks_cap": haystacks, "windows": report.get("text", {}).get("windows", 0),
            "windows_cap": windows}
    held = decide_long(scores, th)
    report["scores"], report["baselines"] = report_scores("long", scores)
    report["roles"] = {head_name(l, h): r for (l, h), r in held.items()}
    report["census"] = census_of(held.items(), scores)
    return report
