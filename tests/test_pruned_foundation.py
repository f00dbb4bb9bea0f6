"""The foundation on physically pruned models: gates, capture and statistics keep original head ids."""

from __future__ import annotations

import numpy as np
import torch

from headscope import head_gates, load_model
from headscope.learned.analyze import analyze, run_stats
from headscope.models.checkpoint import save_model
from headscope.redundancy.pruning.heads import prune_heads
from headscope.stats import STATISTICS

SEQS = [[3, 17, 9, 44, 5, 61, 7, 8, 30, 2], [3, 11, 12, 2], [3, 90, 91, 92, 93, 5, 2]]


def removed_for(hm):
    """Prune one whole layer and part of another (GQA-valid: one query head from every KV group)."""
    per_group = hm.group_size
    partial = [g * per_group for g in range(hm.n_kv_heads)] if per_group > 1 else [1, 2]
    return {0: list(range(hm.n_heads)), 1: partial}


def test_statistics_of_pruned_model_equal_gated_model(tiny):
    removed = removed_for(tiny)
    small = prune_heads(tiny, removed)
    gates = torch.ones(tiny.n_layers, tiny.n_heads)
    for layer, heads in removed.items():
        gates[layer, heads] = 0
    with head_gates(tiny, gates):
        gated = run_stats(tiny, SEQS, 2).means()
    pruned = analyze(small, SEQS, batch_size=2)
    for name in STATISTICS:
        got, want = pruned[name], gated[name].copy()
        for layer, heads in removed.items():
            want[layer, heads] = np.nan  # removed heads have no statistics
        assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: NaN pattern differs"
        ok = ~np.isnan(want)
        d = np.abs(got[ok] - want[ok]).max() if ok.any() else 0.0
        assert d < 1e-5, f"{name}: max abs diff {d}"


def test_gates_on_pruned_model_use_original_head_ids(tiny):
    removed = removed_for(tiny)
    small = prune_heads(tiny, removed)
    ids = torch.tensor([SEQS[0]])
    layer = 1
    victim = next(h for h in range(tiny.n_heads) if h not in removed[layer])
    g = torch.ones(tiny.n_layers, tiny.n_heads)
    for l, heads in removed.items():
        g[l, heads] = 0
    g[layer, victim] = 0
    with torch.no_grad(), head_gates(tiny, g):
        ref = tiny.model(input_ids=ids, use_cache=False)[0]
    g_small = torch.ones(tiny.n_layers, tiny.n_heads)
    g_small[layer, victim] = 0
    with torch.no_grad(), head_gates(small, g_small):
        got = small.model(input_ids=ids, use_cache=False)[0]
    d = (got - ref).abs().max().item()
    assert d < 1e-5, f"max abs diff {d}"


def test_load_model_reads_pruned_checkpoint(tmp_path):
    from headscope.models.tiny import tiny_model

    hm = tiny_model("llama", init_std=0.2)
    small = prune_heads(hm, {1: [0, 3]})  # one query head from each of the two KV groups
    save_model(small, tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    assert again.kept_heads(1) == [1, 2, 4, 5] and again.heads_in_layer(0) == 6
    ids = torch.tensor([SEQS[0]])
    with torch.no_grad():
        d = (again.model(input_ids=ids).logits - small.model(input_ids=ids).logits).abs().max().item()
    assert d < 1e-5, f"max abs diff {d}"
