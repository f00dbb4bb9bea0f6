"""Physical removal of units beyond heads: the smaller model that computes what the masked one does.

- FFN neurons: each layer's input-side FFN projections lose those output rows and the output projection
  those input columns (`HeadModel.slice_ffn`, layout in `models/layout.py`); per-layer widths are
  recorded in `config.headscope_ffn` and saved checkpoints reload them (`models/checkpoint.py`).
- an attention sub-layer: every head of the layer goes (`HeadModel.slice_heads`, an `EmptyAttention`
  stays, adding the output projection's bias if the family has one); recorded as a head-pruning record.
- a block: removed from the layer list. The config's `num_hidden_layers` (and `layer_types` where the
  family has it) shrink with it, the attention modules' `layer_idx` (KV-cache slots) are renumbered,
  and the pruning records are re-keyed: a model with only blocks dropped is a plain, shallower model
  that loads in transformers without headscope.

The input model is never touched: `prune_units` works on a copy.
"""

from __future__ import annotations

import copy
import logging
from typing import Sequence

import torch
from torch import nn

from ...errors import HeadscopeError
from ...models.adapter import FFN_CONFIG_KEY, PRUNING_CONFIG_KEY, HeadModel
from ...models.layout import bias_param, set_path, weight_param
from .masks import UnitMask, check_unit_kind

log = logging.getLogger(__name__)


def drop_blocks(hm: HeadModel, layers: Sequence[int]) -> None:
    """Remove blocks `layers` (current indices) from `hm`, in place; at least one block must stay."""
    drop = sorted({int(l) for l in layers})
    bad = [l for l in drop if not 0 <= l < hm.n_layers]
    if bad:
        raise HeadscopeError(f"block(s) {bad} do not exist: the model has blocks 0..{hm.n_layers - 1}")
    keep = [l for l in range(hm.n_layers) if l not in drop]
    if not keep:
        raise HeadscopeError(f"dropping all {hm.n_layers} blocks would remove every layer; keep at least one")
    if not drop:
        return
    old = hm.layers
    set_path(hm.base_model, hm.spec.layers, nn.ModuleList([old[l] for l in keep]))
    for new_idx, block in enumerate(hm.layers):
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                setattr(module, "layer_idx", new_idx)  # noqa: B010 (an int attribute: torch types attributes as Tensor | Module)
    config = hm.config
    types = getattr(config, "layer_types", None)
    config.num_hidden_layers = len(keep)
    if types is not None:
        config.layer_types = [types[l] for l in keep]
    for key in (PRUNING_CONFIG_KEY, FFN_CONFIG_KEY):
        record = getattr(config, key, None)
        if record:
            setattr(config, key, {str(i): record[str(l)] for i, l in enumerate(keep) if str(l) in record})
    log.info("dropped blocks %s of %s", drop, hm.name)


def prune_units(hm: HeadModel, mask: UnitMask) -> HeadModel:
    """A new, physically smaller model without the units `mask` switches off (layers numbered as in `hm`).

    It equals `hm` run under `unit_masks(hm, mask)` (tests check this on every family).
    """
    if mask.ffn:
        check_unit_kind(hm, "ffn")
    if mask.attention is not None and bool((mask.attention == 0).any()):
        check_unit_kind(hm, "attention")
    blocks = [] if mask.block is None else [int(l) for l in torch.nonzero(mask.block == 0).flatten()]
    if blocks:
        check_unit_kind(hm, "block")
        if len(blocks) >= hm.n_layers:
            raise HeadscopeError(f"the mask drops all {hm.n_layers} blocks, which would remove every layer; "
                                 f"keep at least one")
    plan_heads: dict[int, list[int]] = {}
    gates = mask.head_gates(hm)
    if gates is not None:
        for layer in range(hm.n_layers):
            keep = [h for h in hm.kept_heads(layer) if float(gates[layer, h]) != 0.0]
            if keep != hm.kept_heads(layer):
                hm.check_slice(layer, keep)
                plan_heads[layer] = keep
    plan_ffn: dict[int, list[int]] = {}
    for layer, g in mask.ffn.items():
        now = hm.kept_neurons(layer)
        if g.shape[-1] != len(now):
            raise HeadscopeError(f"FFN mask of layer {layer} has {g.shape[-1]} neurons; the layer has {len(now)}")
        keep = [now[i] for i in range(len(now)) if float(g[i]) != 0.0]
        if not keep and layer not in blocks:
            raise HeadscopeError(f"the mask removes every FFN neuron of layer {layer}; keep at least one, or drop "
                                 f"its block")
        if keep and keep != now:
            plan_ffn[layer] = keep
    new = HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
    for layer, keep in plan_ffn.items():
        if layer not in blocks:
            new.slice_ffn(layer, keep)
    for layer, keep in plan_heads.items():
        if layer not in blocks:
            new.slice_heads(layer, keep)
    drop_blocks(new, blocks)
    return new


def layer_parameters(module: nn.Module) -> int:
    """Parameters of a module (shared ones counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def _weights_and_bias(m: nn.Module) -> int:
    """Numbers in a projection's weight and (where it has one) bias."""
    bias = bias_param(m)
    return weight_param(m).numel() + (0 if bias is None else bias.numel())


def unit_parameters(hm: HeadModel, unit: str, layer: int) -> float:
    """Parameters one unit of `layer` holds: the attention sub-layer's projections (its output bias stays),
    the whole block, or one FFN neuron (its rows in the input projections and its output column)."""
    if unit == "block":
        return float(layer_parameters(hm.layers[layer]))
    if unit == "attention":
        mods = hm.projections(layer)
        n = sum(_weights_and_bias(m) for k, m in mods.items() if k != "o")
        return float(n + weight_param(mods["o"]).numel())
    if unit == "ffn":
        width = hm.ffn_size(layer)
        n = sum(_weights_and_bias(m) for m in hm.ffn_in(layer))
        return float(n + weight_param(hm.ffn_out(layer)).numel()) / width
    if unit == "head":
        mods = hm.projections(layer)
        n = sum(weight_param(m).numel() for m in mods.values())
        return float(n) / hm.heads_in_layer(layer)
    raise HeadscopeError(f"unknown unit {unit!r}")


__all__ = ["drop_blocks", "layer_parameters", "prune_units", "unit_parameters"]
