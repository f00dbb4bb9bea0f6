"""`headscope roles [MODEL]`: role census with baselines -> roles.csv, roles.json, syntax.csv; with
`--long N` the long-range roles too (retrieval, streaming, echo, induction at N tokens) and, with
`--export-card FILE`, a head card for KV-compression tools."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..distributed import check_ranks, is_main
from ..export.card_export import export_card, record_card
from ..export.cards import check_card_path
from ..io import prepare_out_dir
from ..learned import verbs
from ..learned.options import RolesOptions
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..uncertainty import check_until_stable

OUTPUTS = outputs("roles", optional=True)  # roles.csv, roles.json, syntax.csv (with --treebank)


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "roles", RolesOptions,
        help="role census: previous-token, sink, induction, syntactic, coreference heads ...",
        description="Score every head for each role beside a baseline and name the heads that pass "
                    "(see docs/roles.md). Writes roles.csv (analyze's statistics and a `roles` column), roles.json "
                    "(every score, baseline and threshold) and syntax.csv (with --treebank).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = RolesOptions.from_namespace(args)  # validated by the CLI: the long-range options included
    out = prepare_out_dir(options.out, options.force, OUTPUTS)  # refuse before any slow work
    card = None
    # refused before any work when it cannot be written or would replace a file
    if options.export_card is not None:
        card = check_card_path(options.export_card, options.card_format, options.force)
    # Every source is read once, here, so bad input fails before the model loads; the passes get what was read.
    data = verbs.read_roles_data(options)
    check_until_stable(options.until_stable, len(data.source))
    check_ranks(len(data.source), "passages")  # torchrun / --workers: every rank needs a passage
    hm = model or options.load()
    result = verbs.roles(hm, data, options, progress=True)
    # every rank holds the merged census; rank 0 alone runs --long, writes and prints
    if not is_main():
        return 0
    if card is not None:  # roles.json records what the card is
        result = record_card(result, card, options.card_format, options.card_score)
    written = result.save(out, options.force)  # roles.csv, roles.json (and syntax.csv) together, or none
    # outside --out: written atomically once the set is in place
    if card is not None:
        written.append(export_card(result, hm, force=options.force).path)
    print("\n".join(result.lines()))
    print(f"\nwrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0
