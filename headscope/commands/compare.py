"""`headscope compare BASE OTHER`: which capabilities OTHER kept and lost against BASE -> compare.csv, compare.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..compare import CompareOptions, check_model_name
from ..compare import compare as compare_models
from ..compare.cache import read_cache
from ..data import read_texts
from ..io import prepare_out_dir
from ..learned.causal.pairs import read_pairs
from ..models.loading import load_model
from ..options.cli import verb_parser

# compare.csv, compare.json, compare_items.npz (census rows only): an earlier run's npz is refused without --force
OUTPUTS = outputs("compare", optional=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "compare", CompareOptions,
        help="what compression cost: the capabilities OTHER kept, lost or gained against BASE, with paired intervals",
        description="Measure BASE and OTHER (a pruned, regrouped or converted copy of it, with the same tokenizer) on "
                    "the same items: perplexity on held-out text, the causal tasks (IOI, induction on repeated random "
                    "tokens, greater-than; masked on encoders), needle retrieval, and each --pairs file. Each row "
                    "gets the paired change with its bootstrap interval and a verdict against --tolerance: lost, "
                    "kept, gained or cannot tell (docs/compare.md).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = CompareOptions.from_namespace(args)
    out = prepare_out_dir(options.out, options.force, OUTPUTS)  # refuse before any slow work
    check_model_name(options.base, "base")
    check_model_name(options.other, "other")
    for path in options.pairs:
        read_pairs(path)  # a bad or empty file fails before the models load
    # a pattern or kvcache plan that cannot be read, or a row it lacks: before loading
    if options.cache is not None:
        read_cache(options.cache, options.cache_row, options.cache_reversed)
    # the language-model row's passages, read (and a missing or unreadable file refused) before the models load
    texts = read_texts(options.data, options.limit) if options.data is not None else None
    base = load_model(options.base, device=options.device, dtype=options.dtype)
    # the same name twice (BASE through --cache, or a check of compare itself): one model, loaded once
    same = options.other == options.base
    other = base if same else load_model(options.other, device=options.device, dtype=options.dtype)
    result = compare_models(base, other, options, data=texts)
    result.save(out, options.force)  # the files appear together, or none
    print("\n".join(result.lines()))
    print(f"\nwrote {' and '.join(str(out / n) for n in result.files)}", file=sys.stderr)
    return 0
