"""Tiny randomly initialised models built from configs: for tests, benchmarks and learning.

Fixed seed, float32, eager attention. Each family's tiny config has at least 2 layers and 4 query
heads; the llama one is GQA (6 query heads sharing 2 KV heads).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import HeadscopeError
from .adapter import HeadModel

TINY_FAMILIES = ("bert", "gpt2", "llama")


def tiny_config(family: str, **overrides: Any):
    """The config of a tiny model of `family` (bert, gpt2, llama); keyword overrides apply."""
    import transformers as tf

    if family == "bert":
        kw = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        cls = tf.BertConfig
    elif family == "gpt2":
        kw = dict(vocab_size=120, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
        cls = tf.GPT2Config
    elif family == "llama":
        kw = dict(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                  intermediate_size=96, max_position_embeddings=64)
        cls = tf.LlamaConfig
    else:
        raise HeadscopeError(f"no tiny config for family {family!r}; choose one of {', '.join(TINY_FAMILIES)}")
    kw.update(overrides)
    return cls(**kw)


def tiny_model(family: str, seed: int = 0, init_std: float | None = None, **overrides: Any) -> HeadModel:
    """A tiny randomly initialised model of `family` with a causal-LM head where the family has one.

    `init_std` widens the default initialisation (0.02) so attention patterns are not near-uniform.
    """
    import transformers as tf

    config = tiny_config(family, **overrides)
    if init_std is not None:
        config.initializer_range = init_std
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = tf.BertModel(config) if family == "bert" else tf.AutoModelForCausalLM.from_config(config)
    model.eval()
    return HeadModel(model=model, tokenizer=None, name=f"tiny-{family}", source="config")
