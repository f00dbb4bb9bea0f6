"""Timing a physically pruned model against the original: FLOPs and interleaved forward timings.

Single-shot times of each model, one after the other, are off by up to +-20% on a shared or virtual
machine; `time_speedup` times the two in turn in every repeat (after a warm-up each) so drift and load
hit both alike, and reports the median of the per-repeat ratios beside `matmul_flops`' ideal.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...models.adapter import HeadModel


def matmul_flops(hm: HeadModel, n_tokens: int, seq: int) -> float:
    """Forward FLOPs of the model's projections (every Linear/Conv1D, the LM head included) and of attention
    scores and mixing (4 * seq * width per token and layer), for `n_tokens` tokens of length `seq`."""
    linear = 0
    for m in hm.model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, torch.nn.Parameter) and w.dim() == 2 and not isinstance(m, torch.nn.Embedding):
            linear += w.numel()
    api = hm.hf_model
    head = api.get_output_embeddings() if hasattr(api, "get_output_embeddings") else None
    if head is not None and isinstance(api.get_input_embeddings(), torch.nn.Embedding) and \
            head.weight is api.get_input_embeddings().weight:
        linear += head.weight.numel()  # a tied LM head is one parameter but a full matmul
    width = sum(hm.heads_in_layer(l) * hm.d_head_at(l) for l in range(hm.n_layers))
    return 2.0 * linear * n_tokens + 4.0 * seq * width * n_tokens


def time_forward(hm: HeadModel, ids: torch.Tensor, mask: torch.Tensor, repeats: int) -> float:
    """Median wall seconds of one forward pass over (ids, mask), after one warm-up."""
    out = []
    with torch.inference_mode():
        hm.model(input_ids=ids, attention_mask=mask, use_cache=False)
        for _ in range(repeats):
            t0 = time.perf_counter()
            hm.model(input_ids=ids, attention_mask=mask, use_cache=False)
            out.append(time.perf_counter() - t0)
    return float(np.median(out))


def time_speedup(base: HeadModel, small: HeadModel, ids: torch.Tensor, mask: torch.Tensor,
                 repeats: int) -> tuple[float, float]:
    """(median seconds of `small`'s forward, median of the per-repeat ratios base / small), the two timed in
    turn in every repeat after a warm-up each (module docstring)."""
    times, ratios = [], []
    with torch.inference_mode():
        for m in (base, small):
            m.model(input_ids=ids, attention_mask=mask, use_cache=False)
        for _ in range(repeats):
            t0 = time.perf_counter()
            base.model(input_ids=ids, attention_mask=mask, use_cache=False)
            t1 = time.perf_counter()
            small.model(input_ids=ids, attention_mask=mask, use_cache=False)
            t2 = time.perf_counter()
            times.append(t2 - t1)
            ratios.append((t1 - t0) / (t2 - t1))
    return float(np.median(times)), float(np.median(ratios))


__all__ = ["matmul_flops", "time_forward", "time_speedup"]
