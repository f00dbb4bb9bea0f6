"""Benchmark data-parallel analyze: 2 processes against 1, side by side in one run.

  python benchmarks/bench_distributed.py [--model minilm] [--data ptb-test] [--limit 256] [--batch-size 16]
         [--max-length 128] [--repeats 3] [--rounds 2] [--json FILE]

Three set-ups run analyze's scan (`headscope.learned.analyze.analyze`: tokenising, the statistics scan, and for
2 processes the all_reduce merge) on the same `--limit` passages:
  (a) 1 process x 1 thread,
  (b) 1 process x 2 threads (the honest best single process on a 2-core machine),
  (c) 2 processes x 1 thread each, gloo, as `--workers 2` / `torchrun --nproc-per-node 2` run it.
Each set-up runs in fresh processes that load the model, warm up on one batch, then time `--repeats`
analyze calls between barriers (model loading is reported apart: it is paid once per process, in
parallel). The set-ups alternate for `--rounds` rounds so a busy neighbour hurts all of them alike;
the median round counts. Throughput is passages per second; the last line is a one-line summary
that judges the 1.6x target against the better single-process set-up, with the machine load
(`os.getloadavg`) before and after. `--from-json FILE` reprints the summary of a saved run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETUPS = {"1 process x 1 thread": (1, 1), "1 process x 2 threads": (1, 2), "2 processes x 1 thread": (2, 1)}
TARGET = 1.6


def child(args: argparse.Namespace) -> None:
    """One rank (or the single process): load, warm up, time `repeats` analyze calls; rank 0 prints JSON."""
    import torch
    import torch.distributed as dist
    import transformers

    import headscope
    from headscope import distributed as hd
    from headscope.data import read_texts
    from headscope.learned.analyze import analyze  # the scan itself (headscope.analyze adds provenance)

    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    hm = headscope.load_model(args.model)
    texts = read_texts(args.data, args.limit)
    load_s = time.perf_counter() - t0
    hd.init("cpu")
    try:
        def sync() -> None:
            if hd.active():
                dist.barrier()

        analyze(hm, texts.texts[: args.batch_size * hd.world_size()], batch_size=args.batch_size,
                max_length=args.max_length)  # warm-up: one batch per rank
        sync()
        t1 = time.perf_counter()
        for _ in range(args.repeats):
            table = analyze(hm, texts, batch_size=args.batch_size, max_length=args.max_length)
        sync()
        scan_s = time.perf_counter() - t1
        if hd.is_main():
            print(json.dumps({"scan_s": scan_s, "load_s": load_s, "passages": table.meta["passages"],
                              "tokens": table.meta["tokens_seen"], "threads": torch.get_num_threads()}))
    finally:
        hd.shutdown()


def run_setup(args: argparse.Namespace, procs: int, threads: int) -> dict:
    """Start `procs` fresh processes of `threads` threads each; return rank 0's JSON."""
    from headscope import distributed as hd

    cmd = [sys.executable, __file__, "--child", "--threads", str(threads), "--model", args.model, "--data", args.data,
           "--limit", str(args.limit), "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
           "--repeats", str(args.repeats)]
    base = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if procs == 1:
        out = subprocess.run(cmd, env=base, capture_output=True, text=True, check=True).stdout
    else:
        store = hd.rendezvous_store()
        ps = [subprocess.Popen(cmd, env={**base, **hd.rank_env(r, procs, store.port)}, stdout=subprocess.PIPE,
                               text=True) for r in range(procs)]
        outs = [p.communicate()[0] for p in ps]
        if any(p.returncode for p in ps):
            raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in ps]}")
        out = outs[0]
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--data", default="ptb-test")
    ap.add_argument("--limit", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="timed analyze calls per process (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="times each set-up runs, alternating (default 2)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--from-json", default=None, help="reprint the summary of a saved --json run (no rerun)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        summarize(saved["runs"], argparse.Namespace(**{**vars(args), **saved["args"]}), saved["load_before"],
                  saved["load_after"])
        return
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name in SETUPS}
    for r in range(args.rounds):
        for name, (procs, threads) in SETUPS.items():
            res = run_setup(args, procs, threads)
            res["throughput"] = res["passages"] * args.repeats / res["scan_s"]
            runs[name].append(res)
            print(f"round {r + 1}: {name:<24} {res['throughput']:7.1f} passages/s  (scan {res['scan_s']:.2f} s for "
                  f"{args.repeats} x {res['passages']} passages, load {res['load_s']:.1f} s, "
                  f"load avg {os.getloadavg()[0]:.2f})", flush=True)
    load_after = os.getloadavg()
    summary = summarize(runs, args, load_before, load_after)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, **summary, "load_before": load_before, "load_after": load_after,
                       "args": {k: v for k, v in vars(args).items() if k not in ("child", "threads", "json",
                                                                                  "from_json")}}, f, indent=1)


def summarize(runs: dict[str, list[dict]], args: argparse.Namespace, load_before, load_after) -> dict:
    """Print the table and the one-line summary; the target is judged against the BEST single process."""
    best = {name: statistics.median(x["throughput"] for x in rs) for name, rs in runs.items()}
    two = best["2 processes x 1 thread"]
    single = {k: v for k, v in best.items() if k.startswith("1 process")}
    best_single = max(single, key=single.get)
    speedup = two / single[best_single]
    print()
    print(f"{'set-up':<24} {'passages/s':>10} {'2 procs vs it':>14}")
    for name, v in best.items():
        print(f"{name:<24} {v:10.1f} {two / v:13.2f}x")
    verdict = "met" if speedup >= TARGET else "missed"
    others = ", ".join(f"{two / v:.2f}x {k} ({v:.1f}/s)" for k, v in single.items())
    print(f"\nbench_distributed: {args.model} analyze, {args.limit} {args.data} passages, batch {args.batch_size}, "
          f"median of {len(next(iter(runs.values())))} rounds: 2 processes x 1 thread {two:.1f} passages/s = "
          f"{speedup:.2f}x the best single process ({best_single}); {others}; target {TARGET}x {verdict}; "
          f"{os.cpu_count()} cores, load avg {load_before[0]:.2f} before / {load_after[0]:.2f} after")
    return {"median_throughput": best, "speedup_vs_best_single": speedup, "best_single": best_single,
            "speedup": {k: two / v for k, v in single.items()}}

if __name__ == "__main__":
    main()
