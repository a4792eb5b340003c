"""ragged_paged_attention: JAX's serving attention over a paged KV cache, tuned unedited
(ragged_paged_attention.py), the batches it is tuned on (workloads.py) and JAX's table format
for `autotune db export --format jax` (tables.py)."""

from autotune.kernels.ragged_paged_attention.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

__all__ = ["ragged_paged_attention", "ragged_paged_attention_reference"]
