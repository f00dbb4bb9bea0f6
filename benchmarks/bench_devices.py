"""analyze in float32, bfloat16, float16 and dispatched with part of the model on disk, side by side.

  python benchmarks/bench_devices.py [--model minilm] [--limit 32] [--max-length 64] [--cpu-bytes 70000000]

Prints each run's time (1 torch thread), its ratio to float32, and the largest absolute difference
of every statistic to float32 over all heads. The dispatched run uses `device_map="auto"` with
`max_memory={"cpu": --cpu-bytes}`, so what does not fit goes to disk (MiniLM at 70 MB: 4 of 6
layers and the pooler). See docs/devices.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headscope import load_model
from headscope.learned.analyze import analyze


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--data", default="ptb-test")
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--cpu-bytes", type=int, default=70_000_000)
    args = ap.parse_args()
    torch.set_num_threads(1)

    def run(hm):
        t0 = time.perf_counter()
        table = analyze(hm, args.data, limit=args.limit, max_length=args.max_length, batch_size=8)
        return {c: np.asarray(table[c], float) for c in table.columns}, time.perf_counter() - t0

    ref, t_ref = run(load_model(args.model))
    print(f"float32: {t_ref:.1f} s")
    runs = [
        ("bfloat16", dict(dtype="bfloat16")),
        ("float16", dict(dtype="float16")),
        (f"device_map auto, cpu={args.cpu_bytes} bytes", dict(device_map="auto", max_memory={"cpu": args.cpu_bytes})),
    ]
    for name, kw in runs:
        hm = load_model(args.model, **kw)
        if "device_map" in kw:
            placed = list(hm.model.hf_device_map.values())
            print(f"  placement: {placed.count('disk')} of {len(placed)} placed modules on disk")
        got, t = run(hm)
        worst = {c: float(np.nanmax(np.abs(ref[c] - got[c]))) for c in ref if not np.isnan(ref[c]).all()}
        print(f"{name}: {t:.1f} s ({t / t_ref:.2f}x float32); largest abs difference:",
              ", ".join(f"{c} {v:.2g}" for c, v in worst.items()))


if __name__ == "__main__":
    main()
