"""The serving hook for code that builds JAX's splash attention itself (MaxText's
`make_splash_mha(mask, block_sizes=...)`): `tuned_block_sizes`, JAX's BlockSizes with the
forward's fields from splash_attention's entry and the backward's from splash_attention_bwd's
(database, shipped table, overlay, nearest shape, default), so the call site changes one
argument, not its kernel:

    block_sizes = tuned_block_sizes(batch, heads, seq_q, seq_k, head_dim, "bfloat16", causal=True)
    kernel = make_splash_mha(mask, block_sizes=block_sizes, head_shards=1, q_seq_shards=1)
"""

from __future__ import annotations

from typing import Any

import jax

from autotune.kernels.splash_attention.splash_attention import (
    BackwardBlockSizes,
    BlockSizes,
    _jax_blocks,
    splash_attention,
    splash_attention_bwd,
)


def tuned_block_sizes(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    dtype: Any = "float32",
    *,
    causal: bool = False,
    sm_scale: float | None = None,
) -> Any:
    """JAX's splash BlockSizes tuned for attention of q [batch, heads, seq_q, head_dim] over
    k, v [batch, heads, seq_k, head_dim] of `dtype`: forward and backward fields both."""
    s = jax.ShapeDtypeStruct
    q, kv = s((batch, heads, seq_q, head_dim), dtype), s((batch, heads, seq_k, head_dim), dtype)
    options = dict(causal=causal, sm_scale=sm_scale)
    forward = splash_attention.config(q, kv, kv, **options)
    lse = s((batch, heads, seq_q), "float32")
    backward = splash_attention_bwd.config(q, kv, kv, q, lse, q, **options)
    return _jax_blocks(BlockSizes(**forward), BackwardBlockSizes(**backward))
