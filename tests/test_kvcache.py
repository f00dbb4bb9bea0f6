"""The head-aware KV cache against references: a hand-written per-head masked attention (windowed KV
heads see only sink + window), transformers' own full cache at budget 100%, and the byte formula."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from headscope.capacity.kvcache import CachePlan, HeadAwareCache, check_supported, head_aware_attention, windowed_mask
from headscope.errors import HeadscopeError
from headscope.models.tiny import tiny_model

REF = "test_kvcache_reference"
_REF_PLAN: dict[int, CachePlan] = {}  # id(model) -> the plan the reference masks by


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention over the whole sequence (no cache) in which every query head of a windowed KV
    head sees only key j <= i with j < sink or j > i - window; written out head by head."""
    plan = _REF_PLAN[module.config._ref_id]
    b, n_heads, t, d = query.shape
    group = n_heads // key.shape[1]
    scaling = d ** -0.5 if scaling is None else scaling
    pos = torch.arange(t)
    causal = pos[None, :] <= pos[:, None]
    band = causal & ((pos[None, :] < plan.sink) | (pos[None, :] > pos[:, None] - plan.window))
    out = torch.empty(b, t, n_heads, value.shape[-1], dtype=query.dtype)
    for h in range(n_heads):
        kv = h // group
        allowed = causal if kv in plan.full[module.layer_idx] else band  # [q, k]
        scores = (query[:, h] @ key[:, kv].transpose(-1, -2)) * scaling  # [batch, q, k]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[:, :, h] = torch.softmax(scores, -1) @ value[:, kv]
    return out, None


AttentionInterface.register(REF, reference_attention)
AttentionMaskInterface.register(REF, eager_mask)


def _model(n_kv: int = 3, seed: int = 0):
    # 6 query heads over 3 KV heads (groups of 2); wide init so attention is far from uniform
    return tiny_model("llama", seed=seed, init_std=0.2, num_key_value_heads=n_kv, max_position_embeddings=128)


def _reference_logits(hm, plan: CachePlan, ids: torch.Tensor) -> torch.Tensor:
    hm.config._ref_id = id(hm.model)
    _REF_PLAN[id(hm.model)] = plan
    previous = hm.config._attn_implementation
    hm.model.set_attn_implementation(REF)
    try:
        with torch.no_grad():
            return hm.model(input_ids=ids, use_cache=False).logits
    finally:
        hm.model.set_attn_implementation(previous)


def _decode_logits(hm, cache, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Prefill `prefill` tokens, then feed the rest one at a time through `cache`."""
    with torch.no_grad():
        out = [hm.model(input_ids=ids[:, :prefill], cache=cache, use_cache=True).logits]
        for t in range(prefill, ids.shape[1]):
            out.append(hm.model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True).logits)
    return torch.cat(out, 1)


PLANS = [  # per layer the full KV heads; sink, window
    (((0,), (1, 2)), 2, 5),
    (((), (2,)), 3, 4),     # a layer with every KV head windowed
    (((0, 1, 2), ()), 0, 1),  # no sink, window 1: a windowed head sees only itself
    (((1,), (0,)), 4, 30),  # the window covers everything: equal to the full cache
]


@pytest.mark.parametrize("full,sink,window", PLANS)
@pytest.mark.parametrize("prefill", [1, 9])
def test_decoding_equals_masked_reference(full, sink, window, prefill):
    hm = _model()
    plan = CachePlan(full, 3, 2, sink, window)
    ids = torch.randint(3, 120, (2, 32), generator=torch.Generator().manual_seed(1))
    ref = _reference_logits(hm, plan, ids)
    with head_aware_attention(hm):
        inc = _decode_logits(hm, HeadAwareCache(plan), ids, prefill)
        with torch.no_grad():
            one = hm.model(input_ids=ids, cache=HeadAwareCache(plan), use_cache=True).logits
    scale = ref.abs().max()
    assert (inc - ref).abs().max() / scale < 1e-5, f"decoding vs reference: max abs diff {(inc - ref).abs().max()}"
    assert (one - ref).abs().max() / scale < 1e-5, f"prefill vs reference: max abs diff {(one - ref).abs().max()}"


def test_windowing_changes_the_output():
    """The reference is not trivially the full model: a small window changes logits past the window."""
    hm = _model()
    ids = torch.randint(3, 120, (1, 32), generator=torch.Generator().manual_seed(2))
    full = _reference_logits(hm, CachePlan.all_full(2, 3, 2), ids)
    windowed = _reference_logits(hm, CachePlan(((0,), (1,)), 3, 2, 1, 3), ids)
    assert torch.allclose(full[:, :4], windowed[:, :4], atol=1e-5)  # inside sink + window: the same
    assert (full[:, 10:] - windowed[:, 10:]).abs().max() > 1e-2


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_budget_100_equals_transformers_full_cache(implementation):
    hm = _model()
    ids = torch.randint(3, 120, (2, 24), generator=torch.Generator().manual_seed(3))
    hm.model.set_attn_implementation(implementation)
    plain = _decode_logits(hm, DynamicCache(), ids, 6)
    with head_aware_attention(hm):
        ours = _decode_logits(hm, HeadAwareCache(CachePlan.all_full(2, 3, 2)), ids, 6)
    assert (ours - plain).abs().max() < 1e-5, f"max abs diff {(ours - plain).abs().max()}"
    hm.model.set_attn_implementation("eager")


def test_generate_with_the_cache_equals_greedy_reference():
    """generate() drives the cache; its greedy tokens equal argmax over the masked reference."""
    hm = _model()
    plan = CachePlan(((2,), (0,)), 3, 2, 2, 4)
    ids = torch.randint(3, 120, (1, 12), generator=torch.Generator().manual_seed(4))
    with head_aware_attention(hm), torch.no_grad():
        out = hm.model.generate(ids, cache=HeadAwareCache(plan), max_new_tokens=6, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    seq = ids
    for _ in range(6):
        nxt = _reference_logits(hm, plan, seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_padded_batch_rows_equal_each_alone():
    """Right padding: a short row in a batch gives the logits it gives alone (the model's padding mask
    reaches the windowed heads)."""
    hm = _model()
    plan = CachePlan(((0,), (1,)), 3, 2, 1, 4)
    ids = torch.randint(3, 120, (2, 20), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    with head_aware_attention(hm), torch.no_grad():
        both = hm.model(input_ids=ids, attention_mask=mask, cache=HeadAwareCache(plan)).logits
        alone = hm.model(input_ids=ids[1:, :14], cache=HeadAwareCache(plan)).logits
    assert (both[1, :14] - alone[0]).abs().max() < 1e-5


def test_bytes_read_and_stored_equal_the_formula():
    hm = _model()
    plan = CachePlan(((0,), (1, 2)), 3, 2, 2, 5)
    ids = torch.randint(3, 120, (2, 30), generator=torch.Generator().manual_seed(6))
    cache = HeadAwareCache(plan)
    with head_aware_attention(hm), torch.no_grad():
        hm.model(input_ids=ids[:, :3], cache=cache)
        for t in range(3, 30):
            hm.model(input_ids=ids[:, t:t + 1], cache=cache)
            context = t + 1
            assert cache.bytes_read == plan.bytes_read(context, hm.d_head, 4, batch=2)
            assert cache.bytes_stored == plan.bytes_stored(context, hm.d_head, 4, batch=2)
    # windowed heads stop growing: only the full KV heads cost bytes per token
    assert plan.bytes_per_token(hm.d_head, 4) == 2 * hm.d_head * 4 * 3
    full = CachePlan.all_full(2, 3, 2)
    assert full.bytes_read(30, hm.d_head, 4) == 2 * 30 * 2 * 3 * hm.d_head * 4  # = the plain cache


def test_plain_cache_bytes_equal_dynamic_cache():
    hm = _model()
    ids = torch.randint(3, 120, (1, 17), generator=torch.Generator().manual_seed(7))
    ours, plain = HeadAwareCache(CachePlan.all_full(2, 3, 2)), DynamicCache()
    with head_aware_attention(hm), torch.no_grad():
        hm.model(input_ids=ids, cache=ours)
    with torch.no_grad():
        hm.model(input_ids=ids, cache=plain)
    assert ours.bytes_stored == sum(layer.keys.nbytes + layer.values.nbytes for layer in plain.layers)


def test_windowed_mask_by_hand():
    m = windowed_mask(torch.arange(6), torch.arange(6), sink=1, window=2)
    expected = torch.tensor([[1, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0],
                             [1, 0, 1, 1, 0, 0],
                             [1, 0, 0, 1, 1, 0],
                             [1, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)


@pytest.mark.parametrize("sink,window,match", [(-1, 4, "^sink"), (2, 0, "^window"), (2, -3, "^window")])
def test_bad_sink_window(sink, window, match):
    with pytest.raises(HeadscopeError, match=match):
        CachePlan.all_full(2, 3, 2, sink, window)


def test_mqa_and_unsupported_refused():
    with pytest.raises(HeadscopeError, match="MQA"):
        check_supported(_model(n_kv=1))
    with pytest.raises(HeadscopeError, match="not supported"):
        check_supported(tiny_model("gpt2"))
    with pytest.raises(HeadscopeError, match="sliding-window"):
        check_supported(tiny_model("mistral", sliding_window=4))


def test_chunked_passage_nll_equals_reference():
    """Perplexity through the cache (chunked prefill + a last decoding step) equals the NLL of the
    per-head masked reference, and the last step reads the formula's bytes."""
    from headscope.capacity.kvcache.evaluate import evaluate_perplexity
    from headscope.eval.lm import target_nll

    hm = _model()
    plan = CachePlan(((1,), (0, 2)), 3, 2, 2, 6)
    passages = [torch.randint(3, 120, (40,), generator=torch.Generator().manual_seed(s)).tolist() for s in (8, 9)]
    ref_nll, ref_count = 0.0, 0
    for p in passages:
        ids = torch.tensor([p])
        logits = _reference_logits(hm, plan, ids)[0, :-1]
        n, c, _ = target_nll(logits, ids[0, 1:])
        ref_nll, ref_count = ref_nll + float(n), ref_count + c
    got = evaluate_perplexity(hm, plan, passages, chunk=7)
    assert got["ppl_tokens"] == ref_count == 78
    assert abs(got["perplexity"] - math.exp(ref_nll / ref_count)) < 1e-4 * got["perplexity"]
    assert got["bytes_read"] == [plan.bytes_read(40, hm.d_head, 4)] * 2


def test_greedy_equals_generate():
    from headscope.capacity.kvcache.evaluate import greedy

    hm = _model()
    plan = CachePlan(((0,), (2,)), 3, 2, 1, 5)
    prompt = torch.randint(3, 120, (1, 15), generator=torch.Generator().manual_seed(10))
    with head_aware_attention(hm), torch.no_grad():
        ours = greedy(hm, plan, prompt[0].tolist(), 7, chunk=4)
        theirs = hm.model.generate(prompt, cache=HeadAwareCache(plan), max_new_tokens=7, do_sample=False,
                                   pad_token_id=0, eos_token_id=None)
    assert ours == theirs[0, 15:].tolist()


def test_smollm2_decoding_equals_masked_reference_and_bytes_formula(smollm2):
    """Real weights (SmolLM2-135M, GQA 9/3): a third of the KV heads full, the rest sink 2 + window 16;
    prefill then decoding through the cache equals the per-head masked reference, and every step reads
    the formula's bytes."""
    from headscope.capacity.kvcache.choice import choose_random

    hm = smollm2
    plan = choose_random(hm.n_layers, hm.n_kv_heads, hm.n_layers, seed=0, budget=1 / 3).plan(hm.group_size, 2, 16)
    text = "The old lighthouse keeper climbed the stairs every evening, counting the steps as his father had. " * 6
    ids = hm.tokenizer(text, return_tensors="pt")["input_ids"][:, :60]
    ref = _reference_logits(hm, plan, ids)
    cache = HeadAwareCache(plan)
    with head_aware_attention(hm):
        got = _decode_logits(hm, cache, ids, 50)
    assert ids.shape[1] == 60 and cache.bytes_read == plan.bytes_read(60, hm.d_head, 4)
    diff = (got - ref).abs().max()
    assert diff / ref.abs().max() < 1e-4, f"max abs diff {diff}"
    full = _reference_logits(hm, CachePlan.all_full(hm.n_layers, hm.n_kv_heads, hm.group_size), ids)
    assert (full[:, 40:] - ref[:, 40:]).abs().max() > 1e-2  # windowing matters here, so the check can fail
