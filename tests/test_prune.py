"""Physical pruning: pruned model == gated model, empty layers, GQA rules, save -> load in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope import HeadscopeError, head_gates
from headscope.models.checkpoint import PRUNING_FILE, load_checkpoint, save_model
from headscope.models.layout import EmptyAttention
from headscope.models.tiny import tiny_model
from headscope.redundancy.pruning.heads import kept_heads, n_parameters, prune_heads, pruned_gates

TOL = 1e-5


def _ids():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 120, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return ids, mask


def _out(hm, ids, mask, gates=None) -> torch.Tensor:
    """Last hidden state (BERT) or logits (causal), masked positions zeroed (they are undefined)."""
    with torch.no_grad():
        if gates is None:
            y = hm.model(input_ids=ids, attention_mask=mask)[0]
        else:
            with head_gates(hm, gates):
                y = hm.model(input_ids=ids, attention_mask=mask)[0]
    return y * mask[..., None]


def _check_equal(hm, heads) -> float:
    ids, mask = _ids()
    gated = _out(hm, ids, mask, pruned_gates(hm, heads))
    pruned = prune_heads(hm, heads)
    diff = (gated - _out(pruned, ids, mask)).abs().max().item()
    assert diff < TOL, f"pruned != gated for {heads}: max abs diff {diff:.3g}"
    return diff


_MODELS = {f: tiny_model(f, init_std=0.2) for f in ("bert", "gpt2")}


@pytest.mark.parametrize("family", ["bert", "gpt2"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pruned_equals_gated_random_subsets(family, data):
    hm = _MODELS[family]
    flags = data.draw(st.lists(st.booleans(), min_size=hm.n_layers * hm.n_heads,
                               max_size=hm.n_layers * hm.n_heads))
    heads = [(i // hm.n_heads, i % hm.n_heads) for i, f in enumerate(flags) if f]
    _check_equal(hm, heads)


_LLAMA = tiny_model("llama", init_std=0.2)  # 6 query heads in 2 KV groups of 3


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_pruned_equals_gated_gqa_uniform_and_whole_groups(data):
    hm = _LLAMA
    g, n_kv = hm.group_size, hm.n_kv_heads
    heads = []
    for layer in range(hm.n_layers):
        if data.draw(st.booleans(), label=f"whole groups in layer {layer}"):
            groups = data.draw(st.lists(st.integers(0, n_kv - 1), unique=True), label="groups")
            heads += [(layer, k * g + i) for k in groups for i in range(g)]
        else:
            # The same number of query heads from every group, possibly different ones per group.
            n = data.draw(st.integers(0, g), label="per group")
            for k in range(n_kv):
                picked = data.draw(st.lists(st.integers(0, g - 1), min_size=n, max_size=n, unique=True))
                heads += [(layer, k * g + i) for i in picked]
    _check_equal(hm, heads)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_all_heads_of_a_layer(family):
    hm = tiny_model(family, init_std=0.2)
    heads = {0: list(range(hm.n_heads)), 1: [1]} if family != "llama" else {0: list(range(hm.n_heads)), 1: [0, 3]}
    _check_equal(hm, heads)
    pruned = prune_heads(hm, heads)
    assert isinstance(pruned.attention(0), EmptyAttention)
    assert pruned.heads_in_layer(0) == 0
    # The emptied layer adds exactly the output projection's bias (or zero) to the residual stream.
    x = torch.randn(2, 5, hm.d_model)
    y = pruned.attention(0)(x)[0]
    if family == "bert":
        y = pruned.out_proj(0)(y)
    bias = pruned.out_proj(0).bias
    want = torch.zeros_like(x) + (bias if bias is not None else 0)
    assert (y - want).abs().max().item() == 0


def test_every_head_of_every_layer():
    hm = tiny_model("gpt2", init_std=0.2)
    _check_equal(hm, [(l, h) for l in range(hm.n_layers) for h in range(hm.n_heads)])


def test_input_untouched_and_smaller():
    hm = tiny_model("bert", init_std=0.2)
    before = {k: v.clone() for k, v in hm.model.state_dict().items()}
    pruned = prune_heads(hm, {0: [0, 1], 1: [2]})
    after = hm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "prune_heads modified its input"
    assert not hasattr(hm.config, "headscope_pruning")
    assert [pruned.heads_in_layer(l) for l in range(2)] == [2, 3]
    assert kept_heads(pruned) == {0: [2, 3], 1: [0, 1, 3]}
    # Each pruned head removes q, k, v rows (+ biases) and o columns: 4*d_model*d_head + 3*d_head.
    d, dh = hm.d_model, hm.d_head
    assert n_parameters(hm) - n_parameters(pruned) == 3 * (4 * d * dh + 3 * dh)


def test_prune_twice_uses_original_ids():
    hm = tiny_model("llama", init_std=0.2)
    once = prune_heads(hm, {0: [1, 4]})
    twice = prune_heads(once, {0: [0, 3]})
    assert kept_heads(twice)[0] == [2, 5]
    ids, mask = _ids()
    want = _out(hm, ids, mask, pruned_gates(hm, {0: [0, 1, 3, 4]}))
    diff = (want - _out(twice, ids, mask)).abs().max().item()
    assert diff < TOL, f"max abs diff {diff:.3g}"
    with pytest.raises(HeadscopeError, match="already pruned"):
        prune_heads(twice, [(0, 1)])


def test_bad_heads():
    hm = tiny_model("gpt2")
    with pytest.raises(HeadscopeError, match="layer 5 does not exist"):
        prune_heads(hm, [(5, 0)])
    with pytest.raises(HeadscopeError, match="head 9 does not exist"):
        prune_heads(hm, {0: [9]})
    with pytest.raises(HeadscopeError, match="cannot read head"):
        prune_heads(hm, [(0,)])
    # GQA: one query head from one group only leaves groups of 2 and 3.
    with pytest.raises(HeadscopeError, match="same number"):
        prune_heads(_LLAMA, ["L0H1"])


def test_unsupported_family_is_refused(monkeypatch):
    import dataclasses

    import headscope.redundancy.pruning.heads as prune

    hm = tiny_model("bert")
    hm.spec = dataclasses.replace(hm.spec, head_count_attrs=())  # a family with no pruning table
    with pytest.raises(HeadscopeError, match="not implemented for the 'bert' family"):
        prune.prune_heads(hm, [(0, 0)])


def test_save_load_fresh_process(tmp_path):
    """Save pruned BERT, GPT-2 and LLaMA-GQA models; load each in ONE fresh process, two ways."""
    ids, mask = _ids()
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    want, paths = {}, {}
    for family in ("bert", "gpt2", "llama"):
        hm = tiny_model(family, init_std=0.2)
        heads = {0: [1], 1: list(range(hm.n_heads))} if family != "llama" else {0: [0, 3], 1: [3, 4, 5]}
        pruned = prune_heads(hm, heads)
        path = save_model(pruned, tmp_path / family)
        record = json.loads((path / PRUNING_FILE).read_text())
        assert record["kept_heads"] == {str(l): k for l, k in kept_heads(pruned).items()}
        want[family] = _out(hm, ids, mask, pruned_gates(hm, heads))
        paths[family] = str(path)
    assert not list(tmp_path.glob(".*")), "temporary folder left behind"
    script = textwrap.dedent(f"""
        import torch, transformers
        from headscope.models.checkpoint import load_checkpoint
        x = torch.load({str(tmp_path / 'inputs.pt')!r})
        out = {{}}
        for family, path in {paths!r}.items():
            hm = load_checkpoint(path)
            with torch.no_grad():
                y = hm.model(input_ids=x["ids"], attention_mask=x["mask"])[0] * x["mask"][..., None]
            # Without headscope's loader: transformers' Auto class runs the loader shipped in the checkpoint.
            auto = transformers.AutoModel if family == "bert" else transformers.AutoModelForCausalLM
            m = auto.from_pretrained(path, trust_remote_code=True, attn_implementation="eager").eval()
            with torch.no_grad():
                z = m(input_ids=x["ids"], attention_mask=x["mask"])[0] * x["mask"][..., None]
            out[family] = (y, type(m).__name__, z)
        torch.save(out, {str(tmp_path / 'out.pt')!r})
    """)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300, env=env)
    got = torch.load(tmp_path / "out.pt")
    for family, (y, name, z) in got.items():
        diff = (want[family] - y).abs().max().item()
        assert diff < TOL, f"{family}: load_checkpoint (fresh process) != gated: max abs diff {diff:.3g}"
        assert name.startswith("HeadscopePruned"), name
        diff = (want[family] - z).abs().max().item()
        assert diff < TOL, f"{family}: AutoModel trust_remote_code != gated: max abs diff {diff:.3g}"


def test_save_refuses_overwrite_and_replaces_atomically(tmp_path):
    hm = prune_heads(tiny_model("gpt2"), [(0, 0)])
    path = save_model(hm, tmp_path / "m")
    with pytest.raises(HeadscopeError, match="already exists"):
        save_model(hm, path)
    hm2 = prune_heads(tiny_model("gpt2"), [(0, 0), (1, 1)])
    save_model(hm2, path, force=True)
    assert kept_heads(load_checkpoint(path))[1] == [0, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_load_rejects_non_models(tmp_path):
    with pytest.raises(HeadscopeError, match="no config.json"):
        load_checkpoint(tmp_path)
