"""The `--l0-*` options of `score` and `prune` (L0 gate training: `redundancy.importance.l0`)."""

from __future__ import annotations

import argparse

from ..redundancy.importance.l0 import L0Settings, check_l0


def l0_settings(args: argparse.Namespace, default_target: float | None = None) -> L0Settings:
    """The settings the options give (checked: one line and exit 2 on a bad value)."""
    target = args.l0_target if args.l0_target is not None or args.l0_penalty is not None else default_target
    check_l0(args.l0_steps, args.l0_lr, args.l0_temperature, args.l0_penalty, target)
    return L0Settings(steps=args.l0_steps, lr=args.l0_lr, temperature=args.l0_temperature, penalty=args.l0_penalty,
                      target=target)


__all__ = ["l0_settings"]
