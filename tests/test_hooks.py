"""Head gates and attention capture against transformers' own outputs and manual recomputation."""

from __future__ import annotations

import pytest
import torch

from headscope import capture_head_outputs, head_gates, on_attention_weights
from headscope.errors import HeadscopeError


def run(hm, ids, mask):
    with torch.no_grad():
        out = hm.model(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def maxdiff(a, b):
    return (a - b).abs().max().item()


def test_captured_attention_equals_output_attentions(tiny, tiny_ids):
    ids, mask = tiny_ids
    captured = {}
    with torch.no_grad(), on_attention_weights(tiny, lambda l, p: captured.__setitem__(l, p.clone())):
        out = tiny.model(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
    assert len(out.attentions) == tiny.n_layers
    for layer, ref in enumerate(out.attentions):
        assert captured[layer].shape == (3, tiny.n_heads, 12, 12)
        d = maxdiff(captured[layer], ref)
        assert d == 0.0, f"layer {layer}: max abs diff {d}"


def test_gates_of_ones_change_nothing_exactly(tiny, tiny_ids):
    ids, mask = tiny_ids
    ref = run(tiny, ids, mask)
    with head_gates(tiny, torch.ones(tiny.n_layers, tiny.n_heads)):
        same = run(tiny, ids, mask)
    with head_gates(tiny, torch.ones(tiny.n_layers, tiny.n_heads, requires_grad=True)):
        same_grad = run(tiny, ids, mask)
    assert torch.equal(ref, same) and torch.equal(ref, same_grad)


def test_zero_gate_equals_manual_recomputation(tiny, tiny_ids):
    """Zeroing head (l, h) == removing its slice from the output projection's input by hand."""
    ids, mask = tiny_ids
    layer, head = tiny.n_layers - 1, 1
    gates = torch.ones(tiny.n_layers, tiny.n_heads)
    gates[layer, head] = 0
    with head_gates(tiny, gates):
        gated = run(tiny, ids, mask)

    # Manual: zero the head's columns of the output projection weight (Linear [out, in], Conv1D [in, out]).
    proj = tiny.out_proj(layer)
    cols = slice(head * tiny.d_head, (head + 1) * tiny.d_head)
    saved = proj.weight.detach().clone()
    try:
        with torch.no_grad():
            if tiny.spec.conv1d:
                proj.weight[cols, :] = 0
            else:
                proj.weight[:, cols] = 0
        manual = run(tiny, ids, mask)
    finally:
        with torch.no_grad():
            proj.weight.copy_(saved)
    d = maxdiff(gated, manual)
    assert d < 1e-5, f"max abs diff {d}"
    assert maxdiff(gated, run(tiny, ids, mask)) > 1e-4, "zeroing a head should change the output"


def test_per_row_gates_equal_separate_runs(tiny, tiny_ids):
    ids, mask = tiny_ids
    g = torch.rand(3, tiny.n_layers, tiny.n_heads, generator=torch.Generator().manual_seed(0))
    with head_gates(tiny, g):
        batched = run(tiny, ids, mask)
    for r in range(3):
        with head_gates(tiny, g[r]):
            single = run(tiny, ids, mask)
        d = maxdiff(batched[r][mask[r].bool()], single[r][mask[r].bool()])
        assert d < 1e-5, f"row {r}: max abs diff {d}"


def test_capture_head_outputs_shape_and_hooks_removed(tiny, tiny_ids):
    ids, mask = tiny_ids
    store = {}
    with capture_head_outputs(tiny, store):
        run(tiny, ids, mask)
    assert sorted(store) == list(range(tiny.n_layers))
    assert store[0].shape == (3, 12, tiny.n_heads, tiny.d_head)
    assert all(not tiny.out_proj(l)._forward_pre_hooks for l in range(tiny.n_layers))


def test_hooks_removed_after_exception(tiny, tiny_ids):
    ids, mask = tiny_ids
    with pytest.raises(RuntimeError):
        with head_gates(tiny, torch.zeros(tiny.n_layers, tiny.n_heads)):
            raise RuntimeError("boom")
    assert all(not tiny.out_proj(l)._forward_pre_hooks for l in range(tiny.n_layers))


def test_gates_with_wrong_shape_are_refused(tiny):
    with pytest.raises(HeadscopeError, match="expected"):
        with head_gates(tiny, torch.ones(tiny.n_layers + 1, tiny.n_heads)):
            pass


def test_gate_gradient_flows(tiny, tiny_ids):
    ids, mask = tiny_ids
    g = torch.ones(tiny.n_layers, tiny.n_heads, requires_grad=True)
    with head_gates(tiny, g):
        out = tiny.model(input_ids=ids, attention_mask=mask, use_cache=False)
    y = out.logits if hasattr(out, "logits") else out.last_hidden_state
    y.pow(2).mean().backward()
    assert g.grad is not None and g.grad.abs().sum() > 0


@pytest.mark.parametrize("family", ["roberta", "electra", "mistral", "qwen2"])
def test_other_supported_families(family, tiny_ids):
    """The same adapters cover RoBERTa/ELECTRA (BERT layout) and Mistral/Qwen2 (LLaMA layout)."""
    from headscope.models.tiny import tiny_model

    hm = tiny_model(family, init_std=0.2)
    test_captured_attention_equals_output_attentions(hm, tiny_ids)
    test_zero_gate_equals_manual_recomputation(hm, tiny_ids)
