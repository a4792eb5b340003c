"""The row kernels: softmax (softmax.py), rms_norm and layer_norm (norms.py), each with its
backward kernel; what they share is layout.py's."""

from autotune.kernels.rows.norms import (
    layer_norm,
    layer_norm_bwd,
    layer_norm_bwd_reference,
    layer_norm_reference,
    rms_norm,
    rms_norm_bwd,
    rms_norm_bwd_reference,
    rms_norm_reference,
)
from autotune.kernels.rows.softmax import (
    softmax,
    softmax_bwd,
    softmax_bwd_reference,
    softmax_reference,
)

__all__ = [
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_bwd_reference",
    "layer_norm_reference",
    "rms_norm",
    "rms_norm_bwd",
    "rms_norm_bwd_reference",
    "rms_norm_reference",
    "softmax",
    "softmax_bwd",
    "softmax_bwd_reference",
    "softmax_reference",
]
