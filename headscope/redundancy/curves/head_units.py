"""Pruning units: what goes at once, so every point of a curve is a head set that can be removed physically.

In a multi-head (MHA) model one unit is one head. In a GQA model a unit is one query head from every
KV group of a layer (`slice`, the default: the least important remaining head of each group, scored
by their sum) or one whole KV group (`group`): `headscope.redundancy.pruning.heads.prune_heads` can remove either,
while a single query head of a group would break `repeat_kv`.
"""

from __future__ import annotations

import numpy as np

from ...errors import HeadscopeError, did_you_mean
from ...models.adapter import HeadModel

UNITS = ("head", "slice", "group")


def default_unit(hm: HeadModel) -> str:
    """`head` for MHA models, `slice` (one query head per KV group) for GQA/MQA ones."""
    return "head" if hm.group_size == 1 else "slice"


def check_unit(hm: HeadModel, unit: str) -> None:
    """Raise a clear error on an unknown unit, or on single query heads of a GQA model."""
    if unit not in UNITS:
        raise HeadscopeError(f"unknown pruning unit {unit!r}{did_you_mean(unit, UNITS)}; choose one of {', '.join(UNITS)}")
    if unit == "head" and hm.group_size > 1:
        raise HeadscopeError(
            f"{hm.name} is GQA ({hm.n_heads} query heads share {hm.n_kv_heads} KV heads): single query heads "
            f"cannot be removed physically; use unit 'slice' (one query head from every KV group) or 'group'")


def candidate_units(hm: HeadModel, scores: np.ndarray, removed: set[tuple[int, int]],
                    unit: str) -> list[tuple[float, list[tuple[int, int]]]]:
    """Removable units among the remaining heads as (score, heads), lowest score first.

    Within a layer the units are listed in the order they would go, so taking the k lowest of
    all layers never skips a unit whose removal another one depends on.
    """
    g, n_kv = hm.group_size, hm.n_kv_heads
    if unit == "slice" and g == 1:
        unit = "head"
    units: list[tuple[float, list[tuple[int, int]]]] = []
    for layer in range(hm.n_layers):
        alive = [h for h in range(hm.n_heads) if (layer, h) not in removed]
        if unit == "head":
            units += [(float(scores[layer, h]), [(layer, h)]) for h in alive]
        elif unit == "group":
            for k in range(n_kv):
                members = [h for h in alive if h // g == k]
                if members:
                    units.append((float(np.sum(scores[layer, members])), [(layer, h) for h in members]))
        else:  # slice: the i-th least important remaining head of every surviving group
            groups = [sorted((h for h in alive if h // g == k), key=lambda h: scores[layer, h]) for k in range(n_kv)]
            groups = [grp for grp in groups if grp]
            depth = min((len(grp) for grp in groups), default=0)
            total = 0.0
            for i in range(depth):
                heads = [(layer, grp[i]) for grp in groups]
                # Cumulative score: a deeper slice can only go after the shallower ones.
                total += float(sum(scores[layer, h] for _, h in heads))
                units.append((total, heads))
    units.sort(key=lambda u: u[0])
    return units


__all__ = ["UNITS", "candidate_units", "check_unit", "default_unit"]
