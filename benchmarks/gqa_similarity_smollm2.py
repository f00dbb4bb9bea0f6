"""Similarity vs adjacent grouping on real weights (SmolLM2-135M), where the choice matters.

SmolLM2 has 3 KV heads, so its only conversions (3 -> 1, 3 -> 3) leave no grouping to choose. To
measure the grouping choice on real weights we first make a function-identical MHA copy (each query
head gets its own copy of its KV head: 9 KV heads), then reorder the heads so that the copies of one
original KV head are no longer adjacent (query order 0,3,6,1,4,7,2,5,8 with their KV heads; the
function is unchanged). Converting 9 -> 3 KV heads, adjacent grouping now pools copies of *different*
original KV heads, while similarity grouping (from K/V outputs on PTB train text, or from weights)
should find the original triples and reproduce the original model.

    nice python benchmarks/gqa_similarity_smollm2.py [--calib 64] [--heldout 100] [--out FILE.json]

Prints one JSON object (and writes it with --out): per variant the held-out perplexity on PTB valid,
KL to the original model, and the groups chosen in layer 0.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from headscope import load_model
from headscope.capacity import gqa
from headscope.data import read_texts
from headscope.io import atomic_write_text

# After the reorder, positions {0,3,6} hold copies of original KV head 0, {1,4,7} of head 1, {2,5,8} of head 2.
ORIGINAL = [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calib", type=int, default=64, help="PTB train sentences for similarity (default 64)")
    ap.add_argument("--heldout", type=int, default=100, help="PTB valid sentences for evaluation (default 100)")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    hm = load_model("smollm2")
    calib = read_texts("ptb-train", args.calib)
    heldout = read_texts("ptb-valid", args.heldout)
    mha = gqa.expand_kv_heads(hm)
    order = [0, 3, 6, 1, 4, 7, 2, 5, 8]
    shuffled = gqa.permute_query_heads(mha, [order] * hm.n_layers)
    kw = dict(max_length=args.max_length, batch_size=8)
    sim_data = gqa.similarity_groups(shuffled, 3, calib, **kw)
    sim_weights = gqa.similarity_groups(shuffled, 3, None)
    variants = {
        "adjacent (mean)": gqa.convert_to_gqa(shuffled, 3, "mean"),
        "similarity (K/V on data)": gqa.convert_to_gqa(shuffled, 3, groups=sim_data),
        "similarity (weights)": gqa.convert_to_gqa(shuffled, 3, groups=sim_weights),
        "shuffled MHA (unconverted)": shuffled,
    }
    scores = gqa.compare(hm, variants, heldout, **kw)
    result = {
        "model": "smollm2 (expanded to 9 KV heads, heads reordered 0,3,6,1,4,7,2,5,8), 9 -> 3 KV heads",
        "calib": f"ptb-train[:{args.calib}]", "heldout": f"ptb-valid[:{args.heldout}]",
        "heldout_tokens": scores["reference"]["tokens"], "ppl_original": scores["reference"]["ppl"],
        "variants": {k: scores[k] for k in variants},
        "groups_layer0": {"adjacent": gqa.adjacent_groups(9, 3), "similarity (data)": sim_data[0],
                          "similarity (weights)": sim_weights[0]},
        "layers_where_similarity_found_original_triples": {
            "data": sum(g == ORIGINAL for g in sim_data), "weights": sum(g == ORIGINAL for g in sim_weights),
            "of": hm.n_layers},
        "seconds": round(time.time() - t0, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()
