"""Streaming statistics: against a naive per-query reference, invariants, padding, merging."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headscope import HeadStats
from headscope.learned.analyze import analyze, run_stats
from headscope.stats import STATISTICS


def naive_stats(hm, seqs, special_ids=(), punct_ids=(), window=None):
    """Per-query loops over transformers' own output_attentions, one sequence at a time."""
    sums = {k: np.zeros((hm.n_layers, hm.n_heads)) for k in STATISTICS}
    counts = {k: np.zeros((hm.n_layers, hm.n_heads)) for k in STATISTICS}
    for seq in seqs:
        ids = torch.tensor([seq])
        with torch.no_grad():
            out = hm.model(input_ids=ids, output_attentions=True, use_cache=False)
            hidden = {}
            from headscope import capture_head_outputs

            with capture_head_outputs(hm, hidden):
                hm.model(input_ids=ids, use_cache=False)
        t = len(seq)
        for layer, att in enumerate(out.attentions):
            w = hm.out_weight(layer).detach()
            for h in range(hm.n_heads):
                for i in range(t):
                    keys = range(i + 1) if hm.causal else range(t)
                    if window is not None:
                        keys = range(max(0, i - window + 1), i + 1)
                    p = att[0, h, i].double()
                    ent = -sum(float(p[j] * math.log(p[j])) for j in keys if p[j] > 0)
                    vals = {
                        "entropy": ent,
                        "mean_distance": sum(float(p[j]) * abs(i - j) for j in keys),
                        "self_mass": float(p[i]),
                        "first_token_mass": float(p[0]),  # 0 when outside the window
                        "special_mass": sum(float(p[j]) for j in keys if seq[j] in special_ids),
                        "punct_mass": sum(float(p[j]) for j in keys if seq[j] in punct_ids),
                        "max_weight": float(max(p[j] for j in keys)),
                        "sink_logit_mass": max(0.0, 1.0 - sum(float(p[j]) for j in keys)),  # no sink: 0
                    }
                    if len(keys) > 1:
                        vals["entropy_norm"] = ent / math.log(len(keys))
                    if i - 1 in keys:
                        vals["prev_token_mass"] = float(p[i - 1])
                    if not hm.causal and i + 1 < t:
                        vals["next_token_mass"] = float(p[i + 1])
                    z = hidden[layer][0, i, h].double()
                    wh = w[:, h * hm.d_head:(h + 1) * hm.d_head].double()
                    vals["output_norm"] = float((wh @ z).norm())
                    for k, v in vals.items():
                        sums[k][layer, h] += v
                        counts[k][layer, h] += 1
    with np.errstate(invalid="ignore"):
        return {k: np.where(counts[k] > 0, sums[k] / np.maximum(counts[k], 1), np.nan) for k in STATISTICS}


SEQS = [[3, 17, 9, 44, 5, 61, 7, 8, 30, 2], [3, 11, 12, 2], [3, 90, 91, 92, 93, 5, 2]]


def assert_tables_close(table, ref):
    for name in STATISTICS:
        got, want = table[name], ref[name]
        assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: NaN pattern differs"
        ok = ~np.isnan(want)
        d = np.abs(got[ok] - want[ok]).max() if ok.any() else 0.0
        assert d < 1e-5, f"{name}: max abs diff {d}"


def test_statistics_equal_naive_reference(tiny):
    assert_tables_close(analyze(tiny, SEQS, batch_size=2), naive_stats(tiny, SEQS))


def test_next_token_is_nan_only_for_causal(tiny):
    table = analyze(tiny, SEQS)
    assert np.isnan(table["next_token_mass"]).all() == tiny.causal


def test_invariants(tiny):
    table = analyze(tiny, SEQS, batch_size=3)
    assert (table["entropy"] >= -1e-6).all()
    assert (table["entropy"] <= math.log(max(map(len, SEQS))) + 1e-6).all()
    assert ((table["entropy_norm"] >= -1e-6) & (table["entropy_norm"] <= 1 + 1e-6)).all()
    for name in ("prev_token_mass", "self_mass", "first_token_mass", "special_mass", "punct_mass", "max_weight"):
        v = table[name]
        assert ((v >= -1e-6) & (v <= 1 + 1e-6)).all(), name
    assert (table["mean_distance"] >= 0).all()


def test_alone_equals_inside_padded_batch(tiny):
    """Statistics of one sentence alone == its share inside a padded batch (sums subtract)."""
    alone = run_stats(tiny, [SEQS[1]], batch_size=1)
    others = run_stats(tiny, [SEQS[0], SEQS[2]], batch_size=2)
    together = run_stats(tiny, SEQS, batch_size=3)  # SEQS[1] is padded from 4 to 10 tokens here
    for name in alone.sums:
        d_sum = np.abs(together.sums[name] - others.sums[name] - alone.sums[name]).max()
        d_cnt = np.abs(together.counts[name] - others.counts[name] - alone.counts[name]).max()
        assert d_sum < 1e-5 and d_cnt == 0, f"{name}: sum diff {d_sum}, count diff {d_cnt}"


def test_batch_size_does_not_change_results(tiny):
    a = analyze(tiny, SEQS, batch_size=1)
    b = analyze(tiny, SEQS, batch_size=3)
    assert_tables_close(a, b.columns)


def test_merge_of_halves_equals_whole(tiny):
    whole = run_stats(tiny, SEQS, batch_size=2)
    merged = run_stats(tiny, SEQS[:1], 2).merge(run_stats(tiny, SEQS[1:], 2))
    round_trip = HeadStats.from_dict(merged.to_dict())
    assert round_trip.tokens == whole.tokens == sum(map(len, SEQS))
    for name in whole.sums:
        got, want = round_trip.means()[name], whole.means()[name]
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        d = np.abs(got - want)[~np.isnan(want)]
        assert d.size == 0 or d.max() < 1e-9, f"{name}: max abs diff {d.max()}"


def test_merge_refuses_other_shapes():
    with pytest.raises(ValueError, match="cannot merge"):
        HeadStats(2, 4).merge(HeadStats(3, 4))


def test_sliding_window_respected():
    """Mistral with a 3-token window: statistics count only the keys inside the window."""
    from headscope.models.tiny import tiny_model

    hm = tiny_model("llama", init_std=0.2)
    import transformers as tf

    cfg = tf.MistralConfig(**{k: getattr(hm.config, k) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "max_position_embeddings")}, sliding_window=3)
    torch.manual_seed(0)
    cfg.initializer_range = 0.2
    from headscope import wrap
    from headscope.hooks import eager_attention

    mistral = wrap(tf.MistralForCausalLM(cfg).eval())
    assert mistral.sliding_window(0) == 3
    with eager_attention(mistral):  # the model runs sdpa (the default); the reference reads eager's weights
        ref = naive_stats(mistral, SEQS, window=3)
    assert_tables_close(analyze(mistral, SEQS, batch_size=3), ref)
