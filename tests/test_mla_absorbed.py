"""MLA's absorbed decoding (kv_b_proj folded into the query and output sides, attention in the latent space):
cached logits equal the uncached forward, in float64 on tiny models and float32 on SmolLM2's real weights."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from headscope.capacity import mla
from headscope.capacity.mla.modeling import MLAAttention
from headscope.models.adapter import HeadModel
from headscope.models.tiny import tiny_model

IDS = torch.randint(5, 120, (2, 13), generator=torch.Generator().manual_seed(7))


def converted(family: str, kv_heads: int, rank: int = 5, rope_dims: int = 4) -> HeadModel:
    """A tiny model (non-zero biases where the family has them) converted to MLA, in float64."""
    hm = tiny_model(family, init_std=0.2, num_key_value_heads=kv_heads)
    with torch.no_grad():
        for p in hm.model.parameters():
            if p.ndim == 1 and p.abs().sum() == 0:
                p.normal_(0, 0.2)
    conv = mla.convert_to_mla(hm, rank, rope_dims, selection="high")
    conv.model.double()
    conv.model.set_attn_implementation("sdpa")  # eager's softmax rounds float64 to float32
    return conv


def decode(model: torch.nn.Module, ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """Logits of every position: a prefill of `prefix` tokens, then one token at a time on the cache."""
    cache = DynamicCache()
    outs = []
    with torch.no_grad():
        for start, stop in [(0, prefix)] + [(i, i + 1) for i in range(prefix, ids.shape[1])]:
            outs.append(model(input_ids=ids[:, start:stop], cache=cache, use_cache=True).logits)
    return torch.cat(outs, 1)


def count_absorbed(model: torch.nn.Module) -> list[int]:
    """Patch every MLAAttention._absorbed of `model` to count its calls (the list grows once per call)."""
    calls: list[int] = []
    for m in model.modules():
        if isinstance(m, MLAAttention):
            orig = m._absorbed
            m._absorbed = lambda *a, orig=orig: (calls.append(1), orig(*a))[1]  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("family,kv_heads,attn", [("llama", 2, "sdpa"), ("llama", 6, "eager"), ("qwen2", 2, "sdpa"),
                                                  ("mistral", 1, "eager")])
def test_cached_absorbed_decoding_equals_the_uncached_forward_float64(family, kv_heads, attn):
    conv = converted(family, kv_heads)
    model = conv.model.eval()
    mla.set_decode(model, "naive")
    with torch.no_grad():
        reference = model(IDS).logits  # uncached, K and V up-projected from the latent
    # eager hands the attention an additive float mask, sdpa none or a bool one; under eager the prefill is
    # absorbed too (the naive eager prefill would round its softmax to float32)
    model.set_attn_implementation(attn)
    mla.set_decode(model, "auto" if attn == "sdpa" else "absorbed")
    calls = count_absorbed(model)
    cached = decode(model, IDS, 5)
    steps = IDS.shape[1] - 5 + (attn == "eager")  # "auto": every decoding step absorbed, the prefill not
    assert len(calls) == conv.n_layers * steps
    assert (cached - reference).abs().max().item() <= 1e-10
    mla.set_decode(model, "absorbed")  # the absorbed form over the whole sequence (causal mask built by it) too
    with torch.no_grad():
        assert (model(IDS).logits - reference).abs().max().item() <= 1e-10


def test_absorbed_is_not_the_naive_form_in_disguise():
    """The absorbed path computes from the folded weights: breaking kv_b_proj's key rows changes its scores."""
    conv = converted("llama", 2)
    model = conv.model.eval()
    mla.set_decode(model, "absorbed")
    with torch.no_grad():
        before = model(IDS).logits
        att = conv.attention(0)
        att.kv_b_proj.weight[: 2 * att.nope_dims].mul_(3.0)  # type: ignore[union-attr,operator]
        assert (model(IDS).logits - before).abs().max().item() > 1e-3


def test_key_bias_cancels_and_value_bias_is_kept():
    """Qwen2's biases: adding a constant to kv_b_proj's key bias changes nothing (it cancels in the softmax);
    the value bias moves the output."""
    conv = converted("qwen2", 2)
    model = conv.model.eval()
    mla.set_decode(model, "absorbed")
    att = conv.attention(0)
    bias = att.kv_b_proj.bias  # type: ignore[union-attr]
    with torch.no_grad():
        before = model(IDS).logits
        bias[: 2 * att.nope_dims] += 0.5  # type: ignore[index,operator]
        mla.set_decode(model, "naive")
        naive = model(IDS).logits
        mla.set_decode(model, "absorbed")
        assert (model(IDS).logits - naive).abs().max().item() <= 1e-10
        bias[2 * att.nope_dims:] += 0.5  # type: ignore[index,operator]
        assert (model(IDS).logits - before).abs().max().item() > 1e-3


def test_set_decode_refuses_unknown_forms_and_plain_models():
    conv = converted("llama", 2)
    with pytest.raises(ValueError, match="absorbed"):
        mla.set_decode(conv.model, "fast")
    with pytest.raises(ValueError, match="no MLAAttention"):
        mla.set_decode(tiny_model("llama").model, "auto")


def test_a_converted_model_is_in_eval_mode_and_so_decodes_absorbed():
    hm = tiny_model("llama")
    hm.model.eval()
    conv = mla.convert_to_mla(hm, 5, 4, selection="high")
    assert not any(m.training for m in conv.model.modules())


def test_smollm2_float32_cached_absorbed_decoding_equals_the_uncached_forward(smollm2):
    """Real weights, float32, GQA (9 query / 3 KV heads), rank 96 + 8 RoPE dims: the absorbed steps give the
    logits of the uncached forward (magnitude ~20) within float32 rounding."""
    conv = mla.convert_to_mla(smollm2, 96, 8, selection="high")
    model = conv.model.eval()
    ids = smollm2.tokenizer(["The cat sat on the mat because it was tired, and then it slept."],
                            return_tensors="pt").input_ids
    with torch.no_grad():
        reference = model(ids).logits
    calls = count_absorbed(model)
    cached = decode(model, ids, 4)
    assert len(calls) == 30 * (ids.shape[1] - 4)
    diff = (cached - reference).abs().max().item()
    assert diff <= 2e-3, f"max |cached - uncached| {diff:.3g} over logits of magnitude {reference.abs().max():.1f}"
    assert torch.equal(cached.argmax(-1), reference.argmax(-1))


def test_absorbed_decoding_of_a_left_padded_batch_equals_the_uncached_forward():
    """A padded batch hands the attention a boolean mask at every step: the absorbed form applies it as the
    naive form does (real positions compared; float64)."""
    conv = converted("llama", 2)
    model = conv.model.eval()
    mask = torch.ones_like(IDS)
    mask[0, :3] = 0
    with torch.no_grad():
        mla.set_decode(model, "naive")
        reference = model(IDS, attention_mask=mask).logits
        mla.set_decode(model, "auto")
        calls = count_absorbed(model)
        cache = DynamicCache()
        outs = [model(IDS[:, :6], attention_mask=mask[:, :6], cache=cache, use_cache=True).logits]
        for i in range(6, IDS.shape[1]):
            outs.append(model(IDS[:, i:i + 1], attention_mask=mask[:, :i + 1], cache=cache, use_cache=True).logits)
    cached, real = torch.cat(outs, 1), mask.bool()
    assert len(calls) == conv.n_layers * (IDS.shape[1] - 6)
    assert not reference[real].isnan().any()
    assert (cached[real] - reference[real]).abs().max().item() <= 1e-10
