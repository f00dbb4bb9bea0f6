"""Every verb on every family, from the one list in tests/families.py.

For each tiny model: captured attention equals the family's own `output_attentions`; `qkv_weights`
equals the weights read by hand; permuting heads and writing weights back keep the function;
statistics through the kernel equal eager's; pruned equals gated (hypothesis picks prunable sets);
pruned checkpoints reload through headscope and through plain transformers with trust_remote_code;
GQA-converted checkpoints reload in plain transformers; the KV calculator equals the real cache.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from families import (
    BY_HAND,
    DECODERS,
    FAMILIES,
    KV_FAMILIES,
    PRUNABLE,
    QKV_FAMILIES,
    head_layers,
    model,
    padded_ids,
    prunable_heads,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope import HeadscopeError, head_gates, load_model, on_attention_weights
from headscope.capacity.gqa import expand_kv_heads, pool_kv_heads
from headscope.capacity.kv_bytes import kv_cache_bytes
from headscope.learned.analyze import run_stats
from headscope.learned.similarity import SimilaritySettings, similarity
from headscope.models import SPECS, QKVWeights, spec_for, supported_model_types
from headscope.models.checkpoint import PRUNING_FILE, save_model
from headscope.models.specs import families_table
from headscope.redundancy.importance.scoring import ScoreSettings, score
from headscope.redundancy.pruning.heads import prune_heads, pruned_gates
from headscope.stats import STATISTICS

TOL = 1e-5
_G = torch.Generator().manual_seed(3)
# 23, 17, 9 and 4 tokens: longer than every tiny sliding window (4 or 5), batches right-padded.
SEQS = [[3] + torch.randint(5, 120, (n - 1,), generator=_G).tolist() for n in (23, 17, 9, 4)]
# One model per family for the hypothesis tests (built once; prune_heads never changes its input).
_MODELS = {f: model(f) for f in FAMILIES}


def _out(hm, ids, mask, gates=None) -> torch.Tensor:
    """Last hidden state or logits, padded positions zeroed (they are undefined)."""
    with torch.no_grad():
        if gates is None:
            y = hm.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]
        else:
            with head_gates(hm, gates):
                y = hm.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]
    return y * mask[..., None]


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# Model types whose transformers classes are copies of a tested family's (RoBERTa's), same spec.
ALIASES = ("xlm-roberta", "camembert")


# --- the list itself --------------------------------------------------------------------------------


def test_every_supported_model_type_is_in_the_family_list():
    """A spec without a tiny model (and a by-hand reader) would go untested."""
    missing = [t for t in supported_model_types() if t not in FAMILIES and t not in ALIASES]
    assert not missing, f"model types without a tiny config in headscope.models.tiny: {missing}"
    assert set(BY_HAND) == set(FAMILIES)
    assert {s.family for s in SPECS} <= {model(f).spec.family for f in FAMILIES}


# --- capture and layout -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_captured_attention_equals_output_attentions(family):
    hm, (ids, mask) = _MODELS[family], padded_ids()
    captured = {}
    with torch.no_grad(), on_attention_weights(hm, lambda l, p: captured.__setitem__(l, p.clone())):
        out = hm.model(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
    assert len(out.attentions) == len(head_layers(hm))  # transformers records softmax attention layers only
    assert sorted(captured) == head_layers(hm)
    for layer, ref in zip(head_layers(hm), out.attentions, strict=True):
        assert captured[layer].shape == (3, hm.n_heads, 12, 12)
        d = _maxdiff(captured[layer], ref)
        assert d == 0.0, f"{family} layer {layer}: max abs diff {d}"


@pytest.mark.parametrize("family", QKV_FAMILIES)
def test_qkv_weights_equal_the_modules_read_by_hand(family):
    hm = _MODELS[family]
    for layer in head_layers(hm):
        w = hm.qkv_weights(layer)
        weights, biases = BY_HAND[family](hm.layers[layer], hm)
        for name, got, want in zip("qkv", (w.q, w.k, w.v), weights, strict=True):
            assert torch.equal(got, want), f"{family} L{layer} {name}: max abs diff {_maxdiff(got, want):.3g}"
        for name, got, want in zip("qkv", (w.q_bias, w.k_bias, w.v_bias), biases, strict=True):
            assert (got is None) == (want is None), f"{family} L{layer} {name}_bias presence"
            if want is not None:
                assert torch.equal(got, want), f"{family} L{layer} {name}_bias differs"
        assert w.q.shape == (hm.n_heads * hm.d_head_at(layer), hm.d_model)
        assert w.k.shape == w.v.shape == (hm.n_kv_heads * hm.d_head_at(layer), hm.d_model)


@pytest.mark.parametrize("family", QKV_FAMILIES)
def test_writing_weights_back_and_permuting_heads_keep_the_function(family):
    """set_qkv_weights(qkv_weights()) is in place and exact; permuting query heads (with their KV heads)
    leaves the output unchanged and moves the rows the by-hand reader sees."""
    hm = model(family)
    ids, mask = padded_ids()
    before = _out(hm, ids, mask)
    params = {id(p) for p in hm.model.parameters()}
    for layer in head_layers(hm):
        w = hm.qkv_weights(layer)
        hm.set_qkv_weights(layer, QKVWeights(*(None if t is None else t.clone() for t in
                                               (w.q, w.k, w.v, w.q_bias, w.k_bias, w.v_bias, w.q_gate,
                                                w.q_gate_bias))))
    assert {id(p) for p in hm.model.parameters()} == params, "same shapes must be written in place"
    assert torch.equal(_out(hm, ids, mask), before)
    g, n_kv, d = hm.group_size, hm.n_kv_heads, hm.d_head_at(1)
    # Reverse the KV groups and the query heads inside each group.
    order = [k * g + i for k in reversed(range(n_kv)) for i in reversed(range(g))]
    old = BY_HAND[family](hm.layers[1], hm)[0][0].detach().clone()
    hm.permute_heads(1, order)
    new = BY_HAND[family](hm.layers[1], hm)[0][0]
    assert torch.equal(new[:d], old[order[0] * d:(order[0] + 1) * d]), f"{family}: q rows did not move"
    diff = _maxdiff(_out(hm, ids, mask), before)
    assert diff < TOL, f"{family}: permuted heads changed the output: max abs diff {diff:.3g}"


# --- statistics ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_statistics_equal_eager(family):
    hm = _MODELS[family]
    kernel, eager = run_stats(hm, SEQS, 3, block=5), run_stats(hm, SEQS, 3, eager=True)
    assert (kernel.tokens, kernel.passages) == (eager.tokens, eager.passages)
    k, e = kernel.means(), eager.means()
    for name in STATISTICS:
        ok = ~torch.isnan(torch.as_tensor(e[name])).numpy()
        assert (torch.isnan(torch.as_tensor(k[name])).numpy() == ~ok).all(), f"{family} {name}: NaN pattern differs"
        d = abs(k[name][ok] - e[name][ok]).max() if ok.any() else 0.0
        assert d < TOL, f"{family} {name}: kernel vs eager max abs diff {d}"


# (family, config override, layer whose attention the override must change): what makes each family
# different, switched off.
PECULIARITIES = (("gemma3_text", {"layer_types": ["full_attention"] * 2}, 0),
                 ("starcoder2", {"sliding_window": None}, 0),
                 ("gemma2", {"attn_logit_softcapping": None}, 0), ("smollm3", {"no_rope_layers": [1, 1]}, 1),
                 ("olmo3", {"layer_types": ["full_attention"] * 2}, 0),
                 ("gemma4_text", {"sliding_window": 64}, 0),  # its layers' head_dim follows layer_types
                 ("modernbert", {"local_attention": 64}, 1))


@pytest.mark.parametrize("family, override, layer", PECULIARITIES, ids=[p[0] for p in PECULIARITIES])
def test_sliding_windows_and_softcap_matter(family, override, layer):
    """The tiny configs exercise what makes their families different: without the window (the soft-cap,
    the NoPE layer, ...) the attention changes, so a kernel ignoring them would fail the test above."""
    ids, mask = padded_ids()
    hm = _MODELS[family]
    other = type(hm.model)(transformers.AutoConfig.for_model(**{**hm.config.to_dict(), **override}))
    other.load_state_dict(hm.model.state_dict())
    other.eval().set_attn_implementation("eager")
    with torch.no_grad():
        a = hm.model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[layer]
        b = other(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[layer]
    assert _maxdiff(a, b) > 1e-2, f"{family}: {override} changed nothing in layer {layer}"


@pytest.mark.parametrize("family", FAMILIES)
def test_similar_and_score_run(family):
    """The verbs above the adapter (similarity over weights and attention maps, importance by gradient)
    run on every family and give finite numbers of the right shape."""
    hm = _MODELS[family]
    if isinstance(hm.d_head_record, list):  # Gemma-4's per-layer head_dim: similarity refuses it in one line
        with pytest.raises(HeadscopeError, match=r"has head_dim per layer \(\[16, 32\]\); this step needs one"):
            similarity(hm, SEQS[2:], SimilaritySettings(max_length=12, batch_size=2))
    elif not hm.spec.refusal("similar"):  # else refused with the reason: test_a_refusal_names_the_family_and_the_reason
        sim = similarity(hm, SEQS[2:], SimilaritySettings(max_length=12, batch_size=2))
        n = hm.n_layers * hm.n_heads
        assert all(np.asarray(m).shape == (n, n) for m in sim.matrices.values())
    col = score(hm, SEQS[2:], ScoreSettings(methods=("gradient",), max_length=12, batch_size=2))["importance_gradient"]
    assert col.shape == (hm.n_layers, hm.n_heads), f"{family}: {col.shape}"
    assert np.isfinite(col[head_layers(hm)]).all(), f"{family}: {col}"
    assert np.isnan(col[hm.headless_layers]).all(), f"{family}: layers without heads scored {col}"


# --- pruning --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", PRUNABLE)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pruned_equals_gated(family, data):
    hm = _MODELS[family]
    heads = prunable_heads(hm, data.draw)
    ids, mask = padded_ids()
    gated = _out(hm, ids, mask, pruned_gates(hm, heads))
    pruned = prune_heads(hm, heads)
    diff = _maxdiff(gated, _out(pruned, ids, mask))
    assert diff < TOL, f"{family}: pruned != gated for {heads}: max abs diff {diff:.3g}"


def _prune_set(hm) -> dict[int, list[int]]:
    """The first layer with heads loses all of them; the next one loses one query head per KV group (or head 1
    under MHA)."""
    g = hm.group_size
    first, second = head_layers(hm)[:2]
    return {first: list(range(hm.n_heads)), second: [k * g for k in range(hm.n_kv_heads)] if g > 1 else [1]}


def test_pruned_checkpoints_reload_in_a_fresh_process(tmp_path):
    """Every family, pruned and saved; ONE fresh process loads each with load_checkpoint and with
    plain transformers (trust_remote_code runs the loader saved beside the weights)."""
    ids, mask = padded_ids()
    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    want, paths = {}, {}
    for family in PRUNABLE:
        hm = _MODELS[family]
        heads = _prune_set(hm)
        path = save_model(prune_heads(hm, heads), tmp_path / family)
        assert (path / PRUNING_FILE).exists()
        want[family] = _out(hm, ids, mask, pruned_gates(hm, heads))
        paths[family] = str(path)
    script = textwrap.dedent(f"""
        import torch, transformers
        from headscope.models.checkpoint import auto_class, load_checkpoint
        x = torch.load({str(tmp_path / 'inputs.pt')!r})
        out = {{}}
        for family, path in {paths!r}.items():
            with torch.no_grad():
                hm = load_checkpoint(path)
                y = hm.model(input_ids=x["ids"], attention_mask=x["mask"], use_cache=False)[0]
                auto = auto_class(transformers.AutoConfig.from_pretrained(path, trust_remote_code=True))
                m = auto.from_pretrained(path, trust_remote_code=True, attn_implementation="eager").eval()
                z = m(input_ids=x["ids"], attention_mask=x["mask"], use_cache=False)[0]
            out[family] = (y * x["mask"][..., None], type(m).__name__, z * x["mask"][..., None])
        torch.save(out, {str(tmp_path / 'out.pt')!r})
    """)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300, env=env)
    got = torch.load(tmp_path / "out.pt")
    for family, (y, name, z) in got.items():
        assert _maxdiff(want[family], y) < TOL, f"{family}: load_checkpoint != gated: {_maxdiff(want[family], y):.3g}"
        assert name.startswith("HeadscopePruned"), f"{family}: loaded as {name}"
        assert _maxdiff(want[family], z) < TOL, f"{family}: trust_remote_code != gated: {_maxdiff(want[family], z):.3g}"


@pytest.mark.parametrize("family", KV_FAMILIES)
def test_gqa_checkpoints_reload_in_plain_transformers(family, tmp_path):
    """Expanding KV heads keeps the function exactly; pooling them (where there are several) gives a
    model that plain transformers reloads from its config alone (num_key_value_heads)."""
    hm = _MODELS[family]
    ids, mask = padded_ids()
    expanded = expand_kv_heads(hm)
    assert expanded.n_kv_heads == hm.n_heads
    assert _maxdiff(_out(expanded, ids, mask), _out(hm, ids, mask)) < TOL
    converted = [expanded] + ([pool_kv_heads(hm, 1, [[list(range(hm.n_kv_heads))]] * hm.n_layers)]
                              if hm.n_kv_heads > 1 else [])
    for i, conv in enumerate(converted):
        path = save_model(conv, tmp_path / str(i))
        assert not (path / PRUNING_FILE).exists() and "auto_map" not in json.loads((path / "config.json").read_text())
        plain = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        assert plain.config.num_key_value_heads == conv.n_kv_heads
        with torch.no_grad():
            y = plain(input_ids=ids, attention_mask=mask)[0] * mask[..., None]
        d = _maxdiff(y, _out(conv, ids, mask))
        assert d < TOL, f"{family}: {conv.n_kv_heads} KV heads reloaded differently: max abs diff {d:.3g}"


def test_mqa_keeps_its_kv_head_until_all_its_query_heads_go():
    hm = _MODELS["gemma3_text"]
    assert (hm.n_heads, hm.n_kv_heads) == (4, 1)
    three = prune_heads(hm, {1: [0, 2, 3]})
    assert three.layers[1].self_attn.k_proj.out_features == hm.d_head  # the one KV head stays
    assert three.qkv_weights(1).q.shape[0] == hm.d_head
    none = prune_heads(hm, {1: [0, 1, 2, 3]})
    assert none.heads_in_layer(1) == 0 and none.kv_heads_in_layer(1) == []


# --- the KV calculator against real caches ---------------------------------------------------------------


def _cache_nbytes(cache) -> int:
    """K/V bytes of a cache (layers without keys, Qwen3.5's linear-attention states, hold none)."""
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
               if getattr(layer, "keys", None) is not None)


@pytest.mark.parametrize("family", DECODERS)
def test_kv_calculator_equals_the_real_cache(family):
    """A static cache holds exactly the calculator's figure; after generate, the dynamic cache too, except
    that a sliding layer whose window filled keeps window - 1 tokens between steps (documented in kv.py)."""
    hm = _MODELS[family]
    config = hm.config
    ids = torch.randint(5, 120, (2, 9), generator=torch.Generator().manual_seed(0))
    static = transformers.StaticCache(config=config, max_cache_len=9)
    with torch.no_grad():
        hm.model(input_ids=ids, cache=static, use_cache=True)
    assert _cache_nbytes(static) == kv_cache_bytes(config, 9, 2, "fp32"), f"{family}: static cache"
    new = 3
    with torch.no_grad():
        out = hm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                do_sample=False, use_cache=True, return_dict_in_generate=True,
                                pad_token_id=0)
    tokens = ids.shape[1] + new - 1  # the last generated token is never fed back
    windows = [hm.sliding_window(l) for l in range(hm.n_layers)]
    # one token of K and V (fp32, batch 2) fewer in every sliding layer whose window filled
    short = sum(2 * hm.n_kv_heads * hm.d_head_at(l) * 4 * 2 for l, w in enumerate(windows)
                if w is not None and tokens >= w)
    measured = _cache_nbytes(out.cache)
    assert measured == kv_cache_bytes(config, tokens, 2, "fp32") - short, (
        f"{family}: measured {measured} B, calculator {kv_cache_bytes(config, tokens, 2, 'fp32')} B, "
        f"windows {windows}")


def test_phi3_pruned_layer_reads_its_own_head_count():
    """Phi-3 splits its fused output at config.num_attention_heads: a pruned layer sees its own count,
    and everything else (the attention implementation) from the model's config, also in a deep copy."""
    small = prune_heads(_MODELS["phi3"], {1: [0, 3]})
    assert small.attention(1).config.num_attention_heads == 4 and small.config.num_attention_heads == 6
    assert small.attention(0).config is small.config  # unpruned layers keep the shared config
    twin = copy.deepcopy(small.model)
    twin.set_attn_implementation("sdpa")
    assert twin.model.layers[1].self_attn.config._attn_implementation == "sdpa"
    assert small.attention(1).config._attn_implementation == "eager"
    assert not hasattr(_MODELS["phi3"].config, "headscope_pruning")  # the input model is untouched


# --- bad input ---------------------------------------------------------------------------------------------


def test_an_unsupported_family_lists_the_supported_ones_and_the_guide(tmp_path):
    want = r"model type 'xlnet' is not supported; supported: bert, camembert, .*gemma3_text.*opt.*xlm-roberta\. .*" \
           r"docs/families\.md, \"Adding a family\""
    with pytest.raises(HeadscopeError, match=want):
        spec_for("xlnet")
    transformers.XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32).save_pretrained(tmp_path)
    with pytest.raises(HeadscopeError, match=want):  # before any weight is read
        load_model(str(tmp_path))
    with pytest.raises(HeadscopeError, match="'gemma3' is not supported \\(did you mean 'gemma2'"):
        spec_for("gemma3")  # the multimodal wrapper; its text model is gemma3_text


def _fake_gguf(path, architecture: str) -> None:
    """A small but well-formed GGUF file (header, a few keys, one tensor) written by the gguf package."""
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gguf_file_transformers_cannot_read_is_a_clear_error(tmp_path):
    _fake_gguf(tmp_path / "encoder.gguf", "bert")  # a real architecture name that transformers' GGUF reader lacks
    with pytest.raises(HeadscopeError, match=r"cannot read the GGUF file .*encoder\.gguf.*architecture bert is not "
                                             r"supported.*reads GGUF files of these architectures: .*gemma3.*llama"):
        load_model(str(tmp_path / "encoder.gguf"))
    (tmp_path / "not.gguf").write_bytes(b"NOTAGGUF" + bytes(64))
    with pytest.raises(HeadscopeError, match=r"cannot read the GGUF file .*not\.gguf.*magic"):
        load_model(str(tmp_path / "not.gguf"))


@pytest.mark.parametrize("doc", ["docs/families.md"])
def test_docs_table_is_the_generated_one(doc):
    """docs/families.md holds the table families_table() renders from the specs, unchanged."""
    text = (Path(__file__).resolve().parents[1] / doc).read_text(encoding="utf-8")
    start = text.index("<!-- families-table: generated by headscope.models.specs.families_table() -->\n")
    body = text[text.index("\n", start) + 1:text.index("<!-- end families-table -->")]
    assert body == families_table(), f"{doc} is stale: paste headscope.models.specs.families_table() there"
