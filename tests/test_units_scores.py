"""Unit scores against references: prefix-reusing ablation = naive ablation = evaluation under the mask;
Block Influence = cosines of transformers' own hidden states; FFN Taylor = finite differences; activation
scores = activations read from the family's own module."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.data import prepare_tokens
from headscope.redundancy.importance.units import block_influence, ffn_scores, layer_ablation
from headscope.redundancy.pruning import UnitMask, unit_masks
from tests.families import model

TEXT_IDS = [[5, 17, 33, 8, 90, 41, 12, 7, 66], [9, 3, 71, 28, 54, 19], [44, 10, 101, 6, 23, 88, 15]]


def _prep(hm):
    return prepare_tokens(hm, TEXT_IDS, 16)


def _masked_metric(hm, prep, metric, mask):
    from headscope.data import batches, pad_id
    from headscope.eval.evaluate import accumulate, batch_targets, finish
    from headscope.eval.metrics import row_metric
    totals = {"value": [0.0, 0.0]}
    with torch.inference_mode(), unit_masks(hm, mask):
        for b in batches(prep.ids, 2, pad_id=pad_id(hm)):
            tg = batch_targets(prep, None, b.index, b.input_ids.shape[1], hm.device)
            accumulate(totals, row_metric(hm, metric, b.input_ids, b.attention_mask, **tg))
    return finish(metric, totals, prep.n_tokens).value


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text", "gpt_neox"])
@pytest.mark.parametrize("unit", ["attention", "block"])
def test_layer_ablation_prefix_reuse_is_exact(family, unit):
    hm = model(family)
    prep = _prep(hm)
    fast, base = layer_ablation(hm, prep, "lm_loss", unit, batch_size=2)
    naive, base2 = layer_ablation(hm, prep, "lm_loss", unit, batch_size=2, reuse_prefix=False)
    assert base.value == base2.value
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-6)
    for layer in range(hm.n_layers):
        off = torch.ones(hm.n_layers)
        off[layer] = 0
        m = UnitMask(attention=off) if unit == "attention" else UnitMask(block=off)
        assert abs(_masked_metric(hm, prep, "lm_loss", m) - fast[layer]) < 1e-6
    assert np.all(np.abs(fast - base.value) > 1e-4)  # each ablation changes the loss


def test_block_influence_equals_hidden_state_cosines():
    hm = model("bert")
    prep = _prep(hm)
    bi = block_influence(hm, prep, batch_size=2)
    from headscope.data import batches, pad_id
    sums, count = np.zeros(hm.n_layers), 0.0
    with torch.no_grad():
        for b in batches(prep.ids, 3, pad_id=pad_id(hm)):
            hs = hm.model(
                input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True
            ).hidden_states
            m = b.attention_mask.double()
            for l in range(hm.n_layers):
                x, y = hs[l].double(), hs[l + 1].double()
                cos = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
                sums[l] += float((cos * m).sum())
            count += float(m.sum())
    np.testing.assert_allclose(bi, 1 - sums / count, atol=1e-10)


def test_ffn_taylor_equals_finite_differences():
    # GPT-2: its eager attention keeps float64 throughout (LLaMA's softmax runs in float32), so central
    # differences in float64 are exact to ~1e-9 here.
    hm = model("gpt2")
    hm.model.double()
    prep = prepare_tokens(hm, TEXT_IDS[:1], 16)
    scores = ffn_scores(hm, prep, "lm_loss", batch_size=1)
    eps = 1e-5
    for layer, neuron in [(0, 3), (1, 40), (1, 77)]:  # GPT-2's FFN: 128 neurons
        vals = []
        for s in (+1, -1):
            g = torch.ones(hm.ffn_size(layer), dtype=torch.float64)
            g[neuron] += s * eps
            vals.append(_masked_metric(hm, prep, "lm_loss", UnitMask(ffn={layer: g})))
        fd = abs(vals[0] - vals[1]) / (2 * eps)
        assert abs(scores["taylor"][layer][neuron] - fd) < 1e-6 * max(1.0, fd), (layer, neuron, fd)


def test_ffn_activation_score_by_hand():
    hm = model("llama")
    prep = _prep(hm)
    scores = ffn_scores(hm, prep, "lm_loss", batch_size=2)
    from headscope.data import batches, pad_id
    store = []
    hook = hm.model.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, a: store.append(a[0].detach()))
    sums, count = 0.0, 0.0
    try:
        with torch.no_grad():
            for b in batches(prep.ids, 2, pad_id=pad_id(hm)):  # the same batches as the score
                store.clear()
                hm.model(input_ids=b.input_ids, attention_mask=b.attention_mask)
                m = b.attention_mask.double()[..., None]
                sums = sums + (store[0].double().abs() * m).sum((0, 1))
                count += float(m.sum())
    finally:
        hook.remove()
    want = (sums / count * hm.model.model.layers[1].mlp.down_proj.weight.detach().double().norm(dim=0)).numpy()
    np.testing.assert_allclose(scores["activation"][1], want, rtol=1e-9)


def test_layer_scan_costs_L_plus_1_passes_with_half_the_block_evaluations():
    """Per batch: one unablated pass + one pass per layer; with the prefix reused, ablating layer l runs
    blocks l..L-1 only, so the scan evaluates L + L(L+1)/2 blocks instead of L + L^2."""
    hm = model("llama", seed=0)
    import transformers as tf

    from headscope.models import HeadModel
    cfg = hm.config
    cfg.num_hidden_layers = 6
    torch.manual_seed(0)
    deep = HeadModel(model=tf.LlamaForCausalLM(cfg).eval(), name="tiny-llama6")
    prep = prepare_tokens(deep, TEXT_IDS, 16)  # 3 passages: one batch
    calls = {"blocks": 0, "passes": 0}
    # Counted inside the block (its MLP): a stubbed prefix block returns the cached output without running it.
    hooks = [b.mlp.register_forward_hook(lambda *a: calls.__setitem__("blocks", calls["blocks"] + 1))
             for b in deep.layers]
    hooks.append(deep.model.model.register_forward_hook(lambda *a: calls.__setitem__("passes", calls["passes"] + 1)))
    try:
        L = deep.n_layers
        for reuse, blocks in ((True, L + L * (L + 1) // 2), (False, L + L * L)):
            calls.update(blocks=0, passes=0)
            layer_ablation(deep, prep, "lm_loss", "block", batch_size=8, reuse_prefix=reuse)
            assert calls["passes"] == L + 1
            # A dropped block still computes once (its output is then replaced by its input).
            assert calls["blocks"] == blocks, (reuse, calls)
    finally:
        for h in hooks:
            h.remove()
