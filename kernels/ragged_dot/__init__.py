"""ragged_dot: the grouped matmuls of the `ragged_dot` group (kernels/groups.py) beside
megablox's: JAX's Hopper `ragged_dot_mgpu` (ragged_dot_mgpu.py) and a Triton grouped matmul of
our own for other GPUs (grouped_matmul.py); the backward they share (backward.py)."""

from autotune.kernels.ragged_dot.grouped_matmul import grouped_matmul
from autotune.kernels.ragged_dot.ragged_dot_mgpu import ragged_dot_mgpu

__all__ = ["grouped_matmul", "ragged_dot_mgpu"]
