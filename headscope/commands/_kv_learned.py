"""`kvcache --choose learned`: the options of DuoAttention's learned KV heads (`capacity.kvcache.learned`)."""

from __future__ import annotations

import argparse

from ..capacity.kvcache.learned import LearnedSettings
from ..errors import HeadscopeError


def add_learned_args(p: argparse.ArgumentParser) -> None:
    """Add --choose and the --learn-* options."""
    g = p.add_argument_group("learned KV heads (--choose learned)")
    g.add_argument("--choose", choices=("score", "learned"), default="score",
                   help="score: full KV heads by --by (and the random control); learned: also DuoAttention's "
                        "mixing weights trained on passkey prompts from --data, their rows beside the others at "
                        "equal bytes (default score)")
    g.add_argument("--learn-steps", type=int, default=20, help="training steps of the mixing weights (default 20)")
    g.add_argument("--learn-lr", type=float, default=0.02, help="Adam learning rate of the weights (default 0.02)")
    g.add_argument("--learn-l1", type=float, default=0.05, help="L1 penalty on the mean weight (default 0.05)")
    g.add_argument("--learn-prompts", type=int, default=8,
                   help="passkey prompts of --context tokens to train on (default 8)")


def learned_settings(args: argparse.Namespace) -> LearnedSettings | None:
    """The settings of --choose learned (None for --choose score); bad values refused before the model loads."""
    settings = LearnedSettings(steps=args.learn_steps, lr=args.learn_lr, l1=args.learn_l1, prompts=args.learn_prompts)
    if args.choose != "learned":
        return None
    if args.threshold is not None:
        raise HeadscopeError("--choose learned keeps the largest weights at each --keep-full budget; it does not take "
                             "--threshold")
    return settings


__all__ = ["add_learned_args", "learned_settings"]
