"""Arguments and printing shared by several verbs."""

from __future__ import annotations

import argparse
import math

import numpy as np

from ..data import DEFAULT_LIMIT
from ..table import HeadTable


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="minilm",
                   help="built-in name (minilm, smollm2), a model directory, or a hub id (default: minilm)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")


def add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="a .txt (one passage a line), .jsonl (a 'text' field) or .conllu file "
                        "(default: the built-in English sample)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per passage (default 128, capped at the model's)")
    p.add_argument("--batch-size", type=int, default=16, help="passages per forward pass (default 16)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"use only the first N passages (default: a built-in corpus gives its first {DEFAULT_LIMIT}, "
                        f"a file is read whole)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def add_out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="headscope-out", help="output directory (default: headscope-out/)")
    p.add_argument("--force", action="store_true", help="overwrite results already in --out")



def fmt(v: float, width: int = 5) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    return f"{v:{width}.2f}"


def grid(table: HeadTable, column: str, title: str) -> str:
    """A layers x heads grid of one column as text."""
    values = table[column]
    lines = [f"{title} ({column})", "layer " + "".join(f"{'H' + str(h):>6}" for h in range(table.n_heads))]
    for layer in range(table.n_layers):
        lines.append(f"L{layer:<4} " + "".join(" " + fmt(float(v)) for v in np.asarray(values[layer], float)))
    return "\n".join(lines)
