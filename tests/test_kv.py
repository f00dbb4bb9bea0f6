"""The KV-cache calculator against hand-computed figures and against the bytes of real transformers caches."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from headscope.capacity.kv_bytes import (
    CLASSIC_CONFIGS,
    attention_shape,
    classic_rows,
    human_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    layouts,
    load_config,
)
from headscope.capacity.kv_formula import kv_bytes
from headscope.capacity.kvcache.cache import CachePlan
from headscope.capacity.mha import MultiHeadAttention
from headscope.errors import HeadscopeError

KiB, MiB, GiB = 2**10, 2**20, 2**30


def cache_nbytes(cache) -> int:
    """Bytes of every key and value tensor a transformers Cache holds, over all layers."""
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


# --- hand-computed figures: 2 (K,V) * layers * KV heads * d_head * bytes per number -------------------


def test_one_formula_for_configs_the_reference_module_and_the_head_aware_cache():
    """kv_bytes (configs), MultiHeadAttention and CachePlan count the same bytes: all go through kv_formula.kv_bytes."""
    cfg = {"n_layers": 5, "n_heads": 8, "n_kv_heads": 2, "d_head": 16}
    layer = MultiHeadAttention(d_model=128, n_heads=8, n_kv_heads=2, d_head=16)
    plan = CachePlan.all_full(n_layers=5, n_kv_heads=2, group_size=4)
    for dtype, nbytes in (("fp32", 4), ("bf16", 2), ("int8", 1)):
        want = 2 * 5 * 2 * 16 * nbytes
        assert kv_bytes_per_token(cfg, dtype) == 5 * layer.kv_bytes_per_token(dtype) == want
        assert plan.bytes_per_token(16, nbytes) == want == kv_bytes(5 * 2, 16, 8 * nbytes)
        assert plan.bytes_stored(7, 16, nbytes, batch=3) == kv_cache_bytes(cfg, 7, batch=3, dtype=dtype) == 7 * 3 * want
    assert kv_bytes_per_token(cfg, "int4") == 5 * layer.kv_bytes_per_token("int4") == 2 * 5 * 2 * 16 // 2


def test_llama2_7b_bf16_is_512_kib_per_token():
    assert kv_bytes_per_token(CLASSIC_CONFIGS["llama2-7b"], "bf16") == 2 * 32 * 32 * 128 * 2 == 512 * KiB


@pytest.mark.parametrize("key,expected", [
    ("transformer-base", 2 * 6 * 8 * 64 * 2),  # 6 decoder layers, h 8, d_k 64
    ("bert-base", 2 * 12 * 12 * 64 * 2),
    ("gpt3-175b", 2 * 96 * 96 * 128 * 2),  # 4.5 MiB per token
    ("llama2-70b", 2 * 80 * 8 * 128 * 2),  # GQA: 8 KV heads -> 320 KiB
    ("mistral-7b", 2 * 32 * 8 * 128 * 2),
    ("smollm2-135m", 2 * 30 * 3 * 64 * 2),
    ("gemma3-270m", 2 * 18 * 1 * 256 * 2),
])
def test_classic_bytes_per_token_bf16(key, expected):
    assert kv_bytes_per_token(CLASSIC_CONFIGS[key], "bf16") == expected


def test_known_figures_in_binary_units():
    assert human_bytes(kv_bytes_per_token(CLASSIC_CONFIGS["gpt3-175b"])) == "4.50 MiB"
    assert human_bytes(kv_bytes_per_token(CLASSIC_CONFIGS["llama2-70b"])) == "320 KiB"
    # LLaMA-2-7B, 4096 tokens, bf16: 2 GiB per sequence.
    assert kv_cache_bytes(CLASSIC_CONFIGS["llama2-7b"], 4096) == 2 * GiB
    assert human_bytes(1536) == "1.50 KiB" and human_bytes(1000) == "1000 B" and human_bytes(3 * GiB) == "3 GiB"


def test_sliding_window_caps_tokens_per_layer():
    mistral = CLASSIC_CONFIGS["mistral-7b"]  # every layer slides over 4096 tokens
    per_token = 2 * 32 * 8 * 128 * 2
    assert kv_cache_bytes(mistral, 1000) == per_token * 1000
    assert kv_cache_bytes(mistral, 4096) == per_token * 4096
    assert kv_cache_bytes(mistral, 32768, batch=2) == per_token * 4096 * 2
    gemma = CLASSIC_CONFIGS["gemma3-270m"]  # 15 local layers (window 512), 3 global ones
    per_layer_token = 2 * 1 * 256 * 2
    assert attention_shape(gemma).n_sliding_layers == 15
    assert kv_cache_bytes(gemma, 2000) == per_layer_token * (15 * 512 + 3 * 2000)
    assert kv_cache_bytes(gemma, 100) == per_layer_token * 18 * 100


def test_dtypes_scale_the_figure():
    cfg = CLASSIC_CONFIGS["llama2-7b"]
    bf16 = kv_bytes_per_token(cfg, "bf16")
    assert kv_bytes_per_token(cfg, "fp32") == 2 * bf16
    assert kv_bytes_per_token(cfg, "fp16") == bf16
    assert kv_bytes_per_token(cfg, "fp8") == kv_bytes_per_token(cfg, "int8") == bf16 // 2
    assert kv_bytes_per_token(cfg, "int4") == bf16 // 4
    assert kv_bytes_per_token(cfg, torch.float32) == kv_bytes_per_token(cfg, "float32") == 2 * bf16
    assert kv_bytes_per_token(cfg, torch.bfloat16) == bf16


def test_layouts_compare_mha_model_and_mqa_at_same_d_head():
    rows = layouts(CLASSIC_CONFIGS["llama2-70b"], seq_len=4096, batch=8, dtype="bf16")
    assert [(r["layout"], r["n_kv_heads"], r["is_model"]) for r in rows] == [
        ("MHA", 64, False), ("GQA", 8, True), ("MQA", 1, False)]
    assert [r["bytes_per_token"] for r in rows] == [2 * 80 * g * 128 * 2 for g in (64, 8, 1)]
    assert [r["cache_bytes"] for r in rows] == [2 * 80 * g * 128 * 2 * 4096 * 8 for g in (64, 8, 1)]
    assert rows[1]["vs_mha"] == 8 / 64 and rows[1]["group_size"] == 8
    extra = layouts(CLASSIC_CONFIGS["llama2-70b"], kv_heads=[16, 2])
    assert [r["n_kv_heads"] for r in extra] == [64, 16, 8, 2, 1]
    mha_model = layouts(CLASSIC_CONFIGS["llama2-7b"])  # the model is MHA itself: two rows, MHA marked as the model's
    assert [(r["layout"], r["is_model"]) for r in mha_model] == [("MHA", True), ("MQA", False)]
    assert len(classic_rows()) == len(CLASSIC_CONFIGS) and all(r["is_model"] for r in classic_rows())


def test_reference_module_agrees_with_calculator():
    m = MultiHeadAttention(576, 9, 3, d_head=64)
    cfg = {"n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "d_head": 64}  # headscope's own names
    assert 30 * m.kv_bytes_per_token("bf16") == kv_bytes_per_token(cfg, "bf16") == kv_bytes_per_token(
        CLASSIC_CONFIGS["smollm2-135m"], "bf16")


# --- real caches of tiny models of each family, built from transformers configs ---------------------


def _tiny_configs():
    import transformers as tf

    small = dict(vocab_size=60, intermediate_size=64, max_position_embeddings=64)
    return {
        "gpt2": tf.GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                              eos_token_id=0),
        "llama-gqa": tf.LlamaConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                    **small),
        "llama-head_dim": tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=1, head_dim=24, **small),
        "mistral-window": tf.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, sliding_window=5, **small),
        "qwen2-window": tf.Qwen2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                       num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                                       max_window_layers=1, **small),
        "gemma3-local-global": tf.Gemma3TextConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                                   num_key_value_heads=1, head_dim=16, sliding_window=4,
                                                   sliding_window_pattern=2, **small),
    }


@pytest.mark.parametrize("family", list(_tiny_configs()))
def test_calculator_equals_real_static_cache_of_tiny_models(family, tmp_path):
    """StaticCache allocates exactly what the model needs for max_cache_len tokens, windows included."""
    import transformers as tf

    config = _tiny_configs()[family]
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, 60, (2, 9))
    cache = tf.StaticCache(config=config, max_cache_len=9)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    measured = cache_nbytes(cache)
    # The same config three ways: the object, its config.json, and the model directory.
    config.save_pretrained(tmp_path)
    for source in (config, tmp_path / "config.json", tmp_path, load_config(tmp_path)):
        assert kv_cache_bytes(source, seq_len=9, batch=2, dtype="fp32") == measured, f"{family} from {type(source)}"


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa", "mistral-window"])
def test_dynamic_cache_in_bf16(family):
    """A bf16 model's DynamicCache; a sliding layer keeps window - 1 tokens between steps (documented)."""
    import transformers as tf

    config = _tiny_configs()[family]
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    ids = torch.randint(3, 60, (3, 8))
    with torch.no_grad():
        cache = model(ids, use_cache=True).cache
    shape = attention_shape(config)
    held_between_steps = sum(1 for w in shape.windows if w is not None and 8 >= w)  # one token less per full window
    per_layer_token = 2 * shape.n_kv_heads * shape.d_head * 2 * 3  # bf16, batch 3
    assert cache_nbytes(cache) == kv_cache_bytes(config, 8, 3, "bf16") - held_between_steps * per_layer_token


def test_gemma3_multimodal_wrapper_reads_text_config():
    import transformers as tf

    text = dict(_tiny_configs()["gemma3-local-global"].to_dict())
    wrapped = tf.Gemma3Config(text_config=text).to_dict()
    assert attention_shape(wrapped).windows == attention_shape(text).windows == (4, None, 4, None)
    pattern_only = {k: v for k, v in text.items() if k != "layer_types"}  # old configs: sliding_window_pattern
    assert attention_shape(pattern_only).windows == (4, None, 4, None)


def test_bert_config_reads_as_mha_encoder():
    import transformers as tf

    s = attention_shape(tf.BertConfig(hidden_size=96, num_hidden_layers=3, num_attention_heads=6))
    assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_head, s.layout) == (3, 6, 6, 16, "MHA")
    assert "encoder" in s.note


# --- the real SmolLM2 cache ------------------------------------------------------------------------


def test_calculator_equals_real_smollm2_cache_during_generation(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    ids = tok(["The cat sat on the mat because"], return_tensors="pt").input_ids
    new = 4
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                             return_dict_in_generate=True, pad_token_id=tok.eos_token_id)
    cached_tokens = ids.shape[1] + new - 1  # the last generated token is never fed back
    measured = cache_nbytes(out.cache)
    assert all(layer.keys.dtype == torch.float32 for layer in out.cache.layers)
    assert measured == kv_cache_bytes(model.config, cached_tokens, 1, "fp32"), (
        f"measured {measured} B, calculator {kv_cache_bytes(model.config, cached_tokens, 1, 'fp32')} B")
    # The calculator's bf16 figure is the same cache at 2 bytes a number, and the built-in name reads the same config.
    assert measured // 2 == kv_cache_bytes("smollm2", cached_tokens, 1, "bf16")
    assert kv_bytes_per_token("smollm2", "fp32") == measured // cached_tokens == 2 * 30 * 3 * 64 * 4


def test_smollm2_batched_forward_cache(smollm2):
    from transformers import DynamicCache

    ids = torch.randint(10, 1000, (2, 6))
    cache = DynamicCache(config=smollm2.model.config)
    with torch.no_grad():
        smollm2.model(ids, cache=cache, use_cache=True)
    assert cache_nbytes(cache) == kv_cache_bytes(smollm2.model.config, 6, batch=2, dtype="fp32")


# --- bad input -------------------------------------------------------------------------------------


def test_unknown_dtype_says_what_works():
    with pytest.raises(HeadscopeError, match=r"unknown cache dtype 'fp33' \(did you mean 'fp32'\?\).*fp32, fp16, bf16"):
        kv_bytes_per_token(CLASSIC_CONFIGS["llama2-7b"], "fp33")


def test_config_without_head_counts():
    with pytest.raises(
        HeadscopeError,
        match=r"no attention head count.*num_attention_heads.*Keys found: hidden_size, num_hidden_layers",
    ):
        kv_bytes_per_token({"num_hidden_layers": 4, "hidden_size": 64})
    with pytest.raises(HeadscopeError, match="no layer count"):
        kv_bytes_per_token({"num_attention_heads": 4})
    with pytest.raises(HeadscopeError, match="neither head_dim nor a hidden size"):
        kv_bytes_per_token({"num_hidden_layers": 4, "num_attention_heads": 4})
    with pytest.raises(HeadscopeError, match="multi-head latent attention"):
        kv_bytes_per_token({"num_hidden_layers": 4, "num_attention_heads": 4, "kv_lora_rank": 512})


def test_missing_or_bad_files(tmp_path):
    with pytest.raises(HeadscopeError, match=r"no such model or config .*config.json.*minilm, smollm2.*llama2-7b"):
        kv_bytes_per_token(tmp_path / "nope.json")
    with pytest.raises(HeadscopeError, match="has no config.json"):
        kv_bytes_per_token(tmp_path)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(HeadscopeError, match="is not a JSON config"):
        kv_bytes_per_token(bad)
    with pytest.raises(HeadscopeError, match=r"do not divide n_heads=32; choose from \[1, 2, 4, 8, 16, 32\]"):
        layouts(CLASSIC_CONFIGS["llama2-7b"], kv_heads=[3])
    with pytest.raises(HeadscopeError, match="seq_len must be >= 0"):
        kv_cache_bytes(CLASSIC_CONFIGS["llama2-7b"], -1)


# --- CLI -------------------------------------------------------------------------------------------


def test_cli_writes_csv_matching_the_calculator(tmp_path, capsys):
    from headscope.cli import main

    config = {"_name": "toy", "model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2, "hidden_size": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "out"
    assert main(["kv", str(path), "--max-length", "100", "--batch-size", "3", "--cache-dtype", "fp16", "--classic",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "GQA *" in printed and "binary" in printed and "LLaMA-2-70B" in printed
    rows = list(csv.DictReader((out / "kv.csv").read_text().splitlines()))
    model_rows = [r for r in rows if r["source"] == "model"]
    assert [int(r["n_kv_heads"]) for r in model_rows] == [8, 2, 1]
    for r in model_rows:
        expected = 2 * 4 * int(r["n_kv_heads"]) * 16 * 2 * 100 * 3
        assert int(r["cache_bytes"]) == expected
    assert len([r for r in rows if r["source"] == "classic"]) == len(CLASSIC_CONFIGS)
    # refuses to overwrite without --force
    assert main(["kv", str(path), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["kv", "llama2-7b", "--dtype", "fp33"]) == 2
    assert "fp32" in capsys.readouterr().err


# --- built-in names read only the config, and agree with the loaded models' adapters ----------------


def test_builtin_names_agree_with_loaded_models(minilm, smollm2):
    for hm, name in ((minilm, "minilm"), (smollm2, "smollm2")):
        s = attention_shape(name)
        assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_head) == (hm.n_layers, hm.n_heads, hm.n_kv_heads, hm.d_head)
    assert attention_shape("minilm").layout == "MHA" and attention_shape("smollm2").layout == "GQA"


def test_smollm2_config_from_gguf_header_when_no_float_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path))  # no float copy there: falls back to the GGUF metadata
    s = attention_shape("smollm2")
    assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_head, s.windows) == (30, 9, 3, 64, (None,) * 30)
    assert not any(tmp_path.iterdir())  # nothing converted or written
