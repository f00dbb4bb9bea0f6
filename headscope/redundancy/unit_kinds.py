"""The unit vocabulary: everything headscope can remove, one registration each.

A unit kind is registered beside the function that checks a model can lose it, with what the pruning
curve, `score`, `prune` and the CLI read about it:

- `scope`: what `--fraction` and `--step` are shares of: `heads` (of all heads) or `parameters` (of all
  parameters);
- `criteria`: the scope(s) of `importance.CRITERIA` that order it (`head`, `attention`, `block`, `ffn`; `mix` orders
  attention sub-layers and FFN neurons, each by its own criterion, written `a+b`);
- `default_method`: the criterion used when none is asked;
- `iterative`: re-scored after every step (heads, on the original weights with the removed heads gated)
  or scored once on the unpruned model (units beyond heads, as ShortGPT and He et al. do for layers);
- `recovery`: `carried` (one recovered copy trained on from point to point) or `fresh` (each point
  recovered from the original weights).

Heads (`head`, `slice`, `group`) are removed physically by `pruning.heads.prune_heads`, the others by
`pruning.units.prune_units`; which module is a block, an attention module or an FFN projection comes
from the family's spec through `HeadModel`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from ..models.capabilities import why_not
from ..registry import Entry, Registry

CheckFn = Callable[[HeadModel], None]
UNITS: Registry[CheckFn] = Registry("pruning unit")


def _physical_heads(hm: HeadModel, unit: str) -> None:
    why = why_not(hm.spec, "attention", hm.config.model_type)  # what any removal of heads needs
    if why:
        raise HeadscopeError(f"unit {unit!r} cannot be removed physically for the {hm.spec.family} family: {why}; "
                             f"use unit block or ffn")


@UNITS.register("head", help="one query head (MHA models)", scope="heads", criteria=("head",),
                default_method="gradient", iterative=True, recovery="carried")
def check_head(hm: HeadModel) -> None:
    """Single query heads: only where every KV head serves one query head (MHA)."""
    _physical_heads(hm, "head")
    if hm.group_size > 1:
        raise HeadscopeError(
            f"{hm.name} is GQA ({hm.n_heads} query heads share {hm.n_kv_heads} KV heads): single query heads "
            f"cannot be removed physically; use unit 'slice' (one query head from every KV group) or 'group'")


@UNITS.register("slice", help="one query head of every KV group of a layer (GQA; a head in MHA models)",
                scope="heads", criteria=("head",), default_method="gradient", iterative=True, recovery="carried")
def check_slice(hm: HeadModel) -> None:
    """A slice keeps every KV group's query-head count equal, so any model with heads can lose one."""
    _physical_heads(hm, "slice")


@UNITS.register("group", help="a whole KV group: its KV head and every query head reading it", scope="heads",
                criteria=("head",), default_method="gradient", iterative=True, recovery="carried")
def check_group(hm: HeadModel) -> None:
    """Whole KV groups: any model with heads."""
    _physical_heads(hm, "group")


@UNITS.register("attention", help="a whole attention sub-layer", scope="parameters", criteria=("attention",),
                default_method="ablation", iterative=False, recovery="fresh")
def check_attention(hm: HeadModel) -> None:
    """Attention sub-layers are removed as layers with every head pruned."""
    _physical_heads(hm, "attention")


@UNITS.register("block", help="a whole layer (attention and FFN)", scope="parameters", criteria=("block",),
                default_method="block_influence", iterative=False, recovery="fresh")
def check_block(hm: HeadModel) -> None:
    """Blocks: one must stay, and the family must keep its layers apart (its spec may refuse)."""
    why = why_not(hm.spec, "block", hm.config.model_type)
    if why:
        raise HeadscopeError(f"unit 'block' cannot be expressed for the {hm.spec.family} family: {why}; use unit "
                             f"attention, ffn or head")
    if hm.n_layers < 2:
        raise HeadscopeError(f"{hm.name} has {hm.n_layers} block; dropping blocks needs at least 2 (one must stay)")


@UNITS.register("ffn", help="FFN neurons (their rows and columns of the FFN projections)", scope="parameters",
                criteria=("ffn",), default_method="taylor", iterative=False, recovery="fresh")
def check_ffn(hm: HeadModel) -> None:
    """FFN neurons: where the family's spec declares its FFN projections."""
    why = why_not(hm.spec, "ffn", hm.config.model_type)
    if why:
        raise HeadscopeError(f"unit 'ffn' cannot be expressed for the {hm.spec.family} family: {why}; use unit "
                             f"attention, block or head")


@UNITS.register("mix", help="attention sub-layers and FFN neurons, each giving about half the parameters",
                scope="parameters", criteria=("attention", "ffn"), default_method="ablation+taylor",
                iterative=False, recovery="fresh")
def check_mix(hm: HeadModel) -> None:
    """Both kinds must be expressible."""
    check_attention(hm)
    check_ffn(hm)


HEAD_UNITS = tuple(u for u in UNITS if UNITS.get(u).scope == "heads")  # head, slice, group
LAYER_UNITS = tuple(u for u in UNITS if UNITS.get(u).scope == "parameters")  # attention, block, ffn, mix


def unit_kind(name: str) -> Entry[CheckFn]:
    """The registration of unit `name` (a clear error with "did you mean" for an unknown one)."""
    return UNITS.get(name)


def default_unit(hm: HeadModel) -> str:
    """`head` for MHA models, `slice` (one query head per KV group) for GQA/MQA ones."""
    return "head" if hm.group_size == 1 else "slice"


def check_unit(hm: HeadModel, name: str) -> None:
    """Raise a clear error when `name` is no unit, or when `hm` cannot lose such units."""
    unit_kind(name).fn(hm)


__all__ = ["HEAD_UNITS", "LAYER_UNITS", "UNITS", "check_unit", "default_unit", "unit_kind"]
