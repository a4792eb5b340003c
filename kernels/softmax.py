"""Numerically stable softmax over the last axis, `block_rows` rows per grid step.

Any leading axes are flattened into rows; see kernels/rowwise.py for padding and masking.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from autotune import Split, autotuned
from autotune.backends import kernel_platform
from autotune.kernels.differentiable import differentiable
from autotune.kernels.rowwise import F32, fits_rowwise, lane_mask, rowwise_on


def fits_platform(config: dict, sig) -> bool:
    """The row-block rules of kernels/rowwise.py (x, exp(x - max) and the output in float32)."""
    return fits_rowwise(config, sig, f32_temps=3)


def softmax_reference(x: jax.Array) -> jax.Array:
    return jax.nn.softmax(x.astype(F32), axis=-1).astype(x.dtype)


def row_softmax(x: jax.Array, n_cols: int) -> jax.Array:
    """Softmax over the last axis of a float32 row block whose lanes from `n_cols` on are
    padding: what the forward writes and what its backward (kernels/row_grads.py) recomputes."""
    if n_cols != x.shape[-1]:  # padded lanes must not enter the max or the sum
        x = jnp.where(lane_mask(x.shape, n_cols), x, -jnp.inf)
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _kernel(x_ref, o_ref, *, n_cols: int):
    o_ref[...] = row_softmax(x_ref[...].astype(F32), n_cols).astype(o_ref.dtype)


def softmax_on(
    x: jax.Array, *, block_rows: int, num_warps: int, platform: str, interpret: bool
) -> jax.Array:
    """The kernel laid out for `platform` (tests run the GPU layout in interpret mode)."""
    return rowwise_on(
        "softmax",
        _kernel,
        x,
        [],
        block_rows=block_rows,
        num_warps=num_warps,
        platform=platform,
        interpret=interpret,
    )


def _bwd(inputs: tuple, g: jax.Array, *, interpret: bool, **_) -> tuple[jax.Array]:
    # imported here: row_grads imports this module for softmax's reference
    from autotune.kernels.row_grads import softmax_bwd

    (x,) = inputs
    return (softmax_bwd(x, g, interpret=interpret),)


@autotuned(
    name="softmax",
    space="softmax",
    constraints=[fits_platform],
    reference=softmax_reference,
    tuned="tuned",
    split=Split("...c->...c", along="..."),
)
@differentiable(_bwd)
def softmax(
    x: jax.Array, *, block_rows: int = 64, num_warps: int = 4, interpret: bool = False
) -> jax.Array:
    """softmax(x) over the last axis, computed in float32, returned in x's dtype.
    Differentiable: the backward is the tuned kernel softmax_bwd."""
    platform = kernel_platform(interpret)
    return softmax_on(
        x, block_rows=block_rows, num_warps=num_warps, platform=platform, interpret=interpret
    )
