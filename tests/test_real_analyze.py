"""analyze on the real shipped weights; each assertion is a fact measured on them (see comments)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope import on_attention_weights
from headscope.learned.analyze import analyze

pytestmark = pytest.mark.real


def test_minilm_capture_equals_transformers(minilm):
    enc = minilm.tokenizer(["The cat sat on the mat.", "Attention heads differ."], padding=True, return_tensors="pt")
    got = {}
    with torch.no_grad(), on_attention_weights(minilm, lambda l, p: got.__setitem__(l, p.clone())):
        out = minilm.model(**enc, output_attentions=True)
    d = max((got[l] - a).abs().max().item() for l, a in enumerate(out.attentions))
    assert d == 0.0, f"max abs diff {d}"


def test_minilm_heads(minilm):
    table = analyze(minilm, limit=16)
    assert table.meta["tokens_seen"] > 300 and table.meta["n_heads"] == 12
    # Measured on the built-in sample: L0H2 puts 0.9997 of its weight on the previous token,
    # a near-perfect previous-token head.
    assert table["prev_token_mass"][0, 2] > 0.95
    # [CLS]/[SEP] act as a no-op sink in the middle layers (Clark et al. 2019 saw the same in BERT):
    # 19 of 72 heads put more than half their weight on special tokens, none of them in layer 0,
    # whose mean special mass (0.17) is far below layers 1-4 (0.34-0.51).
    special = table["special_mass"]
    assert (special > 0.5).sum() >= 10
    assert (special[0] < 0.5).all()
    assert special[0].mean() < special[1:5].mean(axis=1).min()


def test_smollm2_heads(smollm2):
    table = analyze(smollm2, limit=16, max_length=48)
    assert (table.meta["n_layers"], table.meta["n_heads"], table.meta["n_kv_heads"]) == (30, 9, 3)
    first = table["first_token_mass"]
    # SmolLM2's tokenizer adds no BOS, so the first word is the sink. Measured: 181 of 270 heads put
    # more than half their weight on it, but layers 0 and 1 do not (mean 0.13 and 0.12).
    assert (first > 0.5).sum() >= 135
    assert first[:2].mean() < 0.25 and first[3:].mean() > 0.5
    # Previous-token heads exist early and mid-depth: measured L16H0 0.77, L1H2 0.68.
    assert table["prev_token_mass"].max() > 0.6
    # Causal: the next token is never visible.
    assert np.isnan(table["next_token_mass"]).all()
