"""Benchmark decoding latency per token at a long context with each way of shrinking the KV cache that
headscope builds, against the original model's full cache, side by side in one run (issue 14).

  python benchmarks/bench_decode_caches.py [--model smollm2] [--context 4096] [--ranks 96 48]
         [--budgets 0.25] [--steps 8] [--rounds 3] [--threads 1] [--json FILE]

Caches (each a model and the cache it decodes with):
  full        the original model, transformers' DynamicCache, sdpa attention (what generate() uses)
  MQA         the model converted to 1 KV head (`pool_kv_heads`, mean-pooled), DynamicCache, sdpa
  MLA r       the model converted to MLA with latent rank r (`convert_to_mla`; absorbed decode since issue 35,
              naive before it), DynamicCache holding latent + RoPE dims, sdpa
  head B      the original model with headscope's HeadAwareCache keeping a random share B of KV heads
              full, the rest sink 4 + window 256 (`head_aware_attention`)
Latency depends on the cached tensors' shapes, not their numbers: each cache is filled with
`context - 1` tokens of random entries through its own `update`; one decoding step (one new token
through the whole model) is then timed `--steps` times per round, rounds interleaving the caches. Each
figure is the median step time; ratios are to `full`. Weights are converted without calibration data
(MLA keeps the fastest frequencies, `selection="high"`): the timing does not depend on which.
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
from headscope.capacity.gqa.convert import adjacent_groups, pool_kv_heads
from headscope.capacity.kvcache import HeadAwareCache, head_aware_attention
from headscope.capacity.kvcache.choice import choose_random, n_full_for
from headscope.capacity.mla import convert_to_mla, default_rope_dims


def fill(cache, layers: int, shapes: tuple[tuple[int, int], tuple[int, int]], tokens: int, gen: torch.Generator) -> int:
    """Put `tokens` random entries per layer into `cache` (key [1, h_k, t, d_k], value [1, h_v, t, d_v]);
    returns the KV bytes a decoding step then reads over all layers (float32, `tokens + 1` tokens)."""
    (hk, dk), (hv, dv) = shapes
    for layer in range(layers):
        cache.update(
            torch.randn(1, hk, tokens, dk, generator=gen), torch.randn(1, hv, tokens, dv, generator=gen), layer
        )
    return layers * (hk * dk + hv * dv) * 4 * (tokens + 1)


def step(model, cache, token: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--ranks", type=int, nargs="*", default=[96, 48])
    ap.add_argument("--budgets", type=float, nargs="*", default=[0.25])
    ap.add_argument("--steps", type=int, default=8, help="decoding steps timed per cache per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hm = load_model(args.model)
    L, n_kv, g, d = hm.n_layers, hm.n_kv_heads, hm.group_size, hm.d_head
    gen = torch.Generator().manual_seed(args.seed)
    t = args.context - 1
    runs = {}  # name -> (model, cache, context manager factory or None, KV bytes one step reads)
    cache = DynamicCache()
    runs["full"] = (hm.model, cache, None, fill(cache, L, ((n_kv, d), (n_kv, d)), t, gen))
    mqa = pool_kv_heads(hm, 1, [adjacent_groups(n_kv, 1)] * L)
    cache = DynamicCache()
    runs["MQA"] = (mqa.model, cache, None, fill(cache, L, ((1, d), (1, d)), t, gen))
    rope = default_rope_dims(hm)
    for r in args.ranks:
        mla = convert_to_mla(hm, r, rope, selection="high")
        cache = DynamicCache()
        # MLAAttention caches (k_rope [b, kv, t, rope], latent [b, 1, t, rank]) through update(key, value)
        runs[f"MLA {r}"] = (mla.model, cache, None, fill(cache, L, ((n_kv, rope), (1, r)), t, gen))
    for b in args.budgets:
        plan = choose_random(L, n_kv, n_full_for(b, L * n_kv), args.seed, b).plan(g, 4, 256)
        cache = HeadAwareCache(plan)
        fill(cache, L, ((n_kv, d), (n_kv, d)), t, gen)
        runs[f"head {b:.0%}"] = (hm.model, cache, lambda: head_aware_attention(hm), plan.bytes_read(args.context, d, 4))
    for model in {id(m): m for m, *_ in runs.values()}.values():
        model.set_attn_implementation("sdpa")
    token = torch.tensor([[hm.tokenizer.eos_token_id or 0]])
    times = {n: [] for n in runs}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for n, (model, cache, ctx, _) in runs.items():
                if ctx is None:
                    step(model, cache, token)  # warm-up step of this round, not timed
                    times[n] += [step(model, cache, token) for _ in range(args.steps)]
                else:
                    with ctx():
                        step(model, cache, token)
                        times[n] += [step(model, cache, token) for _ in range(args.steps)]
                        model.set_attn_implementation("sdpa")
    base = statistics.median(times["full"])
    full_bytes = runs["full"][3]
    print(f"{hm.name}: one decoding step at ~{args.context} tokens of context, {args.threads} thread(s), "
          f"{args.rounds} rounds x {args.steps} steps per cache")
    print(f"{'cache':<10} {'KV MiB read/step':>17} {'x full':>7} {'ms/token':>9} {'vs full':>8}")
    rows = []
    for n in runs:
        med = statistics.median(times[n])
        nbytes = runs[n][3]
        rows.append({"cache": n, "kv_bytes_read": nbytes, "kv_fraction": nbytes / full_bytes,
                     "ms_per_token": med * 1e3, "vs_full": med / base, "steps": len(times[n])})
        print(f"{n:<10} {nbytes / 2**20:>17.1f} {nbytes / full_bytes:>7.3f} {med * 1e3:>9.1f} {med / base:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows, "load": os.getloadavg()}, f, indent=2)
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
