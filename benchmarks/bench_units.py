"""Benchmark the layer scans of `score --unit attention|block` (issue 15): passes and time.

  OMP_NUM_THREADS=1 nice python benchmarks/bench_units.py [--model smollm2] [--sentences 16]
      [--max-length 48] [--batch-size 16] [--repeats 2]

The issue's target: a scan over layers or blocks costs at most (units + 1) forward passes over the data,
with prefix reuse where it applies. For each of `attention` and `block` exact ablation this counts, with
hooks, the model forward passes per batch (calls of the base model) and the block evaluations (calls of
each layer's FFN output projection, which run only when a block really runs: a block skipped by the
prefix reuse does not reach it), with and without prefix reuse, and times the scan against one plain
metric pass over the same batches. Block Influence is counted and timed the same way (one pass).
Results of the two scans are compared (they must be equal). Prints one JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", default="ptb-valid")
    ap.add_argument("--sentences", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch

    import headscope
    from headscope.eval.evaluate import evaluate_prepared, make_reference, prepare
    from headscope.eval.metrics import METRICS
    from headscope.redundancy.importance.units import block_influence, layer_ablation

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hm = headscope.load_model(args.model)
    hm.model.eval()
    prep, metric = prepare(hm, args.data, "auto", args.max_length, limit=args.sentences)
    ref = make_reference(hm, prep, batch_size=args.batch_size) if METRICS.get(metric).needs_reference else None
    L = hm.n_layers
    n_batches = (len(prep.ids) + args.batch_size - 1) // args.batch_size

    counts = {"passes": 0, "blocks": 0}
    hooks = [
        hm.model.base_model.register_forward_pre_hook(lambda *a: counts.__setitem__("passes", counts["passes"] + 1))
    ]
    for l in range(L):
        hooks.append(hm.ffn_out(l).register_forward_pre_hook(
            lambda *a: counts.__setitem__("blocks", counts["blocks"] + 1)))

    def counted(fn):
        counts["passes"] = counts["blocks"] = 0
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0, counts["passes"], counts["blocks"]

    def best(fn):
        runs = [counted(fn) for _ in range(args.repeats)]
        return min(runs, key=lambda r: r[1])

    plain, t_plain, p_plain, b_plain = best(lambda: evaluate_prepared(hm, prep, metric, reference=ref,
                                                                            batch_size=args.batch_size))
    rec = {"model": hm.name, "data": args.data, "sentences": len(prep.ids), "max_length": args.max_length,
           "batch_size": args.batch_size, "batches": n_batches, "layers": L, "repeats": args.repeats,
           "threads": torch.get_num_threads(), "plain_pass_s": t_plain, "plain_passes": p_plain,
           "plain_block_evals": b_plain, "metric": metric, "baseline": plain.value}
    for unit in ("attention", "block"):
        (vr, _), t_r, p_r, b_r = best(lambda unit=unit: layer_ablation(hm, prep, metric, unit, reference=ref,
                                                                     batch_size=args.batch_size))
        (vn, _), t_n, p_n, b_n = best(lambda unit=unit: layer_ablation(hm, prep, metric, unit, reference=ref,
                                                                     batch_size=args.batch_size, reuse_prefix=False))
        rec[unit] = {
            "passes_per_batch": p_r / n_batches, "target_passes_per_batch": L + 1,
            "block_evals_per_batch_reuse": b_r / n_batches, "block_evals_per_batch_naive": b_n / n_batches,
            "block_evals_expected_reuse": L + L * (L + 1) // 2, "block_evals_expected_naive": L + L * L,
            "seconds_reuse": t_r, "seconds_naive": t_n, "plain_passes_equivalent_reuse": t_r / t_plain,
            "plain_passes_equivalent_naive": t_n / t_plain, "speedup_reuse": t_n / t_r,
            "max_abs_diff_reuse_vs_naive": float(np.max(np.abs(vr - vn))),
        }
    _, t_bi, p_bi, b_bi = best(lambda: block_influence(hm, prep, batch_size=args.batch_size))
    rec["block_influence"] = {"passes_per_batch": p_bi / n_batches, "block_evals_per_batch": b_bi / n_batches,
                              "seconds": t_bi, "plain_passes_equivalent": t_bi / t_plain}
    for h in hooks:
        h.remove()
    rec["load"] = os.getloadavg()
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
