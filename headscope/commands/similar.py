"""`headscope similar [MODEL]`: head-to-head similarity -> similar_pairs.csv, similarity.npz, clusters.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..data import read_texts
from ..io import prepare_out_dir
from ..learned import verbs
from ..learned.options import SimilarOptions
from ..models.adapter import HeadModel
from ..options.cli import verb_parser

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
    options = SimilarOptions.from_namespace(args)  # validated by the CLI: --top, thresholds, --cka-* included
    out = prepare_out_dir(options.out, options.force, OUTPUTS)  # refuse before any slow work
    source = read_texts(options.data, options.limit)  # bad data fails before the model loads
    hm = model or options.load()
    result = verbs.similar(hm, source, options, progress=True)
    result.save(out, options.force)  # the three files appear together, or none
    print("\n".join(result.lines()))
    print(f"\nwrote {', '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0
