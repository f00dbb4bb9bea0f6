"""Question 2's quality-vs-bytes panel: KV-cache bytes per token against held-out perplexity, one chart, one table.

Rows come from every `--from` directory (not only the first), so one page can set several runs side by side:
`gqa.json` (MHA -> GQA/MQA), `mla.json` (MHA/GQA -> MLA, one file per latent rank), `kvcache.csv` (head-aware
caches at several budgets). Each row shows the cache's bytes per token relative to the original model's cache
and its perplexity relative to the original model's on the same text, converted and after uptraining. The
verbs evaluate on different texts (gqa/mla: short held-out passages; kvcache: long text, where windows
matter), so only the ratios share the chart's axes; the table says which text each row used.

Beside it, MHA2MLA's published SmolLM-135M results (Ji et al. 2025, arXiv:2502.14837v1, Table 1), which
score six commonsense benchmarks after 2.25B tokens of fine-tuning, not perplexity after 32 steps.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ..artifacts import GQA_JSON, KVCACHE_CSV, KVCACHE_JSON, MLA_JSON, artifact
from ..plots import figure, save_png
from .mixing import read_provenance
from .sources import Part, Sources, data_url, within

COLUMNS = ["method", "setting", "kv_bytes_per_token", "kv_share", "ppl_converted", "ppl_uptrained", "uptrain_steps",
           "ppl_ratio_converted", "ppl_ratio_uptrained", "needle_accuracy", "evaluated_on"]

#: MHA2MLA, Table 1, SmolLM-135M (GQA, 3 KV heads, d_head 64; r = d_h/16 = 4 frequencies = 8 RoPE dims per KV
#: head, joint SVD, 2.25B fine-tuning tokens): KV-cache change and the average of MMLU, ARC, PIQA, HellaSwag,
#: OpenBookQA and Winogrande.
MHA2MLA_SMOLLM_135M = [
    {"model": "SmolLM-135M (original)", "d_kv": "-", "kv_share": 1.0, "avg": 44.50, "tokens": "600B (pre-training)"},
    {"model": "GQA, fine-tuned only", "d_kv": 128, "kv_share": 1.0, "avg": 44.25, "tokens": "2.25B"},
    {"model": "GQA2MLA", "d_kv": 32, "kv_share": 0.3125, "avg": 43.06, "tokens": "2.25B"},
    {"model": "GQA2MLA", "d_kv": 16, "kv_share": 0.1875, "avg": 41.84, "tokens": "2.25B"},
    {"model": "GQA2MLA", "d_kv": 8, "kv_share": 0.125, "avg": 40.97, "tokens": "2.25B"},
]
MHA2MLA_CITE = ("Ji et al. 2025, \"Towards Economical Inference: Enabling DeepSeek's Multi-Head Latent Attention in "
                "Any Transformer-based LLMs\", arXiv:2502.14837v1, Table 1 (SmolLM-135M rows)")


def _all(src: Sources, name: str, seen: dict[str, Any]) -> list[tuple[Path, Any]]:
    """Every readable copy of declared file `name` in the search directories: (path, JSON object or CSV rows).

    Files of another model than the first one found (provenance fingerprint; kvcache.csv's is in the
    kvcache.json beside it) are left out and named in seen["skipped"]: one chart never mixes models.
    """
    found = []
    art = artifact(name)
    for d in src.dirs:
        # None too for a symlink leading out of the folder: never opened
        path = within(d, name)
        if path is None:
            continue
        try:
            if art.kind == "json":
                data = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(data, dict) or art.missing(list(data)):
                    continue
            else:
                with path.open(encoding="utf-8", newline="") as f:
                    data = list(csv.DictReader(f))
                if not data or art.missing(list(data[0])):
                    continue
        except (OSError, ValueError):
            # the section that owns the file reports what is wrong with it
            continue
        rec = read_provenance(path if art.kind == "json" else path.with_name(KVCACHE_JSON.name)) or {}
        fingerprint = (rec.get("model") or {}).get("fingerprint")
        if fingerprint is not None:
            if seen.setdefault("fingerprint", fingerprint) != fingerprint:
                seen["skipped"].append(str(path))
                continue
        found.append((path, data))
    return found


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _per_token(k: Any) -> float | None:
    """Measured cache bytes per token of a kv_bytes record, or None when it lacks measured/batch/seq_len."""
    try:
        return k["measured"] / (k["batch"] * k["seq_len"])
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def rows(src: Sources, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per cache: the originals (once per evaluation text), GQA, MLA and head-aware caches.

    Files from another model than the first one read are left out and their paths added to `skipped`."""
    out: list[dict[str, Any]] = []
    originals: dict[str, dict[str, Any]] = {}
    seen: dict[str, Any] = {"skipped": [] if skipped is None else skipped}

    def original(r: dict[str, Any], per_token: float, text: str) -> None:
        kv_heads = r.get("n_kv_heads", r.get("n_kv_heads_before"))
        originals.setdefault(text, {"method": "original", "setting": f"{kv_heads} KV heads",
                                    "kv_bytes_per_token": per_token, "kv_share": 1.0, "ppl_converted": r["ppl_before"],
                                    "ppl_uptrained": None, "uptrain_steps": 0, "ppl_ratio_converted": 1.0,
                                    "ppl_ratio_uptrained": None, "needle_accuracy": None, "evaluated_on": text})

    for path, g in _all(src, GQA_JSON.name, seen):
        text = f"{g['heldout']} ({g['heldout_passages']} passages, <= {g['max_length']} tokens)"
        before, after = _per_token(g.get("kv_bytes_before")), _per_token(g.get("kv_bytes_after"))
        if before is None or after is None:  # said up front with the other unusable files
            src.problems[f"{path}:kv_bytes"] = (f"{path} has no measured KV bytes per token (kv_bytes_before/after "
                                                f"need measured, batch and seq_len); rerun `headscope gqa` to chart it")
            continue
        original(g, before, text)
        steps = (g.get("uptrain") or {}).get("steps", 0)
        layout = "MQA" if g["n_kv_heads_after"] == 1 else "GQA"
        out.append({"method": layout, "setting": f"{g['n_kv_heads_before']} -> {g['n_kv_heads_after']} KV heads "
                                                 f"({g['grouping_used']})",
                    "kv_bytes_per_token": after, "kv_share": after / before, "ppl_converted": g["ppl_after"],
                    "ppl_uptrained": g["ppl_uptrained"], "uptrain_steps": steps,
                    "ppl_ratio_converted": _ratio(g["ppl_after"], g["ppl_before"]),
                    "ppl_ratio_uptrained": _ratio(g["ppl_uptrained"], g["ppl_before"]),
                    "needle_accuracy": None, "evaluated_on": text})
    for _, m in sorted(_all(src, MLA_JSON.name, seen), key=lambda pm: pm[1]["kv_rank"]):
        text = f"{m['heldout']} ({m['heldout_passages']} passages, <= {m['max_length']} tokens)"
        original(m, m["kv_bytes_per_token_before"], text)
        out.append({"method": "MLA", "setting": f"rank {m['kv_rank']} + {m['rope_dims']} RoPE dims/KV head "
                                                f"({m['selection']})",
                    "kv_bytes_per_token": m["kv_bytes_per_token_after"], "kv_share": m["kv_fraction"],
                    "ppl_converted": m["ppl_after"], "ppl_uptrained": m["ppl_uptrained"],
                    "uptrain_steps": (m.get("uptrain") or {}).get("steps", 0),
                    "ppl_ratio_converted": _ratio(m["ppl_after"], m["ppl_before"]),
                    "ppl_ratio_uptrained": _ratio(m["ppl_uptrained"], m["ppl_before"]),
                    "needle_accuracy": None, "evaluated_on": text})
    for _, table in _all(src, KVCACHE_CSV.name, seen):
        num = lambda v: float(v) if v not in (None, "") else None  # noqa: E731
        full = next((r for r in table if r["method"] == "full"), None)
        full_ppl = num(full["perplexity"]) if full else None
        for r in table:
            text = f"long text, {r['context']} tokens"
            steps = int(float(r["uptrain_steps"] or 0))
            entry = {"method": "original" if r["method"] == "full" else f"head-aware cache ({r['method']})",
                     "setting": "full cache" if r["method"] == "full" else
                     f"budget {float(r['budget']):.0%}" + (f", by {r['chosen_by']}" if r["chosen_by"] else "")
                     + f", sink {r['sink']} + window {r['window']}",
                     "kv_bytes_per_token": num(r["kv_bytes_per_token"]), "kv_share": num(r["kv_fraction"]),
                     "ppl_converted": num(r["perplexity"]) if steps == 0 else None,
                     "ppl_uptrained": num(r["perplexity"]) if steps else None, "uptrain_steps": steps,
                     "needle_accuracy": num(r["needle_accuracy"]), "evaluated_on": text}
            entry["ppl_ratio_converted"] = _ratio(entry["ppl_converted"], full_ppl)
            entry["ppl_ratio_uptrained"] = _ratio(entry["ppl_uptrained"], full_ppl)
            out.append(entry)
    return list(originals.values()) + out


def kv_quality_figure(table: list[dict[str, Any]], path: Path | None = None) -> bytes:
    """Perplexity relative to the original against the share of KV bytes kept; open = converted, filled = uptrained."""
    fig, ax = figure(6.4, 4.2)
    colours = {"MQA": "tab:red", "GQA": "tab:orange", "MLA": "tab:blue"}
    for method in dict.fromkeys(r["method"] for r in table if r["method"] != "original"):
        pts = [r for r in table if r["method"] == method]
        c = colours.get(method, "tab:green" if "score" in method else "tab:gray")
        for key, fill, label in (("ppl_ratio_converted", "none", "converted"), ("ppl_ratio_uptrained", c, "uptrained")):
            xy = sorted((r["kv_share"], r[key]) for r in pts if r[key] is not None and r["kv_share"] is not None)
            if xy:
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", color=c, markerfacecolor=fill,
                        linestyle="-" if label == "uptrained" else ":", label=f"{method}, {label}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("KV-cache bytes per token, share of the original model's")
    ax.set_ylabel("perplexity / original's (log)")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def kv_quality_part(src: Sources) -> Part:
    """The chart and the table (q2), MHA2MLA's published table beside them, or a note naming the verbs to run."""
    part = Part()
    skipped: list[str] = []
    table = rows(src, skipped)
    if not any(r["method"] != "original" for r in table):
        part.panel("q2", "KV-cache bytes against quality", note="no gqa.json, mla.json or kvcache.csv found: run "
                   "`headscope gqa MODEL --kv-heads 1 --uptrain 32`, `headscope mla MODEL --kv-rank R --uptrain 32` "
                   "or `headscope kvcache MODEL`, and pass their --out folders with --from")
        return part
    part.panel("q2", "KV-cache bytes against quality", COLUMNS, table, plot=data_url(kv_quality_figure(table)),
               text=["Each cache's bytes per token relative to the original model's cache, against its perplexity "
                     "relative to the original's on the same text (open markers: converted; filled: after the "
                     "uptraining steps shown). Rows evaluated on different texts share only these ratios."]
               + ([f"Left out (another model than the rows shown): {', '.join(skipped)}."] if skipped else []))
    best = [r for r in table if r["method"] == "MLA" and r["ppl_ratio_uptrained"] is not None]
    if best:
        r = min(best, key=lambda r: r["kv_share"])
        part.say("q2", f"MLA at {r['setting']} keeps {r['kv_share']:.1%} of the KV-cache bytes; held-out perplexity "
                       f"goes {r['ppl_ratio_converted']:.3g}x the original's converted and "
                       f"{r['ppl_ratio_uptrained']:.3g}x after {r['uptrain_steps']} uptraining steps.")
    part.panel("q2", "Published: MHA2MLA on SmolLM-135M", ["model", "d_kv", "kv_share", "avg", "tokens"],
               MHA2MLA_SMOLLM_135M,
               text=[f"{MHA2MLA_CITE}. avg = mean of six commonsense benchmarks (MMLU, ARC, PIQA, HellaSwag, "
                     "OpenBookQA, Winogrande), higher is better; d_kv is the latent per KV head (so rank = 3 d_kv "
                     "here) with 8 RoPE dims per KV head; tokens = fine-tuning tokens. A different model (SmolLM, "
                     "not SmolLM2), metric and training budget from the panel above: compare shapes, not numbers."])
    return part
