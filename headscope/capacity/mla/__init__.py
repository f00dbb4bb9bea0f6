"""MHA/GQA -> multi-head latent attention (MLA): partial RoPE, joint low-rank K/V, distillation (MHA2MLA)."""

from .convert import (
                      SUPPORTED_MODEL_TYPES,
                      check_mla,
                      convert_to_mla,
                      default_rope_dims,
                      full_rank,
                      mla_kv_bytes_per_token,
)
from .modeling import DECODE_FORMS, MLA_CONFIG_KEY, MLAAttention, install_mla, set_decode
from .rope import SELECTIONS, norm_scores, select_frequencies

__all__ = ["DECODE_FORMS", "MLA_CONFIG_KEY", "MLAAttention", "SELECTIONS", "SUPPORTED_MODEL_TYPES", "check_mla",
           "convert_to_mla", "default_rope_dims", "full_rank", "install_mla", "mla_kv_bytes_per_token", "norm_scores",
           "select_frequencies", "set_decode"]
