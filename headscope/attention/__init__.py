"""Attention statistics without the T x T map, on any kernel: a registered attention function
(`kernel`) that hands blocks of eager-exact probabilities (`blocks`) to headscope's consumers, or, to
consumers of per-query values only, those values from a tiled online-softmax walk (`fused_rows`)."""

from __future__ import annotations

from .blocks import (
                     DEFAULT_TILE,
                     AttentionBlock,
                     BlockRows,
                     BlockStats,
                     block_attention,
                     check_block,
                     fused_rows,
                     iter_blocks,
)
from .kernel import DEFAULT_BLOCK, KERNEL_NAME, AttentionKernel, check_kernel_support, stats_kernel

__all__ = ["DEFAULT_BLOCK", "DEFAULT_TILE", "KERNEL_NAME", "AttentionBlock", "AttentionKernel", "BlockRows",
           "BlockStats", "block_attention", "check_block", "check_kernel_support", "fused_rows", "iter_blocks",
           "stats_kernel"]
