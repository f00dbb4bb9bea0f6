"""The tiny test models carry their families' real configuration's peculiarities, so a test that passes on the
tiny model cannot pass because the tiny shape hides what the real one has.

PECULIAR lists, per family, what its released configuration has that a plain LLaMA-like one does not (from the
released configs; the example in the comment), and each check below asserts the tiny config (built from the
family's own config class in the installed transformers) and the model transformers builds from it have it too.
"""

from __future__ import annotations

import pytest

from headscope.models.tiny import TINY_FAMILIES
from tests.families import model

# family -> peculiarities of its released configuration
PECULIAR: dict[str, set[str]] = {
    "qwen3": {"wide_heads", "k_norm"},  # Qwen3-0.6B: 16 heads x 128 = 2048 in a 1024-wide model
    "qwen3_moe": {"wide_heads", "k_norm"},  # Qwen3-30B-A3B: 32 x 128 = 4096 in 2048
    "gemma3_text": {"wide_heads", "k_norm", "mqa", "layer_types"},  # Gemma-3-270M: 4 x 256 = 1024 in 640, 1 KV head
    "gemma2": {"wide_heads", "softcap"},  # Gemma-2-2B: 8 x 256 = 2048 in 2304
    # Gemma-4 text: 256 in sliding layers, 512 in full-attention ones (global_head_dim); KV shared across layers
    # and keys as values are refused (tests/test_family_specifics.py builds them from the config class)
    "gemma4_text": {"wide_heads", "k_norm", "layer_types", "per_layer_head_dim"},
    "qwen3_5_text": {"wide_heads", "k_norm", "layer_types"},  # gated query, linear-attention layers
    "gpt_oss": {"wide_heads", "sinks", "layer_types"},  # GPT-OSS-20B: 64 x 64 = 4096 in 2880, a sink per head
    "olmo2": {"k_norm"},
    "olmo3": {"k_norm", "layer_types"},
    "deepseek_v3": {"mla"},
}


def _wide_heads(hm) -> bool:
    layer = next(l for l in range(hm.n_layers) if hm.has_heads(l))
    return hm.n_heads * hm.d_head_at(layer) != hm.d_model


CHECKS = {
    "wide_heads": _wide_heads,
    "k_norm": lambda hm: any(getattr(hm.attention(l), "k_norm", None) is not None for l in range(hm.n_layers)
                             if hm.has_heads(l)),
    "mqa": lambda hm: hm.n_kv_heads == 1 < hm.n_heads,
    "layer_types": lambda hm: len(set(getattr(hm.config, "layer_types", None) or [])) > 1,
    "softcap": lambda hm: bool(getattr(hm.config, "attn_logit_softcapping", None)),
    "per_layer_head_dim": lambda hm: isinstance(hm.d_head_record, list),
    "sinks": lambda hm: hm.has_sinks,
    "mla": lambda hm: bool(hm.spec.head_row_projs),
}


@pytest.mark.parametrize("family", sorted(PECULIAR))
def test_tiny_config_carries_the_real_peculiarities(family):
    assert family in TINY_FAMILIES
    hm = model(family)
    missing = [p for p in sorted(PECULIAR[family]) if not CHECKS[p](hm)]
    assert not missing, f"{family}: the tiny config lacks {missing} that the released configuration has"


def test_every_peculiarity_is_checked_and_plain_families_lack_them():
    """A check that is true of every tiny model could not fail: each holds for a listed family and fails for
    the plain LLaMA."""
    assert set(CHECKS) == set().union(*PECULIAR.values())
    llama = model("llama")
    assert not [p for p, check in CHECKS.items() if check(llama)], "a check is true of the plain LLaMA"
