"""The study's answer: one short paragraph per question, with the numbers (and intervals) the stages wrote.

Each paragraph reads the stages' artifacts by their declared names through `records.Records`: the Result of a
stage run in this process, the file of a stage reused from an earlier run (the same words either way); a stage
that did not run adds the reason instead of a number. The same text heads the report (study.json's `answers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..artifacts import (
    CIRCUIT_JSON,
    CLUSTERS_JSON,
    GQA_JSON,
    IMPORTANCE_JSON,
    KV_CSV,
    KVCACHE_JSON,
    MLA_JSON,
    PRUNE_CURVE_CSV,
    PRUNE_JSON,
    RANK_CORRELATION_CSV,
    REDUNDANCY_CSV,
    ROLES_JSON,
)
from ..capacity.kv_bytes import human_bytes
from ..redundancy.curves.claims import drop_claim, level_of
from . import comparing, patching
from .records import Records
from .unpruned import kept_original

ROLE_WORDS = {"sink": "sink heads", "previous_token": "previous-token", "next_token": "next-token", "broad": "broad",
              "local": "local", "duplicate_token": "duplicate-token", "induction": "induction",
              "coreference": "coreference", "rare_word": "rare-word", "delimiter": "delimiter", "self": "self"}
# What a head of each role does, in a few plain words (the exact rules: docs/roles.md and the report).
ROLE_PLAIN = {"sink": "park their attention on the first or a special token when they have nothing to do",
              "broad": "spread their attention over the whole text",
              "local": "look at nearby words",
              "previous_token": "look one token back",
              "next_token": "look one token ahead",
              "self": "look at their own token",
              "delimiter": "look at separators and punctuation",
              "duplicate_token": "look at an earlier copy of the current token",
              "induction": "look at what followed an earlier copy of the current token (in-context copying)",
              "coreference": "link a word such as a pronoun to what it refers to",
              "rare_word": "look at the rarest word",
              "retrieval": "copy a fact from far back in a long text",
              "streaming": "need only the first tokens and a recent window"}
INTERVAL = "95% interval"
# the circuit the answer names: the smallest reaching this faithfulness (as the report draws)
FAITHFUL = 0.8


def _why(state: dict[str, Any], stage: str) -> str:
    rec = state.get("stages", {}).get(stage) or {}
    return rec.get("reason") or rec.get("status") or "not run"


def _q1(rec: Records, state: dict[str, Any], heads: int) -> str:
    roles_ran = (state.get("stages", {}).get("roles") or {}).get("status") == "done"
    causal = patching.sentence(rec, _why(state, "patch"), ROLE_WORDS, roles_ran)
    return _roles_clause(rec, state, heads) + causal + _circuit_clause(rec, state) + "."


def _circuit_clause(rec: Records, state: dict[str, Any]) -> str:
    """The smallest circuit of the top edges whose faithfulness reaches FAITHFUL, with its interval (circuit.json);
    the reason when the stage did not run on a model it could take."""
    c = rec.json(CIRCUIT_JSON.name)
    if c is None:
        st = (state.get("stages", {}).get("circuit") or {}).get("status")
        return f"; no circuit ({_why(state, 'circuit')})" if st in ("done", "left out", "failed") else ""
    curve = [p for p in c.get("curve") or [] if isinstance(p.get("faithfulness"), (int, float))]
    n = (c.get("pairs") or {}).get("n", "?")
    method = "EAP-IG" if c.get("method") == "eap-ig" else "EAP"
    first = next((p for p in curve if p["faithfulness"] >= FAITHFUL), None)
    if first is None:
        best = max(curve, key=lambda p: p["faithfulness"], default=None)
        return (f"; edge attribution ({method}, {n} IOI pairs) finds no circuit of under all {c.get('total_edges')} "
                f"edges that restores {FAITHFUL:.0%} of the clean logit difference" +
                (f" (best {best['faithfulness']:.2f} at {best['edges']} edges)" if best else ""))
    rnd = first.get("random")
    return (f"; as a circuit of edges between heads and MLPs ({method}, {n} IOI pairs), the top {first['edges']:,} "
            f"of {c['total_edges']:,} edges ({first['fraction']:.1%}) alone restore {first['faithfulness']:.2f} "
            f"[{first['faithfulness_lo']:.2f}, {first['faithfulness_hi']:.2f}] of the clean logit difference "
            f"(faithfulness; a random circuit of that size: {rnd:.2f})" if isinstance(rnd, (int, float)) else
            f"; as a circuit of edges ({method}, {n} IOI pairs), the top {first['edges']:,} of "
            f"{c['total_edges']:,} edges ({first['fraction']:.1%}) restore {first['faithfulness']:.2f} "
            f"[{first['faithfulness_lo']:.2f}, {first['faithfulness_hi']:.2f}] of the clean logit difference")


def _roles_clause(rec: Records, state: dict[str, Any], heads: int) -> str:
    r = rec.json(ROLES_JSON.name)
    if r is None:
        return f"What the heads learn: no role census ({_why(state, 'roles')})"
    census = r.get("census") or {}
    plain = sorted(((k, len(v)) for k, v in census.items() if not k.startswith("syntactic:")), key=lambda t: -t[1])
    if plain:
        parts = [f"{n} {ROLE_WORDS.get(k, k.replace('_', ' '))}" for k, n in plain[:5]]
        said = [f"{ROLE_WORDS.get(k, k.replace('_', ' ')).removesuffix(' heads')} heads {ROLE_PLAIN[k]}"
                for k, _ in plain[:3] if k in ROLE_PLAIN]
        s = (f"What the heads learn: of the {heads} heads, " + ", ".join(parts) + " have a clear role ("
             + "; ".join(said) + "). A head gets a role only when its whole " + INTERVAL + " beats the role's "
             "baseline, so the report, which also shows heads that pass on the estimate alone, counts a few more")
    else:
        s = (f"What the heads learn: none of the {heads} heads has a role whose whole {INTERVAL} beats its "
             f"baseline")
    syn_roles = sum(len(v) for k, v in census.items() if k.startswith("syntactic:"))
    syn = (r.get("syntax") or {}).get("relations") or {}
    if syn:
        best = max(((rel, v) for rel, v in syn.items() if v.get("count", 0) >= 20),
                   key=lambda t: t[1]["best_accuracy"] - t[1]["baseline"], default=None)
        if best:
            rel, v = best
            s += (f"; on grammar (gold dependency trees), {syn_roles} (head, relation) pairs find a word's "
                  f"grammatical partner more often than the best fixed position does (clearest: {v['best_head']} "
                  f"finds the {rel} relation {v['best_accuracy']:.0%} of the time vs {v['baseline']:.0%} for "
                  f"\"always {abs(v['baseline_offset'])} token{'s' if abs(v['baseline_offset']) != 1 else ''} "
                  f"{'back' if v['baseline_offset'] < 0 else 'ahead'}\", {v['count']} arcs)")
    c = r.get("coreference")
    if c:
        s += (f"; the best coreference head, {c['best_head']}, points from a pronoun or repeated mention to the right "
              f"earlier mention {c['best_accuracy']:.0%} of {c['anaphors']} times (picking the nearest mention with "
              f"the same head word gets {c['same_head_word_baseline']:.0%})")
    lc = r.get("long_context")
    if lc:
        counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in lc["census"].items()) or "no head"
        s += f"; in a {lc['length']}-token text: {counts}"
    cl = rec.json(CLUSTERS_JSON.name)
    if cl is not None:
        n = sum(1 for c_ in cl.get("clusters") or [] if len(c_.get("heads") or []) > 1)
        s += (f"; {n} group{'s' if n != 1 else ''} of near-duplicate heads (same attention and outputs)" if n else
              "; no two heads are near-duplicates")
    return s


def _model_kv_row(rec: Records) -> dict[str, str] | None:
    return next((r for r in rec.rows(KV_CSV.name) if r.get("is_model") == "True" and r.get("source") == "model"), None)


def _q2(rec: Records, state: dict[str, Any]) -> str:
    kv = _model_kv_row(rec)
    s = "Are more heads better: "
    if kv is not None:
        s += (f"the {kv['layout']} cache costs {human_bytes(float(kv['bytes_per_token']))} per token "
              f"({kv['n_kv_heads']} KV heads for {kv['n_heads']} query heads, {kv['dtype']})")
    else:
        s += f"no KV-cost table ({_why(state, 'kv')})"
    g = rec.json(GQA_JSON.name)
    if g is not None:
        up = f", {g['ppl_uptrained']:.2f} after uptraining" if g.get("ppl_uptrained") is not None else ""
        s += (f"; {g['n_kv_heads_before']} -> {g['n_kv_heads_after']} KV heads moves held-out perplexity "
              f"{g['ppl_before']:.2f} -> {g['ppl_after']:.2f}{up} for "
              f"{g['kv_bytes_after']['measured'] / max(g['kv_bytes_before']['measured'], 1):.0%} of the cache")
        s += _compared(rec, state, "gqa", "the GQA model")
    m = rec.json(MLA_JSON.name)
    if m is not None:
        up = f", {m['ppl_uptrained']:.2f} after uptraining" if m.get("ppl_uptrained") is not None else ""
        s += (f"; MLA at rank {m['kv_rank']}: perplexity {m['ppl_before']:.2f} -> {m['ppl_after']:.2f}{up}, "
              f"{m['kv_fraction']:.0%} of the cache")
        s += _compared(rec, state, "mla", "the MLA model")
    k = rec.json(KVCACHE_JSON.name)
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
              "cache do not apply") + _heads_per_layer(rec)
    return s + "."


def _heads_per_layer(rec: Records) -> str:
    """How many heads each layer gave up along the pruning curve before the drop passed its target (redundancy.csv,
    after recovery where the curve trained): question 2 for a model with no cache to shrink."""
    p = rec.json(PRUNE_JSON.name)
    rows = rec.rows(REDUNDANCY_CSV.name)
    if p is None or not rows or p.get("target_drop") is None:
        return ""
    col = "removable_recovered" if rows[0].get("removable_recovered") not in (None, "") else "removable"
    try:
        lost = [int(float(r[col])) for r in rows]
        have = [int(float(r["heads"])) for r in rows]
    except (KeyError, ValueError):
        return ""
    metric = "perplexity" if p.get("metric") == "lm_loss" else str(p.get("metric"))
    if not any(lost):
        return (f"; does each layer need all its heads? Along the pruning curve no head could go before {metric} "
                f"dropped {p['target_drop']:.0%}")
    counts = ", ".join(str(n) for n in lost)
    return (f"; does each layer need all its heads? Within a {p['target_drop']:.0%} drop of {metric}, layers "
            f"0-{len(rows) - 1} gave up {counts} of their {have[0] if len(set(have)) == 1 else 'own'} heads "
            f"(redundancy.csv): the layers with the most to spare need fewer heads")


def _q3(rec: Records, state: dict[str, Any]) -> str:
    s = "Which heads are redundant: "
    p = rec.json(PRUNE_JSON.name)
    if p is not None:
        within = p.get("within") or {}
        level = max(within, key=lambda k: float(k.rstrip("%")), default=None)
        claim = None
        if level is not None:
            w = within[level]
            label = "after recovery" if "recovered" in w else "without recovery"
            metric = "perplexity" if p.get("baseline_perplexity") else p["metric"]
            claim = drop_claim(level_of(level), w.get("recovered") or w, p.get("heldout_passages"))
            s += (f"removing heads one step at a time, least important first ({p['method']} order), and measuring "
                  f"{_metric_words(metric)} on held-out text after each step: ")
            s += claim.sentence(of=f"of {metric} {label}", rerun="rerun the prune stage")
            if claim.verdict in ("can go", "cannot tell"):
                s += f" (brackets: the {INTERVAL})"
            s += _resolution(rec, claim.count)
        sm = p.get("saved_model")
        kept = kept_original(rec)
        if kept:
            s += "; " + kept.sentence()
        elif sm:
            removed = int(p.get("n_layers", 0)) * int(p.get("n_heads", 0)) - int(sm["heads_kept"])
            named = claim is not None and removed == claim.count
            what = ("the original model (no head removed)" if removed == 0 else "that pruned model" if named else
                    f"the curve's model at {removed} heads removed")
            s += (f"; the saved model (model/) is {what}: {sm['heads_kept']} heads and "
                  f"{sm['parameters'] / max(sm['parameters_original'], 1):.0%} of the parameters")
            s += _compared(rec, state, "prune", "the pruned model")
    else:
        s += f"no pruning curve ({_why(state, 'prune')})"
    s += _rankings(rec)
    return s + "."


def _compared(rec: Records, state: dict[str, Any], model: str, who: str) -> str:
    """What `who`, saved by stage `model`, kept and lost against the original (the compare stage's compare.csv); why
    it was not compared when the compare stage did not run."""
    rows = rec.compared(model)
    if rows:
        return "; " + comparing.verdicts(rows, who, f"{comparing.FOLDER}/{model}/compare.csv")
    if (state.get("stages", {}).get("compare") or {}).get("status") not in (None, "done"):
        return f"; {who} was not compared with the original ({_why(state, 'compare')})"
    return ""


def _metric_words(metric: str) -> str:
    if metric == "fidelity":
        return "fidelity (how close the pruned model's outputs stay to the original's; 1 = the same)"
    if metric == "perplexity":
        return "perplexity (how surprised the model is by the next word; lower is better)"
    return metric


def _resolution(rec: Records, count: int) -> str:
    """The curve's step size where it decides the answer: the next point it measured after the claimed count."""
    later = []
    for r in rec.rows(PRUNE_CURVE_CSV.name):
        try:
            n = int(float(r["n_removed"]))
        except (KeyError, ValueError):
            continue
        if n > count:
            later.append(n)
    if not later:
        return ""
    nxt = min(later)
    if nxt - count <= 1:
        return ""
    return (f"; the curve measured every {nxt - count} heads, so the true number lies between {count} and "
            f"{nxt - 1}")


def _rankings(rec: Records) -> str:
    """Two answers the student needs together: each criterion ranks heads the same way on other text (split-half
    reliability), yet the criteria disagree with each other (their rank correlation)."""
    imp = rec.json(IMPORTANCE_JSON.name)
    if imp is None:
        return ""
    st = imp["meta"].get("stability") or {}
    ranks = ", ".join(f"{m} {v['spearman_brown']:.2f}" for m, v in st.items())
    s = (f"; how well each way of scoring importance repeats its ranking on two halves of the text (split-half "
         f"reliability, 1 = the same order): {ranks}") if ranks else ""
    pairs: dict[frozenset[str], tuple[str, str, float]] = {}  # each pair of criteria once
    for r in rec.rows(RANK_CORRELATION_CSV.name):
        a = r.get("", "")
        for b, v in r.items():
            try:
                x = float(v)
            except (TypeError, ValueError):
                continue
            if b not in ("", a):
                pairs.setdefault(frozenset((a, b)), (a, b, x))
    if pairs:
        mean = sum(x for _, _, x in pairs.values()) / len(pairs)
        lo = min(pairs.values(), key=lambda t: t[2])
        between = f"mean rank correlation {mean:.2f}; {lo[0]} vs {lo[1]} {lo[2]:.2f}"
        s += (f"; the ways mostly agree with each other on which heads matter ({between})" if mean >= 0.7 else
              f"; but the ways disagree with each other on which heads matter ({between}): which heads look "
              f"redundant depends on how you measure importance")
    return s


def answers(out: Path | Records, state: dict[str, Any]) -> dict[str, str]:
    """{"q1", "q2", "q3"}: one paragraph each, from what the stages wrote (`out`: the study's folder, whose files
    are read, or its `Records`: the Results of the stages run in this process, the files of the others)."""
    rec = Records.of(out)
    heads = int(state.get("model", {}).get("heads") or 0)
    return {"q1": _q1(rec, state, heads), "q2": _q2(rec, state), "q3": _q3(rec, state)}
