"""Physical pruning of attention heads: which heads, validated, and the smaller model.

`prune_heads` slices each layer's Q/K/V output rows and the output projection's input columns
(through `HeadModel.slice_heads`, which owns each family's weight layout), so the returned model
really is smaller and faster; the input model is never touched. Heads are always named by their
ORIGINAL index (`config.num_attention_heads` numbering), also after pruning: the kept heads per
layer are recorded in `config.headscope_pruning` (so they travel in config.json) and in
`headscope_pruning.json` beside a saved checkpoint.

GQA: a layer stays loadable by transformers' `repeat_kv` only if every KV head it keeps serves
the same number of query heads. So a set of heads is prunable when, in each layer, every KV group
either loses all its query heads (then its K/V rows go too) or keeps exactly as many as every
other surviving group. That covers both "prune whole KV groups" and "remove the same number of
query heads from every group"; anything else raises an error naming a prunable alternative.

A layer whose heads are all pruned has its attention module replaced by `EmptyAttention`, whose
output is exactly the output projection's bias (or zero). (torch handles zero-width matmuls, but
GPT-2's `split(split_size)` of an empty fused QKV output does not, so no family's attention
forward runs on an empty layer.)

Saving and loading live in `headscope.models.checkpoint` (`save_model`, `load_checkpoint`; a
saved pruned model also loads with `AutoModel*.from_pretrained(path, trust_remote_code=True)`).
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Mapping

import torch

from ...errors import HeadscopeError
from ...models.adapter import HeadModel
from ...models.capabilities import supported_model_types_for, why_not
from ...table import head_name, parse_head

log = logging.getLogger(__name__)

# --- which heads ---------------------------------------------------------------------------------
def kept_heads(hm: HeadModel) -> dict[int, list[int]]:
    """Original head ids still present in each layer (all of them for an unpruned model)."""
    return {layer: hm.kept_heads(layer) for layer in range(hm.n_layers)}


def normalize_heads(hm: HeadModel, heads: Any) -> dict[int, list[int]]:
    """Turn `{layer: [heads]}`, `[(layer, head)]` or `["L3H7", ...]` into `{layer: sorted heads}`, checked."""
    out: dict[int, set[int]] = {}
    if isinstance(heads, Mapping):
        pairs = [(int(l), int(h)) for l, hs in heads.items() for h in hs]
    else:
        pairs = []
        for item in heads:
            if isinstance(item, str):
                pairs.append(parse_head(item))
            else:
                try:
                    layer, head = item
                except (TypeError, ValueError):
                    raise HeadscopeError(
                        f"cannot read head {item!r}; give (layer, head) pairs, 'L3H7' strings or {{layer: [heads]}}"
                    ) from None
                pairs.append((int(layer), int(head)))
    for layer, head in pairs:
        hm.check_head(layer, head)
        out.setdefault(layer, set()).add(head)
    return {l: sorted(hs) for l, hs in sorted(out.items())}


def check_prunable(hm: HeadModel) -> None:
    """Raise a clear error when headscope cannot physically prune this model's family."""
    why = why_not(hm.spec, "heads", hm.config.model_type)
    if why:
        raise HeadscopeError(f"physical pruning is not implemented for the {hm.spec.family!r} family (model type "
                             f"{hm.config.model_type!r}): {why}. Use head gates (headscope.head_gates) to mask heads "
                             f"instead; model types it serves: {', '.join(supported_model_types_for('heads'))}")


def prune_heads(hm: HeadModel, heads: Any) -> HeadModel:
    """A new, physically smaller model without `heads` (`{layer: [head]}` or `[(layer, head)]`, original ids).

    The input model is left untouched. The result equals the input run with gates of 0 on the
    pruned heads. For GQA layers, see the module docstring for which sets are prunable.
    """
    check_prunable(hm)
    drop = normalize_heads(hm, heads)
    current = kept_heads(hm)
    gone = [head_name(l, h) for l, hs in drop.items() for h in hs if h not in current[l]]
    if gone:
        raise HeadscopeError(
            f"head(s) {', '.join(gone)} were already pruned from this model; "
            f"it still has {sum(map(len, current.values()))} heads (see headscope.redundancy.pruning.heads.kept_heads)"
        )
    target = {l: [h for h in current[l] if h not in drop.get(l, ())] for l in current}
    for layer, keep in target.items():  # validate every layer (GQA) before copying anything
        hm.check_slice(layer, keep)
    model = copy.deepcopy(hm.model)
    new = HeadModel(model=model, tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
    for layer, keep in target.items():
        new.slice_heads(layer, keep)  # records the kept heads in config.headscope_pruning
    n_before = sum(map(len, current.values()))
    n_after = sum(map(len, target.values()))
    log.info("pruned %d of %d heads from %s", n_before - n_after, n_before, hm.name)
    return new


def pruned_gates(hm: HeadModel, heads: Any = None) -> torch.Tensor:
    """Gates `[n_layers, n_heads]` that mask `heads` (default: the heads already pruned from `hm`)."""
    gates = torch.ones(hm.n_layers, hm.n_heads)
    if heads is None:
        for layer, keep in kept_heads(hm).items():
            gates[layer] = 0.0
            gates[layer, keep] = 1.0
        return gates
    for layer, hs in normalize_heads(hm, heads).items():
        gates[layer, hs] = 0.0
    return gates


def n_parameters(hm: HeadModel) -> int:
    """Number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in hm.model.parameters()}.values())
