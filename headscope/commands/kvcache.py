"""`headscope kvcache MODEL --keep-full 25%`: head-aware KV caches (full KV for chosen heads, sink +
window for the rest) against the full cache and a random choice at equal bytes -> kvcache.csv, kvcache.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..artifacts import outputs
from ..capacity import verbs
from ..capacity.kv_bytes import attention_shape, load_config
from ..capacity.kvcache.cache import check_supported_config
from ..capacity.kvcache.choice import read_scores_file
from ..capacity.kvcache.compare import check_positions
from ..capacity.options import KvcacheOptions
from ..compare.check import check_kvcache
from ..data import read_texts
from ..export.card_export import export_card
from ..export.cards import check_card_path
from ..io import prepare_out_dir
from ..models import BUILTINS, load_model
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ._check import check_files, finish_check

OUTPUTS = outputs("kvcache")  # kvcache.csv, kvcache.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "kvcache", KvcacheOptions,
        help="head-aware KV cache: full KV for chosen heads, sink + window for the rest (DuoAttention-style)",
        description="Keep the full KV cache only for the KV heads a per-head score ranks highest (default: Wu et al.'s "
                    "retrieval score, measured here on needle haystacks), and only the first --sink and the last "
                    "--window tokens for the others; evaluate perplexity on long text, needle retrieval and KV bytes "
                    "read per decoding step, against the full cache and a random choice of full heads at equal bytes. "
                    "A KV head is windowed only when all its query heads are (GQA). See docs/kvcache.md.",
    )
    p.set_defaults(func=run)


def _precheck_model(name: str, context: int) -> None:
    """Refuse an unsupported family, an MQA model or a too long context from the config alone, before weights load
    (a hub id is checked once loaded)."""
    if name not in BUILTINS and not Path(name).expanduser().is_dir():
        return
    cfg = load_config(name)
    shape = attention_shape(cfg)
    check_supported_config(name, shape.model_type, shape.n_heads, shape.n_kv_heads)
    check_positions(context, cfg.get("max_position_embeddings"))


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = KvcacheOptions.from_namespace(args)  # validated by the CLI: budgets, window, counts, --by
    card = check_card_path(options.export_card, "duo", options.force) if options.export_card is not None else None
    # before any work; every file this verb may write (an earlier run's check it would not write is removed)
    out = prepare_out_dir(options.out, options.force, outputs("kvcache", optional=True) + check_files())
    # What the run reads, read before any model loads: the --scores file, the data, the training data.
    scores = read_scores_file(options.scores, options.by) if options.scores is not None else None
    data = read_texts(options.data)
    train = read_texts(options.train_data) if options.uptrain_steps and options.train_data is not None else None
    _precheck_model(options.model, options.context)
    hm = model or load_model(options.model, device=options.device,
                                allow_random_weights=options.allow_random_weights)
    result = verbs.kvcache(hm, data, options, scores=scores, train_data=train, progress=True)
    result.save(out, options.force)  # both files appear together, or neither
    # outside --out: written (atomically) once the set is in place
    if card is not None:
        warning = export_card(result, hm, card, force=options.force).warning
        if warning:
            print(warning, file=sys.stderr)
    print("\n".join(result.lines()))
    wrote = list(OUTPUTS)
    # the input model decoding through the cache a user would ship, against itself
    if options.capability_check:
        wrote += finish_check(lambda: check_kvcache(hm, result, data.texts), out, options.force)
    print(f"\nwrote {', '.join(str(out / n) for n in wrote)}{' and ' + str(card) if card else ''}", file=sys.stderr)
    return 0
