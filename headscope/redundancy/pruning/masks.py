"""Masks for units beyond single heads: whole attention sub-layers, whole blocks, FFN neurons.

A `UnitMask` says what is switched off; `unit_masks(hm, mask)` applies it with hooks (removed in
`finally`), so a masked model computes exactly what the physically pruned one does (`units.physical`):

- attention sub-layer `l` off: every head of `l` gated to 0 (`hooks.head_gates`), so the sub-layer adds
  only its output projection's bias (zero in bias-free families), as a layer with every head pruned;
- block `l` off: the block's output is its input (`out = x + g * (block(x) - x)`, g = 0), i.e. the block
  is skipped; ShortGPT's and He et al.'s layer dropping;
- FFN neuron `i` of layer `l` off: its activation, the i-th input feature of the FFN output projection,
  is scaled by 0 (the neuron mask of LLM-Pruner / Taylor pruning). FFN gates may require grad.

Which module is a block, an attention module or an FFN projection comes from the family's spec
(`models/specs.py`) through `HeadModel`; nothing here names a family's attributes.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from ...errors import HeadscopeError, did_you_mean
from ...hooks import head_gates
from ...models.adapter import HeadModel
from ..unit_kinds import check_unit

# What a UnitMask can switch off (the unit vocabulary itself is `redundancy.unit_kinds.UNITS`).
MASKABLE = ("head", "attention", "block", "ffn")


@dataclass
class UnitMask:
    """What is off: heads `[L, H]`, attention sub-layers `[L]`, blocks `[L]`, FFN neurons {layer: [I]}
    (or per row, {layer: [batch, I]}). 1 = kept, 0 = removed; None = all kept."""

    heads: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    block: torch.Tensor | None = None
    ffn: dict[int, torch.Tensor] = field(default_factory=dict)

    def head_gates(self, hm: HeadModel) -> torch.Tensor | None:
        """The `[L, H]` head gates that express the heads and attention sub-layers switched off."""
        if self.heads is None and self.attention is None:
            return None
        g = torch.ones(hm.n_layers, hm.n_heads) if self.heads is None else self.heads.detach().float().cpu().clone()
        if self.attention is not None:
            g = g * self.attention.detach().float().cpu()[:, None]
        return g

    def removed(self) -> dict[str, Any]:
        """The removed units, readable: {"attention": [layers], "block": [layers], "ffn": {layer: n}}."""
        out: dict[str, Any] = {}
        for name in ("attention", "block"):
            t = getattr(self, name)
            if t is not None:
                out[name] = [int(i) for i in torch.nonzero(t == 0).flatten()]
        if self.ffn:
            out["ffn"] = {int(l): int((g == 0).sum()) for l, g in self.ffn.items() if int((g == 0).sum())}
        return out


def check_unit_kind(hm: HeadModel, unit: str) -> None:
    """Raise a clear error when `unit` (head, attention, block, ffn) is unknown or the family cannot express
    it as a mask (`unit_kinds`: a head of any model with heads, which a GQA model may gate but not remove)."""
    if unit not in MASKABLE:
        raise HeadscopeError(
            f"unknown unit {unit!r}{did_you_mean(unit, MASKABLE)}; choose one of {', '.join(MASKABLE)}"
        )
    check_unit(hm, "slice" if unit == "head" else unit)


def _block_hook(gate: float) -> Callable[..., Any]:
    def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        x = args[0] if args else kwargs["hidden_states"]  # [batch, pos, d_model], the block's input
        if isinstance(output, tuple):
            return (x + gate * (output[0] - x), *output[1:])
        return x + gate * (output - x)

    return hook


def _ffn_hook(gate: torch.Tensor) -> Callable[..., tuple]:
    def hook(module: Any, args: tuple) -> tuple:
        a = args[0]  # [batch, pos, n_neurons]
        g = gate.to(a.dtype)
        return (a * (g[:, None, :] if g.dim() == 2 else g), *args[1:])  # per-row gates [batch, n_neurons]

    return hook


@contextmanager
def unit_masks(hm: HeadModel, mask: UnitMask) -> Iterator[None]:
    """Apply `mask` to `hm` for the duration (see the module docstring); every hook is removed after."""
    handles = []
    with ExitStack() as stack:
        gates = mask.head_gates(hm)
        if gates is not None and not bool((gates == 1).all()):
            stack.enter_context(head_gates(hm, gates.to(hm.device)))
        try:
            if mask.block is not None:
                if tuple(mask.block.shape) != (hm.n_layers,):
                    raise HeadscopeError(f"block mask has shape {tuple(mask.block.shape)}; expected ({hm.n_layers},)")
                for layer in range(hm.n_layers):
                    kept = float(mask.block[layer])
                    if kept != 1.0:
                        handles.append(hm.layers[layer].register_forward_hook(_block_hook(kept), with_kwargs=True))
            for layer, g in mask.ffn.items():
                if g.requires_grad or not bool((g == 1).all()):
                    if g.shape[-1] != hm.ffn_size(layer):
                        raise HeadscopeError(f"FFN mask of layer {layer} has {g.shape[-1]} neurons; the layer has "
                                             f"{hm.ffn_size(layer)}")
                    handles.append(hm.ffn_out(layer).register_forward_pre_hook(_ffn_hook(g.to(hm.device))))
            yield
        finally:
            for h in handles:
                h.remove()


__all__ = ["MASKABLE", "UnitMask", "check_unit_kind", "unit_masks"]
