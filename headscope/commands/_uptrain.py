"""Options shared by the verbs that uptrain a model by distillation (gqa, mla; kvcache takes the training
options only, its --data and --seed meaning its own evaluation text and seed)."""

from __future__ import annotations

import argparse

from ..capacity.convert.texts import DEFAULT_DATA, DEFAULT_HELDOUT
from ..capacity.convert.uptraining import LOSSES
from ..data import DEFAULT_LIMIT, TextSource, read_texts
from ..errors import HeadscopeError


def add_uptrain_args(p: argparse.ArgumentParser, data_use: str) -> None:
    """--uptrain, --loss, --lr, the calibration and held-out text, passage sizes and --seed.

    `data_use` says what the verb reads --data for (e.g. "calibration and uptraining text").
    """
    add_training_args(p)
    _add_data_args(p, data_use)


def check_uptrain_args(args: argparse.Namespace) -> None:
    """Refuse passage settings no run could use, before any model loads (what `add_uptrain_args` added)."""
    if args.max_length < 2:
        raise HeadscopeError(f"--max-length must be at least 2 tokens, got {args.max_length}")


def read_uptrain_texts(args: argparse.Namespace) -> tuple[TextSource, TextSource]:
    """--data and --heldout, each read once (with --data-limit / --heldout-limit): the verb passes them on."""
    return read_texts(args.data, args.data_limit), read_texts(args.heldout, args.heldout_limit)


def add_training_args(p: argparse.ArgumentParser) -> None:
    """--uptrain, --loss and --lr: the uptraining budget every verb that uptrains shares."""
    p.add_argument("--uptrain", type=int, default=0, metavar="N", help="uptraining steps after conversion (default 0)")
    p.add_argument("--loss", choices=LOSSES, default="kd",
                   help="uptraining loss: kd = KL to the original model's next-token distribution, "
                        "lm = next-token cross-entropy (default: kd)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate for uptraining (default 1e-3)")


def _add_data_args(p: argparse.ArgumentParser, data_use: str) -> None:
    p.add_argument("--data", default=DEFAULT_DATA,
                   help=f"{data_use}: a built-in corpus (ptb-train|ptb-valid|ptb-test, ewt-test, gum-test, sample) "
                        f"or a .txt/.jsonl/.conllu file (default: {DEFAULT_DATA})")
    p.add_argument("--heldout", default=DEFAULT_HELDOUT,
                   help=f"held-out text for perplexity, same forms as --data (default: {DEFAULT_HELDOUT})")
    p.add_argument("--data-limit", type=int, default=None, metavar="N",
                   help=f"passages of --data to use (default: the first {DEFAULT_LIMIT} of a built-in corpus, "
                        "all of a file)")
    p.add_argument("--heldout-limit", type=int, default=None, metavar="N",
                   help=f"passages of --heldout to use (default: the first {DEFAULT_LIMIT} of a built-in corpus, "
                        "all of a file)")
    p.add_argument("--max-length", type=int, default=64, help="tokens per passage (default 64)")
    p.add_argument("--batch-size", type=int, default=8, help="passages per step (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
