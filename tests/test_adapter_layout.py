"""The adapter owns weight layout: qkv_weights / set_qkv_weights / permute_heads / slice_heads on every family.

Expected weights are read by hand from each family's own modules (not through the spec), and every
function-preserving change is checked against the model's output before the change.
"""

from __future__ import annotations

import copy

import pytest
import torch
from families import BY_HAND

from headscope import HeadscopeError
from headscope.models import QKVWeights, attention_counts
from headscope.models.tiny import tiny_config, tiny_model

TOL = 1e-5


def _by_hand(hm, layer: int) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """[q, k, v] weights as [out, in] and their biases, straight from the family's modules (the one
    by-hand reader of tests/families.py)."""
    return BY_HAND[hm.config.model_type](hm.layers[layer], hm)


def _out(hm, ids):
    with torch.no_grad():
        out = hm.model(input_ids=ids, use_cache=False)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _ids():
    return torch.randint(5, 120, (2, 9), generator=torch.Generator().manual_seed(4))


# qkv_weights against the modules read by hand: tests/test_families.py, on every family of the list.


def test_gpt2_fused_split_reproduces_c_attn():
    """Linear layout is the right orientation: x @ q.T + b_q is the q part of c_attn(x)."""
    hm = tiny_model("gpt2", init_std=0.2)
    x = torch.randn(3, 5, hm.d_model, generator=torch.Generator().manual_seed(0))
    w = hm.qkv_weights(1)
    with torch.no_grad():
        fused = hm.layers[1].attn.c_attn(x)
        mine = torch.cat([x @ w.q.T + w.q_bias, x @ w.k.T + w.k_bias, x @ w.v.T + w.v_bias], -1)
    d = (fused - mine).abs().max().item()
    assert d < TOL, f"max abs diff {d:.3g}"


# set_qkv_weights(qkv_weights()) in place and exact: tests/test_families.py, on every family.


@pytest.mark.parametrize("family", ["bert", "gpt2", "qwen2"])
def test_set_qkv_weights_writes_what_it_is_given(family):
    hm = tiny_model(family, init_std=0.2)
    g = torch.Generator().manual_seed(2)
    w = hm.qkv_weights(0)
    new = QKVWeights(*(None if t is None else torch.randn(t.shape, generator=g) for t in
                       (w.q, w.k, w.v, w.q_bias, w.k_bias, w.v_bias)))
    hm.set_qkv_weights(0, new)
    weights, biases = _by_hand(hm, 0)
    for got, want in zip(weights + biases, [new.q, new.k, new.v, new.q_bias, new.k_bias, new.v_bias], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_set_qkv_weights_can_change_kv_heads(family):
    """Repeating each KV head for the query heads that read it (what repeat_kv does) keeps the output:
    new, larger K/V modules, and the attention's head counts follow."""
    hm = tiny_model(family, init_std=0.2)
    ids = _ids()
    before = _out(hm, ids)
    g, d = hm.group_size, hm.d_head
    hm.model.config.num_key_value_heads = hm.n_heads
    for layer in range(hm.n_layers):
        w = hm.qkv_weights(layer)

        def rep(t):
            return (
                None if t is None else t.reshape(-1, d, *t.shape[1:]).repeat_interleave(g, 0).reshape(-1, *t.shape[1:])
            )

        hm.set_qkv_weights(layer, QKVWeights(w.q, rep(w.k), rep(w.v), w.q_bias, rep(w.k_bias), rep(w.v_bias)))
        assert hm.layers[layer].self_attn.k_proj.out_features == hm.n_heads * d
        assert hm.layers[layer].self_attn.num_key_value_groups == 1
    d_out = (_out(hm, ids) - before).abs().max().item()
    assert d_out < TOL, f"max abs diff {d_out:.3g}"


def test_set_qkv_weights_refuses_wrong_shapes_and_biases():
    hm = tiny_model("llama")
    w = hm.qkv_weights(0)
    with pytest.raises(HeadscopeError, match=r"q has shape \(40, 48\); expected \(48, 48\).*slice_heads"):
        hm.set_qkv_weights(0, QKVWeights(w.q[:40], w.k, w.v))
    four_kv = torch.zeros(4 * 8, 48)
    with pytest.raises(HeadscopeError, match="4 KV heads do not divide 6 query heads"):
        hm.set_qkv_weights(0, QKVWeights(w.q, four_kv, four_kv))
    with pytest.raises(HeadscopeError, match="the q projection has no bias; give q_bias as None"):
        hm.set_qkv_weights(0, QKVWeights(w.q, w.k, w.v, q_bias=torch.zeros(48)))
    gpt2 = tiny_model("gpt2")
    g2 = gpt2.qkv_weights(0)
    with pytest.raises(HeadscopeError, match="gpt2 family gives every query head its own K/V.*need 32 rows, not 16"):
        gpt2.set_qkv_weights(0, QKVWeights(g2.q, g2.k[:16], g2.v[:16], g2.q_bias, g2.k_bias[:16], g2.v_bias[:16]))
    bert = tiny_model("bert")
    b = bert.qkv_weights(0)
    with pytest.raises(HeadscopeError, match="the k projection has bias; give k_bias as a tensor of 32 values"):
        bert.set_qkv_weights(0, QKVWeights(b.q, b.k, b.v, b.q_bias, None, b.v_bias))


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "qwen2"])
def test_permute_heads_keeps_the_function_and_moves_the_rows(family):
    hm = tiny_model(family, init_std=0.2)
    ids = _ids()
    before = _out(hm, ids)
    # LLaMA tiny: 6 query heads over 2 KV heads -> swap the groups and reorder inside them.
    order = [4, 3, 5, 1, 0, 2] if hm.group_size > 1 else [2, 0, 3, 1]
    old = copy.deepcopy(hm.qkv_weights(1))
    old_o = hm.out_weight(1).detach().clone()
    hm.permute_heads(1, order)
    d = hm.d_head
    new = hm.qkv_weights(1)
    for p, h in enumerate(order):
        assert torch.equal(new.q[p * d:(p + 1) * d], old.q[h * d:(h + 1) * d])
        assert torch.equal(hm.out_weight(1)[:, p * d:(p + 1) * d], old_o[:, h * d:(h + 1) * d])
    kv_first = order[0] // hm.group_size
    assert torch.equal(new.k[:d], old.k[kv_first * d:(kv_first + 1) * d])
    diff = (_out(hm, ids) - before).abs().max().item()
    assert diff < TOL, f"max abs diff {diff:.3g}"


def test_permute_heads_refuses_splitting_a_kv_group():
    hm = tiny_model("llama")
    with pytest.raises(
        HeadscopeError, match=r"query heads \[0, 1, 3\] would share KV slot 0 but read different KV heads \[0, 1\]"
    ):
        hm.permute_heads(0, [0, 1, 3, 2, 4, 5])
    with pytest.raises(HeadscopeError, match="is not a permutation of the 6 query heads"):
        hm.permute_heads(0, [0, 1, 2])


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_slice_heads_records_and_shrinks_one_layer(family):
    hm = tiny_model(family, init_std=0.2)
    keep = [3, 4, 5] if family == "llama" else [0, 2, 3]  # llama: KV head 1's whole group
    hm.slice_heads(1, keep)
    assert hm.kept_heads(1) == keep and hm.kept_heads(0) == list(range(hm.n_heads))
    assert hm.config.headscope_pruning == {"0": list(range(hm.n_heads)), "1": keep}
    w = hm.qkv_weights(1)
    n_kv = 1 if family == "llama" else 3
    assert w.q.shape[0] == 3 * hm.d_head and w.k.shape[0] == n_kv * hm.d_head
    assert hm.out_weight(1).shape == (hm.d_model, 3 * hm.d_head)
    with pytest.raises(HeadscopeError, match="heads can be removed, not added back"):
        hm.slice_heads(1, [1] + keep)


def test_slice_heads_refuses_uneven_kv_groups():
    hm = tiny_model("llama")
    with pytest.raises(HeadscopeError, match=r"leave KV groups with \{0: 2, 1: 3\} query heads.*keep 2 per surviving"):
        hm.slice_heads(0, [0, 1, 3, 4, 5])


def test_projections_names_the_modules():
    assert set(tiny_model("gpt2").projections(0)) == {"qkv", "o"}
    hm = tiny_model("llama")
    mods = hm.projections(0)
    assert set(mods) == {"q", "k", "v", "o"} and mods["k"] is hm.layers[0].self_attn.k_proj


def test_max_positions_from_the_spec():
    """RoBERTa's table reserves pad_token_id + 1 slots (tiny: 66 - 2); BERT's reserves none."""
    assert tiny_model("roberta").max_positions == 64
    assert tiny_model("bert").max_positions == 64
    assert tiny_model("roberta").spec.position_offset_from_pad
    assert not tiny_model("electra").spec.position_offset_from_pad


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_one_config_reader_for_objects_and_dicts(family):
    config = tiny_config(family)
    hm = tiny_model(family)
    from_object = attention_counts(config)
    from_dict = attention_counts(config.to_dict())
    assert from_object == from_dict
    assert (hm.n_layers, hm.n_heads, hm.n_kv_heads, hm.d_head, hm.d_model) == (
        from_object.n_layers, from_object.n_heads, from_object.n_kv_heads, from_object.d_head, from_object.d_model)
