"""The reference attention module against PyTorch's attention and transformers' LlamaAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headscope.capacity.mha import MultiHeadAttention, apply_rope
from headscope.errors import HeadscopeError

TOL = 1e-5


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _module(d_model=32, n_heads=4, n_kv_heads=None, seed=0, **kw) -> MultiHeadAttention:
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, n_heads, n_kv_heads, **kw).eval()
    with torch.no_grad():  # wider than the default init so attention is far from uniform
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m


def _inputs(batch=3, pos=7, d_model=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, pos, d_model, generator=g)
    mask = torch.ones(batch, pos, dtype=torch.long)
    mask[1:, 5:] = 0  # right padding: rows of length pos, 5, 3
    mask[2:, 3:] = 0
    return x, mask


def _repeat_kv(t: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[batch, kv_head, pos, d] -> [batch, kv_head*n_rep, pos, d], each KV head repeated for its query group."""
    b, kv, s, d = t.shape
    return t[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def _sdpa_reference(m: MultiHeadAttention, x, mask, causal, enable_gqa=False):
    """Project with the module's own weights, then attend with torch's scaled_dot_product_attention."""
    B, T, _ = x.shape
    q = m.q_proj(x).view(B, T, m.n_heads, m.d_head).transpose(1, 2)
    k = m.k_proj(x).view(B, T, m.n_kv_heads, m.d_head).transpose(1, 2)
    v = m.v_proj(x).view(B, T, m.n_kv_heads, m.d_head).transpose(1, 2)
    if not enable_gqa:
        k, v = _repeat_kv(k, m.group_size), _repeat_kv(v, m.group_size)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    if mask is not None:
        allowed = allowed & mask.bool()[:, None, None, :]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=enable_gqa)
    return m.o_proj(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["nomask", "padding"])
def test_matches_scaled_dot_product_attention(n_kv_heads, causal, padded):
    m = _module(n_kv_heads=n_kv_heads, causal=causal, bias=True)
    x, mask = _inputs()
    mask = mask if padded else None
    with torch.no_grad():
        ours = m(x, attention_mask=mask)
        ref = _sdpa_reference(m, x, mask, causal)
        ref_gqa = _sdpa_reference(m, x, mask, causal, enable_gqa=True)
    assert ours.shape == x.shape
    assert torch.allclose(ours, ref, atol=TOL), f"max abs diff vs SDPA {_maxdiff(ours, ref):.2e}"
    assert torch.allclose(ours, ref_gqa, atol=TOL), f"max abs diff vs SDPA(enable_gqa) {_maxdiff(ours, ref_gqa):.2e}"


def test_independent_d_head_matches_sdpa():
    m = _module(d_model=32, n_heads=4, n_kv_heads=2, d_head=24, causal=True)
    assert m.q_proj.weight.shape == (96, 32) and m.k_proj.weight.shape == (48, 32) and m.o_proj.weight.shape == (32, 96)
    x, mask = _inputs()
    with torch.no_grad():
        ours, ref = m(x, attention_mask=mask), _sdpa_reference(m, x, mask, causal=True)
    assert torch.allclose(ours, ref, atol=TOL), f"max abs diff {_maxdiff(ours, ref):.2e}"


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_matches_torch_multihead_attention(causal):
    d, h = 32, 4
    m = _module(d_model=d, n_heads=h, bias=True, causal=causal)
    ref = torch.nn.MultiheadAttention(d, h, bias=True, batch_first=True).eval()
    with torch.no_grad():  # in_proj_weight is [3d, d] stacked q; k; v
        ref.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
        ref.out_proj.weight.copy_(m.o_proj.weight)
        ref.out_proj.bias.copy_(m.o_proj.bias)
    x, mask = _inputs(d_model=d)
    T = x.shape[1]
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = may NOT attend
    with torch.no_grad():
        ours, w = m(x, attention_mask=mask, return_weights=True)
        ref_out, ref_w = ref(x, x, x, key_padding_mask=~mask.bool(), attn_mask=blocked,
                             need_weights=True, average_attn_weights=False)
    assert torch.allclose(ours, ref_out, atol=TOL), (
        f"max abs diff vs nn.MultiheadAttention {_maxdiff(ours, ref_out):.2e}"
    )
    assert torch.allclose(w, ref_w, atol=TOL), f"max abs diff of weights {_maxdiff(w, ref_w):.2e}"


def _tiny_llama(head_dim=None, rope_theta=10000.0):
    import transformers as tf

    kw = dict(vocab_size=50, hidden_size=64, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2,
              intermediate_size=64, max_position_embeddings=128, initializer_range=0.3,
              rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    if head_dim is not None:
        kw["head_dim"] = head_dim
    config = tf.LlamaConfig(**kw)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return config, tf.LlamaForCausalLM(config).model.eval()


@pytest.mark.parametrize("head_dim,theta", [(None, 10000.0), (16, 500000.0)], ids=["d_head8", "d_head16-theta5e5"])
def test_matches_llama_attention(head_dim, theta):
    from transformers.masking_utils import create_causal_mask

    config, model = _tiny_llama(head_dim, theta)
    attn = model.layers[0].self_attn
    d_head = attn.head_dim
    m = MultiHeadAttention(64, 8, 2, d_head=d_head, rope=True, rope_theta=theta, causal=True).eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(m, name).weight.copy_(getattr(attn, name).weight)
    x, mask = _inputs(batch=3, pos=9, d_model=64)
    position_ids = torch.arange(x.shape[1])[None]
    with torch.no_grad():
        cos_sin = model.rotary_emb(x, position_ids=position_ids)
        causal_mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=mask, cache=None,
                                         position_ids=position_ids)
        ref_out, ref_w = attn(x, position_embeddings=cos_sin, attention_mask=causal_mask)
        ours, w = m(x, attention_mask=mask, return_weights=True)
    assert torch.allclose(ours, ref_out, atol=TOL), f"max abs diff vs LlamaAttention {_maxdiff(ours, ref_out):.2e}"
    assert torch.allclose(w, ref_w, atol=TOL), f"max abs diff of weights vs LlamaAttention {_maxdiff(w, ref_w):.2e}"


def test_apply_rope_matches_transformers_at_arbitrary_positions():
    import transformers.models.llama.modeling_llama as ml

    config, model = _tiny_llama(head_dim=16, rope_theta=1000.0)
    positions = torch.tensor([[0, 3, 10, 127], [5, 6, 7, 8]])  # per-batch, non-contiguous
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 8, 4, 16, generator=g), torch.randn(2, 2, 4, 16, generator=g)
    cos, sin = model.rotary_emb(q, position_ids=positions)
    ref_q, _ = ml.apply_rotary_pos_emb(q, q, cos, sin)
    ref_k, _ = ml.apply_rotary_pos_emb(k, k, cos, sin)
    ours_q, ours_k = apply_rope(q, positions, 1000.0), apply_rope(k, positions, 1000.0)
    assert torch.allclose(ours_q, ref_q, atol=TOL), f"max abs diff {_maxdiff(ours_q, ref_q):.2e}"
    assert torch.allclose(ours_k, ref_k, atol=TOL), f"max abs diff {_maxdiff(ours_k, ref_k):.2e}"


def test_rope_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 1, 1, 32, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 32, generator=g,
                                                                                  dtype=torch.float64)

    def score(m: int, n: int) -> float:
        return float((apply_rope(q, torch.tensor([m])) * apply_rope(k, torch.tensor([n]))).sum())

    for shift in (1, 17, 400):
        assert abs(score(5, 2) - score(5 + shift, 2 + shift)) < 1e-9
    assert abs(score(5, 2) - score(5, 3)) > 1e-6  # and it does depend on the offset


def test_weights_sum_to_one_over_allowed_keys_and_zero_on_masked():
    m = _module(n_kv_heads=2, causal=True)
    x, mask = _inputs()
    with torch.no_grad():
        _, w = m(x, attention_mask=mask, return_weights=True)  # [batch, head, q, k]
    T = x.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
    allowed = allowed.expand_as(w)
    sums = w.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=TOL), (
        f"max |sum - 1| {_maxdiff(sums, torch.ones_like(sums)):.2e}"
    )
    assert float(w[~allowed].abs().max()) == 0.0, f"weight on masked keys {float(w[~allowed].abs().max()):.2e}"
    assert float(w[allowed].min()) > 0.0


def test_query_without_allowed_keys_gets_zero_weights_not_nan():
    m = _module(n_kv_heads=1, causal=True)
    x, _ = _inputs(batch=1, pos=5)
    left_padded = torch.tensor([[0, 0, 1, 1, 1]])  # positions 0, 1 see only padding under the causal mask
    with torch.no_grad():
        out, w = m(x, attention_mask=left_padded, return_weights=True)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert float(w[0, :, :2].abs().max()) == 0.0
    sums = w[0, :, 2:].sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=TOL)


def test_gqa_equals_mha_with_repeated_kv_weights():
    """A GQA layer is the MHA layer whose K/V heads are copies within each group: the fact MHA->GQA builds on."""
    gqa = _module(d_model=48, n_heads=6, n_kv_heads=2, d_head=8, rope=True, causal=True, bias=True)
    mha = MultiHeadAttention(48, 6, 6, d_head=8, rope=True, causal=True, bias=True).eval()
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src = getattr(gqa, name)
            w = src.weight.view(2, 8, 48).repeat_interleave(3, dim=0).reshape(48, 48)
            b = src.bias.view(2, 8).repeat_interleave(3, dim=0).reshape(48)
            getattr(mha, name).weight.copy_(w)
            getattr(mha, name).bias.copy_(b)
    x, mask = _inputs(d_model=48)
    with torch.no_grad():
        a, b = gqa(x, mask), mha(x, mask)
    assert torch.allclose(a, b, atol=TOL), f"max abs diff {_maxdiff(a, b):.2e}"


def test_layout_names_and_param_count():
    assert MultiHeadAttention(64, 8).layout == "MHA"
    assert MultiHeadAttention(64, 8, 2).layout == "GQA"
    assert MultiHeadAttention(64, 8, 1).layout == "MQA"
    m = MultiHeadAttention(64, 8, 2, d_head=16, bias=True)
    q, kv, o = 64 * 128 + 128, 64 * 32 + 32, 128 * 64 + 64  # q: d_model -> 8*16, k and v: d_model -> 2*16
    assert m.n_params == q + 2 * kv + o


@pytest.mark.parametrize("n_kv_heads,d_head", [(8, None), (2, 16), (1, None)])
def test_flops_match_torch_flop_counter(n_kv_heads, d_head):
    from torch.utils.flop_counter import FlopCounterMode

    m = MultiHeadAttention(64, 8, n_kv_heads, d_head=d_head, causal=True, rope=True).eval()
    x = torch.randn(2, 10, 64)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        m(x)
    assert m.flops(10, batch=2) == counter.get_total_flops()


def test_dropout_only_in_training():
    m = _module(dropout=0.5)
    x, _ = _inputs()
    with torch.no_grad():
        assert torch.equal(m(x), m(x))  # eval: deterministic
        m.train()
        torch.manual_seed(0)
        a = m(x)
        torch.manual_seed(1)
        b = m(x)
    assert not torch.allclose(a, b)


def test_bad_input_raises_with_what_would_work():
    with pytest.raises(HeadscopeError, match=r"n_kv_heads=3 does not divide n_heads=8.*\[1, 2, 4, 8\]"):
        MultiHeadAttention(64, 8, 3)
    with pytest.raises(HeadscopeError, match="pass d_head explicitly"):
        MultiHeadAttention(60, 8)
    with pytest.raises(HeadscopeError, match="even d_head"):
        MultiHeadAttention(64, 8, d_head=7, rope=True)
    m = MultiHeadAttention(32, 4)
    with pytest.raises(HeadscopeError, match=r"\[batch, pos, d_model=32\]"):
        m(torch.randn(2, 5, 31))
    with pytest.raises(HeadscopeError, match=r"attention_mask must be \[batch, pos\] = \[2, 5\]"):
        m(torch.randn(2, 5, 32), attention_mask=torch.ones(2, 4))
    with pytest.raises(HeadscopeError):
        m.flops(0)
