"""What the 2026 families add beyond a LLaMA-like layout, and what each family refuses (tests/families.py's list).

Every refusal in a spec names the family and the reason, and a refused verb prints one line, exits 2 and
writes nothing; each family's peculiarity (OLMo-2's norms over all heads, Gemma-4's per-layer geometry,
Qwen3.5's linear-attention layers, GPT-OSS's sink logit, DeepSeek-V3's latent attention) is shown to matter.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from families import FAMILIES, padded_ids
from test_families import _MODELS, SEQS, TOL, _maxdiff, _out

from headscope import HeadscopeError
from headscope.capacity.gqa import expand_kv_heads
from headscope.capacity.kv_bytes import attention_shape, kv_cache_bytes, layouts
from headscope.capacity.kvcache import check_supported
from headscope.capacity.mla import check_mla
from headscope.cli import main
from headscope.hooks import on_attention_blocks
from headscope.learned.analyze import run_stats
from headscope.learned.causal.verb import patch
from headscope.learned.similarity import SimilaritySettings, similarity
from headscope.models import layout
from headscope.models.tiny import tiny_config, tiny_model
from headscope.provenance import model_record
from headscope.redundancy.pruning.heads import prune_heads, pruned_gates
from headscope.redundancy.pruning.masks import check_unit_kind

# --- what a family refuses ------------------------------------------------------------------------------------

REFUSALS = [(f, what) for f in FAMILIES for what, _ in _MODELS[f].spec.refuses]


def _refused_call(hm, what: str):
    """The library call that meets refusal `what` on `hm`."""
    calls = {"ffn": lambda: check_unit_kind(hm, "ffn"), "block": lambda: check_unit_kind(hm, "block"),
             "prune": lambda: prune_heads(hm, {1: [0]}),
             "convert": lambda: expand_kv_heads(hm),
             "similar": lambda: similarity(hm, SEQS[2:], SimilaritySettings(max_length=12)),
             "qkv": lambda: hm.qkv_weights(0), "mla": lambda: check_mla(hm, 1, None),
             "kvcache": lambda: check_supported(hm), "patch": lambda: patch(hm, task="ioi")}
    return calls[what]


@pytest.mark.parametrize("family, what", REFUSALS, ids=[f"{f}-{w}" for f, w in REFUSALS])
def test_a_refusal_names_the_family_and_the_reason(family, what):
    hm = _MODELS[family]
    why = hm.spec.refusal(what)
    with pytest.raises(HeadscopeError, match=re.escape(why)) as err:
        _refused_call(hm, what)()
    assert hm.spec.family in str(err.value)


def _tiny_dir(family: str, base: Path, hf_model=None, extra_words: str = "") -> tuple[Path, Path]:
    """The family's tiny model (or `hf_model`) saved with a word-level tokenizer, and a text file over its words."""
    from tokenizers import (  # only this helper builds a tokenizer
        Tokenizer,
        models,
        pre_tokenizers,
    )

    words = ("the of and to a in is was for on that with as by at it from he his " + extra_words).split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<pad>", *words])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = base / family
    (_MODELS[family].model if hf_model is None else hf_model).save_pretrained(path)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(path)
    text = base / "t.txt"
    rng = np.random.default_rng(0)
    text.write_text("\n".join(" ".join(rng.choice(words, 10)) for _ in range(6)) + "\n")
    return path, text


# (family, what, the verb's arguments after the model): one verb per kind of refusal.
CLI_REFUSALS = [("mixtral", "ffn", ["score", "--unit", "ffn", "--max-length", "8"]),
                ("gpt_oss", "ffn", ["prune", "--unit", "ffn", "--fraction", "10%", "--max-length", "8"]),
                ("olmo2", "prune", ["prune", "--fraction", "25%", "--max-length", "8"]),
                ("olmo3", "convert", ["gqa", "--kv-heads", "1", "--limit", "3"]),
                ("qwen3_5_text", "similar", ["similar", "--max-length", "8"]),
                ("deepseek_v3", "convert", ["gqa", "--kv-heads", "1", "--limit", "3"]),
                ("gemma4_text", "block", ["score", "--unit", "block", "--max-length", "8"])]


@pytest.mark.parametrize("family, what, argv", CLI_REFUSALS, ids=[f"{f}-{w}" for f, w, _ in CLI_REFUSALS])
def test_a_refused_verb_prints_one_line_exits_2_and_writes_nothing(family, what, argv, tmp_path, capsys):
    _refused_on_the_command_line(family, argv, _MODELS[family].spec.refusal(what), tmp_path, capsys)


def _refused_on_the_command_line(family, argv, why, tmp_path, capsys, hf_model=None) -> None:
    path, text = _tiny_dir(family, tmp_path, hf_model)
    out = tmp_path / "out"
    capsys.readouterr()  # saving the model printed a progress bar
    limit = [] if "--limit" in argv else ["--limit", "3"]
    code = main([argv[0], str(path), *argv[1:], "--data", str(text), *limit, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and _MODELS[family].spec.family in err[0] and why in err[0], err
    assert not out.exists() or not any(out.iterdir()), f"{family}: wrote {list(out.iterdir())}"


def test_olmo2_heads_sliced_one_by_one_are_not_the_gated_model():
    """Why OLMo-2's spec refuses pruning: slicing one KV group's heads out (rows, output columns and the norm
    weights, as the layout would) changes the other heads' normalisation, so the result is not the gated model."""
    hm = _MODELS["olmo2"]
    ids, mask = padded_ids()
    gone = list(range(hm.group_size))  # KV group 0
    gated = _out(hm, ids, mask, pruned_gates(hm, {1: gone}))
    sliced = copy.deepcopy(hm)
    keep = [h for h in range(hm.n_heads) if h not in gone]
    layout.slice_block(sliced.layers[1], sliced.spec, hm.d_head, hm.group_size, list(range(hm.n_heads)), keep)
    d = _maxdiff(gated, _out(sliced, ids, mask))
    assert d > 1e-3, f"olmo2: slicing heads kept the gated function (max abs diff {d:.3g}); pruning could be allowed"


@pytest.mark.parametrize("override, problem", [
    ({"num_kv_shared_layers": 1, "num_hidden_layers": 3,
      "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
     "uses KV shared across layers (num_kv_shared_layers=1: its last 1 layers have no K/V projections"),
    ({"attention_k_eq_v": True}, "uses keys as values (attention_k_eq_v: its full-attention layers have no v_proj)"),
], ids=["shared_kv", "k_eq_v"])
def test_gemma4_features_headscope_does_not_hold_are_refused_naming_the_feature(override, problem):
    """HeadModel holds one KV-head count, and each layer's own K and V: Gemma-4 configs with KV shared across
    layers or keys as values are refused in one line naming the family and the feature;
    the model is built by transformers first, so the feature is real, not a misread config."""
    config = tiny_config("gemma4_text", **override)
    transformers.Gemma4ForCausalLM(config)  # transformers builds it
    with pytest.raises(HeadscopeError, match=r"\(gemma4 family\) " + re.escape(problem)) as e:
        tiny_model("gemma4_text", **override)
    assert "\n" not in str(e.value)


def test_gemma4_of_another_geometry_is_one_line_on_the_command_line(tmp_path, capsys):
    config = tiny_config("gemma4_text", num_kv_shared_layers=1, num_hidden_layers=3,
                         layer_types=["sliding_attention", "full_attention", "full_attention"])
    config._attn_implementation = "eager"
    hf_model = transformers.Gemma4ForCausalLM(config)
    _refused_on_the_command_line("gemma4_text", ["analyze", "--max-length", "8"], "uses KV shared across layers",
                                 tmp_path, capsys, hf_model)


def test_qwen3_5_linear_attention_layers_are_skipped_and_said_so():
    """Qwen3.5's linear-attention layer has no softmax heads: no statistics (NaN), no gates, no KV cache in the
    calculator (with a note), and the provenance of every verb names it."""
    hm = _MODELS["qwen3_5_text"]
    assert hm.headless_layers == [0] and hm.kept_heads(0) == [] and not hm.pruned
    means = run_stats(hm, SEQS, 3, block=5).means()
    assert np.isnan(means["entropy"][0]).all() and np.isfinite(means["entropy"][1:]).all()
    shape = attention_shape(hm.config)
    assert shape.n_layers == 2 and "1 of 3 layers are linear attention" in shape.note
    assert model_record(hm)["layers_without_heads"] == [0]
    with pytest.raises(HeadscopeError, match="layer 0 of the qwen3_5 family is a linear_attention layer"):
        hm.check_slice(0, [0])


def test_gpt_oss_sink_takes_its_share_of_every_row():
    """GPT-OSS's learned sink logit is part of each head's softmax: eager's rows sum to 1 - sink_logit_mass,
    the statistics' sink_logit_mass says how much (well above rounding here, 0 for other families), the kernel's
    blocks equal eager's maps, and without the sink (logit -inf) the attention changes."""
    hm = _MODELS["gpt_oss"]
    ids, mask = padded_ids()
    with torch.no_grad():
        a = hm.model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    sink = run_stats(hm, SEQS, 3, block=5).means()["sink_logit_mass"]
    assert (sink > 0.02).all() and (sink < 0.98).all(), sink
    row = a[1][0].sum(-1)  # [head, query] of the first (unpadded) sequence
    assert (row <= 1 + 1e-6).all() and (1 - row).max() > 0.1, row
    assert (run_stats(_MODELS["llama"], SEQS, 3, block=5).means()["sink_logit_mass"] == 0).all()
    blocks = {}  # the kernel's blocks (the path attention-map consumers take) against eager's maps
    with torch.no_grad(), on_attention_blocks(hm, lambda l, q0, p: blocks.setdefault(l, []).append(p.clone()), 5):
        hm.model(input_ids=ids, attention_mask=mask, use_cache=False)
    for layer in range(hm.n_layers):
        d = _maxdiff(torch.cat(blocks[layer], dim=2) * mask[:, None, :, None], a[layer] * mask[:, None, :, None])
        assert d < TOL, f"gpt_oss layer {layer}: kernel blocks vs eager max abs diff {d:.3g}"
    other = copy.deepcopy(hm)
    with torch.no_grad():
        for block in other.layers:
            block.self_attn.sinks.fill_(-1e9)
        b = other.model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    assert _maxdiff(a[1], b[1]) > 1e-2 and torch.allclose(b[1][0].sum(-1), torch.ones(()), atol=1e-5)


def test_deepseek_v3_heads_live_in_the_latent_projections():
    """MLA: a head's output is v_head_dim wide; pruning one removes its rows of q_b_proj (qk_head_dim each) and
    kv_b_proj (qk_nope_head_dim + v_head_dim each) and leaves the shared latent alone; the KV calculator counts the
    latent (kv_lora_rank + qk_rope_head_dim per token and layer); mla refuses a model that is MLA already."""
    hm = _MODELS["deepseek_v3"]
    c = hm.config
    assert hm.d_head == c.v_head_dim == 6 and hm.group_size == 1
    small = prune_heads(hm, {1: [0, 2]})
    a, b = hm.attention(1), small.attention(1)
    assert b.q_b_proj.out_features == 2 * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    assert b.kv_b_proj.out_features == 2 * (c.qk_nope_head_dim + c.v_head_dim) and b.num_heads == 2
    assert b.o_proj.in_features == 2 * c.v_head_dim
    assert torch.equal(b.kv_a_proj_with_mqa.weight, a.kv_a_proj_with_mqa.weight)
    shape = attention_shape(c)
    assert (shape.layout, shape.latent) == ("MLA", c.kv_lora_rank + c.qk_rope_head_dim)
    rows = layouts(c, 10, 1, "bf16")
    assert [r["layout"] for r in rows] == ["MLA", "MHA"]
    assert rows[0]["bytes_per_token"] == c.num_hidden_layers * 16 * 2
    assert rows[1]["bytes_per_token"] == c.num_hidden_layers * c.num_attention_heads * (8 + 4 + 6) * 2
    with pytest.raises(HeadscopeError, match=r"\(deepseek_v3 family\) already uses multi-head latent attention.*"
                                             r"kv_lora_rank 12 \+ qk_rope_head_dim = 16 numbers"):
        check_mla(hm, 4, None)


def test_gemma4_per_layer_head_dim_is_held_per_layer():
    """The tiny Gemma-4 carries the real config's per-layer head_dim (global_head_dim: 32 in its full-attention
    layer, 16 in its sliding one); the adapter reads each layer's own, as transformers built it, and the KV
    calculator counts each layer at its own width."""
    hm = _MODELS["gemma4_text"]
    assert [hm.attention(l).head_dim for l in range(2)] == [hm.d_head_at(l) for l in range(2)] == [16, 32]
    assert hm.d_head_record == [16, 32] and model_record(hm)["shape"]["d_head"] == [16, 32]
    with pytest.raises(HeadscopeError, match=r"has head_dim per layer \(\[16, 32\]\)"):
        _ = hm.d_head
    shape = attention_shape(hm.config)
    assert shape.d_heads == (16, 32)
    # The same from config.json as the released models write it (global_head_dim beside layer_types).
    released = {**{k: v for k, v in hm.config.to_dict().items() if k != "per_layer_config"}, "global_head_dim": 32}
    assert attention_shape(released).d_heads == (16, 32)


def test_gemma4_per_layer_head_dim_analyses_prunes_and_reloads_on_the_command_line(tmp_path, capsys):
    """analyze, score, roles, report and prune --uniform --save-model run on a Gemma-4 with per-layer head_dim;
    the pruned checkpoint analyses again (load_model), prune's last line says how it loads, `kv` reads it."""
    import json  # only this test reads the verbs' JSON

    path, text = _tiny_dir("gemma4_text", tmp_path, extra_words="cat dog saw bird sang small mary john")  # roles: 24+
    data = ["--data", str(text), "--limit", "3", "--max-length", "10"]
    assert main(["analyze", str(path), *data, "--out", str(tmp_path / "a")]) == 0
    assert main(["score", str(path), *data, "--out", str(tmp_path / "s")]) == 0
    assert main(["roles", str(path), *data, "--out", str(tmp_path / "r")]) == 0
    assert main(["report", str(path), *data, "--from", str(tmp_path / "a"), "--from", str(tmp_path / "s"),
                 "--out", str(tmp_path / "rep")]) == 0
    assert main(["prune", str(path), *data, "--fraction", "0.5", "--uniform", "--save-model",
                 "--out", str(tmp_path / "p")]) == 0
    # the last line before the check's (prune --save-model ends with what compare.csv found)
    last = [line for line in capsys.readouterr().out.strip().splitlines() if not line.startswith("check")][-1]
    saved = tmp_path / "p" / "model"
    cfg = json.loads((saved / "config.json").read_text())
    plain = "headscope_base" not in cfg
    assert ("a plain config" in last) == plain, last
    assert main(["analyze", str(saved), *data, "--out", str(tmp_path / "a2")]) == 0
    assert main(["kv", str(saved), "--out", str(tmp_path / "kv")]) == 0


def test_gemma4_kv_shared_layers_cache_nothing_in_the_calculator():
    """Gemma-4's shared KV layers (the last num_kv_shared_layers) keep no cache of their own: the calculator counts
    the others, each at its own head_dim, and equals the static cache transformers fills."""
    config = tiny_config("gemma4_text", num_kv_shared_layers=1, num_hidden_layers=3,
                         layer_types=["sliding_attention", "full_attention", "full_attention"])
    config._attn_implementation = "eager"
    hf_model = transformers.Gemma4ForCausalLM(config).eval()
    ids = torch.randint(5, 120, (2, 9), generator=torch.Generator().manual_seed(0))
    static = transformers.StaticCache(config=config, max_cache_len=9)
    with torch.no_grad():
        hf_model(input_ids=ids, cache=static, use_cache=True)
    measured = sum(t.numel() * t.element_size() for layer in static.layers
                   for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if torch.is_tensor(t))
    shape = attention_shape(config)
    assert shape.n_layers == 2 and "reuse an earlier layer's keys and values" in shape.note
    assert measured == kv_cache_bytes(config, 9, 2, "fp32")
