"""Benchmark MLA decoding (absorbed and naive) against the original model with its full cache, per token,
at several context lengths, side by side in one run (issue 35).

  python benchmarks/bench_mla_decode.py [--model smollm2] [--rank 96] [--contexts 64 2048 4096 8192 16384]
         [--steps 4] [--rounds 3] [--long-rounds 16384=2] [--forms full absorbed naive] [--threads 1] [--json FILE]

Per context length C, three ways to decode one token with C - 1 tokens cached:
  full      the original model, transformers' DynamicCache (K and V of every KV head), sdpa attention
  absorbed  the model converted to MLA (`convert_to_mla`, rank --rank, default RoPE dims), attending in the
            latent space (`kv_b_proj` folded into the query and output sides; the default on a cache)
  naive     the same MLA model re-expanding K and V of every cached token from the latent at every step
Each cache is filled with C - 1 random entries through its own `update` (latency depends on the shapes, not
the numbers); one step (one new token through the whole model) is then timed `--steps` times per round after
one untimed warm-up step, the rounds interleaving the three. `--clock cpu` (default) times the thread's CPU
time, which other processes on a shared machine disturb far less than wall-clock time (`--clock wall`).
Each figure is the median step time over all rounds; the interval is the range of the per-round medians.
The shortest context gives the fixed cost of a step (weights, Python);
what a longer context adds over it is the part the cache's bytes can change.
Weights are converted without calibration data (the fastest frequencies, `selection="high"`): the timing does
not depend on which are kept.
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
from headscope.capacity.mla import convert_to_mla, default_rope_dims, set_decode


def filled(layers: int, key: tuple[int, int], value: tuple[int, int], tokens: int,
           gen: torch.Generator) -> DynamicCache:
    """A DynamicCache holding `tokens` random entries per layer (key [1, h, t, d], value [1, h', t, d'])."""
    cache = DynamicCache()
    for layer in range(layers):
        cache.update(torch.randn(1, key[0], tokens, key[1], generator=gen),
                     torch.randn(1, value[0], tokens, value[1], generator=gen), layer)
    return cache


def step(model: torch.nn.Module, cache: DynamicCache, token: torch.Tensor, clock: str = "cpu") -> float:
    """Seconds one decoding step takes: this thread's CPU time ("cpu", what other processes on a loaded machine
    disturb least) or wall-clock time ("wall")."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    t0 = now()
    model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
    return now() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rank", type=int, default=96)
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 2048, 4096, 8192, 16384])
    ap.add_argument("--forms", nargs="+", default=["full", "absorbed", "naive"],
                    choices=["full", "absorbed", "naive"])
    ap.add_argument("--steps", type=int, default=4, help="decoding steps timed per form per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-rounds", nargs="*", default=[], metavar="C=N",
                    help="fewer rounds for long contexts, e.g. 16384=2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: the thread's CPU time (default; robust to other load on the machine), wall: elapsed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounds_at = {int(k): int(v) for k, v in (x.split("=") for x in args.long_rounds)}
    hm = load_model(args.model)
    layers, n_kv, d = hm.n_layers, hm.n_kv_heads, hm.d_head
    rope = default_rope_dims(hm)
    mla = convert_to_mla(hm, args.rank, rope, selection="high")
    models = {"full": hm.model, "absorbed": mla.model, "naive": mla.model}
    for model in models.values():
        model.set_attn_implementation("sdpa")
    shapes = {"full": ((n_kv, d), (n_kv, d)), "absorbed": ((n_kv, rope), (1, args.rank)),
              "naive": ((n_kv, rope), (1, args.rank))}
    token = torch.tensor([[hm.tokenizer.eos_token_id or 0]])
    gen = torch.Generator().manual_seed(args.seed)
    per_token = {f: layers * (k[0] * k[1] + v[0] * v[1]) * 4 for f, (k, v) in shapes.items()}
    rows = []
    print(f"{hm.name} -> MLA rank {args.rank} + {rope} RoPE dims per KV head: one decoding step, float32, "
          f"{args.threads} thread(s), sdpa, {args.clock} time; KV bytes per token {per_token['full']:,} (full) vs "
          f"{per_token['absorbed']:,} (MLA) = {per_token['absorbed'] / per_token['full']:.4f}")
    print(f"{'context':>8} {'form':<9} {'ms/token':>9} {'round medians':>22} {'vs full':>8} {'steps':>6}")
    t_start = time.perf_counter()
    for context in args.contexts:
        caches = {f: filled(layers, *shapes[f], context - 1, gen) for f in args.forms}
        times: dict[str, list[list[float]]] = {f: [] for f in args.forms}
        with torch.inference_mode():
            for _ in range(rounds_at.get(context, args.rounds)):
                for f in args.forms:
                    if f != "full":
                        set_decode(models[f], "absorbed" if f == "absorbed" else "naive")
                    step(models[f], caches[f], token)  # warm-up, not timed
                    times[f].append([step(models[f], caches[f], token, args.clock) for _ in range(args.steps)])
        base = statistics.median(x for r in times.get("full", []) for x in r) if "full" in times else None
        for f in args.forms:
            flat = [x for r in times[f] for x in r]
            med = statistics.median(flat)
            lo, hi = min(map(statistics.median, times[f])), max(map(statistics.median, times[f]))
            ratio = med / base if base else float("nan")
            rows.append({"context": context, "form": f, "ms_per_token": med * 1e3, "round_median_lo_ms": lo * 1e3,
                         "round_median_hi_ms": hi * 1e3, "vs_full": ratio, "steps": len(flat),
                         "rounds": len(times[f]), "kv_bytes_read": per_token[f] * context})
            print(f"{context:>8} {f:<9} {med * 1e3:>9.1f} {f'[{lo * 1e3:.1f}, {hi * 1e3:.1f}]':>22} {ratio:>8.2f} "
                  f"{len(flat):>6}", flush=True)
        del caches
    print(f"total {time.perf_counter() - t_start:.0f} s; load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"settings": vars(args), "rows": rows, "load": os.getloadavg()}, fh, indent=2)


if __name__ == "__main__":
    main()
