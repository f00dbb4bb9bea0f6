"""Activation and attribution patching (headscope.learned.causal) against hand-built references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.learned.causal.pairs import induction_pairs
from headscope.learned.causal.patching import exact_scan, logits_at, metric_values
from headscope.models.tiny import tiny_model


def _by_hand(hm, b, layer, head, metric, position=None):
    """The corrupt run with head (layer, head)'s slice of the out-projection input replaced by the clean run's."""
    d = hm.d_head
    saved = {}

    def keep(module, args):
        saved["x"] = args[0].detach().clone()

    def replace(module, args):
        x = args[0].clone()
        at = slice(None) if position is None else slice(position, position + 1)
        x[:, at, head * d:(head + 1) * d] = saved["x"][:, at, head * d:(head + 1) * d]
        return (x,)

    proj = hm.out_proj(layer)
    with torch.no_grad():
        h = proj.register_forward_pre_hook(keep)
        try:
            logits_at(hm, b.clean, b.mask, b.position)
        finally:
            h.remove()
        h = proj.register_forward_pre_hook(replace)
        try:
            out = metric_values(logits_at(hm, b.corrupt, b.mask, b.position), b.answer, b.wrong, metric)
        finally:
            h.remove()
    return out.double().numpy()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])
@pytest.mark.parametrize("metric", ["logit_diff", "prob", "loss"])
def test_exact_patching_equals_separate_forwards(family, metric):
    hm = tiny_model(family)
    b = induction_pairs(None, hm.vocab_size, n=5, length=6, seed=1)
    runs = exact_scan(hm, b, metric=metric, batch_size=3, copies=5)
    for layer in range(hm.n_layers):
        for head in range(hm.n_heads):
            np.testing.assert_allclose(runs.patched[:, layer, head], _by_hand(hm, b, layer, head, metric),
                                       rtol=1e-4, atol=1e-5)
    # fewer forwards than one per head and chunk of pairs
    assert runs.forwards < 2 * hm.n_layers * hm.n_heads


def test_per_position_patching_equals_separate_forwards():
    hm = tiny_model("llama")
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=2)
    runs = exact_scan(hm, b, positions="each", batch_size=4, copies=7)
    for layer, head, pos in [(0, 0, 0), (0, 3, 4), (1, 5, 8), (1, 2, 6)]:
        np.testing.assert_allclose(runs.patched[:, layer, head, pos], _by_hand(hm, b, layer, head, "logit_diff",
                                                                               pos), rtol=1e-4, atol=1e-5)


def test_noising_patches_the_clean_run():
    hm = tiny_model("llama")
    b = induction_pairs(None, hm.vocab_size, n=4, length=5, seed=3)
    den, noi = exact_scan(hm, b), exact_scan(hm, b, direction="noising")
    np.testing.assert_allclose(den.clean, noi.clean, rtol=1e-5)
    np.testing.assert_allclose(den.corrupt, noi.corrupt, rtol=1e-5)
    swapped = type(b)(b.corrupt, b.clean, b.mask, b.position, b.answer, b.wrong, b.pairs, b.source)
    np.testing.assert_allclose(noi.patched, exact_scan(hm, swapped).patched, rtol=1e-5, atol=1e-6)
