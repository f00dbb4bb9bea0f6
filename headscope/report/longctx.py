"""Question 1 at long context: the long-range roles of roles.json's `long_context` (`headscope roles
--long N`): retrieval, streaming, echo and induction heads beside their baselines, and the needle test."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..artifacts import ROLES_JSON
from ..heads import Head
from ..learned.roles.registry import of_scope, resolve
from .sources import Part, Sources

TITLE = "Long-range roles"


def role_text(role: str) -> str:
    """The report's words for a long-range role (the registry's label)."""
    found = resolve(role)
    return found[0].label if found else role


def _best(matrix: Any) -> tuple[str, float] | None:
    a = np.asarray(matrix, dtype=float)
    if a.size == 0 or np.all(np.isnan(a)):
        return None
    l, h = np.unravel_index(int(np.nanargmax(a)), a.shape)
    return Head(int(l), int(h)).name, float(a[l, h])


def longctx_part(src: Sources) -> Part:
    """A q1 panel: per long-range score, the heads that pass its rule, the best head and its baseline."""
    part = Part()
    rj = src.json(ROLES_JSON.name)
    if rj is None:
        return part  # the roles section already says to run `headscope roles`
    lc = rj.get("long_context")
    if not lc:
        part.panel("q1", TITLE, note="no long-range roles: run `headscope roles MODEL --long N` (docs/long_context.md)")
        return part
    census, scores, baselines = lc.get("census", {}), lc.get("scores", {}), lc.get("baselines", {})
    rows = []
    for entry in of_scope("long"):
        if entry.score not in scores:
            continue
        best = _best(scores[entry.score])
        base = np.asarray(baselines.get(entry.baseline, []), dtype=float)
        heads = census.get(entry.name, [])
        rows.append(
            {
                "role": entry.label,
                "heads": len(heads),
                "best head": best[0] if best else "-",
                "score": round(best[1], 3) if best else None,
                "uniform baseline": round(float(np.nanmean(base)), 3)
                if base.size and not np.all(np.isnan(base))
                else None,
                "holders": ", ".join(e["head"] for e in heads[:6]) + (" ..." if len(heads) > 6 else ""),
            }
        )
    text = [f"At {lc['length']} tokens:"]
    n = lc.get("needles")
    if n:
        text.append(f"the model answered {sum(r['exact'] for r in n['haystacks'])} of {len(n['haystacks'])} "
                    f"needle haystacks exactly (answer tokens right: {n['token_accuracy']:.2f}); the retrieval "
                    f"score counts the {n['succeeded']} it answered.")
    t = lc.get("text")
    if t:
        text.append(
            f"streaming / echo / induction from {t['windows']} window(s) of {t['data']} "
            f"({t['counted_tokens']} queries; sink {t['sink']} + recent {t['recent']}, copies >= {t['far']} back)."
        )
    part.panel("q1", TITLE, columns=["role", "heads", "best head", "score", "uniform baseline", "holders"], rows=rows,
               text=[" ".join(text)])
    if census:
        part.say("q1", f"At {lc['length']} tokens: " + "; ".join(f"{len(v)} {role_text(r)} head(s)"
                                                                  for r, v in census.items()) + ".")
    return part
