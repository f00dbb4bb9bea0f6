"""Latency of models pruned by units (attention sub-layers, blocks, FFN neurons) against the FLOP-ideal speedup.

Reads the points of `headscope prune --unit ...` runs (their `units.json`: which attention sub-layers and
blocks went, how many FFN neurons per layer), rebuilds each point's physically pruned model (`prune_units`;
which FFN neurons go does not change the time, only how many per layer), and times every model on one fixed
batch (`--batch` rows of `--length` real PTB-valid tokens, no padding), **interleaved**: each round times the
original and then every pruned model once, after one warm-up pass each, so drift and load hit them alike;
the speedup is the median over rounds of original / pruned. The FLOP-ideal speedup is `units.curve.
matmul_flops` of the original over the pruned model's (every projection, the LM head included, plus
attention scores and mixing).

`--align N` adds, for every point with FFN neurons removed, the same model with each layer's kept FFN
width rounded down to a multiple of N (a few more neurons go): whether odd widths cost kernel efficiency.

    HF_HUB_OFFLINE=1 python benchmarks/bench_units_latency.py --from out_attention out_block out_ffn out_mix \
        --threads 2 --rounds 7 --align 64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from headscope import load_model
from headscope.data import prepare_tokens
from headscope.models.adapter import HeadModel
from headscope.redundancy.curves import matmul_flops
from headscope.redundancy.pruning import UnitMask, prune_units
from headscope.redundancy.pruning.heads import n_parameters


def mask_from_names(hm: HeadModel, names: list[str], align: int = 0) -> UnitMask:
    """The UnitMask of a point's removed names (A<l>, B<l>, F<l>:<count>); FFN neurons go from the front.
    With `align`, each layer's kept FFN width is rounded down to a multiple of it."""
    m = UnitMask()
    for name in names:
        if name[0] in "AB":
            kind = "attention" if name[0] == "A" else "block"
            t = getattr(m, kind)
            if t is None:
                t = torch.ones(hm.n_layers)
                setattr(m, kind, t)
            t[int(name[1:])] = 0.0
        else:
            layer, count = map(int, re.fullmatch(r"F(\d+):(\d+)", name).groups())
            width = hm.ffn_size(layer)
            keep = width - count
            if align:
                keep = max(align, keep // align * align)
            g = torch.ones(width)
            g[: width - keep] = 0.0
            m.ffn[layer] = g
    return m


def timed(hm: HeadModel, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        t0 = time.perf_counter()
        hm.model(input_ids=ids, use_cache=False)
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="runs", nargs="+", required=True, help="folders of headscope prune --unit runs")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--align", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    hm = load_model(args.model)
    stream = [t for seq in prepare_tokens(hm, "ptb-valid", 512, 400).ids for t in seq]
    need = args.batch * args.length
    if len(stream) < need:
        raise SystemExit(f"ptb-valid gave {len(stream)} tokens; {need} needed")
    ids = torch.tensor(stream[:need]).view(args.batch, args.length).to(hm.device)
    base_flops = matmul_flops(hm, need, args.length)
    total = n_parameters(hm)
    models: list[tuple[str, HeadModel]] = []
    rows = []
    for run in args.runs:
        rep = json.loads((Path(run) / "units.json").read_text())
        for pt in rep["points"][1:]:
            variants = [("", 0)] + ([(f" aligned {args.align}", args.align)]
                                    if args.align and any(n.startswith("F") for n in pt["removed"]) else [])
            for suffix, align in variants:
                small = prune_units(hm, mask_from_names(hm, pt["removed"], align))
                label = f"{rep['unit']} {100 * (total - n_parameters(small)) / total:.1f}%{suffix}"
                models.append((label, small))
                rows.append({"label": label, "unit": rep["unit"], "aligned": align, "removed": pt["removed"],
                             "fraction_params": (total - n_parameters(small)) / total,
                             "flop_speedup": base_flops / matmul_flops(small, need, args.length)})
    for _, m in [("original", hm), *models]:
        timed(m, ids)  # warm-up
    ratios: list[list[float]] = [[] for _ in models]
    base_times = []
    for r in range(args.rounds):
        base = timed(hm, ids)
        base_times.append(base)
        for k, (_, m) in enumerate(models):
            ratios[k].append(base / timed(m, ids))
        print(f"round {r + 1}/{args.rounds}: original {base:.3f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\n{args.model}: {args.batch} x {args.length} tokens, {torch.get_num_threads()} threads, "
          f"{args.rounds} interleaved rounds; original forward median {statistics.median(base_times):.3f} s")
    print(f"{'model':<28} {'params removed':>14} {'speedup':>8} {'FLOP-ideal':>10} {'achieved/ideal':>14}")
    for row, rs in zip(rows, ratios, strict=True):
        row["speedup"] = statistics.median(rs)
        row["speedups"] = rs
        print(f"{row['label']:<28} {100 * row['fraction_params']:>13.1f}% {row['speedup']:>8.3f} "
              f"{row['flop_speedup']:>10.3f} {100 * row['speedup'] / row['flop_speedup']:>13.0f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "batch": args.batch, "length": args.length,
                                               "threads": torch.get_num_threads(), "rounds": args.rounds,
                                               "original_s": base_times, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
