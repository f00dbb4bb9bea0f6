"""Head cards: per-head long-range scores in the file the Retrieval Head and HeadKV code read,
`{"<layer>-<head>": [score per test]}` (one JSON object on one line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HeadscopeError
from ..io import atomic_write_text
from ..learned.roles.registry import of_scope

# --card-score name -> the long-range score it holds (the role registry's `card` names).
CARD_SCORES = {e.card: e.score for e in of_scope("long") if e.card is not None}


def head_card(report: dict[str, Any], score: str = "retrieval") -> tuple[dict[str, list[float]], str]:
    """The Retrieval Head / HeadKV head-score file: {"<layer>-<head>": [score per test]} and a note.

    `report` is roles.json's `long_context` (`headscope.learned.longctx.long_roles`). For `retrieval`
    the lists hold one score per haystack the model answered (Wu et al. keep only those); when it
    answered none they hold every haystack's score, and the note says so. Other scores are one
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
