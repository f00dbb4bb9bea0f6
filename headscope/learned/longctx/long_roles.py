"""Long-range roles of every head: retrieval, streaming, echo and induction at long context.

Two streamed passes, both through `hooks.on_attention_blocks` (blocks of queries, never T x T):

1. windows of `length` tokens over long text (default `gum-long`; `stride` as in
   `headscope.data.prepare.prepare_windows`, every position counted once): streaming share, echo and
   induction at distance >= `far` (`patterns.PatternReducer`);
2. needle-in-a-haystack sequences of `length` tokens at several depths: Wu et al.'s retrieval score and
   the model's own needle accuracy (`needle`).

`decide_long` names the heads that pass each role's rule (score >= threshold and >= `min_ratio` x its
baseline; streaming: >= `streaming_margin` above it), as `headscope.learned.roles.decide` does for the short-range roles.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ...attention import DEFAULT_BLOCK, check_block
from ...data.prepare import prepare_windows
from ...errors import HeadscopeError
from ...hooks import on_attention_blocks
from ...io import atomic_write_text
from ...models.adapter import HeadModel
from ...table import head_name
from .needle import DEPTHS, RetrievalCounter, answer_logits, build_haystack, gum_sentences
from .patterns import PATTERNS, PatternReducer, PatternSettings

log = logging.getLogger(__name__)

LONG_SCORES = ("retrieval_score", *PATTERNS)
CARD_SCORES = {"retrieval": "retrieval_score", "streaming": "streaming_share", "echo": "echo_far",
               "induction": "induction_far"}
ROLE_OF = {"retrieval_score": "retrieval", "streaming_share": "streaming", "echo_far": "echo_far",
           "induction_far": "induction_far"}


@dataclass(frozen=True)
class LongThresholds:
    """A head has a long-range role when its score passes the threshold and `min_ratio` x its baseline."""

    retrieval_score: float = 0.1  # Wu et al. 2024 call heads above 0.1 retrieval heads
    streaming_share: float = 0.9  # nearly all weight within sink + recent window
    echo_far: float = 0.3
    induction_far: float = 0.3
    min_ratio: float = 3.0
    # A uniform head already puts (sink + recent) / keys-seen there (0.34 at 2,048 tokens), so 3x its
    # share cannot be asked; streaming asks for this much more than the uniform head instead.
    streaming_margin: float = 0.5


def check_long_args(hm: HeadModel | None, length: int, haystacks: int, windows: int, stride: int | None,
                    block: int) -> None:
    """Refuse bad long-context options (before any work when `hm` is None: what needs no model)."""
    check_block(block)
    for name, v, least in (("--long", length, 64), ("--haystacks", haystacks, 0), ("--long-windows", windows, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise HeadscopeError(f"{name} must be an integer of at least {least}; got {v!r}")
    if haystacks == 0 and windows == 0:
        raise HeadscopeError("--haystacks 0 and --long-windows 0 leave nothing to measure; give at least one")
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= length):
        raise HeadscopeError(f"--stride must be between 1 and --long ({length}); got {stride!r}")
    if hm is None:
        return
    if not hm.causal:
        raise HeadscopeError(f"long-range roles are measured on decoders (causal LMs); {hm.name} is an encoder")
    if hm.max_positions is not None and length > hm.max_positions:
        raise HeadscopeError(f"--long {length} exceeds {hm.name}'s {hm.max_positions} positions "
                             f"(max_position_embeddings); use at most {hm.max_positions}")


def pattern_pass(hm: HeadModel, length: int, data: Any, stride: int | None, windows: int, settings: PatternSettings,
                 block: int, progress: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Streaming / echo / induction scores over the first `windows` windows of `data`."""
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
    finally:
        bar.close()
    info = {"data": source.source, "windows": len(wins), "tokens": sum(len(w.ids) for w in wins),
            "counted_tokens": sum(w.count_to - w.count_from for w in wins),
            "window_starts": [[w.passage, w.start] for w in wins], "stride": stride,
            "counted_queries": reducer.queries(), **asdict(settings)}
    return reducer.results(), info


def needle_pass(hm: HeadModel, length: int, haystacks: int, depths: tuple[float, ...], seed: int, block: int,
                progress: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Retrieval scores over `haystacks` needle sequences, depths taken in turn; the model's accuracy."""
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
            "per_haystack": stack}
    return scores, info


def decide_long(scores: dict[str, np.ndarray], th: LongThresholds) -> dict[tuple[int, int], list[str]]:
    """(layer, head) -> long-range roles whose rule it passes."""
    out: dict[tuple[int, int], list[str]] = {}
    for name in LONG_SCORES:
        if name not in scores:
            continue
        s, b = scores[name], scores[name + "_uniform"]
        with np.errstate(invalid="ignore"):
            beats = s - b >= th.streaming_margin if name == "streaming_share" else s >= th.min_ratio * b
            ok = np.nan_to_num((s >= getattr(th, name)) & beats, nan=0).astype(bool)
        for l, h in zip(*np.nonzero(ok)):
            out.setdefault((int(l), int(h)), []).append(ROLE_OF[name])
    return out


def long_roles(hm: HeadModel, length: int, *, data: Any = "gum-long", stride: int | None = None, windows: int = 2,
               haystacks: int = 4, depths: tuple[float, ...] = DEPTHS, settings: PatternSettings = PatternSettings(),
               thresholds: LongThresholds | None = None, block: int = DEFAULT_BLOCK, seed: int = 0,
               progress: bool = False) -> dict[str, Any]:
    """Long-range role scores, baselines, roles and census of `hm` at `length` tokens (roles.json's `long_context`)."""
    th = thresholds or LongThresholds()
    check_long_args(hm, length, haystacks, windows, stride, block)
    scores: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {"length": length, "block": block, "thresholds": asdict(th)}
    if windows:
        s, info = pattern_pass(hm, length, data, stride, windows, settings, block, progress)
        scores.update(s)
        report["text"] = info
    if haystacks:
        s, info = needle_pass(hm, length, haystacks, depths, seed, block, progress)
        scores.update(s)
        report["needles"] = info
    roles = decide_long(scores, th)
    census: dict[str, list[dict[str, Any]]] = {}
    for (l, h), names in sorted(roles.items()):
        for role in names:
            key = next(k for k, r in ROLE_OF.items() if r == role)
            census.setdefault(role, []).append({"head": head_name(l, h), "score": float(scores[key][l, h]),
                                                "baseline": float(scores[key + "_uniform"][l, h])})
    report["scores"] = {k: v for k, v in scores.items() if k in LONG_SCORES or k == "retrieval_score_all"}
    report["baselines"] = {k: v for k, v in scores.items() if k.endswith("_uniform")}
    report["roles"] = {head_name(l, h): r for (l, h), r in sorted(roles.items())}
    report["census"] = {r: sorted(v, key=lambda e: -e["score"]) for r, v in census.items()}
    return report


def head_card(report: dict[str, Any], score: str = "retrieval") -> tuple[dict[str, list[float]], str]:
    """The Retrieval Head / HeadKV head-score file: {"<layer>-<head>": [score per test]} and a note.

    For `retrieval` the lists hold one score per haystack the model answered (Wu et al. keep only those);
    when it answered none they hold every haystack's score, and the note says so. Other scores are one
    number per head (a list of one).
    """
    if score not in CARD_SCORES:
        raise HeadscopeError(f"--card-score {score!r} is not one of {', '.join(CARD_SCORES)}")
    note = ""
    if score == "retrieval":
        needles = report.get("needles")
        if not needles:
            raise HeadscopeError("the retrieval card needs needle haystacks (--haystacks at least 1)")
        stack = np.asarray(needles["per_haystack"], float)  # [haystack, layer, head]
        ok = [i for i, r in enumerate(needles["haystacks"]) if r["succeeded"]]
        if not ok:
            ok = list(range(len(stack)))
            note = (f"the model answered none of the {len(stack)} haystacks; the card holds every haystack's score "
                    f"(Wu et al. keep only answered ones)")
        values = stack[ok]
    else:
        key = CARD_SCORES[score]
        if key not in report["scores"]:
            raise HeadscopeError(f"--card-score {score} needs the long-text windows (--long-windows at least 1)")
        values = np.asarray(report["scores"][key], float)[None]
    _, L, H = values.shape
    card = {f"{l}-{h}": [float(x) for x in values[:, l, h]] for l in range(L) for h in range(H)}
    return card, note


def write_card(path: str | Path, card: dict[str, list[float]]) -> None:
    """Write a head card (one JSON object on one line, as the Retrieval Head code writes and reads it)."""
    atomic_write_text(Path(path), json.dumps(card, allow_nan=True) + "\n")
