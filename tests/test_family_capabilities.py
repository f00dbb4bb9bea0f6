"""What each family supports, read from its spec (headscope.models.capabilities).

SUPPORTED pins the support table as it stood before the capabilities moved into the specs (issue 41, item 4),
per model type: each verb's own check and `why_not` must both give it. Then the table `headscope models` prints
and docs/families.md's copy, the refusals' wording, and a new LLaMA-like family registered for the test's
duration (one spec, one config) that every capability serves, with the same numbers as LLaMA on the same weights.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from headscope import HeadscopeError
from headscope.capacity.gqa import SUPPORTED_MODEL_TYPES as GQA_TYPES
from headscope.capacity.gqa import check_convertible, convert_to_gqa
from headscope.capacity.kvcache import SUPPORTED as KVCACHE_TYPES
from headscope.capacity.kvcache import (
    CachePlan,
    HeadAwareCache,
    check_supported,
    check_supported_config,
    head_aware_attention,
)
from headscope.capacity.mla import SUPPORTED_MODEL_TYPES as MLA_TYPES
from headscope.capacity.mla import check_mla, convert_to_mla, full_rank
from headscope.cli import main
from headscope.export.gguf import MODEL_TYPES as GGUF_TYPES
from headscope.export.gguf import check_source, export_gguf
from headscope.learned.causal.pairs import induction_pairs
from headscope.learned.causal.paths import check_receivers
from headscope.learned.causal.verb import patch
from headscope.learned.verbs import analyze
from headscope.models import HeadModel
from headscope.models.capabilities import CAPABILITIES, capability_table, supported_model_types_for, supports, why_not
from headscope.models.checkpoint import save_model
from headscope.models.specs import LLAMA, register_spec, spec_for, supported_model_types, unregister_spec
from headscope.models.tiny import TINY_FAMILIES, tiny_model
from headscope.redundancy.pruning.heads import check_prunable, prune_heads
from headscope.redundancy.unit_kinds import check_unit

TYPES = tuple(supported_model_types())  # the built-in families (read before the test family registers)
_ALL = frozenset(TYPES)
# capability -> the model types that have it (everything else is refused), as on main before issue 41.
SUPPORTED: dict[str, frozenset[str]] = {
    "heads": _ALL - {"olmo2", "olmo3"},
    "attention": _ALL,
    "block": _ALL - {"gemma4_text"},
    "ffn": _ALL - {"mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3"},
    "gqa": frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma2", "starcoder2", "phi3",
                      "smollm3", "mixtral", "qwen3_moe", "gemma4_text", "gpt_oss"}),
    "mla": frozenset({"llama", "mistral", "qwen2"}),
    "kvcache": frozenset({"llama", "mistral", "qwen2", "qwen3", "starcoder2", "phi3"}),
    "gguf": frozenset({"llama"}),
    "patch": _ALL,
    "paths": _ALL - {"deepseek_v3"},
}


def test_the_specs_give_the_pinned_table():
    for c in CAPABILITIES:
        got = {t for t in TYPES if supports(spec_for(t), c.name, t)}
        assert got == SUPPORTED[c.name], (c.name, sorted(got ^ SUPPORTED[c.name]))
    assert set(SUPPORTED) == {c.name for c in CAPABILITIES}


def _accepts(check) -> bool:
    try:
        check()
    except HeadscopeError:
        return False
    return True


def _gguf_accepts(model_type: str, tmp_path) -> bool:
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "tokenizer.json").write_text("{}")
    return _accepts(lambda: check_source(folder))


def test_kvcache_mla_gqa_and_gguf_accept_the_pinned_model_types(tmp_path):
    """The config-level checks of kvcache, mla, gqa and export (before any weight loads)."""
    seen = {
        "kvcache": {t for t in TYPES if _accepts(lambda t=t: check_supported_config("m", t, 4, 2))},
        "mla": set(MLA_TYPES) & _ALL,
        "gqa": set(GQA_TYPES) & _ALL,
        "gguf": {t for t in TYPES if _gguf_accepts(t, tmp_path)},
    }
    for what, types in seen.items():
        assert types == SUPPORTED[what], (what, sorted(types ^ SUPPORTED[what]))


@pytest.mark.parametrize("model_type", TINY_FAMILIES)
def test_pruning_units_and_path_patching_accept_the_pinned_model_types(model_type):
    """The model-level checks of prune (heads, units) and patch's paths to heads, on each tiny model."""
    hm = tiny_model(model_type)
    seen = {"heads": _accepts(lambda: check_prunable(hm)),
            **{u: _accepts(lambda u=u: check_unit(hm, u)) for u in ("attention", "block", "ffn")},
            "paths": _accepts(lambda: check_receivers(hm, 1))}
    for what, ok in seen.items():
        assert ok == (model_type in SUPPORTED[what]), (model_type, what)


def test_every_model_type_has_a_spec():
    assert all(spec_for(t) for t in TYPES)


# --- the table, and the refusals' wording ----------------------------------------------------------------------

def test_docs_hold_the_capability_table_the_specs_give():
    text = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text(encoding="utf-8")
    start = text.index("<!-- capabilities-table: generated by headscope.models.capabilities.capability_table() -->\n")
    body = text[text.index("\n", start) + 1:text.index("<!-- end capabilities-table -->")]
    assert body == capability_table(), "docs/families.md is stale: paste capability_table() there"


def test_headscope_models_prints_the_capability_table(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert capability_table() in out
    # one row per family, a cell per capability; the declared reasons are listed under it
    assert "| llama | yes | yes | yes | yes | yes | yes | yes | `llama` only | yes | yes |" in out
    assert f"- olmo2, heads: {spec_for('olmo2').refusal('prune')}." in out


# (model type, capability, the library call that meets it on a config with that model type)
REFUSED = [("gpt2", "kvcache", lambda t: check_supported_config("m", t, 4, 2)),
           ("gemma2", "kvcache", lambda t: check_supported_config("m", t, 4, 2)),
           ("qwen3", "mla", None), ("opt", "mla", None), ("gpt2", "gqa", None)]


@pytest.mark.parametrize("model_type, capability, call", REFUSED, ids=[f"{t}-{c}" for t, c, _ in REFUSED])
def test_a_refusal_names_the_family_and_the_specs_reason(model_type, capability, call):
    spec = spec_for(model_type)
    why = why_not(spec, capability, model_type)
    assert why
    if call is None:
        hm = tiny_model(model_type)
        call = {"mla": lambda t: check_mla(hm, 1, None), "gqa": lambda t: check_convertible(hm, 1)}[capability]
    with pytest.raises(HeadscopeError) as err:
        call(model_type)
    assert why in str(err.value) and spec.family in str(err.value) and "--" not in str(err.value)


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "gpt2"])
def test_gguf_export_refuses_with_the_family_and_reason_before_loading(model_type, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(HeadscopeError) as err:
        check_source(folder)
    spec = spec_for(model_type)
    assert spec.family in str(err.value) and why_not(spec, "gguf", model_type) in str(err.value)


def test_the_verbs_lists_are_read_from_the_specs():
    assert MLA_TYPES == supported_model_types_for("mla") and GQA_TYPES == supported_model_types_for("gqa")
    assert KVCACHE_TYPES == supported_model_types_for("kvcache") and GGUF_TYPES == supported_model_types_for("gguf")


# --- a new LLaMA-like family: one spec, one config ---------------------------------------------------------------

TOY = "toyllama"


class ToyConfig(transformers.LlamaConfig):
    model_type = TOY


class ToyModel(transformers.LlamaModel):
    config_class = ToyConfig


class ToyForCausalLM(transformers.LlamaForCausalLM):
    config_class = ToyConfig


# The whole family: LLaMA's layout under its own name and model type.
TOY_SPEC = replace(LLAMA, family="toy", model_types=(TOY,), examples="a test's own family", notes="")


@pytest.fixture(scope="module")
def toy():
    """The family registered with transformers and headscope for this module, and (llama, toy) tiny models holding
    the same weights; everything is unregistered after."""
    transformers.AutoConfig.register(TOY, ToyConfig)
    transformers.AutoModel.register(ToyConfig, ToyModel)
    transformers.AutoModelForCausalLM.register(ToyConfig, ToyForCausalLM)
    register_spec(TOY_SPEC)
    try:
        llama = tiny_model("llama", init_std=0.2, vocab_size=300, max_position_embeddings=128)
        kw = {k: v for k, v in llama.config.to_dict().items() if k not in ("model_type", "architectures")}
        config = ToyConfig(**kw)
        config._attn_implementation = "eager"
        model = ToyForCausalLM(config).eval()
        model.load_state_dict(llama.model.state_dict())
        yield llama, HeadModel(model=model, tokenizer=None, name="tiny-toy", source="config")
    finally:
        unregister_spec(TOY_SPEC)
        from transformers.models.auto import modeling_auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        CONFIG_MAPPING._extra_content.pop(TOY, None)
        for mapping in (modeling_auto.MODEL_MAPPING, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING):
            mapping._extra_content.pop(ToyConfig, None)


IDS = torch.randint(3, 300, (2, 14), generator=torch.Generator().manual_seed(0))


def _logits(hm) -> torch.Tensor:
    with torch.no_grad():
        return hm.model(input_ids=IDS, use_cache=False).logits


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.allclose(a, b, atol=1e-5, rtol=0), f"max abs difference {(a - b).abs().max().item():.2e}"


def test_a_new_llama_like_family_gets_every_capability(toy):
    _, hm = toy
    assert hm.spec is TOY_SPEC and hm.config.model_type == TOY
    assert {c.name: why_not(TOY_SPEC, c.name, TOY) for c in CAPABILITIES} == {c.name: None for c in CAPABILITIES}


def test_the_new_family_analyses_prunes_and_converts_as_llama(toy):
    llama, hm = toy
    _same(_logits(hm), _logits(llama))
    ours, theirs = (analyze(m, IDS.tolist(), bootstrap=100).to_pandas() for m in (hm, llama))
    assert list(ours.columns) == list(theirs.columns) and "entropy" in ours.columns
    np.testing.assert_allclose(ours.to_numpy(float), theirs.to_numpy(float), atol=1e-5, equal_nan=True)
    drop = {0: [0, 3], 1: [1, 4]}  # one query head of each KV group: a slice
    _same(_logits(prune_heads(hm, drop)), _logits(prune_heads(llama, drop)))
    check_unit(hm, "ffn")
    _same(_logits(convert_to_gqa(hm, 1)), _logits(convert_to_gqa(llama, 1)))
    rank = full_rank(hm, 4) // 2
    _same(_logits(convert_to_mla(hm, rank, 4, selection="high")),
          _logits(convert_to_mla(llama, rank, 4, selection="high")))


def test_the_new_family_runs_the_head_aware_cache_as_llama(toy):
    llama, hm = toy
    plan = CachePlan(((0,), (1,)), hm.n_kv_heads, hm.group_size, 2, 4)
    got = []
    for m in (hm, llama):
        check_supported(m)
        with head_aware_attention(m), torch.no_grad():
            cache = HeadAwareCache(plan)
            out = [m.model(input_ids=IDS[:, :6], cache=cache, use_cache=True).logits]
            out += [m.model(input_ids=IDS[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(6, 14)]
        got.append(torch.cat(out, 1))
    _same(*got)
    assert not torch.allclose(got[0], _logits(hm), atol=1e-3)  # the windowed heads changed something


def test_the_new_family_patches_as_llama(toy):
    llama, hm = toy
    pairs = induction_pairs(None, hm.vocab_size, n=4, length=6, seed=1)
    a, b = (patch(m, pairs, methods=("exact",), bootstrap=100, paths="L1H0") for m in (hm, llama))
    ours, theirs = a.to_pandas(), b.to_pandas()
    assert list(ours.columns) == list(theirs.columns) and "effect" in ours.columns
    np.testing.assert_allclose(ours.to_numpy(float), theirs.to_numpy(float), atol=1e-5)
    assert len(a.paths) == len(b.paths)
    assert {p["via"] for p in a.paths if p["receiver"] == "L1H0"} >= {"q", "k", "v"}  # into L1H0's Q/K/V
    for x, y in zip(a.paths, b.paths, strict=True):
        assert x.keys() == y.keys()
        np.testing.assert_allclose([float(v) for k, v in x.items() if isinstance(v, float)],
                                   [float(v) for k, v in y.items() if isinstance(v, float)], atol=1e-5)


def _bpe_tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat saw a dog and the small bird sang"] * 20, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")


def test_the_new_family_exports_the_gguf_file_llama_gets(toy, tmp_path):
    """The spec maps the family to llama.cpp's `llama` graph (gguf_arch, inherited from LLAMA): the file holds the
    same tensors and metadata as the same weights exported as llama (tests/test_export_gguf.py runs llama's in
    llama.cpp)."""
    import gguf

    readers = []
    for name, m in (("toy", toy[1]), ("llama", toy[0])):
        m.tokenizer = _bpe_tokenizer()
        src = save_model(m, tmp_path / name / "model")
        info = export_gguf(src, tmp_path / f"{name}.gguf", dtype="f32")
        assert info["arch"] == "llama"
        readers.append(gguf.GGUFReader(tmp_path / f"{name}.gguf"))
    ours, theirs = readers
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    fields, other = ({k: b"".join(v.parts[i].tobytes() for i in v.data) for k, v in r.fields.items()}
                     for r in readers)
    differ = {k for k in fields.keys() | other.keys() if fields.get(k) != other.get(k)}
    assert differ == {"general.description"}, differ  # it names the source folder
