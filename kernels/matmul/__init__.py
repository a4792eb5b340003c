"""matmul and bmm: tiled products (matmul.py, bmm.py), sharing their bodies (tiles.py)."""

from autotune.kernels.matmul.bmm import bmm, bmm_reference
from autotune.kernels.matmul.matmul import matmul, matmul_reference

__all__ = ["bmm", "bmm_reference", "matmul", "matmul_reference"]
