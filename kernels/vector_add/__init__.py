"""vector_add: x + y, the hello-world of Pallas (vector_add.py)."""

from autotune.kernels.vector_add.vector_add import vector_add, vector_add_reference

__all__ = ["vector_add", "vector_add_reference"]
