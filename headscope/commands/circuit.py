"""`headscope circuit MODEL --pairs FILE | --task NAME`: edge attribution and circuits -> edges.csv, circuit.json."""

from __future__ import annotations

import argparse
import sys

from ..artifacts import outputs
from ..io import prepare_out_dir
from ..learned.causal.pairs import read_pairs
from ..learned.circuits import verb as verbs
from ..learned.circuits.graph import check_model
from ..learned.options import CircuitOptions
from ..models.adapter import HeadModel
from ..options.cli import verb_parser

OUTPUTS = outputs("circuit", optional=True)  # edges.csv, circuit.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "circuit", CircuitOptions,
        help="circuits: edge attribution (EAP, EAP-IG) and faithfulness at every size, GQA-native",
        description="Score every edge of the model's graph (embeddings, heads and MLPs to each head's query, each "
                    "KV group's keys and values, each MLP and the logits) on clean/corrupt prompt pairs with EAP or "
                    "EAP-IG, then run circuits of the top edges at every size and write their faithfulness with "
                    "intervals over pairs, CMD and CPR (MIB's circuit track): edges.csv, circuit.json "
                    "(docs/circuits.md).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    options = CircuitOptions.from_namespace(args)
    out = prepare_out_dir(options.out, options.force, OUTPUTS)  # refuse before any slow work
    if options.pairs is not None:
        read_pairs(options.pairs)  # a bad file fails before the model loads
    hm = model or options.load()
    check_model(hm)
    result = verbs.circuit(hm, None, options)
    result.save(out, options.force)
    print("\n".join(result.lines()))
    print(f"\nwrote {' and '.join(str(out / n) for n in result.files)}", file=sys.stderr)
    return 0
