"""One model's value on every item of a capability: what `compare` pairs between BASE and OTHER.

Each function runs one model over items both models share and returns per-item numbers, so the change has a paired
interval (the items are resampled together):

- `lm_items`: each passage's summed next-token NLL and its counted positions (`eval.lm.nll_sums`);
- `fidelity_items`: each passage's mean-pooled final hidden states (an encoder's output), cosine taken later;
- `pair_items`: each pair's logit(answer) - logit(wrong) on its clean text (`learned.causal`'s metric);
- `needle_items`: each haystack's share of answer tokens the model predicts, teacher-forced (`roles --long`'s
  needle accuracy, `learned.longctx.needle`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..data import Tokens, batches, pad_id
from ..eval.lm import nll_sums
from ..eval.metrics import final_hidden, mean_pool
from ..learned.causal.pairs import PairBatch
from ..learned.causal.patching import chunks, run_metric
from ..learned.longctx.needle import Haystack, answer_logits
from ..models.adapter import HeadModel
from ..models.dispatch import input_device


def lm_items(hm: HeadModel, tokens: Tokens, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per passage: summed next-token NLL (nats) and counted positions, `[passages]` each."""
    nll, count = np.zeros(len(tokens)), np.zeros(len(tokens))
    dev = input_device(hm.model)
    with torch.inference_mode():
        for b in batches(tokens.ids, batch_size, pad_id(hm)):
            ids, mask = b.input_ids.to(dev), b.attention_mask.to(dev)
            logits = hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            s, n = nll_sums(logits, ids, mask)
            nll[b.index], count[b.index] = s.cpu().numpy(), n.cpu().numpy()
    return nll, count


def fidelity_items(hm: HeadModel, tokens: Tokens, batch_size: int) -> torch.Tensor:
    """Per passage: the mean-pooled final hidden states `[passages, d_model]` (float64)."""
    out = torch.zeros(len(tokens), hm.d_model, dtype=torch.float64)
    dev = input_device(hm.model)
    with torch.inference_mode():
        for b in batches(tokens.ids, batch_size, pad_id(hm)):
            ids, mask = b.input_ids.to(dev), b.attention_mask.to(dev)
            out[b.index] = mean_pool(final_hidden(hm, ids, mask), mask).double().cpu()
    return out


def pair_items(hm: HeadModel, b: PairBatch, batch_size: int) -> np.ndarray:
    """Per pair: logit(answer) - logit(wrong) at the metric position of the clean text, `[pairs]`."""
    out = []
    with torch.inference_mode():
        for rows in chunks(len(b), batch_size):
            part = b.take(rows)
            out.append(run_metric(hm, part, part.clean, "logit_diff").double().cpu().numpy())
    return np.concatenate(out)


def needle_items(hm: HeadModel, haystacks: list[Haystack]) -> np.ndarray:
    """Per haystack: the share of the answer's tokens that are the model's argmax, teacher-forced, `[haystacks]`."""
    out = np.zeros(len(haystacks))
    dev = input_device(hm.model)
    with torch.inference_mode():
        for i, hay in enumerate(haystacks):
            a0, a1 = hay.answer
            _, logits = answer_logits(hm, torch.tensor([hay.ids], device=dev), a0 - 1)
            pred = logits[: a1 - a0].argmax(-1).cpu()
            out[i] = float((pred == torch.tensor(hay.ids[a0:a1])).double().mean())
    return out


__all__ = ["fidelity_items", "lm_items", "needle_items", "pair_items"]
