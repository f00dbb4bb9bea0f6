"""The study's answer: one short paragraph per question, with the numbers (and intervals) the stages wrote.

Each paragraph reads the files in the study's folder by their declared names; a stage that did not run
adds the reason instead of a number. The same text heads the report (study.json's `answers`).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ..artifacts import CLUSTERS_JSON, GQA_JSON, IMPORTANCE_JSON, KV_CSV, KVCACHE_JSON, MLA_JSON, PRUNE_JSON, ROLES_JSON
from ..capacity.kv_bytes import human_bytes
from ..redundancy.curves.claims import drop_claim, level_of
from . import patching
from .patching import read_json

ROLE_WORDS = {"sink": "sink heads", "previous_token": "previous-token", "next_token": "next-token", "broad": "broad",
              "local": "local", "duplicate_token": "duplicate-token", "induction": "induction",
              "coreference": "coreference", "rare_word": "rare-word", "delimiter": "delimiter", "self": "self"}


def _why(state: dict[str, Any], stage: str) -> str:
    rec = state.get("stages", {}).get(stage) or {}
    return rec.get("reason") or rec.get("status") or "not run"


def _q1(out: Path, state: dict[str, Any], heads: int) -> str:
    roles_ran = (state.get("stages", {}).get("roles") or {}).get("status") == "done"
    causal = patching.sentence(out, _why(state, "patch"), ROLE_WORDS, roles_ran)
    return _roles_clause(out, state, heads) + causal + "."


def _roles_clause(out: Path, state: dict[str, Any], heads: int) -> str:
    r = read_json(out / ROLES_JSON.name)
    if r is None:
        return f"What the heads learn: no role census ({_why(state, 'roles')})"
    census = r.get("census") or {}
    plain = sorted(((k, len(v)) for k, v in census.items() if not k.startswith("syntactic:")), key=lambda t: -t[1])
    parts = [f"{n} {ROLE_WORDS.get(k, k.replace('_', ' '))}" for k, n in plain[:5]]
    s = (f"What the heads learn: of the {heads} heads, " + ", ".join(parts) + " pass their role's rule beside its "
         "baseline on the interval's bound" if parts else
         f"What the heads learn: none of the {heads} heads passes a role's rule")
    syn_roles = sum(len(v) for k, v in census.items() if k.startswith("syntactic:"))
    syn = (r.get("syntax") or {}).get("relations") or {}
    if syn:
        best = max(((rel, v) for rel, v in syn.items() if v.get("count", 0) >= 20),
                   key=lambda t: t[1]["best_accuracy"] - t[1]["baseline"], default=None)
        if best:
            rel, v = best
            s += (f"; {syn_roles} head-relation pairs beat the best fixed offset on treebank syntax (clearest: "
                  f"{v['best_head']} finds {rel} {v['best_accuracy']:.0%} of the time vs {v['baseline']:.0%} at "
                  f"offset {v['baseline_offset']:+d}, {v['count']} arcs)")
    c = r.get("coreference")
    if c:
        s += (f"; the best coreference head, {c['best_head']}, picks the gold antecedent {c['best_accuracy']:.0%} "
              f"of {c['anaphors']} times (same-head-word baseline {c['same_head_word_baseline']:.0%})")
    lc = r.get("long_context")
    if lc:
        counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in lc["census"].items()) or "no head"
        s += f"; at {lc['length']} tokens: {counts}"
    cl = read_json(out / CLUSTERS_JSON.name)
    if cl is not None:
        n = len(cl.get("clusters") or [])
        s += f"; {n} near-duplicate cluster{'s' if n != 1 else ''} of heads (similar attention and outputs)"
    return s


def _model_kv_row(out: Path) -> dict[str, str] | None:
    try:
        with open(out / KV_CSV.name, encoding="utf-8") as f:
            return next((r for r in csv.DictReader(f) if r.get("is_model") == "True" and r.get("source") == "model"),
                        None)
    except OSError:
        return None


def _q2(out: Path, state: dict[str, Any]) -> str:
    kv = _model_kv_row(out)
    s = "Are more heads better: "
    if kv is not None:
        s += (f"the {kv['layout']} cache costs {human_bytes(float(kv['bytes_per_token']))} per token "
              f"({kv['n_kv_heads']} KV heads for {kv['n_heads']} query heads, {kv['dtype']})")
    else:
        s += f"no KV-cost table ({_why(state, 'kv')})"
    g = read_json(out / "gqa" / GQA_JSON.name)
    if g is not None:
        up = f", {g['ppl_uptrained']:.2f} after uptraining" if g.get("ppl_uptrained") is not None else ""
        s += (f"; {g['n_kv_heads_before']} -> {g['n_kv_heads_after']} KV heads moves held-out perplexity "
              f"{g['ppl_before']:.2f} -> {g['ppl_after']:.2f}{up} for "
              f"{g['kv_bytes_after']['measured'] / max(g['kv_bytes_before']['measured'], 1):.0%} of the cache")
    m = read_json(out / "mla" / MLA_JSON.name)
    if m is not None:
        up = f", {m['ppl_uptrained']:.2f} after uptraining" if m.get("ppl_uptrained") is not None else ""
        s += (f"; MLA at rank {m['kv_rank']}: perplexity {m['ppl_before']:.2f} -> {m['ppl_after']:.2f}{up}, "
              f"{m['kv_fraction']:.0%} of the cache")
    k = read_json(out / KVCACHE_JSON.name)
    if k is not None:
        rows = {r["method"]: r for r in k.get("rows", [])}
        full, chosen, rnd = rows.get("full"), next((r for m_, r in rows.items() if m_ not in ("full", "random")),
                                                  None), rows.get("random")
        if full and chosen:
            s += (f"; keeping full KV for {chosen['budget']:.0%} of KV heads (sink + window for the rest) gives "
                  f"perplexity {chosen['perplexity']:.2f} vs {full['perplexity']:.2f} full"
                  + (f" and {rnd['perplexity']:.2f} for a random choice" if rnd else "")
                  + f" at {chosen['kv_ratio']:.0%} of the bytes read")
    causal = state.get("model", {}).get("causal")
    if not causal:
        s += ("; fewer KV heads is a decoder question (an encoder keeps no cache): GQA, MLA and the head-aware "
              "cache do not apply")
    return s + "."


def _q3(out: Path, state: dict[str, Any]) -> str:
    s = "Which heads are redundant: "
    p = read_json(out / PRUNE_JSON.name)
    if p is not None:
        within = p.get("within") or {}
        level = max(within, key=lambda k: float(k.rstrip("%")), default=None)
        if level is not None:
            w = within[level]
            label = "after recovery" if "recovered" in w else "without recovery"
            metric = "perplexity" if p.get("baseline_perplexity") else p["metric"]
            claim = drop_claim(level_of(level), w.get("recovered") or w, p.get("heldout_passages"))
            s += claim.sentence(of=f"of {metric} {label}", rerun="rerun the prune stage") + f" ({p['method']} order)"
        sm = p.get("saved_model")
        if sm:
            s += (f"; the physically pruned model keeps {sm['heads_kept']} heads and {sm['parameters']:,} of "
                  f"{sm['parameters_original']:,} parameters")
    else:
        s += f"no pruning curve ({_why(state, 'prune')})"
    imp = read_json(out / IMPORTANCE_JSON.name)
    if imp is not None:
        st = imp["meta"].get("stability") or {}
        ranks = ", ".join(f"{m} {v['spearman_brown']:.2f}" for m, v in st.items())
        s += f"; the criteria's rankings hold up across halves of the passages (split-half, Spearman-Brown): {ranks}"
    return s + "."


def answers(out: Path, state: dict[str, Any]) -> dict[str, str]:
    """{"q1", "q2", "q3"}: one paragraph each, from the files the stages wrote into `out`."""
    heads = int(state.get("model", {}).get("heads") or 0)
    return {"q1": _q1(out, state, heads), "q2": _q2(out, state), "q3": _q3(out, state)}
