"""ragged_paged_attention: JAX's serving attention over a paged KV cache, tuned unedited
(ragged_paged_attention.py), the batches it is tuned on (workloads.py) and JAX's table format
for `autotune db export --format jax` (tables.py)."""

from autotune.kernels.ragged_paged_attention.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_reference,
)
from autotune.kernels.ragged_paged_attention.tables import jax_table
from autotune.registry import add_table_format

add_table_format("ragged_paged_attention", jax_table)

__all__ = ["ragged_paged_attention", "ragged_paged_attention_reference"]
