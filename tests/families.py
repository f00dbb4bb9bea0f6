"""The one list of model families that every family test runs on: a family added here is tested everywhere.

Each family's tiny config lives in `headscope.models.tiny` (2 layers, float32, eager, fixed seed);
`FAMILIES` below is that list, and `BY_HAND` reads each family's Q/K/V weights straight from its own
modules (attribute names written out, never through headscope's spec), so the adapter's layout is
checked against something it did not compute. `test_families.py` checks that every supported
model type has an entry in both.
"""

from __future__ import annotations

from typing import Callable

import torch
from hypothesis import strategies as st

from headscope.models import HeadModel
from headscope.models.tiny import TINY_FAMILIES, tiny_model

FAMILIES: tuple[str, ...] = TINY_FAMILIES
# Families whose config stores num_key_value_heads: GQA conversion and KV-head expansion apply.
KV_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma2", "starcoder2", "phi3", "smollm3",
               "mixtral", "qwen3_moe", "gemma4_text", "gpt_oss")
DECODERS = tuple(f for f in FAMILIES if f not in ("bert", "roberta", "electra", "modernbert"))
# Families whose heads can be pruned one by one (the others' specs refuse it, with the reason).
PRUNABLE = tuple(f for f in FAMILIES if not tiny_model(f).spec.refusal("prune"))

# Overrides that make a family's options matter on the test sequences (23 tokens): windows shorter
# than the sequence. The other sliding families (gemma3_text, gemma2, starcoder2) have them already.
OVERRIDES: dict[str, dict] = {"mistral": {"sliding_window": 5}}

Weights = tuple[list[torch.Tensor], list[torch.Tensor | None]]


def model(family: str, seed: int = 0) -> HeadModel:
    """The family's tiny model with attention patterns far from uniform (init std 0.2)."""
    return tiny_model(family, seed=seed, init_std=0.2, **OVERRIDES.get(family, {}))


def _separate(q, k, v) -> Weights:
    mods = [q, k, v]
    return [m.weight for m in mods], [m.bias for m in mods]


def _bert(block, hm) -> Weights:
    s = block.attention.self
    return _separate(s.query, s.key, s.value)


def _gpt2(block, hm) -> Weights:
    w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: [d_model, 3 * d_model]
    d = hm.d_model
    return [w[:, i * d:(i + 1) * d].T for i in range(3)], [b[i * d:(i + 1) * d] for i in range(3)]


def _llama(block, hm) -> Weights:
    a = block.self_attn
    return _separate(a.q_proj, a.k_proj, a.v_proj)


def _phi3(block, hm) -> Weights:
    w = block.self_attn.qkv_proj.weight  # [q rows; k rows; v rows], k and v n_kv_heads wide
    nq, nkv = hm.n_heads * hm.d_head, hm.n_kv_heads * hm.d_head
    return [w[:nq], w[nq:nq + nkv], w[nq + nkv:]], [None, None, None]


def _gpt_neox(block, hm) -> Weights:
    lin = block.attention.query_key_value  # rows: head 0 q, k, v, head 1 q, k, v, ...
    d, h = hm.d_head, hm.n_heads
    w = [torch.cat([lin.weight[(3 * i + part) * d:(3 * i + part + 1) * d] for i in range(h)]) for part in range(3)]
    b = [torch.cat([lin.bias[(3 * i + part) * d:(3 * i + part + 1) * d] for i in range(h)]) for part in range(3)]
    return w, b


def _modernbert(block, hm) -> Weights:
    lin = block.attn.Wqkv  # rows [q; k; v], each d_model wide
    d = hm.d_model
    return [lin.weight[i * d:(i + 1) * d] for i in range(3)], [lin.bias[i * d:(i + 1) * d] for i in range(3)]


def _qwen3_5(block, hm) -> Weights:
    a = block.self_attn
    d = hm.d_head
    q = a.q_proj.weight.view(hm.n_heads, 2 * d, -1)[:, :d].reshape(hm.n_heads * d, -1)  # per head [query; gate]
    return [q, a.k_proj.weight, a.v_proj.weight], [None, None, None]


def _opt(block, hm) -> Weights:
    a = block.self_attn
    return _separate(a.q_proj, a.k_proj, a.v_proj)


BY_HAND: dict[str, Callable[[torch.nn.Module, HeadModel], Weights] | None] = {
    "bert": _bert, "roberta": _bert, "electra": _bert, "gpt2": _gpt2,
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "gemma3_text": _llama, "gemma2": _llama,
    "starcoder2": _llama, "phi3": _phi3, "gpt_neox": _gpt_neox, "opt": _opt, "smollm3": _llama,
    "mixtral": _llama, "qwen3_moe": _llama,
    "olmo2": _llama, "olmo3": _llama, "gemma4_text": _llama,
    "modernbert": _modernbert, "qwen3_5_text": _qwen3_5, "gpt_oss": _llama,
    "deepseek_v3": None,  # multi-head latent attention: no per-head Linear Q/K/V (its spec refuses "qkv")
}
# Families whose Q/K/V weights are per-head Linear maps (qkv_weights, permuting heads).
QKV_FAMILIES = tuple(f for f in FAMILIES if BY_HAND[f] is not None)


def prunable_heads(hm: HeadModel, draw: Callable) -> list[tuple[int, int]]:
    """A prunable set of heads drawn with hypothesis' `draw`: per layer, whole KV groups, or the same
    number of query heads from every group (any subset when every head has its own K/V)."""
    g, n_kv = hm.group_size, hm.n_kv_heads
    heads = []
    for layer in range(hm.n_layers):
        if not hm.has_heads(layer):
            continue
        if draw(st.booleans(), label=f"whole groups in layer {layer}"):
            groups = draw(st.lists(st.integers(0, n_kv - 1), unique=True), label="groups")
            heads += [(layer, k * g + i) for k in groups for i in range(g)]
        else:
            n = draw(st.integers(0, g), label="per group")
            for k in range(n_kv):
                picked = draw(st.lists(st.integers(0, g - 1), min_size=n, max_size=n, unique=True))
                heads += [(layer, k * g + i) for i in picked]
    return heads


def head_layers(hm: HeadModel) -> list[int]:
    """The layers with softmax heads (all but Qwen3.5's linear-attention layers)."""
    return [layer for layer in range(hm.n_layers) if hm.has_heads(layer)]


def padded_ids() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [3, 12] and a right-padded mask (rows of 12, 9 and 5 tokens): the tests' usual batch."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return ids, mask
