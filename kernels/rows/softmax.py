"""Numerically stable softmax over the last axis, `block_rows` rows per grid step, and its
backward kernel.

Any leading axes are flattened into rows; see layout.py for padding and masking.
Differentiable: the backward is `softmax_bwd`, a kernel of its own (tuned apart from the
forward), which recomputes each row's softmax from x and takes the output's cotangent g.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from autotune import Example, Split, autotuned
from autotune.backends import kernel_platform
from autotune.kernels.differentiable import differentiable
from autotune.kernels.rows.layout import (
    F32,
    GPU_ROW_BWD_ELEMS,
    BlockSizes,
    check_like,
    fits_rowwise,
    lane_mask,
    row_grads_call,
    rowwise_on,
)


def fits_platform(config: dict, sig) -> bool:
    """The row-block rules of layout.py (x, exp(x - max) and the output in float32)."""
    return fits_rowwise(config, sig, f32_temps=3)


def fits_platform_bwd(config: dict, sig) -> bool:
    """The row-block rules of layout.py, for x and g in, dx out and float32 temporaries."""
    return fits_rowwise(config, sig, f32_temps=6, row_arrays=3, gpu_thread_elems=GPU_ROW_BWD_ELEMS)


def softmax_reference(x: jax.Array) -> jax.Array:
    return jax.nn.softmax(x.astype(F32), axis=-1).astype(x.dtype)


def softmax_bwd_reference(x: jax.Array, g: jax.Array) -> jax.Array:
    return jax.vjp(softmax_reference, x)[1](g)[0]


def row_softmax(x: jax.Array, n_cols: int) -> jax.Array:
    """Softmax over the last axis of a float32 row block whose lanes from `n_cols` on are
    padding: what the forward writes and what its backward recomputes."""
    if n_cols != x.shape[-1]:  # padded lanes must not enter the max or the sum
        x = jnp.where(lane_mask(x.shape, n_cols), x, -jnp.inf)
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _kernel(x_ref, o_ref, *, n_cols: int):
    o_ref[...] = row_softmax(x_ref[...].astype(F32), n_cols).astype(o_ref.dtype)


def _bwd_kernel(x_ref, g_ref, dx_ref, *, n_cols: int):
    y = row_softmax(x_ref[...].astype(F32), n_cols)
    g = g_ref[...].astype(F32)
    dx_ref[...] = (y * (g - jnp.sum(g * y, axis=-1, keepdims=True))).astype(dx_ref.dtype)


def softmax_on(x: jax.Array, *, block_sizes: BlockSizes, platform: str, interpret: bool):
    """The kernel laid out for `platform` (tests run the GPU layout in interpret mode)."""
    return rowwise_on(
        "softmax", _kernel, x, [], block_sizes=block_sizes, platform=platform, interpret=interpret
    )


def _bwd(inputs: tuple, g: jax.Array, *, interpret: bool, **_) -> tuple[jax.Array]:
    (x,) = inputs
    return (softmax_bwd(x, g, interpret=interpret),)


@autotuned(
    name="softmax",
    space="softmax",
    constraints=[fits_platform],
    reference=softmax_reference,
    tuned="../tuned",
    split=Split("...c->...c", along="..."),
    example=Example("f32[3,5,37]"),
    backward=("softmax_bwd",),
)
@differentiable(_bwd)
def softmax(
    x: jax.Array, *, block_sizes: BlockSizes = BlockSizes(), interpret: bool = False
) -> jax.Array:
    """softmax(x) over the last axis, computed in float32, returned in x's dtype.
    Differentiable: the backward is the tuned kernel softmax_bwd."""
    platform = kernel_platform(interpret)
    return softmax_on(x, block_sizes=block_sizes, platform=platform, interpret=interpret)


@autotuned(
    name="softmax_bwd",
    space="softmax_bwd",
    constraints=[fits_platform_bwd],
    reference=softmax_bwd_reference,
    tuned="../tuned",
    split=Split("...c,...c->...c", along="..."),
    example=Example("f32[3,5,37],f32[3,5,37]"),
)
def softmax_bwd(
    x: jax.Array, g: jax.Array, *, block_sizes: BlockSizes = BlockSizes(), interpret: bool = False
) -> jax.Array:
    """The gradient of softmax(x) (last axis) for the output's cotangent g."""
    check_like("softmax_bwd", x, g)
    if x.size == 0:
        return x
    (dx,) = row_grads_call(
        functools.partial(_bwd_kernel, n_cols=x.shape[-1]),
        [x, g],
        [],
        0,
        block_sizes=block_sizes,
        interpret=interpret,
    )
    return dx
