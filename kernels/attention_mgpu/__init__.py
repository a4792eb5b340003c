"""attention_mgpu: JAX's own Mosaic GPU attention, forward and backward, with its block sizes
tuned (attention_mgpu.py)."""

from autotune.kernels.attention_mgpu.attention_mgpu import (
    attention_mgpu,
    attention_mgpu_bwd,
    attention_mgpu_bwd_reference,
)

__all__ = ["attention_mgpu", "attention_mgpu_bwd", "attention_mgpu_bwd_reference"]
