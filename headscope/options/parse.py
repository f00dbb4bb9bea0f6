"""Text-to-value readers for flags whose text form is not a plain number (argparse's `type=`)."""

from __future__ import annotations

import argparse


def share(text: str | float) -> float:
    """'1%' -> 0.01, '0.01' -> 0.01 (a number passes through)."""
    if isinstance(text, (int, float)):
        return float(text)
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share: write e.g. 1% or 0.01") from None


def int_list(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4; got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values
