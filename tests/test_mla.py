"""MHA/GQA -> MLA conversion: exact at full rank, the frequency criterion, the cache, reload, the verb, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import PreTrainedTokenizerFast

from headscope.capacity import mla
from headscope.capacity.convert.evaluate import CACHE_FORMULAS, KV_HEADS_FORMULA, cache_bytes, kv_report
from headscope.capacity.mla.checkpoint import load_mla, save_mla
from headscope.capacity.mla.to_latent import convert_and_evaluate
from headscope.capacity.options import MlaOptions
from headscope.errors import HeadscopeError
from headscope.models.adapter import HeadModel
from headscope.models.tiny import tiny_model

IDS = torch.randint(5, 120, (3, 14), generator=torch.Generator().manual_seed(3))
CALIB = [list(range(5, 40)), list(range(60, 90)), list(range(30, 70)), list(range(90, 119))]


def tiny(family: str = "llama", **overrides) -> HeadModel:
    """Tiny LLaMA-like model (6 query heads, 2 KV heads, d_head 8); biases of qwen2 made non-zero so they count."""
    hm = tiny_model(family, init_std=0.2, **overrides)
    with torch.no_grad():
        for p in hm.model.parameters():
            if p.ndim == 1 and p.abs().sum() == 0:
                p.normal_(0, 0.2)
    return hm


def logits(hm: HeadModel, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return hm.model(ids).logits


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> None:
    diff = (a - b).abs().max().item()
    assert diff <= tol, f"max abs difference {diff:.3g} > {tol}"


# --- exactness --------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,kv_heads", [("llama", 2), ("llama", 6), ("qwen2", 2), ("mistral", 1)])
def test_full_rank_and_every_frequency_is_exact(family, kv_heads):
    """All RoPE frequencies kept + the full rank of [W_k_nope; W_v] => the original logits (GQA, MHA with
    rank capped by d_model, biases, MQA)."""
    hm = tiny(family, num_key_value_heads=kv_heads)
    d = hm.d_head
    top = mla.full_rank(hm, d)
    assert top == min(hm.d_model, kv_heads * d)
    conv = mla.convert_to_mla(hm, top, d, data=CALIB, allow_full_rank=True)
    close(logits(conv), logits(hm), 1e-5)
    assert all(type(conv.attention(l)).__name__ == "MLAAttention" for l in range(hm.n_layers))
    assert type(hm.attention(0)).__name__ != "MLAAttention"  # the input model is untouched


def test_partial_rope_at_full_rank_equals_a_hand_built_partial_rope_model():
    """With some frequencies dropped and the full rank, the MLA model equals the original model whose
    dropped dimensions are simply not rotated (computed here by hand with PyTorch's attention)."""
    hm = tiny("llama")
    d, g, h = hm.d_head, hm.n_kv_heads, hm.n_heads
    conv = mla.convert_to_mla(hm, mla.full_rank(hm, 4), 4, data=CALIB, allow_full_rank=True)
    freqs = conv.config.headscope_mla["frequencies"]
    layer = 0
    x = torch.randn(2, 9, hm.d_model, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9)[None].expand(2, 9)
    cos, sin = hm.model.model.rotary_emb(x, pos)
    w = hm.qkv_weights(layer)
    q = (x @ w.q.T).view(2, 9, h, d).transpose(1, 2)
    k = (x @ w.k.T).view(2, 9, g, d).transpose(1, 2)
    v = (x @ w.v.T).view(2, 9, g, d).transpose(1, 2)
    def rot(t):
        return t * cos[:, None] + torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1) * sin[:, None]
    keep = torch.zeros(g, d, dtype=torch.bool)
    for kv, f in enumerate(freqs[str(layer)]):
        keep[kv, f] = keep[kv, [i + d // 2 for i in f]] = True
    k = torch.where(keep[None, :, None], rot(k), k)
    q = torch.where(keep.repeat_interleave(h // g, 0)[None, :, None], rot(q), q)
    want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(h // g, 1),
                                                            v.repeat_interleave(h // g, 1), is_causal=True)
    want = want.transpose(1, 2).reshape(2, 9, -1) @ hm.out_weight(layer).T
    with torch.no_grad():
        got, _ = conv.attention(layer)(x, position_embeddings=(cos, sin),
                                       attention_mask=torch.full((9, 9), float("-inf")).triu(1)[None, None])
    close(got, want, 1e-5)


def test_lower_rank_loses_and_error_falls_with_rank():
    hm = tiny("llama")
    ref = logits(hm)
    errs = [(logits(mla.convert_to_mla(hm, r, 8, selection="high")) - ref).abs().max().item() for r in (2, 8, 15)]
    assert errs[0] > errs[1] > errs[2] > 1e-4, errs


# --- frequency selection ----------------------------------------------------------------------------
def test_two_norm_scores_match_a_direct_computation():
    """Scores = sum over a KV head's query heads of mean ||q_f|| times mean ||k_f|| over real tokens."""
    hm = tiny("llama")
    ids = [CALIB[0], CALIB[1]]
    got = mla.norm_scores(hm, ids, batch_size=2)
    d, g, h = hm.d_head, hm.n_kv_heads, hm.n_heads
    xs = []
    hook = hm.attention(1).register_forward_pre_hook(lambda m, a, kw: xs.append(kw["hidden_states"]), with_kwargs=True)
    with torch.no_grad():
        for seq in ids:  # one passage at a time: no padding anywhere
            hm.model(torch.tensor([seq]))
    hook.remove()
    x = torch.cat([t[0] for t in xs])  # [tokens, d_model]
    w = hm.qkv_weights(1)
    q, k = (x @ w.q.T).view(-1, h, d), (x @ w.k.T).view(-1, g, d)
    def pair(t):  # [heads, d/2]
        return (t[..., :d // 2] ** 2 + t[..., d // 2:] ** 2).sqrt().mean(0)
    qn, kn = pair(q), pair(k)
    want = torch.stack([(qn[j * 3:(j + 1) * 3] * kn[j]).sum(0) for j in range(g)])
    close(got[1].float(), want, 1e-4)
    sel = mla.select_frequencies(hm, 4, "2-norm", ids, batch_size=2)
    assert sel["1"] == [sorted(torch.topk(want[j], 2).indices.tolist()) for j in range(g)]
    assert mla.select_frequencies(hm, 4, "high")["0"] == [[0, 1], [0, 1]]


# --- cache and generation ---------------------------------------------------------------------------
def test_cache_holds_latent_and_rope_keys_and_bytes_equal_the_formula():
    hm = tiny("llama")
    conv = mla.convert_to_mla(hm, 5, 4, data=CALIB)
    with torch.no_grad():
        out = conv.model.generate(IDS[:2], attention_mask=torch.ones_like(IDS[:2]), max_new_tokens=3,
                                  min_new_tokens=3, do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    cache = out.past_key_values
    seq = IDS.shape[1] + 3 - 1  # the last generated token is not fed back
    assert tuple(cache.layers[0].keys.shape) == (2, 2, seq, 4)  # [batch, kv heads, pos, rope dims]
    assert tuple(cache.layers[0].values.shape) == (2, 1, seq, 5)  # [batch, 1, pos, kv_rank]
    per_token = mla.mla_kv_bytes_per_token(conv.config.headscope_mla, hm.n_layers)
    assert per_token == 2 * (5 + 2 * 4) * 4
    assert cache_bytes(cache) == per_token * seq * 2
    # cached decoding equals a full forward over the generated sequence
    with torch.no_grad():
        full = conv.model(out.sequences).logits[:, IDS.shape[1] - 1:-1].argmax(-1)
    assert torch.equal(full, out.sequences[:, IDS.shape[1]:])


def test_one_kv_report_for_gqa_and_mla():
    """convert.evaluate.kv_report finds the MLA formula MLA registered; gqa.json's keys stay without per_token."""
    hm = tiny("llama")
    conv = mla.convert_to_mla(hm, 5, 4, data=CALIB)
    before, after = kv_report(hm, per_token=True), kv_report(conv, per_token=True)
    assert (
        before["formula"] == KV_HEADS_FORMULA and before["bytes_per_token"] == 2 * 2 * 2 * 8 * 4
    )  # K,V x layers x kv x d
    assert after["formula"] == CACHE_FORMULAS.get(mla.MLA_CONFIG_KEY).help
    assert after["bytes_per_token"] == mla.mla_kv_bytes_per_token(conv.config.headscope_mla, hm.n_layers)
    assert before["match"] and after["match"], (before, after)
    assert after["calculated"] == after["bytes_per_token"] * after["seq_len"] * after["batch"]
    plain = kv_report(conv)
    assert list(plain) == ["measured", "calculated", "seq_len", "batch", "dtype", "match"] and plain["match"]


# --- save / reload ----------------------------------------------------------------------------------
def test_reload_three_ways(tmp_path):
    hm = tiny("qwen2")
    conv = mla.convert_to_mla(hm, 7, 4, data=CALIB)
    path = save_mla(conv, tmp_path / "m")
    assert (path / "headscope_mla.json").exists() and (path / "modeling_headscope_mla.py").exists()
    back = load_mla(path)
    want = conv.model.state_dict()
    assert all(torch.equal(t, want[k]) for k, t in back.model.state_dict().items())  # every weight, bit for bit
    close(logits(back), logits(conv), 1e-5)  # the attention kernel (eager or sdpa) may differ in the last bits
    from headscope import load_model
    close(logits(load_model(str(path))), logits(conv), 1e-5)
    code = ("import sys, torch, transformers as tf; m = tf.AutoModelForCausalLM.from_pretrained(sys.argv[1], "
            "trust_remote_code=True).eval(); ids = torch.load(sys.argv[2]);\n"
            "with torch.no_grad(): torch.save(m(ids).logits, sys.argv[3])")
    torch.save(IDS, tmp_path / "ids.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")],
                   check=True, env=env, capture_output=True)
    close(torch.load(tmp_path / "out.pt"), logits(conv), 1e-5)


# --- the recipe and uptraining ----------------------------------------------------------------------
def test_recipe_reports_and_uptraining_moves_only_attention():
    hm = tiny("llama")
    options = MlaOptions(model="tiny", kv_rank=4, rope_dims=4, steps=3, batch_size=2)
    final, rep = convert_and_evaluate(hm, options, data=CALIB, heldout=CALIB)
    assert rep["kv_bytes_after"]["match"] and rep["kv_bytes_before"]["match"]
    assert rep["kv_bytes_per_token_after"] == 2 * (4 + 2 * 4) * 4
    assert rep["kv_bytes_per_token_before"] == 2 * 2 * 2 * 8 * 4
    assert rep["full_rank"] == 24 and rep["ppl_uptrained"] is not None and len(rep["uptrain"]["losses"]) == 3
    assert rep["kl_uptrained"] < rep["kl_after"]
    assert torch.equal(final.model.model.embed_tokens.weight, hm.model.model.embed_tokens.weight)
    assert not torch.equal(final.attention(0).kv_a_proj.weight,
                           mla.convert_to_mla(hm, 4, 4, data=CALIB).attention(0).kv_a_proj.weight)


# --- bad input --------------------------------------------------------------------------------------
def test_bad_rank_rope_dims_and_family():
    hm = tiny("llama")  # d_model 48, 2 KV heads, d_head 8: full rank with 4 RoPE dims = 2 * (16 - 4) = 24
    with pytest.raises(HeadscopeError, match=r"^kv_rank must be from 1 to 23: the full rank .* is 24"):
        mla.convert_to_mla(hm, 24, 4, data=CALIB)
    with pytest.raises(HeadscopeError, match="full rank"):
        mla.convert_to_mla(hm, 100, 4, data=CALIB)
    with pytest.raises(HeadscopeError, match="^kv_rank must be from 1"):
        mla.convert_to_mla(hm, 0, 4, data=CALIB)
    for dims in (0, 3, 10):
        with pytest.raises(HeadscopeError, match=r"^rope_dims must be an even number from 2 to d_head = 8"):
            mla.convert_to_mla(hm, 4, dims, data=CALIB)
    for family in ("gpt2", "gemma3_text", "qwen3"):
        with pytest.raises(HeadscopeError, match=f"supports model types llama, mistral, qwen2.*{family}"):
            mla.convert_to_mla(tiny_model(family), 2, 2)
    conv = mla.convert_to_mla(hm, 4, 4, data=CALIB)
    with pytest.raises(HeadscopeError, match="already an MLA model"):
        mla.convert_to_mla(conv, 4, 4, data=CALIB)


def _cli_checkpoint(tmp_path, family="llama"):
    """A tiny checkpoint with a word-level tokenizer, and a text file over its words."""
    words = "the of and to a in is was for on that with as by at it from he his".split()
    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", *words])}
    tok = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
    src = tmp_path / "src"
    tiny_model(family, init_std=0.2).model.save_pretrained(src)
    fast.save_pretrained(src)
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(0)
    text.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(12)) + "\n")
    return src, text


def test_cli_end_to_end_and_bad_input_leaves_nothing(tmp_path, capsys):
    from headscope.cli import main  # here: the parser imports every verb

    src, text = _cli_checkpoint(tmp_path)
    out = tmp_path / "out"
    common = ["--data", str(text), "--heldout", str(text), "--out", str(out)]
    capsys.readouterr()  # save_pretrained's progress bar
    for bad, says in ((["--kv-rank", "24", "--rope-dims", "4"], "the full rank"),
                      (["--kv-rank", "4", "--rope-dims", "3"], "--rope-dims must be an even number"),
                      (["--kv-rank", "4", "--rope-dims", "12"], "from 2 to d_head = 8"),
                      (["--kv-rank", "0"], "--kv-rank must be at least 1"),
                      (["--kv-rank", "4", "--device-map", "auto"], "cannot convert a dispatched model")):
        assert main(["mla", str(src), *bad, *common]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
        assert not out.exists()
    gpt2_src, _ = _cli_checkpoint(tmp_path / "g", "gpt2")
    capsys.readouterr()
    assert main(["mla", str(gpt2_src), "--kv-rank", "2", *common]) == 2
    assert "supports model types llama, mistral, qwen2" in capsys.readouterr().err and not out.exists()

    args = ["mla", str(src), "--kv-rank", "6", "--rope-dims", "4", "--steps", "2", *common]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "latent rank 6 (full rank 24)" in printed and printed.count("(equal)") == 2, printed
    rep = json.loads((out / "mla.json").read_text())
    assert rep["kv_rank"] == 6 and rep["rope_dims"] == 4 and rep["ppl_uptrained"] is not None
    assert rep["provenance"]["verb"] == "mla"
    from headscope import artifacts as A  # the file matches its declaration: every key declared, required ones there
    assert all(any(f.matches(k) for f in A.MLA_JSON.fields) for k in rep), set(rep)
    assert {f.name for f in A.MLA_JSON.fields if f.required} <= set(rep)
    assert sorted(p.name for p in out.iterdir()) == sorted(A.outputs("mla", optional=True))  # with the check
    assert rep["kv_bytes_after"]["bytes_per_token"] == 2 * (6 + 2 * 4) * 4
    from headscope import load_model
    assert type(load_model(str(out / "model")).attention(0)).__name__ == "MLAAttention"
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err


# --- real weights -----------------------------------------------------------------------------------
def test_smollm2_exact_at_full_rank_and_cache_bytes(smollm2):
    """SmolLM2 (30 layers, 9 query / 3 KV heads, d_head 64): every frequency + full rank 192 => its own logits;
    MHA2MLA's default (8 RoPE dims per KV head) at rank 48 caches (48 + 3 x 8) / (2 x 3 x 64) of the bytes."""
    ids = smollm2.tokenizer(["The cat sat on the mat because it was tired."], return_tensors="pt").input_ids
    assert mla.full_rank(smollm2, 64) == 192 and mla.full_rank(smollm2, 8) == 360
    exact = mla.convert_to_mla(smollm2, 192, 64, selection="high", allow_full_rank=True)
    close(logits(exact, ids), logits(smollm2, ids), 2e-4)
    small = mla.convert_to_mla(smollm2, 48, 8, data=[ids[0].tolist()])
    with torch.no_grad():
        out = small.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                                   do_sample=False, return_dict_in_generate=True,
                                   pad_token_id=smollm2.tokenizer.eos_token_id)
    seq = ids.shape[1] + 1
    assert cache_bytes(out.past_key_values) == 30 * (48 + 3 * 8) * 4 * seq
