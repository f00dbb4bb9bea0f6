"""`headscope gqa MODEL --kv-heads G`: MHA->GQA/MQA conversion -> OUT/model (checkpoint) and OUT/gqa.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import MODEL_DIR, outputs
from ..capacity import verbs
from ..capacity.gqa import SUPPORTED_MODEL_TYPES
from ..capacity.gqa.groupings import GROUPINGS
from ..capacity.options import GqaOptions
from ..compare.check import check
from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..models.checkpoint import how_it_loads
from ..options.cli import verb_parser
from ._check import check_files, finish_check
from ._uptrain import read_uptrain_texts

OUTPUTS = outputs("gqa")  # model/, gqa.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "gqa", GqaOptions,
        help="convert a LLaMA-like model to fewer KV heads (GQA/MQA), optionally uptrain, save",
        description="Mean-pool the K/V projections of groups of KV heads into KV heads (Ainslie et al. 2023), "
                    "optionally uptrain by distillation, and write a standard checkpoint (OUT/model) plus a report "
                    "(OUT/gqa.json): perplexity before / after conversion / after uptraining on held-out text, and "
                    "KV-cache bytes measured from a real generation cache beside the calculator. "
                    f"Supported: {', '.join(SUPPORTED_MODEL_TYPES)}.",
        epilog="groupings (--grouping): " + "; ".join(GROUPINGS.help_lines()),
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = GqaOptions.from_namespace(args).validate()
    # refuse before any slow work
    out = prepare_out_dir(options.out, options.force, outputs("gqa", optional=True) + check_files())
    # bad data fails before the model loads; passed on, never read again
    data, heldout = read_uptrain_texts(options)
    hm = model or options.load()
    # the conversion checks --kv-heads against the model first, before any work.
    result = verbs.gqa(hm, data, options, heldout=heldout, progress=True)
    result.save(out, options.force)  # model/ and gqa.json appear together, or neither
    print("\n".join(result.lines()))
    wrote = list(OUTPUTS)
    # what the converted model lost against the input (gqa leaves it untouched)
    if options.capability_check:
        wrote += finish_check(lambda: check(hm, result.model, seed=options.seed), out, options.force)
    print(f"\nwrote {', '.join(str(out / n) for n in wrote)}; the model has {how_it_loads(out / MODEL_DIR.name)}",
          file=sys.stderr)
    return 0
