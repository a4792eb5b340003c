"""gpu_attention: JAX's GPU attention kernels, tuned unedited: its Triton attention, forward and
backward (triton_attention.py), its decode attention and paged attention (decode.py)."""

from autotune.kernels.gpu_attention.decode import (
    decode_attention,
    decode_attention_reference,
    paged_attention_gpu,
    paged_attention_gpu_reference,
)
from autotune.kernels.gpu_attention.triton_attention import (
    attention_bwd_reference,
    triton_attention,
    triton_attention_bwd,
)

__all__ = [
    "attention_bwd_reference",
    "decode_attention",
    "decode_attention_reference",
    "paged_attention_gpu",
    "paged_attention_gpu_reference",
    "triton_attention",
    "triton_attention_bwd",
]
