"""The census's induction pass: random token sequences repeated twice, in the tokenizer's own frame.

For the second occurrence of token i (position s = start + length + i), induction is the mass on
position start + i + 1 (the token that followed its first occurrence), duplicate-token the mass on
start + i; each beside the uniform head's mass on the same key.
"""

from __future__ import annotations

import numpy as np
import torch

from ...attention.blocks import n_visible_keys
from ...data import token_classes
from ...data.prepare import passage_frame
from ...errors import HeadscopeError
from ...hooks import on_attention_blocks
from ...models.adapter import HeadModel


def special_frame(hm: HeadModel) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a passage ([CLS] ... [SEP]; none for SmolLM2)."""
    return passage_frame(hm.tokenizer) if hm.tokenizer is not None else ([], [])


def repeated_sequences(hm: HeadModel, n_sequences: int = 32, length: int = 24,
                       seed: int = 0) -> tuple[torch.Tensor, int]:
    """Random token sequences repeated twice, in the tokenizer's special-token frame: (ids, start)."""
    vocab = hm.vocab_size
    flags = token_classes(hm)
    usable = torch.nonzero(~flags.special[:vocab] & ~flags.punct[:vocab]).flatten()
    if hm.tokenizer is not None:
        usable = usable[usable < len(hm.tokenizer)]
    if len(usable) < length:
        raise HeadscopeError(f"need at least {length} ordinary token ids for induction sequences; "
                             f"the vocabulary has {len(usable)}")
    prefix, suffix = special_frame(hm)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_sequences):
        seq = usable[torch.randperm(len(usable), generator=g)[:length]]  # distinct: one first occurrence each
        rows.append(torch.cat([torch.tensor(prefix, dtype=torch.long), seq, seq,
                               torch.tensor(suffix, dtype=torch.long)]))
    ids = torch.stack(rows)
    if hm.max_positions is not None and ids.shape[1] > hm.max_positions:
        raise HeadscopeError(f"induction sequences of {ids.shape[1]} tokens exceed the model's {hm.max_positions} "
                             f"positions; lower the repeat length")
    return ids, len(prefix)


def induction_scores(hm: HeadModel, n_sequences: int = 32, length: int = 24, seed: int = 0,
                     batch_size: int = 16) -> dict[str, np.ndarray]:
    """Induction and duplicate-token scores `[n_layers, n_heads]` and their uniform baselines.

    For the second occurrence of token i (position s = start + length + i), induction is the mass
    on position start + i + 1 (the token that followed its first occurrence), duplicate is the mass
    on start + i; the last token is left out of induction (what followed it is the repeat itself).
    """
    ids, start = repeated_sequences(hm, n_sequences, length, seed)
    L, H = hm.n_layers, hm.n_heads
    sums = {k: np.zeros((L, H)) for k in ("induction", "duplicate")}
    base = {k: np.zeros(L) for k in ("induction", "duplicate")}
    counts = {"induction": 0, "duplicate": 0}
    second = torch.arange(length) + start + length  # query positions
    t = ids.shape[1]

    def on_attn(layer: int, q_start: int, probs: torch.Tensor) -> None:
        p = probs.detach().double()  # [b, h, q_block, k]: queries q_start ..
        ones = torch.ones(p.shape[0], t, dtype=torch.long, device=p.device)
        n_keys = n_visible_keys(ones, hm.causal, hm.sliding_window(layer)).double()  # [b, q]
        for name, shift, n in (("duplicate", 0, length), ("induction", 1, length - 1)):
            q = second[:n]
            q = q[(q >= q_start) & (q < q_start + p.shape[2])]  # this block's queries
            k = q - length + shift
            sums[name][layer] += p[:, :, q - q_start, k].sum((0, 2)).cpu().numpy()
            base[name][layer] += float((1.0 / n_keys[:, q]).sum())

    with on_attention_blocks(hm, on_attn), torch.inference_mode():
        for s in range(0, len(ids), batch_size):
            chunk = ids[s:s + batch_size]
            hm.model(input_ids=chunk.to(hm.device), attention_mask=torch.ones_like(chunk).to(hm.device),
                     use_cache=False)
            counts["duplicate"] += len(chunk) * length
            counts["induction"] += len(chunk) * (length - 1)
    out = {}
    for name in ("induction", "duplicate"):
        out[f"{name}_score"] = sums[name] / counts[name]
        out[f"{name}_score_uniform"] = np.repeat((base[name] / counts[name])[:, None], H, 1)
    return out
