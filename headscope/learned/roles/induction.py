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
from ...stats import COUNT
from ...uncertainty import Accumulator, PassageSums, ratio


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


def induction_sums(hm: HeadModel, n_sequences: int = 32, length: int = 24, seed: int = 0,
                   batch_size: int = 16) -> PassageSums:
    """Per-sequence sums of the induction and duplicate-token masses and their uniform baselines, each with
    its count (`<name>|count`), `[sequences, n_layers, n_heads]`: the scores are their ratios (`induction_scores`),
    and resampling the sequences gives their intervals.

    For the second occurrence of token i (position s = start + length + i), induction is the mass
    on position start + i + 1 (the token that followed its first occurrence), duplicate is the mass
    on start + i; the last token is left out of induction (what followed it is the repeat itself).
    """
    ids, start = repeated_sequences(hm, n_sequences, length, seed)
    L, H, n = hm.n_layers, hm.n_heads, len(ids)
    acc = Accumulator(n)
    for name in ("induction_score", "duplicate_score"):
        for k in (name, name + "_uniform"):
            acc.declare(k, (L, H))
            acc.declare(k + COUNT, (L, H))
    second = torch.arange(length) + start + length  # query positions
    t = ids.shape[1]
    rows: list[int] = []

    def heads_of(layer: int, per_head: np.ndarray) -> np.ndarray:
        """`[b, kept heads]` values at the kept heads' original ids of `[b, H]` (a physically pruned layer's
        removed heads get 0 sums and 0 counts: no score, no role)."""
        full = np.zeros((per_head.shape[0], H))
        full[:, hm.kept_heads(layer)] = per_head
        return full

    def on_attn(layer: int, q_start: int, probs: torch.Tensor) -> None:
        # [b, h, q_block, k]: queries q_start .. (h: the layer's kept heads)
        p = probs.detach().double()
        ones = torch.ones(p.shape[0], t, dtype=torch.long, device=p.device)
        n_keys = n_visible_keys(ones, hm.causal, hm.sliding_window(layer)).double()  # [b, q]
        kept = p.shape[1]
        for name, shift, m in (("duplicate_score", 0, length), ("induction_score", 1, length - 1)):
            q = second[:m]
            q = q[(q >= q_start) & (q < q_start + p.shape[2])]  # this block's queries
            k = q - length + shift
            acc.add(name, rows, heads_of(layer, p[:, :, q - q_start, k].sum(2).cpu().numpy()), (layer,))
            base = (1.0 / n_keys[:, q]).sum(-1).cpu().numpy()  # [b]
            acc.add(name + "_uniform", rows, heads_of(layer, np.repeat(base[:, None], kept, 1)), (layer,))
            for key in (name, name + "_uniform"):
                acc.add(key + COUNT, rows, heads_of(layer, np.full((len(rows), kept), float(len(q)))), (layer,))

    with on_attention_blocks(hm, on_attn), torch.inference_mode():
        for s in range(0, n, batch_size):
            chunk = ids[s:s + batch_size]
            rows[:] = range(s, s + len(chunk))
            hm.model(input_ids=chunk.to(hm.device), attention_mask=torch.ones_like(chunk).to(hm.device),
                     use_cache=False)
    return acc.result()


INDUCTION_SCORES = ("induction_score", "duplicate_score")


def scores_of(sums: PassageSums, names: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    """Each `name` and its `name_uniform` twin as the ratio of its summed mass to its summed count."""
    total = sums.total()
    return {k: ratio(k, k + COUNT)(total) for name in names for k in (name, name + "_uniform")}


def induction_scores(hm: HeadModel, n_sequences: int = 32, length: int = 24, seed: int = 0,
                     batch_size: int = 16) -> dict[str, np.ndarray]:
    """Induction and duplicate-token scores `[n_layers, n_heads]` and their uniform baselines (`induction_sums`)."""
    return scores_of(induction_sums(hm, n_sequences, length, seed, batch_size), INDUCTION_SCORES)
