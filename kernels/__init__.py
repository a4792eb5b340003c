"""The Pallas kernels shipped with pallas-autotune, each decorated with @autotuned.

Importing this package registers them by name.
"""

from kernels.matmul import matmul, matmul_reference
from kernels.vector_add import vector_add, vector_add_reference

__all__ = ["matmul", "matmul_reference", "vector_add", "vector_add_reference"]
