"""Flash attention: the forward (forward.py, its VJP too) and the backward's two kernels
(backward.py), their TPU bodies (tpu.py), their references (reference.py), and what they share
(tiles.py: blocks, masks, shapes)."""

from autotune.kernels.flash_attention.backward import flash_attention_dkv, flash_attention_dq
from autotune.kernels.flash_attention.forward import flash_attention
from autotune.kernels.flash_attention.reference import (
    attention_dkv_reference,
    attention_dq_reference,
    attention_reference,
)

__all__ = [
    "attention_dkv_reference",
    "attention_dq_reference",
    "attention_reference",
    "flash_attention",
    "flash_attention_dkv",
    "flash_attention_dq",
]
