"""The attention the live view shows: the model's own probabilities for one text, every head or one head.

Short texts (at most `SMALL_MAX` tokens) run once under eager attention and keep every head's map, so
the page can draw small multiples and switch heads without another forward pass. Longer texts compute
the asked head alone: the model runs with its own kernel up to that head's layer, where a registered
attention function computes that one head's rows block by block (`headscope.attention.blocks`, the same
probabilities as eager, tested against it) and stops the forward pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..attention.blocks import iter_blocks
from ..attention.kernel import check_kernel_support, stats_attention_forward
from ..errors import HeadscopeError
from ..hooks import on_attention_weights
from ..models.adapter import HeadModel
from ..models.config import attention_implementation

__all__ = ["MAX_CHARS", "SMALL_MAX", "Encoded", "TooLong", "all_heads", "check_head", "encode", "one_head"]

# characters of text read at all: the tokenizer's work stays small whatever is sent
MAX_CHARS = 20_000
# tokens up to which every head is computed at once (small multiples, switching heads)
SMALL_MAX = 48
ONE_HEAD_NAME = "headscope_view_one_head"
# queries per block of the one-head path: memory block x T per step
BLOCK = 128


class TooLong(HeadscopeError):
    """A text over the view's limits (characters or tokens): the server answers 413."""


@dataclass(frozen=True)
class Encoded:
    """A text as the model sees it: token ids, and the tokenizer's own token strings (special tokens included)."""

    text: str
    ids: list[int]
    tokens: list[str]
    # what was done to the text on the way (cut to the model's positions), else None
    note: str | None = None


def encode(hm: HeadModel, text: Any, max_tokens: int) -> Encoded:
    """Tokenise `text` as the model's tokenizer does by default; refuse empty, over-long or non-text input."""
    if not isinstance(text, str):
        raise HeadscopeError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise HeadscopeError("text is empty; type a sentence")
    if len(text) > MAX_CHARS:
        raise TooLong(f"text has {len(text)} characters; the limit is {MAX_CHARS} characters and "
                             f"{max_tokens} tokens")
    if hm.tokenizer is None:
        raise HeadscopeError(f"{hm.name} has no tokenizer, so it cannot read text; load a model folder with its "
                             f"tokenizer files")
    ids = [int(i) for i in hm.tokenizer(text, truncation=False)["input_ids"]]
    if not ids:
        raise HeadscopeError("text gives no tokens; type a sentence")
    if len(ids) > max_tokens:
        raise TooLong(f"text has {len(ids)} tokens; the limit is {max_tokens} tokens (shorten the text, or "
                      f"start the view with a larger max_tokens)", fields=("max_tokens",))
    note = None
    positions = hm.max_positions
    if positions is not None and len(ids) > positions:  # the position table ends: cut as the tokenizer cuts
        cut = [int(i) for i in hm.tokenizer(text, truncation=True, max_length=positions)["input_ids"]]
        note = (f"text cut to its first {len(cut)} of {len(ids)} tokens: {hm.name} reads at most {positions} "
                f"positions")
        ids = cut
    tokens = [str(t) for t in hm.tokenizer.convert_ids_to_tokens(ids)]
    return Encoded(text, ids, tokens, note)


def check_head(hm: HeadModel, layer: int, head: int) -> None:
    """Refuse a head the model does not have, naming the ranges that exist."""
    if not 0 <= layer < hm.n_layers:
        raise HeadscopeError(f"layer {layer} does not exist: the model has layers 0..{hm.n_layers - 1}")
    n = hm.heads_in_layer(layer)
    if not 0 <= head < n:
        raise HeadscopeError(f"head {head} does not exist in layer {layer}: it has heads 0..{n - 1}" if n else
                             f"layer {layer} has no attention heads")


def _run(hm: HeadModel, ids: list[int]) -> None:
    x = torch.tensor([ids], dtype=torch.long, device=hm.device)
    with torch.inference_mode():
        hm.model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False)


def all_heads(hm: HeadModel, ids: list[int]) -> list[np.ndarray]:
    """Every head's map under eager attention: per layer `[head, query, key]` float32 (empty for no heads)."""
    maps: list[np.ndarray] = [np.zeros((0, len(ids), len(ids)), np.float32) for _ in range(hm.n_layers)]

    def keep(layer: int, probs: torch.Tensor) -> None:  # probs [1, head, query, key]
        maps[layer] = probs[0].detach().float().cpu().numpy()

    with on_attention_weights(hm, keep):
        _run(hm, ids)
    return maps


class _Done(Exception):
    """Raised once the asked head's map is complete: the layers above it need not run."""


# id(attention module) -> (layer, head, [T, T] array the blocks fill). Keyed by identity like the statistics
# kernel's table (BERT's attention knows no layer index); an entry lives only while `one_head` runs.
_TARGET: dict[int, tuple[int, int, np.ndarray]] = {}
_MODELS: dict[int, HeadModel] = {}  # the same key -> the model (its causality and windows)


def _one_head_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention function: other layers as the statistics kernel computes them without
    consumers (sdpa, or eager in blocks with soft-capping or a sink); the target layer's one head in blocks."""
    target = _TARGET.get(id(module))
    if target is None:
        return stats_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    layer, head, out = target
    if scaling is None:
        scaling = query.shape[-1] ** -0.5  # eager's default
    group = query.shape[1] // key.shape[1]
    q = query[:, head:head + 1].detach()  # [1, 1, T, d_head]
    k = key[:, head // group:head // group + 1].detach()  # its KV head (GQA: query heads share in order)
    mask = attention_mask
    if mask is not None and mask.dim() == 4 and mask.shape[1] > 1:
        mask = mask[:, head:head + 1]
    sink = kwargs.get("s_aux")
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal_without_mask = bool(mask is None and query.shape[2] > 1 and is_causal)  # sdpa's own triangle
    hm: HeadModel = _MODELS[id(module)]
    for blk in iter_blocks(q, k, mask, layer=layer, block=BLOCK, scaling=scaling, causal=hm.causal,
                           window=hm.sliding_window(layer), softcap=kwargs.get("softcap"),
                           causal_without_mask=causal_without_mask,
                           sink=None if sink is None else sink[head:head + 1]):
        out[blk.q_start:blk.q_end, blk.k_start:blk.k_end] = blk.probs[0, 0].float().cpu().numpy()
    raise _Done


@contextmanager
def _target(hm: HeadModel, layer: int, head: int, out: np.ndarray) -> Iterator[None]:
    key = id(hm.attention(layer))
    _TARGET[key] = (layer, head, out)
    _MODELS[key] = hm
    try:
        yield
    finally:
        _TARGET.pop(key, None)
        _MODELS.pop(key, None)


def one_head(hm: HeadModel, ids: list[int], layer: int, head: int) -> np.ndarray:
    """One head's map `[query, key]` float32, computed for that head alone (models whose attention does not
    dispatch through transformers' registry: from the eager maps of its layer)."""
    check_head(hm, layer, head)
    try:
        check_kernel_support(hm)
    except HeadscopeError:
        return all_heads(hm, ids)[layer][head]
    out = np.zeros((len(ids), len(ids)), np.float32)
    with _target(hm, layer, head, out), attention_implementation(hm.model, ONE_HEAD_NAME, _one_head_forward):
        try:
            _run(hm, ids)
        except _Done:
            return out
    raise HeadscopeError(f"layer {layer} of {hm.name} never ran its attention through transformers' registry; "
                         f"the view cannot compute one head of it alone")
