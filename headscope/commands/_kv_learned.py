"""`kvcache --choose learned`: the options of DuoAttention's learned KV heads (`capacity.kvcache.learned`)."""

from __future__ import annotations

import argparse

from ..capacity.kvcache.learned import LearnedSettings
from ..errors import HeadscopeError


def learned_settings(args: argparse.Namespace) -> LearnedSettings | None:
    """The settings of --choose learned (None for --choose score); bad values refused before the model loads."""
    settings = LearnedSettings(steps=args.learn_steps, lr=args.learn_lr, l1=args.learn_l1, prompts=args.learn_prompts)
    if args.choose != "learned":
        return None
    if args.threshold is not None:
        raise HeadscopeError("--choose learned keeps the largest weights at each --keep-full budget; it does not take "
                             "--threshold")
    return settings


__all__ = ["learned_settings"]
