"""Small differences measured in one process: a plain sdpa forward, analyze through the statistics kernel,
the same with `output="blocks"` and the old eager path, timed in turn for several rounds (CPU time, one
thread; medians). Steadier than separate processes for ratios near 1 on a shared machine.

  python benchmarks/bench_kernel_interleaved.py [--model minilm] [--length 128] [--batch 16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    import torch
    from bench_stats_kernel import passage_ids

    import headscope
    from headscope.learned.analyze import run_stats

    torch.set_num_threads(1)
    hm = headscope.load_model(args.model)
    ids = passage_ids(hm, args.length, args.batch)
    x = {"input_ids": torch.tensor(ids), "attention_mask": torch.ones(args.batch, args.length, dtype=torch.long)}

    def plain() -> None:
        with torch.inference_mode():
            hm.model(**x, use_cache=False)

    runs = {"plain": plain, "kernel": lambda: run_stats(hm, ids, args.batch),
            "fused": lambda: run_stats(hm, ids, args.batch, output="blocks"),
            "eager": lambda: run_stats(hm, ids, args.batch, eager=True)}
    for fn in runs.values():
        fn()  # warm up
    cpu: dict[str, list[float]] = {n: [] for n in runs}
    print(f"load average before: {open('/proc/loadavg').read().split()[0]}")
    for _ in range(args.rounds):
        for name, fn in runs.items():
            c0 = time.process_time()
            fn()
            cpu[name].append(time.process_time() - c0)
    med = {n: statistics.median(v) for n, v in cpu.items()}
    for n, v in med.items():
        print(f"{n:>7} {v:7.3f} CPU s  {v / med['plain']:5.2f}x plain")
    print(f"load average after: {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
