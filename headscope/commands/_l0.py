"""The `--l0-*` options of `score` and `prune` (L0 gate training: `redundancy.importance.l0`)."""

from __future__ import annotations

import argparse

from ..redundancy.importance.hard_concrete import BETA
from ..redundancy.importance.l0 import L0Settings, check_l0


def add_l0_args(p: argparse.ArgumentParser, target_help: str) -> None:
    """Add --l0-steps, --l0-lr, --l0-temperature, --l0-penalty and --l0-target."""
    g = p.add_argument_group("L0 gates (--method l0)")
    g.add_argument("--l0-steps", type=int, default=200, help="gate training steps (default 200)")
    g.add_argument("--l0-lr", type=float, default=0.1, help="Adam learning rate of the gates' log-alpha (default 0.1)")
    g.add_argument("--l0-temperature", type=float, default=BETA,
                   help=f"hard-concrete temperature beta (default {BETA:.3g}, as Louizos et al.)")
    g.add_argument("--l0-penalty", type=float, default=None,
                   help="penalty weight on the expected share of open gates (instead of a target)")
    g.add_argument("--l0-target", type=float, default=None, help=target_help)


def l0_settings(args: argparse.Namespace, default_target: float | None = None) -> L0Settings:
    """The settings the options give (checked: one line and exit 2 on a bad value)."""
    target = args.l0_target if args.l0_target is not None or args.l0_penalty is not None else default_target
    check_l0(args.l0_steps, args.l0_lr, args.l0_temperature, args.l0_penalty, target)
    return L0Settings(steps=args.l0_steps, lr=args.l0_lr, temperature=args.l0_temperature, penalty=args.l0_penalty,
                      target=target)


__all__ = ["add_l0_args", "l0_settings"]
