"""The lines `headscope prune` prints for a curve (`redundancy.verbs.PruneResult.lines`)."""

from __future__ import annotations

from typing import Any

from ...errors import plural
from ...eval.metrics import METRICS
from .claims import drop_claim, level_of
from .results import CurveResult

# protected heads shown with their intervals per capability, largest first (prune.json holds all)
SHOWN = 10


def _ppl(metric: str) -> tuple[str, Any]:
    """The name and converter of the figure shown for `metric` (perplexity for lm_loss)."""
    to_ppl = METRICS.get(metric).derived.get("perplexity")
    return ("perplexity", to_ppl) if to_ppl else (metric, lambda v: v)


def curve_lines(res: CurveResult, summary: dict[str, Any]) -> list[str]:
    """What `prune` prints for a head curve: each point, the largest fractions within each drop, redundancy
    per layer and the saved model."""
    name, conv = _ppl(res.metric)
    out = [f"{res.model}: {res.n_layers} layers x {res.n_heads} heads ({res.n_kv_heads} KV), pruning by "
           f"{res.method} ({res.unit}s), {name} on {summary['heldout']}"]
    if "protected" in summary:
        out += protected_lines(summary["protected"])
    head = f"{'removed':>8} {'fraction':>8} {name:>12} {'drop':>8}"
    if res.recover_steps:
        head += f" {name + ' rec.':>16} {'drop rec.':>9}"
    extra_keys = list(res.rows[0].extra)
    out.append(head + "".join(f" {k:>11}" for k in extra_keys))
    for r in res.rows:
        line = f"{r.n_removed:>8} {r.fraction_removed:>8.3f} {conv(r.metric):>12.4f} {r.drop:>8.2%}"
        if res.recover_steps:
            line += f" {conv(r.metric_recovered):>16.4f} {r.drop_recovered:>9.2%}"
        out.append(line + "".join(f" {r.extra[k]:>11.4f}" for k in extra_keys))
    out.append("")
    n = summary["heldout_passages"]
    for lv, w in summary["within"].items():
        s = within_text(lv, w, n)
        if "recovered" in w:
            s += f"; with recovery, {within_text(lv, w['recovered'], n)}"
        out.append(s)
    iv = summary["intervals"]
    out.append(f"(drops with {iv['level']:.0%} {iv['method']} intervals over the {n} held-out passages, paired with "
               f"the unpruned model; 'can go' only when the interval's upper bound stays within)")
    by = "its interval's upper bound" if res.has_intervals else "the point estimate"
    out.append(f"\nredundancy per layer at {res.target_drop:.2%} drop, by {by} (removable / heads):")
    out.append("  " + " ".join(f"L{r['layer']}:{r['removable']}/{r['heads']}" for r in res.redundancy()))
    if "saved_model" in summary:
        m = summary["saved_model"]
        out.append(f"\npruned model: {m['heads_kept']} heads, {m['parameters']:,} parameters "
                   f"(was {m['parameters_original']:,}) in {m['path']}; "
                   + ("a plain config: AutoModel*.from_pretrained(path) loads it" if m["plain_config"] else
                      "its own model_type (heads differ per layer, or transformers refuses the family's config "
                      "with this shape): load it with headscope.load_model or trust_remote_code=True"))
    return out


def protected_lines(p: dict[str, Any]) -> list[str]:
    """prune.json's `protected` as lines: the heads by capability, each with its effect and interval and what it was
    measured on, and whether the curve stopped early because only protected heads remained."""
    parts = [(", ".join(h["head"] for h in heads) or "none") + f" ({cap})" for cap, heads in p["by_capability"].items()]
    out = [f"protected {plural(len(p['heads']), 'head')}, never pruned: " + "; ".join(parts)]
    for cap, heads in p["by_capability"].items():
        how = p["settings"][cap]
        on = f"{how['pairs']} pairs" if "pairs" in how else \
            f"{how['answered']} of {how['haystacks']} haystacks of {how['length']} tokens answered"
        figure = "effect" if "pairs" in how else "retrieval score"
        shown = ", ".join(f"{h['head']} {h['effect']:.3g} [{h['lo']:.3g}, {h['hi']:.3g}]" for h in heads[:SHOWN])
        more = f", and {len(heads) - SHOWN} more (prune.json)" if len(heads) > SHOWN else ""
        out.append(f"  {cap}: {figure} with its {how['intervals']['level']:.0%} interval on {on}: "
                   f"{shown or 'none'}{more}")
    stop = p.get("stopped_at")
    if p.get("stopped_early") and stop is not None:
        out.append(f"the curve stopped early at {stop['n_removed']} heads removed ({stop['fraction_removed']:.1%}): "
                   f"only protected heads (or units holding one) remain")
    return out


def within_text(level: str, w: dict[str, Any], passages: int | None) -> str:
    """One answer of prune.json's `within` as the claim its interval supports (`drop_claim`), and whether the
    point estimate's step is distinguishable from the next one."""
    text = drop_claim(level_of(level), w, passages).sentence()
    nxt = w.get("next_step")
    if nxt is not None and not nxt["distinguishable"]:
        text += f" (the point at {w['fraction_removed']:.3f} is not distinguishable from the next step)"
    return text


def removed_text(removed: list[str]) -> str:
    """One line for a point's removed units: every attention sub-layer or block by name (in removal order),
    and the FFN neurons as a count with the layers that gave most. (The line once showed only the last six
    names; FFN names come last, so a mix curve's attention sub-layers never showed.)"""
    layers = [n for n in removed if not n.startswith("F")]
    ffn = [(int(n[1:].split(":")[0]), int(n.split(":")[1])) for n in removed if n.startswith("F")]
    parts = [" ".join(layers)] if layers else []
    if ffn:
        top = sorted(ffn, key=lambda t: (-t[1], t[0]))[:3]
        parts.append(f"FFN: {sum(c for _, c in ffn)} neurons from {len(ffn)} layers (most: "
                     + ", ".join(f"layer {l} {c}" for l, c in top) + ")")
    return "; ".join(parts)


def unit_curve_lines(res: CurveResult, summary: dict[str, Any]) -> list[str]:
    """What `prune --unit attention/block/ffn/mix` prints: each point with the units it removed."""
    name, conv = _ppl(res.metric)
    timed = res.points[0].speedup is not None
    out = [f"{res.model}: removing {res.unit} units by {res.method}; {name} on {summary['heldout']}",
           f"{'params':>7} {name:>12} {'drop':>8}" + (f" {'recovered':>12}" if res.recover_steps else "")
           + (f" {'speedup':>8} {'ideal':>6}" if timed else "") + "  removed"]
    for r, rec in zip(res.points, res.records(), strict=True):
        line = f"{r.fraction_removed:>7.1%} {conv(r.metric):>12.4f} {r.drop:>8.2%}"
        if res.recover_steps:
            line += f" {conv(r.metric_recovered):>12.4f}"
        if timed:
            line += f" {r.speedup:>8.2f} {r.flop_speedup:>6.2f}"
        out.append(line + "  " + removed_text(rec["removed"].split()))
    return out
