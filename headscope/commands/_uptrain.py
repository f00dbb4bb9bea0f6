"""Options shared by the verbs that uptrain a model by distillation (gqa, mla; kvcache takes the training
options only, its --data and --seed meaning its own evaluation text and seed)."""

from __future__ import annotations

import argparse

from ..data import TextSource, read_texts
from ..errors import HeadscopeError


def check_uptrain_args(args: argparse.Namespace) -> None:
    """Refuse passage settings no run could use, before any model loads (what `add_uptrain_args` added)."""
    if args.max_length < 2:
        raise HeadscopeError(f"--max-length must be at least 2 tokens, got {args.max_length}")


def read_uptrain_texts(args: argparse.Namespace) -> tuple[TextSource, TextSource]:
    """--data and --heldout, each read once (with --limit / --heldout-limit): the verb passes them on."""
    return read_texts(args.data, args.limit), read_texts(args.heldout, args.heldout_limit)


