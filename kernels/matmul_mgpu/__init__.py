"""matmul_mgpu: a Hopper matmul for Mosaic GPU (matmul_mgpu.py)."""

from autotune.kernels.matmul_mgpu.matmul_mgpu import matmul_mgpu, matmul_mgpu_reference

__all__ = ["matmul_mgpu", "matmul_mgpu_reference"]
