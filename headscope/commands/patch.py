"""`headscope patch MODEL --pairs FILE | --task NAME`: each head's causal effect -> patching.csv, patching.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..io import prepare_out_dir
from ..learned.causal import verb as verbs
from ..learned.causal.pairs import read_pairs
from ..learned.options import PatchOptions
from ..models.adapter import HeadModel
from ..options.cli import verb_parser

OUTPUTS = outputs("patch", optional=True)  # patching.csv, patching_positions.csv, patching.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "patch", PatchOptions,
        help="activation patching: each head's causal effect on clean/corrupt prompt pairs",
        description="Run clean/corrupt prompt pairs through a model, patch each head's output from one run into the "
                    "other (exact, batched over heads) and estimate it to first order (attribution patching); write "
                    "each head's effect with its bootstrap interval over pairs, its attribution estimate and its "
                    "direct logit attribution to patching.csv, and the run to patching.json (docs/patching.md).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = PatchOptions.from_namespace(args)
    out = prepare_out_dir(options.out, options.force, OUTPUTS)  # refuse before any slow work
    if options.pairs is not None:
        read_pairs(options.pairs)  # a bad file fails before the model loads
    hm = model or options.load()
    result = verbs.patch(hm, None, options)
    result.save(out, options.force)  # the files appear together, or none
    print("\n".join(result.lines()))
    print(f"\nwrote {' and '.join(str(out / n) for n in result.files)}", file=sys.stderr)
    return 0
