"""Batched matmul: x [B, M, K] @ y [B, K, N], one grid axis per batch entry, tiled as matmul.

The batch axis is squeezed out of every block, so each step runs the tile body on one (M, N)
output tile; padding, clamping, the per-platform rules and the TPU body (with the batch a
"parallel" grid axis) are tiles.py's, which matmul shares.
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
from autotune.kernels.matmul import tiles
from autotune.kernels.precision import ACC_DTYPE, Precision, check_precision, dot_precision


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """bmm's tunables, per batch entry: the output tile (block_m x block_n), the K step
    block_k; on a GPU Triton's warps and pipeline stages."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 2


def fits_platform(config: dict, sig) -> bool:
    """tiles.py's rules for one batch entry's [M, K] x [K, N]."""
    if len(sig.shapes) != 2 or any(len(s) != 3 for s in sig.shapes):
        return True  # the kernel itself rejects such calls with a clear message
    per_entry = tuple(dataclasses.replace(a, shape=a.shape[1:]) for a in sig.args)
    return tiles.fits_platform(config, dataclasses.replace(sig, args=per_entry))


def bmm_reference(x: jax.Array, y: jax.Array, *, precision: str | None = None) -> jax.Array:
    precision = dot_precision(precision, x.dtype)
    out = jnp.einsum("bmk,bkn->bmn", x, y, precision=precision, preferred_element_type=ACC_DTYPE)
    return out.astype(x.dtype)


def _bwd(residuals: tuple, g: jax.Array, *, precision: str, interpret: bool, **_) -> tuple:
    """dx = g y^T and dy = x^T g per batch entry, each a tuned bmm call of its own shapes."""
    x, y = residuals
    return (
        bmm(g, jnp.swapaxes(y, 1, 2), precision=precision, interpret=interpret),
        bmm(jnp.swapaxes(x, 1, 2), g, precision=precision, interpret=interpret),
    )


@autotuned(
    name="bmm",
    space="bmm",
    constraints=[fits_platform],
    defaults_for=tiles.platform_defaults,
    reference=bmm_reference,
    tuned="../tuned",
    split=Split("bmk,bkn->bmn", along="bmn"),
    example=Example("f32[2,20,13],f32[2,13,24]"),
    backward=("bmm",),
)
@differentiable(_bwd)
def bmm(
    x: jax.Array,
    y: jax.Array,
    *,
    block_sizes: BlockSizes = BlockSizes(),
    precision: Precision = None,
    interpret: bool = False,
) -> jax.Array:
    """x @ y per batch entry for x [B, M, K] and y [B, K, N] of one float dtype (the dots at
    `precision`, as in matmul). Differentiable: the backward's products are bmm calls of
    their own."""
    check_precision(precision)
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0] or x.shape[2] != y.shape[1]:
        raise ValueError(f"bmm needs x [B, M, K] and y [B, K, N], got {x.shape=} and {y.shape=}")
    if x.dtype != y.dtype:
        raise ValueError(f"bmm needs one dtype, got {x.dtype=} and {y.dtype=}")
    precision = dot_precision(precision, x.dtype)
    (b, m, _), n = x.shape, y.shape[2]
    if x.size == 0 or y.size == 0:  # an empty batch, or K = 0: the sum over nothing
        return jnp.zeros((b, m, n), x.dtype)
    platform = kernel_platform(interpret)
    blocks = (block_sizes.block_m, block_sizes.block_n, block_sizes.block_k)
    (bm, bn, bk), xp, yp = tiles.padded_operands(x, y, blocks, platform)
    if mosaic_tpu.targets_tpu(platform, interpret):
        return tiles.unpadded(tiles.tpu_call(xp, yp, bm, bn, bk, precision), m, n)
    (_, mp, kp), np_ = xp.shape, yp.shape[2]
    out = pl.pallas_call(
        functools.partial(tiles.tile_kernel, block_k=bk, n_k=kp // bk, precision=precision),
        out_shape=out_struct((b, mp, np_), x.dtype, xp, yp),
        grid=(b, mp // bm, np_ // bn),
        in_specs=[
            pl.BlockSpec((None, bm, kp), lambda t, i, j: (t, i, 0)),
            pl.BlockSpec((None, kp, bn), lambda t, i, j: (t, 0, j)),
        ],
        out_specs=pl.BlockSpec((None, bm, bn), lambda t, i, j: (t, i, j)),
        compiler_params=triton.compiler_params(
            block_sizes.num_warps, block_sizes.num_stages, platform
        ),
        interpret=interpret,
    )(xp, yp)
    return tiles.unpadded(out, m, n)
