"""A kernel as another library would ship it: the tests tune it without editing it.

Written in the style of JAX's ops/tpu kernels: structured block parameters (a tuple
`block_shape` and a frozen dataclass `block_sizes`), no `interpret` argument, and a TPU-only
grid spec (a scalar-prefetch operand in SMEM and a float32 VMEM scratch accumulator). Nothing
here knows about pallas-autotune.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    block_k: int = 128

    def __post_init__(self):
        if self.block_k <= 0:
            raise ValueError(f"{self.block_k=} must be positive")


def _kernel(scale_ref, x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] * scale_ref[0].astype(jnp.float32)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=["block_shape", "block_sizes"])
def scaled_matmul(
    x: jax.Array,
    y: jax.Array,
    scale: jax.Array,
    *,
    block_shape: tuple[int, int] = (128, 128),
    block_sizes: BlockSizes = BlockSizes(),
) -> jax.Array:
    """scale[0] * (x @ y), with x [M, K], y [K, N] and an int32 scale [1]."""
    (m, k), n = x.shape, y.shape[1]
    bm, bn = block_shape
    bk = block_sizes.block_k
    if m % bm or n % bn or k % bk:
        raise ValueError(f"{x.shape=} and {y.shape=} must be multiples of {block_shape=}, {bk=}")
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, t, s: (i, t)),
            pl.BlockSpec((bk, bn), lambda i, j, t, s: (t, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, t, s: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    return pl.pallas_call(
        _kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
    )(scale, x, y)
