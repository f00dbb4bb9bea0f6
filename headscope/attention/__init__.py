"""Attention statistics without the T x T map, on any kernel: a registered attention function
(`kernel`) that hands blocks of eager-exact probabilities (`blocks`) to headscope's consumers."""

from __future__ import annotations

from .blocks import AttentionBlock, BlockStats, block_attention, check_block, iter_blocks
from .kernel import DEFAULT_BLOCK, KERNEL_NAME, AttentionKernel, check_kernel_support, stats_kernel

__all__ = ["DEFAULT_BLOCK", "KERNEL_NAME", "AttentionBlock", "AttentionKernel", "BlockStats", "block_attention",
           "check_block", "check_kernel_support", "iter_blocks", "stats_kernel"]
