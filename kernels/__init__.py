"""The Pallas kernels shipped with pallas-autotune, each decorated with @autotuned.

Importing this package registers them by name, with the variant groups over them (groups.py).
Each reads the tuned tables shipped in tuned/ (`tuned="tuned"`: `autotune db export` files, one
per hardware check; see tuned/README.md), which serve the calls a user's database has no
entry for.
"""

from autotune.kernels.attention_mgpu import attention_mgpu
from autotune.kernels.bmm import bmm, bmm_reference
from autotune.kernels.flash_attention import attention_reference, flash_attention
from autotune.kernels.flash_attention_bwd import (
    attention_dkv_reference,
    attention_dq_reference,
    flash_attention_dkv,
    flash_attention_dq,
)
from autotune.kernels.groups import attention_variants, matmul_variants
from autotune.kernels.matmul import matmul, matmul_reference
from autotune.kernels.matmul_mgpu import matmul_mgpu, matmul_mgpu_reference
from autotune.kernels.norms import layer_norm, layer_norm_reference, rms_norm, rms_norm_reference
from autotune.kernels.row_grads import (
    layer_norm_bwd,
    layer_norm_bwd_reference,
    rms_norm_bwd,
    rms_norm_bwd_reference,
    softmax_bwd,
    softmax_bwd_reference,
)
from autotune.kernels.softmax import softmax, softmax_reference
from autotune.kernels.vector_add import vector_add, vector_add_reference

__all__ = [
    "attention_dkv_reference",
    "attention_mgpu",
    "attention_dq_reference",
    "attention_reference",
    "attention_variants",
    "bmm",
    "bmm_reference",
    "flash_attention",
    "flash_attention_dkv",
    "flash_attention_dq",
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_bwd_reference",
    "layer_norm_reference",
    "matmul",
    "matmul_mgpu",
    "matmul_mgpu_reference",
    "matmul_reference",
    "matmul_variants",
    "rms_norm",
    "rms_norm_bwd",
    "rms_norm_bwd_reference",
    "rms_norm_reference",
    "softmax",
    "softmax_bwd",
    "softmax_bwd_reference",
    "softmax_reference",
    "vector_add",
    "vector_add_reference",
]
