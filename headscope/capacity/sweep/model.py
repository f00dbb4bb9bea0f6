"""The models a sweep trains: a small decoder-only `TinyLM` over the reference attention, and its costs."""

from __future__ import annotations

import math
from typing import Iterable, cast

import torch
from torch import nn

from ..kv_bytes import kv_bytes_per_token as kv_calc
from ..mha import MultiHeadAttention
from .config import SweepConfig
from .tasks import PAIR_OFFSETS, PAIR_VOCAB

__all__ = ["KV_DTYPE", "Block", "TinyLM", "build_model", "kv_bytes_per_token", "model_flops_per_token"]

# KV bytes are reported for a bf16 cache, the usual inference dtype
KV_DTYPE = "bf16"


class Block(nn.Module):
    """Pre-LayerNorm transformer block (attention + optional MLP); without `norm`, no LayerNorm at all."""

    def __init__(self, cfg: SweepConfig, mlp: bool, norm: bool) -> None:
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d) if norm else nn.Identity()
        self.attn = MultiHeadAttention(d, cfg.n_heads, n_kv_heads=cfg.kv_heads, d_head=cfg.head_dim, bias=False,
                                       rope=False, causal=True)
        self.mlp = None
        if mlp:
            self.ln2 = nn.LayerNorm(d) if norm else nn.Identity()
            self.mlp = nn.Sequential(nn.Linear(d, cfg.d_ff_mult * d), nn.GELU(), nn.Linear(cfg.d_ff_mult * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # [batch, pos, d_model]
        if self.mlp is not None:
            x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Module):
    """Decoder-only model: token + learned position embeddings, `n_layers` blocks, a linear read-out.

    `attn_only=True` builds the synthetic tasks' model: no MLP, no LayerNorm, so every head's output is
    exactly a softmax-weighted sum of linear maps of the embeddings (what the one-head arguments use).
    `cfg.init_std` set: every weight matrix is drawn N(0, init_std) instead of GPT-2's init.
    """

    def __init__(self, cfg: SweepConfig, vocab: int, n_out: int, attn_only: bool = False) -> None:
        super().__init__()
        d = cfg.d_model
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(cfg.seq, d)
        self.blocks = nn.ModuleList(Block(cfg, mlp=not attn_only, norm=not attn_only) for _ in range(cfg.n_layers))
        self.ln_f = nn.Identity() if attn_only else nn.LayerNorm(d)
        self.head = nn.Linear(d, n_out, bias=False)
        if n_out == vocab:
            self.head.weight = self.tok_emb.weight  # tied, as in GPT-2
        # GPT-2 init: N(0, 0.02), residual output projections scaled down by sqrt(2 * n_layers).
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("o_proj.weight", "mlp.2.weight")) else 0.02
                if cfg.init_std is not None:
                    std = cfg.init_std
                nn.init.normal_(p, 0.0, std)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [batch, pos, n_out] for `ids` [batch, pos]."""
        x = self.tok_emb(ids) + self.pos_emb.weight[: ids.shape[1]]  # [batch, pos, d_model]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(cfg: SweepConfig, vocab: int) -> TinyLM:
    """The model a configuration trains (seeded by `cfg.seed`): an LM for ptb, attention-only for xor and pair."""
    torch.manual_seed(cfg.seed)
    if cfg.task == "pair":
        return TinyLM(cfg, PAIR_VOCAB, PAIR_VOCAB ** len(PAIR_OFFSETS), attn_only=True)
    if cfg.task == "xor":
        return TinyLM(cfg, 3, 2, attn_only=True)  # tokens 0, 1 and the query "="; classes 0 and 1
    return TinyLM(cfg, vocab, vocab)


def model_flops_per_token(model: TinyLM, seq: int) -> int:
    """Forward FLOPs per token: 2 per multiply-accumulate of every matmul (projections, attention, MLP, read-out).

    Attention matmuls count the full seq x seq score matrix (as `MultiHeadAttention.flops` does: the
    module computes it, then masks). Not counted: embeddings lookups, LayerNorm, softmax, GELU, biases.
    """
    total = 0
    for block in cast(Iterable[Block], model.blocks):
        total += block.attn.flops(seq, batch=1) // seq
        if block.mlp is not None:
            total += 2 * sum(m.weight.numel() for m in block.mlp if isinstance(m, nn.Linear))
    return total + 2 * model.head.weight.numel()


def kv_bytes_per_token(cfg: SweepConfig, dtype: str = KV_DTYPE) -> int:
    """KV-cache bytes per token of a configuration's whole model, from the `headscope.capacity.kv_bytes` calculator."""
    return kv_calc({"num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
                    "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_size": cfg.d_model}, dtype)
