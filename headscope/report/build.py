"""Collect everything the report shows into one JSON-ready dict, with the plain-language summaries."""

from __future__ import annotations

import base64
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..stats import STATISTICS
from ..table import HeadTable
from . import plots
from .sources import (
    PRODUCERS,
    Sources,
    clean,
    grid_columns,
    head_index,
    per_head_from_json,
    read_csv_records,
    read_json,
    square_matrix,
)

log = logging.getLogger(__name__)

# What each known column means, shown in the legend and tooltips.
DESCRIPTIONS: dict[str, str] = {"roles": "roles found above their baselines by headscope roles", **STATISTICS}

# Plots written beside report.html; prefixed so they never clash with a verb's own figures.
PLOT_NAMES = {
    "importance": "report-importance.png",
    "prune_curve": "report-prune-curve.png",
    "redundancy": "report-redundancy.png",
    "sweep": "report-sweep.png",
}
GRID_PLOT_COLUMNS = ("entropy_norm", "mean_distance", "first_token_mass", "prev_token_mass", "special_mass")


def missing_note(*names: str) -> str:
    """'not run yet: run `headscope <verb>`' for the verbs that write the missing files."""
    verbs = []
    for n in names:
        v = PRODUCERS.get(n, "")
        if v and v not in verbs:
            verbs.append(v)
    return "not run yet: run " + " and ".join(f"`headscope {v}`" for v in verbs) + f" (no {', '.join(names)})"


def _flat(arr: np.ndarray) -> list:
    return clean(np.asarray(arr).ravel().tolist())


def _heads_list(items: Sequence[tuple[int, int, float]], k: int = 4) -> str:
    return ", ".join(f"L{l}H{h}" for l, h, _ in items[:k]) + (" ..." if len(items) > k else "")


def _frac_text(n: int, total: int) -> str:
    return f"{n} of {total} heads"


# --- question 1 --------------------------------------------------------------------------------
def summarise_heads(table: HeadTable, special_names: str) -> list[str]:
    """Plain sentences about the per-head statistics and roles of this model."""
    N = table.n_layers * table.n_heads
    out: list[str] = []

    def above(col: str, thr: float) -> list[tuple[int, int, float]]:
        if col not in table:
            return []
        v = np.asarray(table[col], float)
        return sorted([(l, h, float(v[l, h])) for l, h in table.heads() if v[l, h] > thr], key=lambda t: -t[2])

    sink_col = "special_mass" if "special_mass" in table and np.nanmax(np.asarray(table["special_mass"], float)) > 0 \
        else "first_token_mass"
    sinks = above(sink_col, 0.5)
    if sink_col in table:
        where = special_names if sink_col == "special_mass" else "the first token"
        out.append(f"{_frac_text(len(sinks), N)} put more than half their attention on {where}"
                   + (f" (strongest: {_heads_list(sinks, 3)})" if sinks else "")
                   + "; such heads mostly 'rest' there when they have nothing to do.")
    prev = above("prev_token_mass", 0.5)
    if "prev_token_mass" in table:
        out.append(f"{_frac_text(len(prev), N)} are previous-token heads (over half their attention one token back)"
                   + (f": {_heads_list(prev)}." if prev else "."))
    if "entropy_norm" in table:
        e = np.nanmean(np.asarray(table["entropy_norm"], float), axis=1)
        trend = "broader" if e[-1] > e[0] + 0.05 else "sharper" if e[-1] < e[0] - 0.05 else "about as focused"
        out.append(f"Attention gets {trend} with depth: mean normalised entropy is {e[0]:.2f} in layer 0 and "
                   f"{e[-1]:.2f} in layer {table.n_layers - 1} (1 = uniform over the context).")
    if "mean_distance" in table:
        (l, h, d), = table.top("mean_distance", 1)
        out.append(f"The longest-range head is L{l}H{h}, looking {d:.1f} tokens away on average.")
    if "roles" in table:
        fams: dict[str, set[tuple[int, int]]] = {}
        none = 0
        for l, h in table.heads():
            v = table["roles"][l, h]
            names = [r.strip() for r in str(v).split(";") if r.strip() and str(v) not in ("nan", "None")]
            if not names:
                none += 1
            for r in names:
                fams.setdefault(r.split(":", 1)[0], set()).add((l, h))
        if fams:
            parts = ", ".join(f"{r} {len(c)}" for r, c in sorted(fams.items(), key=lambda t: -len(t[1])))
            out.append(f"Heads per role family (a head can hold several): {parts}; {none} heads hold no role "
                       "above its baseline.")
    return out


def _roles_column(table: HeadTable) -> list[str] | None:
    if "roles" not in table:
        return None
    vals = []
    for l, h in table.heads():
        v = table["roles"][l, h]
        s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
        vals.append(";".join(r.strip() for r in s.split(";") if r.strip()))
    return vals


MIN_RELATION_COUNT = 20


def _syntax(src: Sources, coref: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Best head per relation against its baseline (syntax.csv), plus the coreference row from roles.json."""
    p = src.get("syntax.csv")
    if p is None and not coref:
        return None
    rows: list[dict[str, Any]] = []
    cols: list[str] = []
    if p is not None:
        got = read_csv_records(p)
        if got is not None:
            cols, rows = got
    rel = next((c for c in ("relation", "rel", "deprel", "task") if c in cols), None)
    acc = next((c for c in ("accuracy", "acc", "score") if c in cols), None)
    base = next((c for c in cols if c.startswith("baseline") and c != "baseline_offset"), None)
    baselines: dict[str, Any] = {}
    if "kind" in cols and rel and acc:
        # `headscope roles` writes one offset-baseline row per relation after the per-head rows.
        for r in rows:
            if r.get("kind") != "head":
                baselines[str(r.get(rel))] = (r.get(acc), r.get("baseline_offset"))
        rows = [r for r in rows if r.get("kind") == "head"]
    best: list[dict[str, Any]] = []
    if rel and acc:
        by_rel: dict[str, dict[str, Any]] = {}
        for r in rows:
            k = str(r.get(rel))
            if isinstance(r.get(acc), (int, float)) and (k not in by_rel or r[acc] > by_rel[k][acc]):
                by_rel[k] = r
        for k, r in by_rel.items():
            b = baselines.get(k, (r.get(base) if base else None, None))
            lh = head_index(r, 10**6, 10**6)
            best.append({"relation": k, "best head": f"L{lh[0]}H{lh[1]}" if lh else "?", "accuracy": r[acc],
                         "baseline": b[0], **({"baseline offset": b[1]} if b[1] not in (None, "") else {}),
                         **({"count": r["count"]} if "count" in r else {})})
    # Relations seen only a few times give accuracies of 0 or 1 by chance; leave them out.
    rare = [r for r in best if isinstance(r.get("count"), (int, float)) and r["count"] < MIN_RELATION_COUNT]
    best = [r for r in best if r not in rare]
    if coref and isinstance(coref.get("best"), dict):
        best.append(coref["best"])
    best.sort(key=lambda r: -(r["accuracy"] or 0))
    text: list[str] = []
    if best:
        beats = [r for r in best if isinstance(r.get("baseline"), (int, float)) and r["accuracy"] > r["baseline"]]
        text.append(f"For {len(beats)} of {len(best)} relations the best single head beats its positional baseline; "
                    "top: " + ", ".join(f"{r['relation']} {r['best head']} {r['accuracy']:.2f}"
                                        + (f" (baseline {r['baseline']:.2f})" if isinstance(r.get("baseline"), (int, float))
                                           else "") for r in best[:3]) + ".")
    columns = []
    for r in best:
        columns += [c for c in r if c not in columns]
    note = (f"Best single head per relation (green: beats its baseline); {len(rare)} relations seen fewer than "
            f"{MIN_RELATION_COUNT} times are left out." if rare else
            "Best single head per relation (green: beats its baseline).")
    return {"columns": columns, "best": best[:60], "text": text, "note": note, "relation": "relation", "accuracy": "accuracy",
            "baseline": "baseline", "rows": len(rows)}


def role_report(rj: Any, n_layers: int, n_heads: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per-head role scores with baselines, and the extras (census, coreference), from roles.json.

    roles.json holds `scores` and `baselines` as [layer][head] matrices (baseline of score X named
    `X_uniform`, `X_baseline`, or `uniform_distance` for mean_distance); other layouts fall back to a
    generic per-head reader.
    """
    extras: dict[str, Any] = {}
    per_head: dict[str, dict[str, Any]] = {}
    if not isinstance(rj, dict):
        return per_head_from_json(rj, n_layers, n_heads), extras
    body = rj.get("roles") if isinstance(rj.get("roles"), dict) and "scores" in rj.get("roles", {}) else rj
    scores, baselines = body.get("scores"), body.get("baselines") or {}

    def grid(m: Any) -> np.ndarray | None:
        try:  # a [layer][head] matrix (or flat list); anything else is not a per-head score
            return np.asarray(m, dtype=float).reshape(n_layers, n_heads)
        except (TypeError, ValueError):
            return None

    if isinstance(scores, dict):
        base_grids = {k: grid(v) for k, v in baselines.items()} if isinstance(baselines, dict) else {}
        for name, m in scores.items():
            a = grid(m)
            if a is None:
                continue
            bname = next((b for b in (f"{name}_uniform", f"{name}_baseline", name.replace("_mass", "_uniform"),
                                      "uniform_distance" if name == "mean_distance" else "")
                          if base_grids.get(b) is not None), None)
            for l in range(n_layers):
                for h in range(n_heads):
                    rec = {"score": clean(float(a[l, h]))}
                    if bname:
                        rec["baseline"] = clean(float(base_grids[bname][l, h]))
                        # A local head attends closer than uniform attention would: lower is the role.
                        rec["beats baseline when"] = "lower" if name == "mean_distance" else "higher"
                    per_head.setdefault(f"L{l}H{h}", {})[name] = rec
        # Plain statistics already sit in the head's numbers; keep the scores that have a baseline.
        if any("baseline" in r for rec in per_head.values() for r in rec.values()):
            per_head = {k: {n: r for n, r in rec.items() if "baseline" in r} for k, rec in per_head.items()}
        th = body.get("thresholds")
        if isinstance(th, dict):
            extras["thresholds"] = clean(th)
    else:
        per_head = per_head_from_json(body, n_layers, n_heads)
    census = body.get("census")
    if isinstance(census, dict):
        rows = []
        for role, heads in census.items():
            if isinstance(heads, list):
                top = [x for x in heads if isinstance(x, dict)]
                rows.append({"role": role, "heads": len(heads),
                             "best": ", ".join(f"{x.get('head')} {fmt_num(x.get('score'))}"
                                               + (f" (baseline {fmt_num(x.get('baseline'))})"
                                                  if isinstance(x.get('baseline'), (int, float)) else "")
                                               for x in top[:4])})
        extras["census"] = rows
    co = body.get("coreference")
    if isinstance(co, dict) and "accuracy" in co:
        a = np.asarray(co["accuracy"], float)
        if a.size == n_layers * n_heads and not np.all(np.isnan(a)):
            a = a.reshape(n_layers, n_heads)
            l, h = np.unravel_index(int(np.nanargmax(a)), a.shape)
            b = [co.get(k) for k in ("nearest_mention_baseline", "same_head_word_baseline")
                 if isinstance(co.get(k), (int, float))]
            extras["coref"] = {"best": clean({"relation": "coreference (antecedent)", "best head": f"L{l}H{h}",
                                              "accuracy": float(a[l, h]), "baseline": max(b) if b else None,
                                              "count": co.get("count", co.get("anaphors"))})}
    return clean(per_head), extras


def fmt_num(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else str(v)


def _similarity(src: Sources, n_layers: int, n_heads: int) -> dict[str, Any] | None:
    pairs_p, npz_p, cl_p = src.get("similar_pairs.csv"), src.get("similarity.npz"), src.get("clusters.json")
    if not (pairs_p or npz_p or cl_p):
        return None
    out: dict[str, Any] = {"text": []}
    if pairs_p:
        got = read_csv_records(pairs_p)
        if got:
            cols, rows = got
            out["pairs_columns"] = cols
            # The file lists the most similar pairs first: keep the top 30, and each head's top 3 so
            # every head can show its neighbours, without embedding all n*(n-1)/2 pairs.
            keep, per_head = [], {}
            for i, r in enumerate(rows):
                a, b = str(r.get("head_a")), str(r.get("head_b"))
                if i < 30 or per_head.get(a, 0) < 3 or per_head.get(b, 0) < 3:
                    keep.append(r)
                    per_head[a] = per_head.get(a, 0) + 1
                    per_head[b] = per_head.get(b, 0) + 1
            out["pairs"] = keep
            if rows and "head_a" in cols:
                r = rows[0]
                nums = ", ".join(f"{c} {r[c]:.2f}" for c in [c for c in cols if c not in ("head_a", "head_b")
                                                             and isinstance(r.get(c), (int, float))][:4])
                out["text"].append(f"The most similar pair is {r['head_a']} and {r.get('head_b')} ({nums}).")
    if cl_p:
        data = read_json(cl_p)
        clusters = data.get("clusters", data) if isinstance(data, dict) else data
        if isinstance(clusters, dict):
            clusters = list(clusters.values())
        if isinstance(clusters, list):
            norm = []
            for c in clusters:
                heads = c.get("heads", c.get("members")) if isinstance(c, dict) else c
                if isinstance(heads, list):
                    norm.append({"heads": [str(h) if not isinstance(h, list) else f"L{h[0]}H{h[1]}" for h in heads],
                                 **({k: clean(v) for k, v in c.items() if k not in ("heads", "members")}
                                    if isinstance(c, dict) else {})})
            multi = [c for c in norm if len(c["heads"]) > 1]
            out["clusters"] = norm
            out["text"].append(
                f"{len(multi)} redundancy clusters of near-duplicate heads ({sum(len(c['heads']) for c in multi)} heads "
                "in all)." if multi else "No two heads are near-duplicates: every redundancy cluster holds one head.")
    if npz_p:
        N = n_layers * n_heads
        mats = {}
        try:
            with np.load(npz_p, allow_pickle=False) as z:
                for k in z.files:
                    if z[k].dtype.kind not in "fiu":
                        continue  # head names, metadata
                    a = np.asarray(z[k], float)
                    if a.size == N * N and N <= 600:  # larger matrices would make the page heavy
                        a = a.reshape(N, N)
                        lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
                        q = np.rint((np.nan_to_num(a, nan=lo) - lo) / (hi - lo or 1.0) * 255).astype(np.uint8)
                        mats[k] = {"min": clean(lo), "max": clean(hi),
                                   "data": base64.b64encode(q.tobytes()).decode("ascii")}
        except Exception as e:  # a foreign or truncated npz must not break the whole page
            log.warning("cannot read %s (%s)", npz_p, e)
        if mats:
            out["matrices"] = mats
    return out


# --- question 2 --------------------------------------------------------------------------------
KV_SHOW = ("source", "name", "layout", "n_layers", "n_heads", "n_kv_heads", "d_head", "dtype", "bytes_per_token",
           "seq_len", "bytes_per_sequence", "vs_mha", "note")


def _human(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or float(n).is_integer() else f"{n:.2f} {unit}"
        n /= 1024
    return ""


def _kv_view(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    cols = [c for c in KV_SHOW if any(c in r for r in rows)]
    out = []
    for r in rows:
        v = {c: r.get(c) for c in cols}
        if "bytes_per_token" in v:
            v["per token"] = _human(r.get("bytes_per_token"))
        if "bytes_per_sequence" in v:
            v["per sequence"] = _human(r.get("bytes_per_sequence"))
        if isinstance(r.get("is_model"), bool) and r["is_model"] and r.get("source", "model") == "model":
            v["layout"] = f"{r.get('layout')} (this model)"
        out.append(v)
    extra = [c for c in ("per token", "per sequence") if any(c in r for r in out)]
    return cols + extra, out


def kv_rows(meta: dict[str, Any], src: Sources, config: Any = None) -> tuple[list[str], list[dict[str, Any]], str]:
    """KV-cache rows: kv.csv when `headscope kv` wrote one, else headscope.kv's calculator for the
    model plus the classic configs, else the model's own row computed here."""
    p = src.get("kv.csv")
    if p is not None:
        got = read_csv_records(p)
        if got:
            for r in got[1]:
                if isinstance(r.get("is_model"), str):
                    r["is_model"] = r["is_model"].lower() == "true"
            cols, rows = _kv_view(got[1])
            return cols, rows, f"from {p}"
    L, H, KV, D = (meta.get(k) for k in ("n_layers", "n_heads", "n_kv_heads", "d_head"))
    if not all(isinstance(v, int) for v in (L, H, KV, D)):
        return [], [], ""
    cfg = config if config is not None else {
        "_name": meta.get("model", "model"), "model_type": meta.get("model_type", "model"), "num_hidden_layers": L,
        "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D, "hidden_size": H * D}
    try:  # `headscope kv`'s calculator: the model's layouts, then the classic configs
        from .. import kv as kvmod

        rows = [{"source": "model", **r} for r in kvmod.layouts(cfg, 4096, 1, "bf16")]
        rows += [{"source": "classic", **r} for r in kvmod.classic_rows(4096, 1, "bf16")]
        cols, rows = _kv_view([clean(r) for r in rows])
        return cols, rows, "computed here with headscope.kv (bf16 cache, 4096-token sequence, batch 1)"
    except Exception as e:  # the kv module is optional for the report
        log.info("headscope.kv unavailable (%s); computing the model's own row", e)
    rows = []
    for name, kv in (("this model", KV), ("as MHA", H), ("as MQA", 1)):
        b = 2 * L * kv * D * 2  # K and V, every layer, every KV head, d_head values, 2 bytes (bf16)
        rows.append({"source": "model", "name": name, "n_layers": L, "n_heads": H, "n_kv_heads": kv, "d_head": D,
                     "bytes_per_token": b, "seq_len": 4096, "bytes_per_sequence": b * 4096, "vs_mha": kv / H})
    cols, rows = _kv_view(rows)
    return cols, rows, "computed here (bf16: 2 x layers x kv_heads x d_head x 2 bytes per token)"


def _sweep(src: Sources, out: Path, write_plots: bool) -> dict[str, Any] | None:
    """sweep.csv: quality and speed against the head count, one line per KV layout (and task)."""
    p = src.get("sweep.csv")
    if p is None:
        return None
    got = read_csv_records(p)
    if got is None:
        return None
    cols, rows = got
    res: dict[str, Any] = {"columns": cols, "rows": rows, "text": []}
    hcol = next((c for c in ("n_heads", "heads") if c in cols), None)
    kvcol = next((c for c in ("n_kv_heads", "kv_heads") if c in cols), None)
    if hcol is None:
        return res
    tasks = sorted({str(r.get("task")) for r in rows}) if "task" in cols else [None]
    task = "ptb" if "ptb" in tasks else tasks[0]
    sel = [r for r in rows if task is None or str(r.get("task")) == task]
    # The synthetic tasks (xor, pair) are scored by accuracy (higher is better); language modelling by
    # bits or perplexity (lower is better).
    quality, higher_better = None, False
    if task in ("xor", "pair", "synthetic") and "val_acc" in cols:
        quality, higher_better = "val_acc", True
    else:
        quality = next((c for c in ("val_bits_per_token", "val_ppl", "val_loss", "ppl", "loss") if c in cols
                        and any(isinstance(r.get(c), (int, float)) for r in sel)), None)
        if quality is None and "val_acc" in cols:
            quality, higher_better = "val_acc", True
    speed = next((c for c in ("tokens_per_s", "tok_per_s", "throughput") if c in cols), None)
    ok = [r for r in sel if isinstance(r.get(quality), (int, float)) and isinstance(r.get(hcol), (int, float))]
    if not (quality and ok):
        return res
    for r in ok:
        h, kv = r[hcol], r.get(kvcol) if kvcol else None
        lay = "MHA" if kv in (None, h) else "MQA" if kv == 1 else f"GQA (kv={kv:g})" if isinstance(kv, (int, float)) else "?"
        if "d_model" in r and len({x.get("d_model") for x in ok}) > 1:
            lay += f", d_model {r['d_model']:g}"
        r["_group"] = lay if kvcol else quality
    best = (max if higher_better else min)(ok, key=lambda r: r[quality])
    one = [r for r in ok if r.get(hcol) == 1]
    where = f" on the {task} task" if task else ""
    s = f"Best {quality}{where}: {best[quality]:.4g} with {best[hcol]:g} head{'s' if best[hcol] != 1 else ''}"
    if isinstance(best.get("d_head"), (int, float)):
        s += f" of d_head {best['d_head']:g}"
    if best.get("_group") not in (None, quality, "MHA"):
        s += f", {best['_group']}"
    if one and one[0] is not best:
        s += f"; a single head gets {one[0][quality]:.4g}"
    res["text"].append(s + f" ({'higher' if higher_better else 'lower'} is better).")
    if speed:
        sp = [r for r in ok if isinstance(r.get(speed), (int, float))]
        if sp:
            fast, slow = max(sp, key=lambda r: r[speed]), min(sp, key=lambda r: r[speed])
            res["text"].append(f"Training speed runs from {slow[speed]:.3g} {speed} ({slow[hcol]:g} heads) to "
                               f"{fast[speed]:.3g} ({fast[hcol]:g} heads).")
    png = plots.sweep_plot(ok, quality, speed, out / PLOT_NAMES["sweep"] if write_plots else None,
                           heads=hcol, group="_group", title=f"head-count sweep{where}")
    for r in ok:
        r.pop("_group", None)
    res["plot"] = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return res


def _gqa(src: Sources) -> dict[str, Any] | None:
    p = src.get("gqa.json")
    if p is None:
        return None
    data = read_json(p)
    if not isinstance(data, dict):
        return None
    flat = {k: clean(v) for k, v in data.items() if not isinstance(v, (dict, list))}
    nested = {k: clean(v) for k, v in data.items() if isinstance(v, (dict, list))}
    text = []
    num = lambda k: isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)
    if num("ppl_before") and num("ppl_after"):
        s = (f"Converting {data.get('model', 'the model')} from {data.get('n_kv_heads_before', '?')} to "
             f"{data.get('n_kv_heads_after', '?')} KV heads ({data.get('grouping_used', data.get('grouping', '?'))} "
             f"grouping) moves held-out perplexity from {data['ppl_before']:.3g} to {data['ppl_after']:.3g}")
        if num("ppl_uptrained"):
            s += f", and {data['ppl_uptrained']:.3g} after uptraining"
        b, a = data.get("kv_bytes_before"), data.get("kv_bytes_after")
        if isinstance(b, dict) and isinstance(a, dict) and isinstance(b.get("measured"), (int, float)) \
                and isinstance(a.get("measured"), (int, float)) and b["measured"]:
            s += f"; its KV cache shrinks to {a['measured'] / b['measured']:.0%} of the original"
        text.append(s + ".")
    return {"summary": flat, "details": nested, "text": text}


# --- question 3 --------------------------------------------------------------------------------
def _spearman_text(rc: dict[str, Any]) -> str | None:
    names, vals = rc["names"], rc["values"]
    pairs = [(names[i], names[j], vals[i][j]) for i in range(len(names)) for j in range(i + 1, len(names))
             if i < len(vals) and j < len(vals[i]) and vals[i][j] is not None]
    if not pairs:
        return None
    mean = sum(p[2] for p in pairs) / len(pairs)
    lo = min(pairs, key=lambda p: p[2])
    hi = max(pairs, key=lambda p: p[2])
    agree = "largely agree" if mean > 0.7 else "partly agree" if mean > 0.3 else "disagree"
    return (f"The importance criteria {agree} on which heads matter: mean rank correlation {mean:.2f}; "
            f"closest {hi[0]} vs {hi[1]} ({hi[2]:.2f}), furthest {lo[0]} vs {lo[1]} ({lo[2]:.2f}).")


def _find_speedups(obj: Any, path: str = "") -> list[tuple[str, float]]:
    """(key path, value) of every numeric field whose name mentions speedup, at any depth."""
    out: list[tuple[str, float]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if "speedup" in str(k).lower() and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((p, float(v)))
            else:
                out += _find_speedups(v, p)
    return out


def _prune(src: Sources, out: Path, write_plots: bool) -> dict[str, Any]:
    """Pruning curve, redundancy profile and the summary (prune.json) with plain sentences."""
    res: dict[str, Any] = {"text": []}
    summary = read_json(src.get("prune.json")) if src.get("prune.json") else None
    metric_name = "metric"
    lm = False
    if isinstance(summary, dict):
        res["summary"] = {k: clean(v) for k, v in summary.items() if not isinstance(v, (dict, list))}
        res["details"] = {k: clean(v) for k, v in summary.items() if isinstance(v, (dict, list))}
        metric_name = str(summary.get("metric_name", summary.get("metric", metric_name)))
        lm = metric_name == "lm_loss"
        within = summary.get("within")
        if isinstance(within, dict):
            for level, w in within.items():
                if not isinstance(w, dict) or not isinstance(w.get("fraction_removed"), (int, float)):
                    continue
                drop = "perplexity increase" if lm else f"{metric_name} drop"
                part = lambda x: ("no head can be removed" if not x.get("n_removed") else
                                  f"{x['fraction_removed']:.0%} of the heads ({x.get('n_removed', '?')}) can be removed")
                s = f"Within a {level} {drop}, {part(w)}"
                r = w.get("recovered")
                if isinstance(r, dict) and isinstance(r.get("fraction_removed"), (int, float)):
                    s += ("; with recovery training between steps, " +
                          ("still none" if not r.get("n_removed") else
                           f"{r['fraction_removed']:.0%} ({r.get('n_removed', '?')})"))
                res["text"].append(s + ".")
        sm = summary.get("saved_model")
        if isinstance(sm, dict) and isinstance(sm.get("parameters"), (int, float)) \
                and isinstance(sm.get("parameters_original"), (int, float)) and sm["parameters_original"]:
            res["text"].append(f"The physically pruned model keeps {sm.get('heads_kept', '?')} heads and "
                               f"{sm['parameters'] / sm['parameters_original']:.1%} of the parameters "
                               f"({sm['parameters']:,} of {sm['parameters_original']:,}).")
        for k, v in _find_speedups(summary):
            res["text"].append(f"The physically pruned model runs {v:.2f}x as fast as the original ({k}).")
    p = src.get("prune_curve.csv")
    if p is not None:
        got = read_csv_records(p)
        if got:
            cols, rows = got
            show = [c for c in cols if c != "removed"]  # the removed-heads lists make the table unreadable
            res["curve"] = {"columns": show, "rows": [{c: r.get(c) for c in show} for r in rows]}
            ok = [r for r in rows if isinstance(r.get("fraction_removed"), (int, float)) and
                  isinstance(r.get("metric"), (int, float))]
            if ok:
                y, yr = ("perplexity", "perplexity_recovered") if "perplexity" in cols else ("metric", "metric_recovered")
                label = "perplexity" if y == "perplexity" else metric_name
                if not res["text"]:
                    base = min(ok, key=lambda r: r["fraction_removed"])
                    mid = min(ok, key=lambda r: abs(r["fraction_removed"] - 0.5))
                    s = (f"Removing {mid['fraction_removed']:.0%} of the heads ({mid.get('n_removed', '?')}) moves "
                         f"{label} from {base[y]:.4g} to {mid[y]:.4g}")
                    if isinstance(mid.get(yr), (int, float)):
                        s += f"; with recovery training it is {mid[yr]:.4g}"
                    res["text"].append(s + ".")
                png = plots.prune_curve(ok, label, out / PLOT_NAMES["prune_curve"] if write_plots else None,
                                        columns=(y, yr))
                res["curve"]["plot"] = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    p = src.get("redundancy.csv")
    if p is not None:
        got = read_csv_records(p)
        if got:
            cols, rows = got
            res["redundancy"] = {"columns": cols, "rows": rows}
            ok = [r for r in rows if isinstance(r.get("removable"), (int, float)) and
                  isinstance(r.get("layer"), (int, float))]
            if ok:
                target = (summary or {}).get("target_drop") if isinstance(summary, dict) else None
                at = f"At the target drop ({target:.0%})" if isinstance(target, (int, float)) else "At the target drop"
                of = lambda r: f" of {r['heads']:g}" if isinstance(r.get("heads"), (int, float)) else ""
                cols_ = [c for c in ("removable", "removable_recovered")
                         if any(isinstance(r.get(c), (int, float)) for r in ok)]
                if not any(r.get(c) for r in ok for c in cols_):
                    res["text"].append(f"{at}, no head is removable" +
                                       (", with or without recovery." if len(cols_) > 1 else "."))
                    cols_ = []
                for col in cols_:
                    how = " with recovery" if col.endswith("recovered") else ""
                    rs = [r for r in ok if isinstance(r.get(col), (int, float))]
                    tot = sum(r[col] for r in rs)
                    if not tot:
                        res["text"].append(f"{at}, no head is removable{how}.")
                        continue
                    top = max(rs, key=lambda r: r[col])
                    low = min(rs, key=lambda r: r[col])
                    res["text"].append(f"{at}, {tot:g} heads are removable{how}; layer {top['layer']:g} is the most "
                                       f"redundant ({top[col]:g}{of(top)}), layer {low['layer']:g} the least "
                                       f"({low[col]:g}{of(low)}).")
                png = plots.redundancy_profile(ok, out / PLOT_NAMES["redundancy"] if write_plots else None)
                res["redundancy"]["plot"] = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return res


# --- everything --------------------------------------------------------------------------------
def collect(table: HeadTable | None, src: Sources, out: Path, examples: list[dict[str, Any]],
            model_meta: dict[str, Any], special_names: str = "special tokens",
            write_plots: bool = True, config: Any = None) -> dict[str, Any]:
    """The report's data: every section present or a 'not run yet' note, plus the summary sentences."""
    meta = {**model_meta, **({k: v for k, v in table.meta.items() if k not in ("stats", "versions")}
                              if table is not None else {})}
    n_layers = int(meta.get("n_layers") or (table.n_layers if table is not None else 0))
    n_heads = int(meta.get("n_heads") or (table.n_heads if table is not None else 0))
    data: dict[str, Any] = {"model": clean(meta), "n_layers": n_layers, "n_heads": n_heads, "missing": {},
                            "text": {"q1": [], "q2": [], "q3": []}, "descriptions": DESCRIPTIONS,
                            "examples": examples, "plots": {}}
    written: list[str] = []

    # Q1: the grid columns (statistics + role scores + importance), roles as a category.
    columns: dict[str, list] = {}
    if table is not None:
        for name, arr in table.columns.items():
            if np.asarray(arr).dtype.kind == "f":
                columns[name] = _flat(arr)
        roles = _roles_column(table)
        if roles is not None:
            data["roles"] = roles
        data["text"]["q1"] += summarise_heads(table, special_names)
        if write_plots:
            for col in GRID_PLOT_COLUMNS:
                if col in table:
                    name = f"report-heads-{col}.png"
                    plots.heads_grid(np.asarray(table[col], float), f"{col}: {DESCRIPTIONS.get(col, '')}",
                                     out / name)
                    written.append(name)
    else:
        data["missing"]["heads"] = missing_note("heads.csv")
    imp_p = src.get("importance.csv")
    importance: dict[str, list] = {}
    if imp_p is not None and n_layers:
        importance = grid_columns(imp_p, n_layers, n_heads, prefix="importance_")
        if not importance:  # a file that names its criteria without the prefix
            importance = {f"importance_{k}": v for k, v in grid_columns(imp_p, n_layers, n_heads).items()}
    for k, v in importance.items():
        columns.setdefault(k, v)
    data["columns"] = columns
    data["importance_columns"] = list(importance)
    if not importance:
        data["missing"]["importance"] = missing_note("importance.csv")
    elif write_plots:
        plots.importance_grids({k: np.array([np.nan if x is None else x for x in v], float).reshape(n_layers, n_heads)
                                for k, v in importance.items()}, out / PLOT_NAMES["importance"])
        written.append(PLOT_NAMES["importance"])

    roles_p = src.get("roles.json")
    extras: dict[str, Any] = {}
    if roles_p is not None and n_layers:
        rj = read_json(roles_p)
        data["role_scores"], extras = role_report(rj, n_layers, n_heads)
        if extras.get("census") is not None:
            data["census"] = extras["census"]
        if extras.get("thresholds") is not None:
            data["thresholds"] = extras["thresholds"]
    else:
        data["missing"]["roles"] = missing_note("roles.json")
    syn = _syntax(src, extras.get("coref"))
    if syn is None:
        data["missing"]["syntax"] = missing_note("syntax.csv")
    else:
        data["syntax"] = syn
        data["text"]["q1"] += syn.pop("text")
    sim = _similarity(src, n_layers, n_heads)
    if sim is None:
        data["missing"]["similarity"] = missing_note("similar_pairs.csv")
    else:
        data["text"]["q1"] += sim.pop("text")
        data["similarity"] = sim
    if not examples:
        data["missing"]["examples"] = ("no example sentences: give the model (`headscope report MODEL`) "
                                       "and data with passages of 4..24 tokens")

    # Q2
    sweep = _sweep(src, out, write_plots)
    if sweep is None:
        data["missing"]["sweep"] = missing_note("sweep.csv")
    else:
        data["text"]["q2"] += sweep.pop("text")
        data["sweep"] = sweep
        if write_plots and "plot" in sweep:
            written.append(PLOT_NAMES["sweep"])
    kv_cols, kv, kv_from = kv_rows(meta, src, config)
    if kv:
        data["kv"] = {"columns": kv_cols, "rows": kv, "source": kv_from}
        mine = next((r for r in kv if isinstance(r.get("bytes_per_token"), (int, float))
                     and "this model" in str(r.get("layout", "")) + str(r.get("name", ""))), {})
        b = mine.get("bytes_per_token")
        KV, H = meta.get("n_kv_heads"), meta.get("n_heads")
        if b is not None and isinstance(KV, int) and isinstance(H, int):
            s = f"This model caches {b / 1024:.1f} KiB of {mine.get('dtype') or 'bf16'} keys and values per token ({KV} KV heads for {H} query heads"
            s += ", i.e. plain multi-head attention)." if KV == H else \
                f"; as plain MHA it would need {H // KV}x as much)."
            data["text"]["q2"].append(s)
    else:
        data["missing"]["kv"] = missing_note("kv.csv")
    gqa = _gqa(src)
    if gqa is None:
        data["missing"]["gqa"] = missing_note("gqa.json")
        try:  # say so when conversion does not apply to this family at all (encoders like BERT)
            from ..gqa import SUPPORTED_MODEL_TYPES

            mt = meta.get("model_type")
            if mt and mt not in SUPPORTED_MODEL_TYPES:
                data["missing"]["gqa"] = (f"not applicable: `headscope gqa` converts LLaMA-like decoders "
                                          f"({', '.join(SUPPORTED_MODEL_TYPES)}); this model is {mt}")
        except ImportError:
            pass
    else:
        data["text"]["q2"] += gqa.pop("text")
        data["gqa"] = gqa

    # Q3
    rc_p = src.get("rank_correlation.csv")
    if rc_p is not None:
        rc = square_matrix(rc_p)
        if rc is not None:
            data["rank_correlation"] = rc
            t = _spearman_text(rc)
            if t:
                data["text"]["q3"].append(t)
    else:
        data["missing"]["rank_correlation"] = missing_note("rank_correlation.csv")
    if importance:
        first = data["importance_columns"][0]
        vals = [(i // n_heads, i % n_heads, v) for i, v in enumerate(importance[first]) if v is not None]
        if vals:
            vals.sort(key=lambda t: -t[2])
            data["text"]["q3"].insert(0, f"By {first.removeprefix('importance_')}, the most important heads are "
                                         f"{_heads_list(vals, 4)}; the least important are "
                                         f"{', '.join(f'L{l}H{h}' for l, h, _ in vals[-3:][::-1])}.")
    prune = _prune(src, out, write_plots)
    data["text"]["q3"] += prune.pop("text")
    data["prune"] = prune
    if "curve" not in prune:
        data["missing"]["prune_curve"] = missing_note("prune_curve.csv")
    elif write_plots:
        written.append(PLOT_NAMES["prune_curve"])
    if "redundancy" not in prune:
        data["missing"]["redundancy"] = missing_note("redundancy.csv")
    elif write_plots:
        written.append(PLOT_NAMES["redundancy"])
    if "summary" not in prune:
        data["missing"]["prune_summary"] = missing_note("prune.json")
    data["plots_written"] = written
    data["sources"] = {k: str(v) for k, v in src.found.items()}
    return data
