"""Benchmark the head-aware KV cache: decoding latency per token at a long context, each cache against
the full cache, side by side in one run.

  python benchmarks/bench_kvcache.py [--model smollm2] [--context 4096] [--budgets 0.25 0.5] [--sink 4]
         [--window 256] [--steps 16] [--rounds 3] [--threads 1] [--seed 0] [--json FILE]

Caches, all on one loaded model:
  dynamic     transformers' own DynamicCache, sdpa attention (what generate() uses by default)
  full        headscope's HeadAwareCache with every KV head full (the same computation as `dynamic`)
  budget B    HeadAwareCache keeping a random share B of KV heads full, the rest sink + window
Latency does not depend on the cached numbers, only on their shapes, so each cache is filled with
`context - 1` tokens of random K/V through its own `update` (no 4k-token prefill per cache; the
windowed heads drop what they would drop); then one decoding step (one new token through the whole
model) is timed `--steps` times per round. Rounds interleave the caches (full, dynamic, 25%, ...,
full, ...) so a change in machine load hits them alike; each cache's figure is its median step time,
and ratios are to `full`. The bytes each step reads are printed beside (measured = formula).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import DynamicCache

from headscope import load_model
from headscope.capacity.kvcache import HeadAwareCache, HeadPlan, head_aware_attention
from headscope.capacity.kvcache.choice import choose_random, n_full_for


def fill(cache, n_layers: int, n_kv: int, d_head: int, tokens: int, gen: torch.Generator) -> None:
    """Put `tokens` tokens of random K/V into every layer of `cache` through its own update."""
    for layer in range(n_layers):
        k = torch.randn(1, n_kv, tokens, d_head, generator=gen)
        v = torch.randn(1, n_kv, tokens, d_head, generator=gen)
        cache.update(k, v, layer)


def step(hm, cache, token: torch.Tensor) -> float:
    t0 = time.perf_counter()
    hm.model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.25, 0.5])
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16, help="decoding steps timed per cache per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hm = load_model(args.model)
    L, n_kv, g, d = hm.n_layers, hm.n_kv_heads, hm.group_size, hm.d_head
    plans = {"full": HeadPlan.all_full(L, n_kv, g, args.sink, args.window)}
    for b in args.budgets:
        c = choose_random(L, n_kv, n_full_for(b, L * n_kv), args.seed, b)
        plans[f"budget {b:.0%}"] = c.plan(g, args.sink, args.window)
    names = ["full", "dynamic", *[n for n in plans if n != "full"]]
    gen = torch.Generator().manual_seed(args.seed)
    caches, times = {}, {n: [] for n in names}
    for n in names:
        caches[n] = DynamicCache() if n == "dynamic" else HeadAwareCache(plans[n])
        fill(caches[n], L, n_kv, d, args.context - 1, gen)
    token = torch.tensor([[hm.tokenizer.eos_token_id or 0]])
    reads = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for n in names:
                if n == "dynamic":
                    hm.model.set_attn_implementation("sdpa")
                    step(hm, caches[n], token)  # warm-up step of this round, not timed
                    times[n] += [step(hm, caches[n], token) for _ in range(args.steps)]
                    hm.model.set_attn_implementation("eager")
                    continue
                with head_aware_attention(hm):
                    step(hm, caches[n], token)
                    times[n] += [step(hm, caches[n], token) for _ in range(args.steps)]
                    reads[n] = caches[n].bytes_read
                    ctx = caches[n].get_seq_length()
                    assert reads[n] == plans[n].bytes_read(ctx, d, 4), (n, reads[n], plans[n].bytes_read(ctx, d, 4))
    base = statistics.median(times["full"])
    rows = []
    print(f"{hm.name}: decoding one token at ~{args.context} tokens of context, {args.threads} thread(s), "
          f"{args.rounds} rounds x {args.steps} steps per cache; sink {args.sink}, window {args.window}")
    print(f"{'cache':<12} {'KV full':>8} {'ms/token':>9} {'vs full':>8} {'KV MiB read/step':>17}")
    for n in names:
        med = statistics.median(times[n])
        frac = plans[n].fraction_full if n in plans else 1.0
        mib = reads[n] / 2**20 if n in reads else plans["full"].bytes_read(args.context, d, 4) / 2**20
        rows.append({"cache": n, "kv_fraction": frac, "ms_per_token": med * 1e3, "vs_full": med / base,
                     "kv_mib_read": mib, "steps": len(times[n])})
        print(f"{n:<12} {frac:>8.1%} {med * 1e3:>9.1f} {med / base:>8.2f} {mib:>17.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows, "load": os.getloadavg()}, f, indent=2)
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
