"""Models load with sdpa; eager is an option: loaders pick sdpa (eager where transformers has no sdpa for
the family, logged), and gates, gradients, captured weights and statistics on an sdpa model equal those
of the same model under eager, which every full-map path switches to only while it runs."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from families import FAMILIES, model, padded_ids

from headscope import head_gates, load_model, on_attention_weights
from headscope.hooks import eager_attention
from headscope.learned.analyze import run_stats
from headscope.models.checkpoint import auto_class
from headscope.models.config import attn_implementation_for
from headscope.stats import STATISTICS

TOL = 1e-5
SEQS = [[3] + torch.randint(5, 120, (n - 1,), generator=torch.Generator().manual_seed(3)).tolist() for n in (19, 8)]
# transformers 5 has no sdpa for these (gemma2: logit soft-capping); they load eager.
NO_SDPA = ("gemma2", "gpt_oss")  # gpt_oss: sdpa has no sink logit


def twins(family: str):
    """The family's tiny model under eager and an exact copy under the implementation loaders pick."""
    eager = model(family)
    fast = copy.deepcopy(eager)
    fast.model.set_attn_implementation(attn_implementation_for(auto_class(fast.config), fast.config))
    return eager, fast


@pytest.mark.parametrize("family", FAMILIES)
def test_loaders_pick_sdpa_unless_the_family_has_none(family):
    want = "eager" if family in NO_SDPA else "sdpa"
    eager = model(family)
    assert attn_implementation_for(auto_class(eager.config), eager.config) == want


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_load_model_uses_sdpa_or_falls_back_visibly(family, tmp_path, caplog):
    hm = model(family)
    hm.model.save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="headscope.models.config"):
        loaded = load_model(str(tmp_path))
    if family in NO_SDPA:
        assert loaded.config._attn_implementation == "eager"
        assert "no sdpa attention" in caplog.text and "eager" in caplog.text
    else:
        assert loaded.config._attn_implementation == "sdpa"
        assert caplog.text == ""


@pytest.mark.parametrize("family", FAMILIES)
def test_gates_and_gradients_equal_under_sdpa_and_eager(family):
    """Head gates (ablation) and their gradient (gradient importance) do not depend on the kernel."""
    eager, fast = twins(family)
    ids, mask = padded_ids()
    gates = torch.rand(eager.n_layers, eager.n_heads, generator=torch.Generator().manual_seed(0))
    gates[0, 1] = 0.0  # one head ablated
    outs, grads = [], []
    for hm in (eager, fast):
        g = gates.clone().requires_grad_(True)
        with head_gates(hm, g):
            y = hm.model(input_ids=ids, attention_mask=mask, use_cache=False)[0] * mask[..., None]
        # a fixed random readout: sum(y^2) of a final LayerNorm is constant, its gradient pure rounding
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        (y * w).sum().backward()
        outs.append(y.detach())
        grads.append(g.grad)
    d = (outs[0] - outs[1]).abs().max().item()
    assert d < TOL, f"{family}: gated output sdpa vs eager max abs diff {d}"
    scale = grads[0].abs().max().item()
    dg = (grads[0] - grads[1]).abs().max().item()
    assert dg < TOL * max(scale, 1.0), f"{family}: gate gradient sdpa vs eager max abs diff {dg} (scale {scale})"


@pytest.mark.parametrize("family", FAMILIES)
def test_full_maps_switch_to_eager_only_while_active(family):
    eager, fast = twins(family)
    impl = fast.config._attn_implementation
    ids, mask = padded_ids()
    got = {}
    with torch.no_grad():
        with on_attention_weights(fast, lambda l, p: got.__setitem__(l, p.clone())):
            assert fast.config._attn_implementation == "eager"
            fast.model(input_ids=ids, attention_mask=mask, use_cache=False)
        out = eager.model(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
    assert fast.config._attn_implementation == impl  # restored
    layers = [layer for layer in range(eager.n_layers) if eager.has_heads(layer)]  # softmax layers are recorded
    assert len(out.attentions) == len(layers)
    for layer, ref in zip(layers, out.attentions, strict=True):
        d = (got[layer] - ref).abs().max().item()
        assert d == 0.0, f"{family} layer {layer}: max abs diff {d}"


def test_eager_attention_restores_after_an_error():
    _, fast = twins("llama")
    with pytest.raises(RuntimeError, match="boom"):
        with eager_attention(fast):
            raise RuntimeError("boom")
    assert fast.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_on_an_sdpa_model_equal_the_eager_reference(family):
    eager, fast = twins(family)
    impl = fast.config._attn_implementation
    kernel, ref = run_stats(fast, SEQS, 2, block=5), run_stats(eager, SEQS, 2, eager=True)
    assert fast.config._attn_implementation == impl
    eager_on_fast = run_stats(fast, SEQS, 2, eager=True)  # the reference path on the sdpa model itself
    assert fast.config._attn_implementation == impl
    k, e, e2 = kernel.means(), ref.means(), eager_on_fast.means()
    for name in STATISTICS:
        for other, what in ((k, "kernel on sdpa model"), (e2, "eager=True on sdpa model")):
            a, b = torch.as_tensor(other[name]), torch.as_tensor(e[name])
            assert torch.equal(a.isnan(), b.isnan()), f"{family} {name}: NaN pattern of {what} differs"
            ok = ~b.isnan()
            d = (a[ok] - b[ok]).abs().max().item() if ok.any() else 0.0
            assert d < TOL, f"{family} {name}: {what} vs eager reference max abs diff {d}"
