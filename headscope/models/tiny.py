"""Tiny randomly initialised models built from configs: for tests, benchmarks and learning.

Fixed seed, float32, eager attention. Each tiny config has 2 layers (Qwen3.5: 3, one of them without
softmax heads) and at least 4 query heads;
the LLaMA-family ones, Qwen3, Gemma-2, StarCoder2, Phi-3, SmolLM3 and the MoE ones are GQA (6 or 4 query heads sharing 2
KV heads), Gemma-3 is MQA like the real 270M (4 query heads, 1 KV head). Where a family's head_dim
may differ from d_model / heads (Qwen3, Gemma), it does here, so the two cannot be confused; Gemma-4's differs
per layer as in the real model (tests/test_tiny_shapes.py checks each family's peculiarities).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers as tf

from ..errors import HeadscopeError, did_you_mean
from .adapter import HeadModel

_ENCODER = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_LLAMA = dict(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
              intermediate_size=96, max_position_embeddings=64)

# family -> (config class, model class, keyword arguments); encoders get no LM head.
_TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertConfig", "BertModel", _ENCODER),
    "roberta": ("RobertaConfig", "RobertaModel", {**_ENCODER, "max_position_embeddings": 66}),
    "electra": ("ElectraConfig", "ElectraModel", {**_ENCODER, "embedding_size": 16}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=120, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                   bos_token_id=1, eos_token_id=2)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA),
    "mistral": ("MistralConfig", "MistralForCausalLM", _LLAMA),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LLAMA),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_LLAMA, "head_dim": 12}),
    # One sliding layer (window 4) then a global one, like the real model's 5:1 pattern; the scaling
    # query_pre_attn_scalar (24) is not head_dim (16), so using the wrong one shows.
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, intermediate_size=64, max_position_embeddings=64, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # Soft-capping at 2.0 bends the logits of this tiny model's attention (its raw logits reach ~5).
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=64, max_position_embeddings=64, query_pre_attn_scalar=16, sliding_window=4,
        attn_logit_softcapping=2.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**_LLAMA, "sliding_window": 5, "use_bias": True,
                                                                 "bos_token_id": 1, "eos_token_id": 2,
                                                                 "residual_dropout": 0.0, "embedding_dropout": 0.0}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_LLAMA, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                                               "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, rotary_pct=0.25, attention_bias=True, hidden_dropout=0.0,
        attention_dropout=0.0, bos_token_id=1, eos_token_id=2)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
        max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
        pad_token_id=1, bos_token_id=2, eos_token_id=2)),
    # Layer 1 is a NoPE layer (no rotary), as every fourth layer of the real model; pad_token_id must lie in
    # the vocabulary (the default, 128004, does not).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {**_LLAMA, "no_rope_layers": [1, 0], "pad_token_id": 0,
                                                         "bos_token_id": 1, "eos_token_id": 2}),
    # Mixture-of-experts: 4 experts, 2 per token; Mixtral with a window shorter than the test sequences,
    # Qwen3-MoE with one dense layer (mlp_only_layers) before a sparse one, like the real models' options.
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_LLAMA, "num_local_experts": 4, "num_experts_per_tok": 2,
                                                        "sliding_window": 5}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**_LLAMA, "head_dim": 12, "num_experts": 4,
                                                            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                                            "decoder_sparse_step": 1, "mlp_only_layers": [0]}),
    # q_norm / k_norm span all heads; OLMo-3 with one sliding layer (window 4) before a global one.
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {**_LLAMA, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {**_LLAMA, "sliding_window": 4, "pad_token_id": 0, "bos_token_id": 1,
                                                  "eos_token_id": 2,
                                                  "layer_types": ["sliding_attention", "full_attention"]}),
    # Gemma-4 text: Gemma-3's tiny shape with GQA, per-layer inputs (8 wide) and, like the real model (256 / 512),
    # a full-attention layer with its own head_dim (global_head_dim 32 beside the sliding layer's 16).
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, global_head_dim=32, intermediate_size=64, max_position_embeddings=64, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=120, pad_token_id=0, bos_token_id=2, eos_token_id=1)),
    # ModernBERT: layer 0 global, layer 1 local with a window of |q - k| <= 2 (local_attention 4); the special
    # token ids must lie in the vocabulary.
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=4, attention_bias=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, embedding_dropout=0.0,
        mlp_dropout=0.0, attention_dropout=0.0)),
    # Qwen3.5's text model: a linear-attention layer (no softmax heads) then two full-attention ones, a gated
    # query projection and partial rotary (the default 0.25).
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {
        **_LLAMA, "num_hidden_layers": 3, "head_dim": 12,
        "layer_types": ["linear_attention", "full_attention", "full_attention"], "linear_num_value_heads": 4,
        "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # GPT-OSS: a sink logit per head (initialised like the weights), one sliding layer (window 4) then a global
    # one, biases on every projection, 4 experts with 2 per token.
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {
        **_LLAMA, "head_dim": 12, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"], "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2}),
    # DeepSeek-V3 (MLA): a low-rank query (q_lora_rank 16), a latent of 12 plus a shared rotary key of 4, per-head
    # key 8 + 4 and value 6 (so no two widths agree); layer 0 dense, layer 1 MoE (4 routed experts, 1 shared).
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=12, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=6, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
}
TINY_FAMILIES = tuple(_TINY)


def tiny_config(family: str, **overrides: Any) -> tf.PreTrainedConfig:
    """The config of a tiny model of `family` (see TINY_FAMILIES); keyword overrides apply."""
    if family not in _TINY:
        raise HeadscopeError(f"no tiny config for {family!r}{did_you_mean(family, _TINY)}; "
                             f"choose one of {', '.join(TINY_FAMILIES)}")
    config_cls, _, kw = _TINY[family]
    return getattr(tf, config_cls)(**{**kw, **overrides})


def tiny_model(family: str, seed: int = 0, init_std: float | None = None, **overrides: Any) -> HeadModel:
    """A tiny randomly initialised model of `family`, eager attention, in eval mode.

    `init_std` widens the default initialisation (0.02) so attention patterns are not near-uniform.
    """
    config = tiny_config(family, **overrides)
    if init_std is not None:
        config.initializer_range = init_std
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(tf, _TINY[family][1])(config).eval()
    return HeadModel(model=model, tokenizer=None, name=f"tiny-{family}", source="config")
