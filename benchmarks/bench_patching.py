"""Benchmark the exact patching scan: batched over heads vs the naive per-head loop vs one forward, in one run.

  python benchmarks/bench_patching.py [--model smollm2] [--task ioi] [--pairs 8] [--copies 4,16,64] [--repeats 3]

All three time the same pairs (denoising, all positions, logit_diff): one forward = the corrupt batch once; the
naive loop = one forward of the batch per head (what TransformerLens's per-head helpers do); batched = headscope's
scan with C copies of the batch per forward, each patching one head. Both scans also run the clean and corrupt
forwards once. Medians of --repeats, interleaved; the batched scan's values are checked equal to the loop's.
Prints a JSON line per setting and the ratios side by side. Threads: BENCH_THREADS (default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import numpy as np
    import torch

    from headscope.learned.causal.pairs import induction_pairs, load_pairs
    from headscope.learned.causal.patching import exact_scan, naive_scan, run_metric
    from headscope.models import load_model
    from headscope.models.tiny import tiny_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama", help="tiny-llama (built here) or any model headscope loads")
    p.add_argument("--task", default="ioi")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--copies", default="4,16,64")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    if a.model == "tiny-llama":
        hm = tiny_model("llama")
        b = induction_pairs(None, hm.vocab_size, n=a.pairs, length=8)
    else:
        hm = load_model(a.model)
        b = load_pairs(hm.tokenizer, hm.causal, hm.vocab_size, task=a.task, limit=a.pairs)
    heads = sum(hm.heads_in_layer(l) for l in range(hm.n_layers))
    copies = [int(c) for c in a.copies.split(",")]

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    times: dict[str, list[float]] = {"one forward": [], "naive loop": [], **{f"batched x{c}": [] for c in copies}}
    ref = None
    for _ in range(a.repeats):
        with torch.no_grad():
            times["one forward"].append(timed(lambda: run_metric(hm, b, b.corrupt, "logit_diff"))[0])
        t, ref = timed(lambda: naive_scan(hm, b))
        times["naive loop"].append(t)
        for c in copies:
            t, runs = timed(lambda c=c: exact_scan(hm, b, batch_size=len(b), copies=c))
            times[f"batched x{c}"].append(t)
            np.testing.assert_allclose(runs.patched, ref, rtol=1e-3, atol=1e-3)
    med = {k: statistics.median(v) for k, v in times.items()}
    one = med["one forward"]
    print(json.dumps({"model": hm.name, "pairs": len(b), "tokens": int(b.mask.shape[1]), "heads": heads,
                      "threads": torch.get_num_threads(), "repeats": a.repeats,
                      "seconds": {k: round(v, 4) for k, v in med.items()}}))
    print(f"{'':<14}{'seconds':>9}{'x one forward':>15}{'x naive loop':>14}")
    for k, v in med.items():
        print(f"{k:<14}{v:>9.3f}{v / one:>15.1f}{v / med['naive loop']:>14.2f}")


if __name__ == "__main__":
    main()
