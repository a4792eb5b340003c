"""Tiled matmul: grid over (M, N) output tiles, accumulating over K tiles in float32.

With `group_m` > 1 the grid is one axis whose programs walk the output tiles in groups of
`group_m` tile rows, down a column of the group before the next column: programs that run at
the same time then share y's columns and a few rows of x, which stay in the GPU's L2 cache
(the grouped order of Triton's tutorial matmul). `group_m` 1 is the plain row-major grid.
Padding, clamping and the TPU body are tiles.py's.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned, out_struct
from autotune.backends import kernel_platform, mosaic_tpu, triton
from autotune.kernels.differentiable import differentiable
from autotune.kernels.matmul.tiles import (
    fits_platform,
    padded_operands,
    platform_defaults,
    tile_kernel,
    tpu_call,
    unpadded,
)
from autotune.kernels.precision import ACC_DTYPE, Precision, dot_precision


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """matmul's tunables: the output tile (block_m x block_n) and the K step block_k; on a GPU
    Triton's warps and pipeline stages, and the row groups the output tiles are walked in."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 2
    group_m: int = 1


def matmul_reference(x: jax.Array, y: jax.Array, *, precision: str | None = None) -> jax.Array:
    return jnp.dot(
        x, y, precision=dot_precision(precision, x.dtype), preferred_element_type=ACC_DTYPE
    ).astype(x.dtype)


def grouped_tile(pid, tiles_m: int, tiles_n: int, group_m: int):
    """The (row, column) of output tile `pid` in the grouped order (see the module docstring)."""
    per_group = group_m * tiles_n
    first_m = (pid // per_group) * group_m
    rows = jnp.minimum(tiles_m - first_m, group_m)  # the last group may be shorter
    return first_m + (pid % per_group) % rows, (pid % per_group) // rows


def _bwd(residuals: tuple, g: jax.Array, *, precision: str, interpret: bool, **_) -> tuple:
    """dx = g y^T and dy = x^T g, each served by the tuned matmul for its own shapes."""
    x, y = residuals
    return (
        matmul(g, y.T, precision=precision, interpret=interpret),
        matmul(x.T, g, precision=precision, interpret=interpret),
    )


@autotuned(
    name="matmul",
    space="matmul",
    constraints=[fits_platform],
    defaults_for=platform_defaults,
    reference=matmul_reference,
    tuned="../tuned",
    split=Split("mk,kn->mn", along="mn"),
    example=Example("f32[37,45],f32[45,29]"),
    backward=("matmul",),
)
@differentiable(_bwd)
def matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    block_sizes: BlockSizes = BlockSizes(),
    precision: Precision = None,
    interpret: bool = False,
) -> jax.Array:
    """x @ y for 2-D x [M, K] and y [K, N] of one float dtype; float32 accumulation, the dots
    at `precision` (None: "highest" for float32, the native pass for 16-bit floats; see
    dot_precision); output tiles in `group_m` row groups. Differentiable: the backward's two
    products are matmul calls of their own."""
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0]:
        raise ValueError(f"matmul needs x [M, K] and y [K, N], got {x.shape=} and {y.shape=}")
    if x.dtype != y.dtype:
        raise ValueError(f"matmul needs one dtype, got {x.dtype=} and {y.dtype=}")
    precision = dot_precision(precision, x.dtype)
    m, n = x.shape[0], y.shape[1]
    platform = kernel_platform(interpret)
    b = block_sizes
    (bm, bn, bk), xp, yp = padded_operands(x, y, (b.block_m, b.block_n, b.block_k), platform)
    if mosaic_tpu.targets_tpu(platform, interpret):
        return unpadded(tpu_call(xp, yp, bm, bn, bk, precision), m, n)
    (mp, kp), np_ = xp.shape, yp.shape[1]
    tiles_m, tiles_n = mp // bm, np_ // bn
    if b.group_m > 1:
        grid = (tiles_m * tiles_n,)

        def tile(pid):
            return grouped_tile(pid, tiles_m, tiles_n, b.group_m)
    else:
        grid = (tiles_m, tiles_n)

        def tile(i, j):
            return i, j

    out = pl.pallas_call(
        functools.partial(tile_kernel, block_k=bk, n_k=kp // bk, precision=precision),
        out_shape=out_struct((mp, np_), x.dtype, xp, yp),
        grid=grid,
        in_specs=[
            pl.BlockSpec((bm, kp), lambda *g: (tile(*g)[0], 0)),
            pl.BlockSpec((kp, bn), lambda *g: (0, tile(*g)[1])),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda *g: tile(*g)),
        compiler_params=triton.compiler_params(b.num_warps, b.num_stages, platform),
        interpret=interpret,
    )(xp, yp)
    return unpadded(out, m, n)
