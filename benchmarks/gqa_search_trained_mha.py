"""`search` grouping (calibration-KL search) on the MHA models of gqa_similarity_trained_mha.py.

Companion of `benchmarks/gqa_similarity_trained_mha.py`: it loads the same cached checkpoints (trains
them if the cache is missing, with that script's defaults), the same texts (training = PTB train minus
its last 500 sentences; calibration = those 500; held-out = the first 2,000 PTB valid sentences) and
the same evaluation settings (passages <= 64 tokens, batches of 16), runs

    gqa.search_groups(hm, G, calibration, candidates=8, seed=0)   # the CLI's defaults

for G = 4 and 2, and evaluates the searched conversion on the held-out text (used for nothing else).
It writes one row per (model seed, G) to --csv and prints them beside the adjacent / similarity /
random rows of docs/gqa/trained_mha.csv (which must exist: run the other script first), including
the best of the 10 random groupings as chosen by calibration KL (a choice one could make without the
held-out text) and by held-out KL (an oracle).

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/gqa_search_trained_mha.py --model-seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gqa_similarity_trained_mha as base

from headscope.capacity import gqa
from headscope.data import ptb_sentences

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["model_seed", "G", "grouping", "search_candidates", "search_seed", "heldout_ppl", "heldout_kl",
           "calib_kl", "calib_kl_start", "search_start", "calib_kl_adjacent", "calib_kl_similarity", "kl_evaluations",
           "calibration_batches", "search_seconds", "layers_changed", "chosen", "groups", "ppl_mha",
           "heldout_kl_adjacent_recomputed"]


def comparison(search_rows: list[dict], old_rows: list[dict]) -> str:
    """Held-out ppl / KL of search beside adjacent, similarity (+fallback) and the 10 random groupings."""
    out = [f"{'model':>5} {'G':>2}  {'adjacent':>15}  {'sim+fallback':>15}  {'rand best-calib':>15}  "
           f"{'rand best-held':>15}  {'search':>15}  {'#rand<search':>12}  {'calib KL start->search':>24}  "
           f"{'evals':>5} {'sec':>6}"]
    for s in search_rows:
        rs = [r for r in old_rows if r["model_seed"] == s["model_seed"] and r["G"] == s["G"]
              and r["uptrain_steps"] == 0]
        def get(name: str, rs: list = rs) -> dict:
            return next(r for r in rs if r["grouping"] == name)
        rnd = [r for r in rs if r["grouping"] == "random"]
        by_cal = min(rnd, key=lambda r: r["calib_kl"])
        by_held = min(rnd, key=lambda r: r["heldout_kl"])
        f = lambda r: f"{r['heldout_ppl']:.1f} / {r['heldout_kl']:.3f}"  # noqa: E731
        beat = sum(r["heldout_kl"] < s["heldout_kl"] for r in rnd)
        out.append(f"{s['model_seed']:>5} {s['G']:>2}  {f(get('adjacent')):>15}  "
                   f"{f(get('similarity-data+fallback')):>15}  "
                   f"{f(by_cal):>15}  {f(by_held):>15}  {f(s):>15}  {beat:>9}/{len(rnd)}  "
                   f"{s['calib_kl_start']:.3f} -> {s['calib_kl']:.3f}{'':>8}  {s['kl_evaluations']:>5} "
                   f"{s['search_seconds']:>6.0f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/headscope-trained-mha", help="where trained checkpoints are cached")
    ap.add_argument("--model-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--G", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib", type=int, default=500)
    ap.add_argument("--heldout", type=int, default=2000)
    ap.add_argument("--old-csv", default=str(REPO / "docs/gqa/trained_mha.csv"))
    ap.add_argument("--csv", default=str(REPO / "docs/gqa/trained_mha_search.csv"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.time()
    old_rows = base.read_csv(args.old_csv)
    sents = ptb_sentences("train")
    train, calib = sents[:-args.calib], sents[-args.calib:]
    heldout = ptb_sentences("valid", args.heldout)
    # the other script's training defaults, used only if a checkpoint is not cached
    train_args = argparse.Namespace(work=args.work, hidden=128, layers=4, heads=8, train_steps=2000, anneal_steps=400,
                                    train_batch=16, lr=3e-3)
    ev = dict(max_length=64, batch_size=16)
    rows: list[dict] = []
    for seed in args.model_seeds:
        hm, _ = base.trained_model(train_args, seed, train, heldout[:200])
        for G in args.G:
            t1 = time.perf_counter()
            found = gqa.search_groups(hm, G, calib, candidates=args.candidates, seed=args.seed, **ev)
            wall = time.perf_counter() - t1
            models = {"search": gqa.convert_to_gqa(hm, G, groups=found["groups"]),
                      "adjacent": gqa.convert_to_gqa(hm, G)}
            held = gqa.compare(hm, models, heldout, **ev)
            rows.append(dict(
                model_seed=seed, G=G, grouping="search", search_candidates=args.candidates, search_seed=args.seed,
                heldout_ppl=held["search"]["ppl"], heldout_kl=held["search"]["kl"],
                calib_kl=found["calibration_kl_search"], calib_kl_start=found["calibration_kl_start"],
                search_start=found["search_start"], calib_kl_adjacent=found["calibration_kl_adjacent"],
                calib_kl_similarity=found["calibration_kl_similarity"], kl_evaluations=found["kl_evaluations"],
                calibration_batches=found["calibration_batches"], search_seconds=wall,
                layers_changed=json.dumps(found["layers_changed_by_search"]),
                chosen=json.dumps([t["chosen"] for t in found["search_trace"]]), groups=json.dumps(found["groups"]),
                ppl_mha=held["reference"]["ppl"], heldout_kl_adjacent_recomputed=held["adjacent"]["kl"]))
            print(
                f"[seed {seed}] G={G}: search {wall:.0f} s, {found['kl_evaluations']} KL evaluations; calibration KL "
                f"{found['calibration_kl_start']:.4f} ({found['search_start']}) -> "
                f"{found['calibration_kl_search']:.4f};"
                f" held-out ppl {held['search']['ppl']:.2f} KL {held['search']['kl']:.4f} (adjacent recomputed: "
                f"{held['adjacent']['kl']:.4f}); chosen {[t['chosen'] for t in found['search_trace']]}",
                flush=True,
            )
            base.write_csv(args.csv, rows, COLUMNS)  # after every row, so a cut-short run keeps what it measured
    print(comparison(rows, old_rows))
    print(f"wrote {args.csv}; wall time {time.time() - t0:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
