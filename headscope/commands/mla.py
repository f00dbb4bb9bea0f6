"""`headscope mla MODEL --kv-rank R`: MHA/GQA -> MLA conversion -> OUT/model (checkpoint) and OUT/mla.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import MODEL_DIR, outputs
from ..capacity import verbs
from ..capacity.mla import SUPPORTED_MODEL_TYPES
from ..capacity.options import MlaOptions
from ..compare.check import check
from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..models.checkpoint import how_it_loads
from ..options.cli import verb_parser
from ._check import check_files, finish_check
from ._uptrain import read_uptrain_texts

OUTPUTS = outputs("mla")  # model/, mla.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "mla", MlaOptions,
        help="convert a LLaMA-like model to multi-head latent attention (MHA2MLA), optionally uptrain, save",
        description="Keep RoPE on a few key dimensions per KV head (the frequencies with the largest query x key "
                    "2-norms), factor the other key dimensions and the values jointly into a rank-R latent by SVD "
                    "(Ji et al. 2025, MHA2MLA), optionally uptrain by distillation, and write a checkpoint "
                    "(OUT/model, reloads with headscope.load_model or trust_remote_code) plus OUT/mla.json: "
                    "perplexity before / after / uptrained on held-out text and KV-cache bytes measured from a "
                    f"real generation cache beside the formula. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    # What needs no model is refused before anything loads (MlaOptions.check); the conversion checks the rank
    # against the model's full rank (check_mla) right after loading, before any work or any file.
    options = MlaOptions.from_namespace(args).validate()
    out = prepare_out_dir(options.out, options.force, outputs("mla", optional=True) + check_files())
    data, heldout = read_uptrain_texts(options)  # passed on, never read again
    hm = model or options.load()
    result = verbs.mla(hm, data, options, heldout=heldout, progress=True)
    result.save(out, options.force)  # model/ and mla.json appear together, or neither
    print("\n".join(result.lines()))
    wrote = list(OUTPUTS)
    # what the converted model lost against the input (mla leaves it untouched)
    if options.capability_check:
        wrote += finish_check(lambda: check(hm, result.model, seed=options.seed), out, options.force)
    print(f"\nwrote {', '.join(str(out / n) for n in wrote)}; the model has {how_it_loads(out / MODEL_DIR.name)}",
          file=sys.stderr)
    return 0
