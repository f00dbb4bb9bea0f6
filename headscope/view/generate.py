"""Greedy continuation of a text (decoders): the view then shows the heads over prompt and continuation.

Each step feeds the last token with the model's KV cache and takes the argmax of its next-token logits, until
`n` tokens or an end-of-sequence token: what transformers' `generate(do_sample=False)` does with no logits
processor (tested equal token for token in tests/test_view_features.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import HeadscopeError
from ..eval.metrics import has_lm_head
from ..models.adapter import HeadModel

__all__ = ["MAX_NEW_TOKENS", "Continuation", "continue_greedily", "end_tokens"]

MAX_NEW_TOKENS = 256  # tokens one request may generate


@dataclass(frozen=True)
class Continuation:
    """The prompt's ids, the generated ids after them, and why generation stopped ("tokens" or "end")."""

    prompt: list[int]
    generated: list[int]
    stopped: str


def end_tokens(hm: HeadModel) -> set[int]:
    """The ids that end a generation: the generation config's `eos_token_id` (else the model config's)."""
    gen = getattr(hm.hf_model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = getattr(hm.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def check_generates(hm: HeadModel) -> None:
    """Refuse a model that cannot continue a text (an encoder, a classifier), saying why."""
    if not has_lm_head(hm):
        kind = "a bidirectional encoder" if not hm.causal else "a causal model without an LM head"
        raise HeadscopeError(f"{hm.name} is {kind}: it predicts no next token, so it cannot continue a text; "
                             f"generation needs a decoder with an LM head (e.g. smollm2)")


def continue_greedily(hm: HeadModel, ids: list[int], n: int) -> Continuation:
    """Up to `n` tokens after `ids`, each the most likely next token (ties: the lowest id, as torch's argmax)."""
    check_generates(hm)
    if not 1 <= n <= MAX_NEW_TOKENS:
        raise HeadscopeError(f"tokens={n}: generate from 1 to {MAX_NEW_TOKENS} tokens")
    stop = end_tokens(hm)
    generated: list[int] = []
    x = torch.tensor([ids], dtype=torch.long, device=hm.device)
    mask = torch.ones_like(x)
    carried: dict[str, object] = {}  # the KV cache, under the name this transformers gives it
    with torch.inference_mode():
        while len(generated) < n:
            out = hm.model(input_ids=x, attention_mask=mask, use_cache=True, **carried)
            # transformers 5.25 names the cache `cache`; earlier 5.x `past_key_values`
            name = "cache" if "cache" in out else "past_key_values"
            carried = {name: out[name]}
            nxt = int(out.logits[0, -1].argmax())  # logits [1, T, vocab]: the last position's next token
            generated.append(nxt)
            if nxt in stop:
                return Continuation(list(ids), generated, "end")
            x = torch.tensor([[nxt]], dtype=torch.long, device=hm.device)
            mask = torch.cat([mask, torch.ones_like(x)], dim=1)
    return Continuation(list(ids), generated, "tokens")
