"""`headscope similar [MODEL]`: head-to-head similarity -> similar_pairs.csv, similarity.npz, clusters.json."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..artifacts import CLUSTERS_JSON, SIMILAR_PAIRS_CSV, SIMILARITY_NPZ, outputs
from ..data import read_texts
from ..errors import HeadscopeError
from ..io import atomic_write_text, prepare_out_dir, staged
from ..learned.options import SimilarOptions
from ..learned.similarity import (
    LN2,
    check_cka_batch,
    check_cka_memory,
    check_thresholds,
    similarity,
)
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..provenance import provenance
from ..table import to_jsonable
from ._common import interval_settings, load_from_args

OUTPUTS = outputs("similar")  # similar_pairs.csv, similarity.npz, clusters.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "similar", SimilarOptions,
        help="head-to-head similarity (attention JS, output CKA, weight subspaces) "
             "and near-duplicate clusters",
        description="Compare every pair of heads: Jensen-Shannon divergence of their attention "
                    "patterns on the same tokens (nats), linear CKA of their outputs, and "
                    "principal angles between their OV and QK weight subspaces. Writes "
                    "similar_pairs.csv (one row per pair, js ascending), similarity.npz "
                    "(the full matrices) and clusters.json (near-duplicate groups).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    out = prepare_out_dir(args.out, args.force, OUTPUTS)  # refuse before any slow work
    if args.top < 0:
        raise HeadscopeError(f"--top must be 0 or more, got {args.top}")
    check_thresholds(args.js_max, args.cka_min)
    check_cka_batch(args.cka_batch)
    if args.cka_pool < 0:
        raise HeadscopeError(f"--cka-pool must be 0 or more tokens, got {args.cka_pool}")
    if args.cka_memory < 1:
        raise HeadscopeError(f"--cka-memory must be at least 1 MiB, got {args.cka_memory}")
    source = read_texts(args.data, args.limit)  # bad data fails before the model loads
    hm = model or load_from_args(args)
    if args.cka == "exact":  # one head's block must fit: known once the model's shape is
        check_cka_memory(args.cka_memory * 2**20, hm.n_layers * hm.n_heads, hm.d_head)
    sim = similarity(hm, source, max_length=args.max_length, batch_size=args.batch_size,
                     js_max_tokens=args.js_max_tokens, seed=args.seed, cka=args.cka, cka_batch=args.cka_batch,
                     cka_pool=args.cka_pool, cka_memory=args.cka_memory * 2**20, progress=True)
    clusters = sim.clusters(args.js_max, args.cka_min)
    pairs = sim.pairs()
    settings = interval_settings(args)
    top = min(args.top, len(pairs))
    lo, hi = sim.js_intervals(list(zip(pairs["head_a"][:top], pairs["head_b"][:top], strict=True)), settings)
    at = list(pairs.columns).index("js") + 1
    pairs.insert(at, "js_lo", np.concatenate([lo, np.full(len(pairs) - top, np.nan)]))
    pairs.insert(at + 1, "js_hi", np.concatenate([hi, np.full(len(pairs) - top, np.nan)]))
    with staged(out, args.force) as stage:  # the three files appear together, or none
        atomic_write_text(stage / SIMILAR_PAIRS_CSV.name,
                          pairs.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
        sim.to_npz(stage / SIMILARITY_NPZ.name)
        atomic_write_text(stage / CLUSTERS_JSON.name, json.dumps(to_jsonable({
            "js_max": args.js_max, "cka_min": args.cka_min,
            "rule": "complete linkage: every pair inside a cluster has js <= js_max and cka >= cka_min",
            "clusters": clusters, "meta": sim.meta,
            "intervals": {**settings.record(), "pairs": top,
                          "of": "js of the --top pairs (similar_pairs.csv js_lo, js_hi)"},
            "provenance": provenance("similar", hm, source, args)}),
            indent=1, allow_nan=False) + "\n")

    m = sim.meta
    print(f"{hm.name}: {m['n_layers']} layers x {m['n_heads']} heads = {sim.n} heads, {len(pairs)} pairs; "
          f"JS over {m['js_queries']} queries, CKA over {m['cka_tokens']} tokens from {m['data']}")
    print(f"js in nats (0 = same pattern, ln 2 = {LN2:.3f} = disjoint); cka, *_cos: 1 = same")
    print()
    shown = pairs.head(args.top)
    cols = ["cka", "ov_angle_cos", "qk_angle_cos"]
    print(f"{'head_a':>7} {'head_b':>7} {'js [' + format(settings.level, '.0%') + ' interval]':>26} "
          + " ".join(f"{c:>12}" for c in cols))
    for row in shown.itertuples(index=False):
        js = f"{row.js:.4f} [{row.js_lo:.4f}, {row.js_hi:.4f}]"
        print(f"{row.head_a:>7} {row.head_b:>7} {js:>26} " + " ".join(f"{getattr(row, c):12.4f}" for c in cols))
    if top:
        print(f"js intervals: {settings.method} bootstrap over the {m['passages']} passages, {settings.B} resamples "
              f"(CKA mixes passages in its minibatches: no interval)")
    print()
    if clusters:
        print(f"near-duplicate clusters (every pair js <= {args.js_max:g}, cka >= {args.cka_min:g}):")
        for c in clusters:
            print(f"  {', '.join(c['heads'])}  (max js {c['max_js']:.4f}, min cka {c['min_cka']:.3f})")
    else:
        print(f"no near-duplicate clusters: no pair has js <= {args.js_max:g} and cka >= {args.cka_min:g} "
              f"(loosen with --js-max / --cka-min)")
    print(f"\nwrote {', '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0

