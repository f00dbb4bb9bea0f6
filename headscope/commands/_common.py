"""Arguments and printing shared by several verbs."""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from ..data import DEFAULT_LIMIT
from ..errors import HeadscopeError
from ..table import HeadTable

# Count options any verb may define (argparse dest -> the option as the user typed it); each must be >= 1.
POSITIVE = {"batch_size": "--batch-size", "max_length": "--max-length", "limit": "--limit",
            "heldout_limit": "--heldout-limit", "data_limit": "--data-limit", "steps": "--steps",
            "seq": "--seq", "batch": "--batch", "layers": "--layers", "d_model": "--d-model",
            "eval_tokens": "--eval-tokens", "ig_steps": "--ig-steps", "search_candidates": "--search-candidates"}
# Options that must be >= 0.
NON_NEGATIVE = {"sentences": "--sentences", "recover": "--recover", "uptrain": "--uptrain", "top": "--top"}
# Learning rates: finite and > 0.
RATES = {"lr": "--lr", "recover_lr": "--recover-lr"}


def check_device(device: str) -> str:
    """Refuse a torch device string that does not parse or names hardware this machine lacks."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise HeadscopeError(f"--device {device!r} is not a torch device; use cpu, cuda, cuda:0 or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HeadscopeError(f"--device {device!r}: CUDA is not available on this machine "
                                 f"(torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise HeadscopeError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA "
                                 f"device(s), numbered from 0; use cuda:0")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise HeadscopeError(f"--device {device!r}: MPS is not available on this machine; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise HeadscopeError(f"--device {device!r}: headscope runs on cpu, cuda or mps; use --device cpu")
    return device


def check_common(args: argparse.Namespace) -> None:
    """Validate the options many verbs share (counts, rates, device), before any verb does work.

    The CLI calls this for every verb, so a verb gets these checks by naming its options as here.
    """
    for dest, flag in POSITIVE.items():
        v = getattr(args, dest, None)
        if v is not None and v < 1:
            raise HeadscopeError(f"{flag} must be at least 1; got {v}")
    for dest, flag in NON_NEGATIVE.items():
        v = getattr(args, dest, None)
        if v is not None and v < 0:
            raise HeadscopeError(f"{flag} must be 0 or more; got {v}")
    for dest, flag in RATES.items():
        v = getattr(args, dest, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise HeadscopeError(f"{flag} must be a positive number like 1e-3; got {v}")
    if getattr(args, "device", None) is not None:
        check_device(args.device)


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
