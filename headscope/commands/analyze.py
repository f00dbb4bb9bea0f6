"""`headscope analyze [MODEL]`: per-head attention statistics -> heads.csv, heads.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import HEADS_CSV, HEADS_JSON, outputs
from ..data import read_texts
from ..distributed import check_ranks, is_main
from ..io import prepare_out_dir, staged
from ..learned.analyze import analyze
from ..learned.options import AnalyzeOptions
from ..options.cli import verb_parser
from ..provenance import provenance
from ..stats import STATISTICS
from ._common import (
    grid,
    interval_settings,
    load_from_args,
)

OUTPUTS = outputs("analyze")  # heads.csv, heads.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "analyze", AnalyzeOptions,
        help="per-head attention statistics (entropy, distance, sink, ...)",
        description="Stream text through a model and write per-head attention statistics "
                    "to heads.csv and heads.json. Columns: " + ", ".join(STATISTICS),
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = prepare_out_dir(args.out, args.force, OUTPUTS)  # refuse before any slow work
    source = read_texts(args.data, args.limit)  # bad data fails before the model loads
    check_ranks(len(source), "passages")  # torchrun / --workers: every rank needs a passage
    hm = load_from_args(args)
    table = analyze(hm, source, max_length=args.max_length, batch_size=args.batch_size,
                    seed=args.seed, progress=True, intervals=interval_settings(args))
    if not is_main():  # every rank holds the merged table; rank 0 alone writes and prints
        return 0
    table = table.with_columns(meta={"provenance": provenance("analyze", hm, source, args)})
    with staged(out, args.force) as stage:  # both files appear together, or neither
        table.to_csv(stage / HEADS_CSV.name)
        table.to_json(stage / HEADS_JSON.name)
    m = table.meta
    print(f"{hm.name}: {m['n_layers']} layers x {m['n_heads']} heads ({m['n_kv_heads']} KV), "
          f"{m['passages']} passages, {m['tokens_seen']} tokens from {m['data']}")
    for col, title in (("entropy_norm", "normalised entropy: 1 = uniform, 0 = one key"),
                       ("mean_distance", "mean attention distance, tokens"),
                       ("first_token_mass", "mass on the first token (sink)")):
        print()
        print(grid(table, col, title))
    print("\nmost notable heads:")
    for col, label in (("prev_token_mass", "previous token"), ("self_mass", "self"),
                       ("next_token_mass", "next token"), ("first_token_mass", "first token / sink"),
                       ("special_mass", "special tokens"), ("punct_mass", "punctuation")):
        top = [t for t in table.top(col, 3) if t[2] == t[2]]
        if top:
            lo, hi = table[f"{col}_lo"], table[f"{col}_hi"]
            print(f"  {label:<20}" + ", ".join(f"L{l}H{h} {v:.2f} [{lo[l, h]:.2f}, {hi[l, h]:.2f}]"
                                               for l, h, v in top))
    iv = m["intervals"]
    print(f"\n[lo, hi]: {iv['level']:.0%} intervals, {iv['method']} bootstrap over the {m['passages']} passages "
          f"({iv['B']} resamples); split-half stability of each statistic's ranking in heads.json")
    print(f"\nwrote {' and '.join(str(out / n) for n in OUTPUTS)}", file=sys.stderr)
    return 0
