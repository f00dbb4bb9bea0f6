"""Question 1's roles: per-head role scores beside their baselines, the census (roles.json), and the
best head per dependency relation and for coreference (syntax.csv, roles.json's `coreference`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import plots
from ..artifacts import ROLES_JSON, SYNTAX_CSV
from ..heads import Head
from ..learned.roles.registry import key, resolve, role_for_score
from ..table import parse_head
from .sources import Part, Sources, clean

# Relations seen only a few times give accuracies of 0 or 1 by chance; they are left out.
MIN_RELATION_COUNT = 20


# The unit of each role's score (and of its baseline, which is the same measure), by the score it reads.
SCORE_UNITS = {"mean_distance": "tokens", "entropy_norm": "normalised entropy (1 = uniform)",
               "coref_accuracy": "accuracy", "syntax_{member}": "accuracy",
               "retrieval_score": "needle-copy score"}
WEIGHT_UNIT = "of the attention weight"  # every other score: mean attention weight on some position


def score_unit(role: str) -> str:
    """The unit of a role's score and baseline (`local`: tokens; `sink`: of the attention weight)."""
    found = resolve(role)
    return SCORE_UNITS.get(found[0].score, WEIGHT_UNIT) if found is not None else ""


def fmt_num(v: Any) -> str:
    """Two decimals for numbers, the value as text otherwise."""
    return f"{v:.2f}" if isinstance(v, (int, float)) else str(v)


def role_scores(rj: dict[str, Any], n_layers: int, n_heads: int) -> dict[str, dict[str, Any]]:
    """Per head (`L3H7`), each role score that has a baseline: {score, baseline, beats baseline when}."""
    scores, baselines = rj["scores"], rj["baselines"]
    bounds = rj.get("score_intervals") or {}  # files written before intervals have none
    shares = rj.get("held_share") or {}
    per_head: dict[str, dict[str, Any]] = {}
    for name, matrix in scores.items():
        entry = role_for_score(name)
        if entry is None or entry.baseline not in baselines:
            continue  # plain statistics already sit in the head's numbers
        # A local head attends closer than uniform attention would: lower is the role (the registry says so).
        direction = "higher" if entry.higher_is_better else "lower"
        a = np.asarray(matrix, dtype=float).reshape(n_layers, n_heads)
        b = np.asarray(baselines[entry.baseline], dtype=float).reshape(n_layers, n_heads)
        lo, hi = (np.asarray(bounds[name][k], dtype=float).reshape(n_layers, n_heads) if name in bounds else None
                  for k in ("lo", "hi"))
        share = np.asarray(shares[entry.name], dtype=float).reshape(n_layers, n_heads) if entry.name in shares else None
        for l in range(n_layers):
            for h in range(n_heads):
                rec: dict[str, Any] = {"score": float(a[l, h])}
                if lo is not None and hi is not None:
                    rec.update({"lo": float(lo[l, h]), "hi": float(hi[l, h])})
                rec.update({"baseline": float(b[l, h]), "beats baseline when": direction})
                if share is not None:
                    rec["held in resamples"] = float(share[l, h])
                per_head.setdefault(Head(l, h).name, {})[name] = rec
    return clean(per_head)


def census_rows(census: dict[str, list[dict[str, Any]]],
                uncertain: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """One row per role: how many heads hold it, how many are uncertain (roles.json's `uncertain`), and the best
    four with their scores, intervals and baselines."""
    unsure: dict[str, int] = {}
    for names in (uncertain or {}).values():
        for r in names:
            unsure[r] = unsure.get(r, 0) + 1
    rows = []
    for role in [*census, *(r for r in unsure if r not in census)]:
        heads = census.get(role, [])
        unit = score_unit(role)
        u = f" {unit}" if unit else ""
        best = ", ".join(f"{x['head']} {fmt_num(x['score'])}"
                         + (f" [{fmt_num(x['lo'])}, {fmt_num(x['hi'])}]" if isinstance(x.get("lo"), (int, float))
                            and isinstance(x.get("hi"), (int, float)) else "") + u
                         + (f" (baseline {fmt_num(x['baseline'])}{u})" if isinstance(x.get("baseline"), (int, float))
                            else "") for x in heads[:4])
        row = {"role": role, "heads": len(heads), "best": best}
        if uncertain is not None:
            row = {"role": role, "heads": len(heads), "uncertain": unsure.get(role, 0), "best": best}
        rows.append(row)
    return rows


def coreference_row(co: dict[str, Any] | None, n_layers: int, n_heads: int) -> dict[str, Any] | None:
    """The best head at finding antecedents, as a row of the relations table (None without --coref)."""
    if not co:
        return None
    a = np.asarray(co["accuracy"], dtype=float).reshape(n_layers, n_heads)
    if np.all(np.isnan(a)):
        return None  # no anaphor was scored
    l, h = np.unravel_index(int(np.nanargmax(a)), a.shape)
    b = [co[k] for k in ("nearest_mention_baseline", "same_head_word_baseline") if isinstance(co[k], (int, float))]
    return clean({"relation": "coreference (antecedent)", "best head": Head(int(l), int(h)).name,
                  "accuracy": float(a[l, h]), "baseline": max(b) if b else None, "count": co["anaphors"]})


def syntax_table(src: Sources, coref: dict[str, Any] | None) -> dict[str, Any] | None:
    """Best head per relation against its fixed-offset baseline (syntax.csv), plus the coreference row."""
    t = src.csv(SYNTAX_CSV.name)
    if t is None and coref is None:
        return None
    rows = t.rows if t is not None else []
    # `headscope roles` writes one offset-baseline row per relation after the per-head rows.
    baselines = {
        str(r["relation"]): (r["accuracy"], r["baseline_offset"]) for r in rows if r["kind"] == "offset_baseline"
    }
    head_rows = [r for r in rows if r["kind"] == "head"]
    by_rel: dict[str, dict[str, Any]] = {}
    for r in head_rows:
        k = str(r["relation"])
        if isinstance(r["accuracy"], (int, float)) and (k not in by_rel or r["accuracy"] > by_rel[k]["accuracy"]):
            by_rel[k] = r
    best: list[dict[str, Any]] = []
    for k, r in by_rel.items():
        base, offset = baselines.get(k, (None, None))
        best.append({"relation": k, "best head": Head(int(r["layer"]), int(r["head"])).name, "accuracy": r["accuracy"],
                     "baseline": base, **({"baseline offset": offset} if offset is not None else {}),
                     "count": r["count"]})
    rare = [r for r in best if r["count"] < MIN_RELATION_COUNT]
    best = [r for r in best if r["count"] >= MIN_RELATION_COUNT]
    if coref is not None:
        best.append(coref)
    best.sort(key=lambda r: -(r["accuracy"] or 0))
    text: list[str] = []
    if best:
        beats = [r for r in best if isinstance(r.get("baseline"), (int, float)) and r["accuracy"] > r["baseline"]]
        text.append(f"For {len(beats)} of {len(best)} relations the best single head beats its positional baseline; "
                    "top: " + ", ".join(f"{r['relation']} {r['best head']} {r['accuracy']:.2f}"
                                        + (f" (baseline {r['baseline']:.2f})"
                                           if isinstance(r.get("baseline"), (int, float)) else "")
                                        for r in best[:3]) + ".")
    columns: list[str] = []
    for r in best:
        columns += [c for c in r if c not in columns]
    note = "Best single head per relation (green: beats its baseline)" + (
        f"; {len(rare)} relations seen fewer than {MIN_RELATION_COUNT} times are left out." if rare else ".")
    return {"columns": columns, "best": best[:60], "text": text, "note": note, "relation": "relation",
            "accuracy": "accuracy", "baseline": "baseline", "rows": len(head_rows)}


ROLE_BARS_PNG = "report-roles.png"


def role_bar_rows(rj: dict[str, Any], per_role: int = 3) -> list[dict[str, Any]]:
    """The best `per_role` assigned heads of each role with their intervals, then each role's best uncertain heads
    (roles.json's `uncertain`), for the role bar chart; roles without intervals are left out."""
    bounds = rj.get("score_intervals") or {}
    rows: list[dict[str, Any]] = []
    for role, heads in rj["census"].items():
        rows += [{"role": role, "head": e["head"], "score": e["score"], "lo": e["lo"], "hi": e["hi"],
                  "uncertain": False} for e in heads[:per_role] if "lo" in e]
    unsure: dict[str, list[dict[str, Any]]] = {}
    for head, names in (rj.get("uncertain") or {}).items():
        l, h = parse_head(head)
        for r in names:
            found = resolve(r)
            name = key(found[0].score, found[1]) if found is not None else None
            if name is None or name not in bounds or name not in rj["scores"]:
                continue
            unsure.setdefault(r, []).append({"role": r, "head": head, "score": float(rj["scores"][name][l][h]),
                                             "lo": float(bounds[name]["lo"][l][h]),
                                             "hi": float(bounds[name]["hi"][l][h]), "uncertain": True})
    for items in unsure.values():
        rows += sorted(items, key=lambda e: -e["score"])[:per_role]
    return rows


def roles_part(src: Sources, n_layers: int, n_heads: int, figs: dict[str, bytes] | None = None) -> Part:
    """Role scores per head with their intervals, the census (with uncertain counts), thresholds, the bar chart
    of the strongest heads per role (intervals as error bars, uncertain heads grey), and the syntax table."""
    part = Part()
    rj = src.json(ROLES_JSON.name) if n_layers else None
    if rj is not None and (rj["n_layers"], rj["n_heads"]) != (n_layers, n_heads):
        src.fault(ROLES_JSON.name, f"is for {rj['n_layers']} layers x {rj['n_heads']} heads, not this model's "
                                   f"{n_layers} x {n_heads}")
        rj = None
    coref = None
    if rj is None:
        part.missing["roles"] = src.note(ROLES_JSON.name)
    else:
        part.data["role_scores"] = role_scores(rj, n_layers, n_heads)
        part.data["census"] = census_rows(rj["census"], rj.get("uncertain"))
        bars = role_bar_rows(rj)
        if figs is not None and bars:
            figs[ROLE_BARS_PNG] = plots.role_bars(bars)
            part.plots.append(ROLE_BARS_PNG)
        part.data["thresholds"] = clean(rj["thresholds"])
        coref = coreference_row(rj["coreference"], n_layers, n_heads)
    syn = syntax_table(src, coref)
    if syn is None:
        part.missing["syntax"] = src.note(SYNTAX_CSV.name)
    else:
        part.say("q1", *syn.pop("text"))
        part.data["syntax"] = syn
    return part
