"""What each family supports, asked of the verbs themselves: the support table as it stood before the
capabilities moved into the specs (issue 41, item 4), pinned per model type.

Each row of SUPPORTED is what the verb's own check accepts today; a model type missing from a row is refused.
"""

from __future__ import annotations

import json

import pytest

from headscope import HeadscopeError
from headscope.capacity.gqa import SUPPORTED_MODEL_TYPES as GQA_TYPES
from headscope.capacity.kvcache import check_supported_config
from headscope.capacity.mla import SUPPORTED_MODEL_TYPES as MLA_TYPES
from headscope.export.gguf import check_source
from headscope.learned.causal.paths import check_receivers
from headscope.models.specs import spec_for, supported_model_types
from headscope.models.tiny import TINY_FAMILIES, tiny_model
from headscope.redundancy.pruning.heads import check_prunable
from headscope.redundancy.unit_kinds import check_unit

TYPES = tuple(supported_model_types())
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
            "paths": _accepts(lambda: check_receivers(hm, 1)), "patch": True}
    for what, ok in seen.items():
        assert ok == (model_type in SUPPORTED[what]), (model_type, what)


def test_every_model_type_has_a_spec():
    assert all(spec_for(t) for t in TYPES)
