"""llama.cpp tokens/s of pruned SmolLM2 GGUFs against the unpruned one, prefill and decode, beside the FLOP-ideal
ratio.

Each model is exported with `headscope export` (f16 by default), loaded in llama-cpp-python, and timed in turn
(unpruned, then each pruned one, every repeat), so load on a shared machine hits them alike; the figure is the
median over repeats of each pruned/unpruned tokens/s ratio. Prefill: one `eval` of a T-token prompt; decode: N
single-token `eval`s after it. The ideal is the ratio of matmul FLOPs per token (Q, K, V, O and FFN
projections, QK^T and AV at the context length, the LM head) of the unpruned to the pruned shape.

    python benchmarks/bench_gguf.py [--threads 1] [--repeats 5] [--prompt 128] [--decode 32] [--dtype f16]

Pruned variants: `uniform` = one query head of every KV group in every layer (a third of the heads; llama.cpp's
`llama` architecture), `per-layer+ffn` = one whole KV group from every other layer (a sixth of the heads) and a
third of the FFN neurons of every layer (`deci`). Heads and neurons are chosen by index, not importance: speed
depends only on the shapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llama_cpp
import numpy as np
import torch

from headscope import load_model
from headscope.export.gguf import Shape, export_gguf, model_shape
from headscope.models.adapter import HeadModel
from headscope.models.checkpoint import save_model
from headscope.redundancy.pruning import UnitMask, prune_heads, prune_units


def variants(hm: HeadModel) -> dict[str, HeadModel]:
    """The unpruned model and the pruned shapes (module docstring)."""
    g, L = hm.group_size, hm.n_layers
    uniform = prune_heads(hm, {l: [k * g for k in range(hm.n_kv_heads)] for l in range(L)})
    per_layer = prune_heads(hm, {l: list(range(g)) for l in range(0, L, 2)})
    ffn = {l: torch.ones(hm.ffn_size(l)) for l in range(L)}
    for m in ffn.values():
        m[::3] = 0.0
    return {"unpruned": hm, "uniform": uniform, "per-layer+ffn": prune_units(per_layer, UnitMask(ffn=ffn))}


def flops(shape: Shape, d: int, dh: int, vocab: int, ctx: int) -> float:
    """Matmul multiply-adds per token at context length `ctx`."""
    total = float(d * vocab)
    for h, kv, ff in zip(shape.n_heads, shape.n_kv_heads, shape.n_ff, strict=True):
        total += d * dh * (2 * h + 2 * kv) + 2 * h * dh * ctx + 3 * d * ff
    return total


def time_one(llm: llama_cpp.Llama, prompt: list[int], n_decode: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one run."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    tok = prompt[-1]
    for _ in range(n_decode):
        llm.eval([tok])
    t2 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_decode / (t2 - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--dtype", default="f16")
    args = ap.parse_args()
    hm = load_model("smollm2")
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, hm.vocab_size, args.prompt)]
    ctx = args.prompt + args.decode // 2
    models, ideal = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, m in variants(hm).items():
            src = save_model(m, Path(tmp) / name)
            info = export_gguf(src, Path(tmp) / f"{name}.gguf", dtype=args.dtype)
            models[name] = llama_cpp.Llama(info["path"], n_ctx=ctx + args.decode, n_threads=args.threads,
                                           n_batch=args.prompt, verbose=False)
            shape = model_shape(m)
            ideal[name] = (info["arch"], sum(shape.n_heads), flops(shape, hm.d_model, hm.d_head, hm.vocab_size, ctx))
        for llm in models.values():  # warm-up
            time_one(llm, prompt, 4)
        runs: dict[str, list[tuple[float, float]]] = {n: [] for n in models}
        for _ in range(args.repeats):
            for name, llm in models.items():
                runs[name].append(time_one(llm, prompt, args.decode))
    base = runs["unpruned"]
    full = ideal["unpruned"][2]
    print(f"SmolLM2-135M {args.dtype}, llama.cpp via llama-cpp-python {llama_cpp.__version__}, {args.threads} "
          f"thread(s), prompt {args.prompt} tokens, decode {args.decode}, {args.repeats} interleaved repeats")
    print("| model | llama.cpp arch | query heads | prefill tok/s | decode tok/s | prefill ratio | decode ratio "
          "| FLOP-ideal |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        pre = statistics.median(x[0] for x in r)
        dec = statistics.median(x[1] for x in r)
        pr = statistics.median(x[0] / b[0] for x, b in zip(r, base, strict=True))
        dr = statistics.median(x[1] / b[1] for x, b in zip(r, base, strict=True))
        arch, heads, f = ideal[name]
        print(f"| {name} | {arch} | {heads} | {pre:.0f} | {dec:.1f} | {pr:.3f} | {dr:.3f} | {full / f:.3f} |")


if __name__ == "__main__":
    main()
