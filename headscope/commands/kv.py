"""`headscope kv`: KV-cache bytes per token, per sequence and per batch for MHA / GQA / MQA layouts."""

from __future__ import annotations

import argparse

from ..artifacts import KV_CSV, KV_JSON
from ..capacity import verbs
from ..capacity.options import KvOptions
from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser

UNITS = verbs.UNITS


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "kv", KvOptions,
        help="KV-cache size of a model's MHA / GQA / MQA layouts, and of classic models",
        description="Bytes of KV cache per token, per sequence and per batch. MODEL is a built-in model "
                    "(minilm, smollm2; only its config is read), a model directory, a config.json, or a classic "
                    "config name (see --classic). " + UNITS,
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    """kv reads a config, never weights: a loaded `model` is not used."""
    options = KvOptions.from_namespace(args).validate()
    out = prepare_out_dir(options.out, options.force, [KV_CSV.name, KV_JSON.name]) if options.out else None
    result = verbs.kv(None, options)
    print("\n".join(result.lines()))
    if out is not None:
        result.save(out, options.force)  # both files appear together, or neither
        print(f"wrote {out / KV_CSV.name} and {out / KV_JSON.name}")
    return 0
