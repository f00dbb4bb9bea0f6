"""Seconds a built-in model takes to load (after a first load that converts or caches it), three times each.

    python benchmarks/model_load_time.py minilm smollm2
"""

from __future__ import annotations

import sys
import time

from headscope.models import load_model


def main(names: list[str]) -> None:
    for name in names:
        load_model(name)  # the first load converts a GGUF to the float cache, or warms the file cache
        times = []
        for _ in range(3):
            t = time.perf_counter()
            load_model(name)
            times.append(time.perf_counter() - t)
        print(f"{name}: load {', '.join(f'{s:.2f}' for s in times)} s")


if __name__ == "__main__":
    main(sys.argv[1:] or ["minilm", "smollm2"])
