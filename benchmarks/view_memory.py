"""What one long `/api/attention` request costs the view server in memory (docs/view.md, "Memory").

    python benchmarks/view_memory.py [--model smollm2] [--tokens 1000 3000] [--repeats 3]

Starts `headscope view MODEL --max-tokens 4000` on a free 127.0.0.1 port and, for each request, resets the
server process's peak RSS (`/proc/PID/clear_refs`, Linux; needs to own the process), sends one head's request
for a text of about N tokens (each repeat a different text from the built-in sample, so nothing is cached) and
prints the peak RSS above the RSS before the request, the answer's size and its time. Run it with the
repository to measure on PYTHONPATH (before and after a change: the same command on each checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from urllib.parse import quote


def rss_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1000, 3000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layer", type=int, default=3)
    args = ap.parse_args()

    from headscope.data import read_texts

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "headscope", "view", args.model, "--port", "0", "--max-tokens",
                             "4000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        port = int(re.search(r":(\d+)/", proc.stdout.readline())[1])
        base = f"http://127.0.0.1:{port}"
        words = " ".join(read_texts(None).texts).split()
        while len(words) < 12_000:
            words += words
        sent = 0
        for n in args.tokens:
            for _ in range(args.repeats):
                text = " ".join(words[sent * 7: sent * 7 + int(n * 0.85)])  # about n tokens on SmolLM2
                sent += 1
                before = rss_mib(proc.pid, "VmRSS")
                with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
                    f.write("5")  # the peak (VmHWM) starts again from the current RSS
                start = time.perf_counter()
                url = f"{base}/api/attention?text={quote(text)}&layer={args.layer}&head=0"
                body = urllib.request.urlopen(url, timeout=900).read()
                took = time.perf_counter() - start
                peak = rss_mib(proc.pid, "VmHWM")
                tokens = len(json.loads(body)["tokens"])
                print(f"{tokens} tokens: RSS before {before:.0f} MiB, peak {peak:.0f} MiB, growth {peak - before:.0f} "
                      f"MiB, answer {len(body) / 2**20:.1f} MiB, {took:.1f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
