"""Role census over the UD English-EWT test split on MiniLM: time and peak memory, and whether it streams.

Each size runs in a fresh subprocess (peak RSS only ever grows within a process), so the peaks of
10% and 100% of the sentences are comparable. Run: `nice python benchmarks/bench_roles.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

EWT = "ewt-test"  # the UD English-EWT test split shipped in the package


def child(limit: int, repeat: int = 1) -> None:
    """One measurement: load MiniLM, then the census on the first `limit` EWT sentences (text + syntax),
    the whole list `repeat` times over (same length distribution, `repeat` times the work)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import headscope
    from headscope.data import TextSource, read_conllu
    from headscope.learned.roles import RoleSettings, roles

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    hm = headscope.load_model("minilm")
    roles(hm, ["warm up the kernels once."], RoleSettings(repeat_length=8, n_sequences=2))
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
    t0, c0 = time.perf_counter(), time.process_time()
    sents = read_conllu(EWT)[:limit] * repeat
    table = roles(hm, TextSource([s.text for s in sents], str(EWT), sents), treebank=sents)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rep = table.meta["roles"]
    longest = max(len(hm.tokenizer(s.text)["input_ids"]) for s in sents)
    print(json.dumps({"sentences": len(sents), "longest_tokens": longest, "tokens": table.meta["tokens_seen"],
                      "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                      "peak_rss_mib": round(rss_peak, 1), "rss_after_load_mib": round(rss_loaded, 1),
                      "growth_mib": round(rss_peak - rss_loaded, 1),
                      "arcs": sum(r["count"] for r in rep["syntax"]["relations"].values())}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="0.1,1,2",
                   help="fractions of the split to run, each in a fresh process; above 1 the split is repeated")
    args = p.parse_args()
    if args.child is not None:
        child(args.child, args.repeat)
        return
    from headscope.data import read_conllu

    n = len(read_conllu(EWT))
    rows = []
    for frac in (float(f) for f in args.sizes.split(",")):
        limit, repeat = (max(1, int(n * frac)), 1) if frac <= 1 else (n, int(frac))
        out = subprocess.run([sys.executable, __file__, "--child", str(limit), "--repeat", str(repeat)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    print("\n| sentences | longest (tokens) | tokens | arcs | wall (s) | CPU (s) | peak RSS (MiB) "
          "| RSS after model load (MiB) | growth (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['sentences']} | {r['longest_tokens']} | {r['tokens']} | {r['arcs']} | {r['seconds']} "
            f"| {r['cpu_seconds']} | {r['peak_rss_mib']} | "
            f"{r['rss_after_load_mib']} | {r['growth_mib']} |"
        )


if __name__ == "__main__":
    main()
