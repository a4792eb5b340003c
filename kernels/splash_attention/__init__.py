"""splash_attention: JAX's splash attention, forward and backward, tuned unedited
(splash_attention.py), and the `BlockSizes` hook for code that calls JAX's kernel itself
(block_sizes.py)."""

from autotune.kernels.splash_attention.block_sizes import tuned_block_sizes
from autotune.kernels.splash_attention.splash_attention import (
    splash_attention,
    splash_attention_bwd,
    splash_attention_bwd_reference,
)

__all__ = [
    "splash_attention",
    "splash_attention_bwd",
    "splash_attention_bwd_reference",
    "tuned_block_sizes",
]
