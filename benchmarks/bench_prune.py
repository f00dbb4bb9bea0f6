"""Latency of physically pruned models vs the unpruned one, against the FLOP-ideal speedup.

For each model and p in {25%, 50%} of query heads pruned, times the transformer body (no LM head)
on a fixed batch, interleaving original and pruned models in every repeat so that load on a
shared machine hits them alike, and reports the median. The ideal speedup is 1 / (1 - p * s),
where s is the share of the body's matmul FLOPs that scale with the number of query heads at the
benchmark's sequence length: Q and O projections and the two attention matmuls (QK^T, AV), plus
K and V projections when they shrink with the heads (MHA; in GQA slice pruning every KV head keeps
at least one query head, so K and V stay). Elementwise work (softmax, norms, RoPE) is not counted.

    python benchmarks/bench_prune.py [--models minilm,smollm2] [--threads 1] [--repeats 9]

Heads are chosen at random (fixed seed) and spread evenly over layers; for GQA, whole slices (one
query head of every KV group) go, so p is rounded to a multiple of n_kv_heads per model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from headscope import load_model
from headscope.models.adapter import HeadModel
from headscope.redundancy.pruning.heads import prune_heads

SHAPES = {"minilm": (4, 128), "smollm2": (1, 128)}  # (batch, tokens)


def choose_heads(hm: HeadModel, p: float, seed: int = 0) -> list[tuple[int, int]]:
    """About p of all query heads, spread evenly over layers, in prunable units (slices for GQA)."""
    rng = np.random.default_rng(seed)
    g, n_kv = hm.group_size, hm.n_kv_heads
    unit = n_kv if g > 1 else 1  # heads per unit
    per_layer_units = hm.n_heads // unit
    n_units = int(round(p * hm.n_layers * hm.n_heads / unit))
    counts = [n_units // hm.n_layers + (1 if l < n_units % hm.n_layers else 0) for l in range(hm.n_layers)]
    heads = []
    for layer, k in enumerate(counts):
        k = min(k, per_layer_units)
        if g == 1:
            heads += [(layer, int(h)) for h in rng.choice(hm.n_heads, size=k, replace=False)]
        else:
            for grp in range(n_kv):
                members = rng.choice(g, size=k, replace=False)
                heads += [(layer, grp * g + int(i)) for i in members]
    return heads


def body_flops(hm: HeadModel, heads_per_layer: list[int], kv_per_layer: list[int], T: int) -> float:
    """Matmul FLOPs per token of the transformer body at sequence length T."""
    c = hm.config
    d, dh = hm.d_model, hm.d_head
    ff = int(getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * d)
    mlp_mats = 3 if c.model_type in ("llama", "mistral", "qwen2") else 2
    total = 0.0
    for h, kv in zip(heads_per_layer, kv_per_layer, strict=True):
        total += 2 * d * h * dh  # Q
        total += 2 * 2 * d * kv * dh  # K, V
        total += 2 * h * dh * d  # O
        total += 2 * 2 * T * dh * h  # QK^T and AV (eager computes the full T x T product)
        total += 2 * mlp_mats * d * ff
    return total


def time_body(models: dict[str, HeadModel], ids: torch.Tensor, mask: torch.Tensor, warmup: int,
              repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in models}
    with torch.inference_mode():
        for r in range(warmup + repeats):
            for name, hm in models.items():  # interleaved: drift on a shared machine hits all alike
                t0 = time.perf_counter()
                hm.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
                dt = time.perf_counter() - t0
                if r >= warmup:
                    times[name].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} (after {args.warmup} warmup), "
        f"eager attention, transformer body only"
    )
    print(f"{'model':<8} {'batch x T':>10} {'p':>6} {'s':>6} {'orig ms':>9} {'pruned ms':>10} {'speedup':>8} "
          f"{'ideal':>7} {'achieved/ideal':>15} {'params':>14}")
    for name in args.models.split(","):
        hm = load_model(name)
        B, T = SHAPES[name]
        g = torch.Generator().manual_seed(0)
        vocab = hm.model.get_input_embeddings().num_embeddings
        ids = torch.randint(100, vocab, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        full = body_flops(hm, [hm.n_heads] * hm.n_layers, [hm.n_kv_heads] * hm.n_layers, T)
        variants: dict[str, HeadModel] = {"orig": hm}
        facts = {}
        for p in (0.25, 0.5):
            heads = choose_heads(hm, p)
            small = prune_heads(hm, heads)
            kept = [small.heads_in_layer(l) for l in range(hm.n_layers)]
            kv = [hm.n_kv_heads if hm.group_size > 1 and k > 0 else k for k in kept]
            p_real = len(heads) / (hm.n_layers * hm.n_heads)
            flops_small = body_flops(hm, kept, kv, T)
            s = (full - flops_small) / full / p_real  # share of FLOPs scaling with the heads removed
            variants[f"p{p}"] = small
            facts[f"p{p}"] = (p_real, s, sum(x.numel() for x in small.model.base_model.parameters()))
        med = time_body(variants, ids, mask, args.warmup, args.repeats)
        n_orig = sum(x.numel() for x in hm.model.base_model.parameters())
        for key, (p_real, s, n_par) in facts.items():
            speed = med["orig"] / med[key]
            ideal = 1.0 / (1.0 - p_real * s)
            print(f"{name:<8} {f'{B} x {T}':>10} {p_real:>6.1%} {s:>6.3f} {med['orig'] * 1e3:>9.1f} "
                  f"{med[key] * 1e3:>10.1f} {speed:>8.3f} {ideal:>7.3f} {speed / ideal:>15.1%} "
                  f"{n_par / 1e6:>6.2f}M/{n_orig / 1e6:.2f}M")


if __name__ == "__main__":
    main()
