"""Units beyond heads: masked equals physically pruned on every family, checkpoints reload, bad masks refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.models.checkpoint import load_checkpoint, save_model
from headscope.redundancy.pruning import UnitMask, drop_blocks, prune_units, unit_masks
from tests.families import FAMILIES, model, padded_ids


def _hidden(hm, ids, mask):
    with torch.no_grad():
        out = hm.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state * mask[..., None]  # padded positions are not compared


def _random_mask(hm, seed: int) -> UnitMask:
    g = torch.Generator().manual_seed(seed)
    L = hm.n_layers
    ffn = {}
    for layer in range(L) if hm.has_ffn else ():  # MoE families have no FFN neurons (their spec refuses them)
        n = hm.ffn_size(layer)
        keep = (torch.rand(n, generator=g) > 0.5).float()
        keep[int(torch.randint(n, (1,), generator=g))] = 1.0  # at least one neuron stays
        ffn[layer] = keep
    attention = torch.ones(L)
    with_heads = [layer for layer in range(L) if hm.has_heads(layer)]  # Qwen3.5's linear layers have none
    attention[with_heads[int(torch.randint(len(with_heads), (1,), generator=g))]] = 0.0
    return UnitMask(attention=attention, ffn=ffn)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_pruned_equals_masked_ffn_and_attention(family, seed):
    hm = model(family)
    ids, mask = padded_ids()
    m = _random_mask(hm, seed)
    with unit_masks(hm, m):
        want = _hidden(hm, ids, mask)
    small = prune_units(hm, m)
    got = _hidden(small, ids, mask)
    diff = (got - want).abs().max().item()
    assert diff < 1e-5, f"{family}: max abs diff {diff}"
    for layer, g in m.ffn.items():
        assert small.ffn_size(layer) == int(g.sum()) and small.kept_neurons(layer) == \
            [i for i in range(len(g)) if g[i] == 1]
    # The mask really changed something (the test could fail): the masked model differs from the original.
    assert (_hidden(hm, ids, mask) - want).abs().max().item() > 1e-4


@pytest.mark.parametrize("family", [f for f in FAMILIES if not model(f).spec.refusal("block")])
def test_pruned_equals_masked_block(family):
    hm = model(family, seed=3)
    n_layers = hm.n_layers
    ids, mask = padded_ids()
    for layer in range(hm.n_layers):
        block = torch.ones(hm.n_layers)
        block[layer] = 0.0
        m = UnitMask(block=block)
        with unit_masks(hm, m):
            want = _hidden(hm, ids, mask)
        small = prune_units(hm, m)
        assert small.n_layers == hm.n_layers - 1 and small.config.num_hidden_layers == hm.n_layers - 1
        types = getattr(hm.config, "layer_types", None)
        if types is not None:
            assert small.config.layer_types == [t for i, t in enumerate(types) if i != layer]
        got = _hidden(small, ids, mask)
        diff = (got - want).abs().max().item()
        assert diff < 1e-5, f"{family} without block {layer}: max abs diff {diff}"
    assert hm.n_layers == n_layers  # the input model is untouched


@pytest.mark.parametrize("family", FAMILIES)
def test_reload_round_trip(family, tmp_path):
    hm = model(family, seed=5)
    ids, mask = padded_ids()
    m = _random_mask(hm, 7)
    small = prune_units(hm, m)
    save_model(small, tmp_path / "m")
    back = load_checkpoint(tmp_path / "m")
    want, got = small.model.state_dict(), back.model.state_dict()
    assert sorted(want) == sorted(got)
    for k in want:  # the weights come back bit for bit
        assert torch.equal(want[k], got[k]), k
    diff = (_hidden(back, ids, mask) - _hidden(small, ids, mask)).abs().max().item()
    assert diff < 1e-5, f"{family}: reloaded differs by {diff}"  # memory layout may change the sum order
    if small.has_ffn:
        assert [back.ffn_size(l) for l in range(back.n_layers)] == [small.ffn_size(l) for l in range(small.n_layers)]


def test_block_drop_reloads_in_plain_transformers(tmp_path):
    """A model with a block dropped is a plain shallower checkpoint: transformers loads it, no remote code."""
    hm = model("gemma3_text", seed=2)
    ids, mask = padded_ids()
    small = prune_units(hm, UnitMask(block=torch.tensor([0.0, 1.0])))
    save_model(small, tmp_path / "m")
    code = (
        "import sys, torch, transformers\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r}, attn_implementation='eager')\n"
        "assert m.config.num_hidden_layers == 1, m.config.num_hidden_layers\n"
        "assert m.config.layer_types == ['full_attention'], m.config.layer_types\n"
        f"ids = torch.tensor({ids.tolist()}); mask = torch.tensor({mask.tolist()})\n"
        "h = m.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state * mask[..., None]\n"
        "torch.save(h, sys.argv[1])\n")
    out = tmp_path / "h.pt"
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    diff = (torch.load(out) - _hidden(small, ids, mask)).abs().max().item()
    assert diff < 1e-6, diff


def test_combined_units_reload_with_trust_remote_code(tmp_path):
    """Blocks, attention sub-layers and FFN neurons together: the remote loader rebuilds the same model."""
    hm = model("llama", seed=4)
    ids, mask = padded_ids()
    hm3 = model("llama", seed=4)
    hm3.config.num_hidden_layers = 3
    import transformers as tf  # a 3-layer model of the same family
    cfg = hm3.config
    torch.manual_seed(0)
    from headscope.models import HeadModel
    deep = HeadModel(model=tf.LlamaForCausalLM(cfg).eval(), name="tiny-llama3")
    m = UnitMask(block=torch.tensor([1.0, 0.0, 1.0]), attention=torch.tensor([1.0, 1.0, 0.0]),
                 ffn={0: (torch.arange(96) % 3 != 0).float()})
    with unit_masks(deep, m):
        want = _hidden(deep, ids, mask)
    small = prune_units(deep, m)
    assert small.n_layers == 2 and small.heads_in_layer(1) == 0 and small.ffn_size(0) == 64
    save_model(small, tmp_path / "m")
    code = (
        "import sys, torch, transformers\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r}, trust_remote_code=True)\n"
        f"ids = torch.tensor({ids.tolist()}); mask = torch.tensor({mask.tolist()})\n"
        "h = m.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state * mask[..., None]\n"
        "torch.save(h, sys.argv[1])\n")
    out = tmp_path / "h.pt"
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    diff = (torch.load(out) - want).abs().max().item()
    assert diff < 1e-5, diff
    del hm


def test_refuses_removing_every_layer():
    hm = model("llama")
    with pytest.raises(HeadscopeError, match="every layer"):
        prune_units(hm, UnitMask(block=torch.zeros(hm.n_layers)))
    with pytest.raises(HeadscopeError, match="every layer"):
        drop_blocks(hm, [0, 1])
    with pytest.raises(HeadscopeError, match="every FFN neuron"):
        prune_units(hm, UnitMask(ffn={0: torch.zeros(hm.ffn_size(0))}))


def test_smollm2_pruned_equals_masked(smollm2):
    """Real weights: SmolLM2 without block 29, the attention sub-layer of layer 28 and every third FFN
    neuron of layer 0 computes what the masked model does, and is smaller by exactly those parameters.

    In float64: in float32 the two differ by ~1.4e-5 of the largest logit on one CPU and less on another
    (sgemm picks shape-dependent kernels, and the pruned matrices have other shapes), which says nothing
    about the pruning; in float64 the rounding is ~1e-13 and any real difference shows.
    """
    import copy

    from headscope.models.adapter import HeadModel

    hm = HeadModel(copy.deepcopy(smollm2.model).double(), smollm2.tokenizer, name=smollm2.name)
    enc = hm.tokenizer(["The cat sat on the mat.", "Prices rose sharply in May"], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    block = torch.ones(hm.n_layers)
    block[29] = 0
    attention = torch.ones(hm.n_layers)
    attention[28] = 0
    ffn = {0: (torch.arange(hm.ffn_size(0)) % 3 != 0).float()}
    m = UnitMask(block=block, attention=attention, ffn=ffn)
    with torch.no_grad():
        with unit_masks(hm, m):
            want = hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        small = prune_units(hm, m)
        got = small.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        plain = hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    scale = (want * mask[..., None]).abs().max().item()
    d = ((got - want) * mask[..., None]).abs().max().item() / scale
    assert d < 1e-10, f"pruned != masked: max abs diff {d * scale:.3g} ({d:.3g} of the largest logit {scale:.3g})"
    assert ((plain - want) * mask[..., None]).abs().max().item() > 1.0  # the mask changes the logits a lot
    from headscope.redundancy.pruning import unit_parameters
    from headscope.redundancy.pruning.heads import n_parameters
    gone = unit_parameters(hm, "block", 29) + unit_parameters(hm, "attention", 28) + \
        unit_parameters(hm, "ffn", 0) * int((ffn[0] == 0).sum())
    assert n_parameters(hm) - n_parameters(small) == round(gone)
    assert small.n_layers == 29 and small.heads_in_layer(28) == 0 and small.ffn_size(0) == 1024


def test_latency_times_original_and_pruned_in_turn(monkeypatch):
    """`--latency`'s timing: after a warm-up each, the original and the pruned model run in turn in every repeat,
    and the speedup is the median of the per-repeat ratios (a fake clock the two fake models advance by 2 and 1,
    except one disturbed repeat, which the median ignores)."""
    import types

    import headscope.redundancy.curves.latency as curve

    clock = {"t": 0.0}
    calls: list[str] = []
    cost = {"base": [2.0] * 6, "small": [1.0, 1.0, 1.0, 9.0, 1.0, 1.0]}  # warm-up first; one slow repeat

    def fake(name):
        def forward(**kw):
            calls.append(name)
            clock["t"] += cost[name][calls.count(name) - 1]
        return types.SimpleNamespace(model=forward)

    monkeypatch.setattr(curve.time, "perf_counter", lambda: clock["t"])
    seconds, speedup = curve.time_speedup(fake("base"), fake("small"), None, None, 5)
    assert calls == ["base", "small"] + ["base", "small"] * 5
    assert seconds == 1.0 and speedup == 2.0
