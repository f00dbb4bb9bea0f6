"""The texts of the verbs that uptrain a model by distillation (gqa, mla); their option checks are in
`capacity.options.ConversionOptions.check`."""

from __future__ import annotations

import argparse

from ..data import TextSource, read_texts


def read_uptrain_texts(args: argparse.Namespace) -> tuple[TextSource, TextSource]:
    """--data and --heldout, each read once (with --limit / --heldout-limit): the verb passes them on."""
    return read_texts(args.data, args.limit), read_texts(args.heldout, args.heldout_limit)
