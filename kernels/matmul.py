"""Tiled matmul: grid over (M, N) output tiles, accumulating over K tiles in float32.

With `group_m` > 1 the grid is one axis whose programs walk the output tiles in groups of
`group_m` tile rows, down a column of the group before the next column: programs that run at
the same time then share y's columns and a few rows of x, which stay in the GPU's L2 cache
(the grouped order of Triton's tutorial matmul). `group_m` 1 is the plain row-major grid.

Shapes that are not multiples of the block sizes are zero-padded up to them (zeros add nothing
to a dot product) and the result is sliced back, so every block size is valid for every shape;
a block larger than its dimension is clamped to the dimension (on GPU, to the power of two
that covers it: Triton blocks are powers of two).

On a TPU (and when lowered for one, or run under TPU interpret mode) the kernel has its own
body, `tpu_call`: the grid walks (M, N, K) tiles with K last, and the float32 sum lives in VMEM
scratch, so VMEM holds three tiles whatever K is (the layout of JAX's ops/tpu/matmul.py).
"""

from __future__ import annotations

import functools
from typing import Literal, get_args

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Split, autotuned, out_struct
from autotune.backends import clamp_block, kernel_platform, mosaic_tpu, triton
from autotune.backends.hardware import gpu_registers_ok, gpu_smem_bytes, is_pow2, tpu_block_ok
from autotune.kernels.differentiable import differentiable

ACC_DTYPE = jnp.float32
# jnp.dot's precision for float32 inputs: "highest" computes in float32; "high" and "default"
# allow fewer bits (TF32 on NVIDIA GPUs, bfloat16 passes on TPUs), which the oracle's tolerance
# follows (autotune.measure.verify). None, the default, is the inputs' own (`dot_precision`).
# A static argument annotated Literal[...] is checked up front by `autotune tune` and job files
# (autotune.tuning.task.check_call), before any database is opened or kernel traced.
Precision = Literal["highest", "high", "default", None]
PRECISIONS = get_args(Precision)


def check_precision(precision: str | None) -> None:
    if precision not in PRECISIONS:
        named = ", ".join(p for p in PRECISIONS if p is not None)
        raise ValueError(f"precision={precision!r}: use one of {named}, or None (the default)")


def dot_precision(precision: str | None, dtype) -> str:
    """The precision a kernel's dots take for inputs of `dtype`: the one the call asked for,
    else "highest" for float32 (the float32 a user means) and "default" for 16-bit floats: a
    product of two of them is exact in the float32 accumulator, so one native pass of the TPU's
    MXU gives what "highest" would, without its multi-pass float32 emulation
    (`contract_precision<fp32>` in Mosaic); on a GPU both are one 16-bit MMA."""
    check_precision(precision)
    if precision is not None:
        return precision
    return "highest" if jnp.dtype(dtype).itemsize >= 4 else "default"


def _blocks(config: dict, sig) -> tuple[int, int, int, int, int, int]:
    (m, k), (_, n) = sig.shapes[0], sig.shapes[1]
    dims = (("block_m", m), ("block_n", n), ("block_k", k))
    bm, bn, bk = (clamp_block(config[p], d, sig.platform) for p, d in dims)
    return m, n, k, bm, bn, bk


def fits_platform(config: dict, sig) -> bool:
    """TPU: (8, 128) tiling of the tiles, the TPU body's VMEM (`tpu_vmem`) within the chip's
    budget; GPU: power-of-two tiles in shared memory, the float32 accumulator in registers."""
    if len(sig.shapes) != 2 or any(len(s) != 2 for s in sig.shapes):
        return True  # the kernel itself rejects such calls with a clear message
    m, n, k, bm, bn, bk = _blocks(config, sig)
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    if sig.platform == "tpu":
        mp, np_, kp = (pl.cdiv(d, b) * b for d, b in ((m, bm), (n, bn), (k, bk)))
        return (
            tpu_block_ok((bm, bk), (mp, kp))
            and tpu_block_ok((bk, bn), (kp, np_))
            and tpu_block_ok((bm, bn), (mp, np_))
            and tpu_vmem(bm, bn, bk, itemsize) <= mosaic_tpu.vmem_budget(sig.device_kind)
        )
    if sig.platform == "gpu":
        stages = config.get("num_stages", 2)
        smem = stages * (bm * bk + bk * bn) * itemsize
        return (
            all(is_pow2(b) and b >= 16 for b in (bm, bn, bk))
            and smem <= gpu_smem_bytes(sig.device_kind)
            and gpu_registers_ok(bm * bn, config.get("num_warps", 4))
        )
    return True


def tpu_vmem(bm: int, bn: int, bk: int, itemsize: int) -> int:
    """VMEM bytes of the TPU body's step: x, y and out tiles double-buffered by the pipeline,
    the float32 accumulator (scratch) and the float32 product before it is added."""
    return 2 * (bm * bk + bk * bn) * itemsize + 2 * bm * bn * itemsize + 2 * bm * bn * 4


def padded_operands(x: jax.Array, y: jax.Array, blocks: tuple[int, int, int], platform: str):
    """((bm, bn, bk), xp, yp) for x [..., M, K] @ y [..., K, N] (bmm's batch axis leading):
    the blocks (block_m, block_n, block_k) clamped to their dimensions on `platform`, and x and
    y zero-padded to multiples of them (zeros add nothing to a dot product)."""
    (m, k), n = x.shape[-2:], y.shape[-1]
    bm, bn, bk = (clamp_block(b, d, platform) for b, d in zip(blocks, (m, n, k)))
    mp, np_, kp = (pl.cdiv(d, b) * b for d, b in ((m, bm), (n, bn), (k, bk)))
    lead = ((0, 0),) * (x.ndim - 2)
    xp = jnp.pad(x, (*lead, (0, mp - m), (0, kp - k))) if (mp, kp) != (m, k) else x
    yp = jnp.pad(y, (*lead, (0, kp - k), (0, np_ - n))) if (kp, np_) != (k, n) else y
    return (bm, bn, bk), xp, yp


def unpadded(out: jax.Array, m: int, n: int) -> jax.Array:
    """A product of `padded_operands` sliced back to its [..., M, N]."""
    return out[..., :m, :n] if out.shape[-2:] != (m, n) else out


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


def _tpu_kernel(x_ref, y_ref, o_ref, acc_ref, *, k_axis: int, precision: str):
    k_step = pl.program_id(k_axis)

    @pl.when(k_step == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, ACC_DTYPE)

    acc_ref[...] += jnp.dot(
        x_ref[...], y_ref[...], precision=precision, preferred_element_type=ACC_DTYPE
    )

    @pl.when(k_step == pl.num_programs(k_axis) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def tpu_call(x: jax.Array, y: jax.Array, bm: int, bn: int, bk: int, precision: str) -> jax.Array:
    """The TPU body for x [..., M, K] @ y [..., K, N] padded to the blocks (one leading batch
    axis at most, bmm's): grid (batch, M tiles, N tiles, K tiles), K "arbitrary", the rest
    "parallel", laid out for megacore (`mosaic_tpu.ParallelGrid`: on v4 and v5p the leading
    one is split across the two cores)."""
    from jax.experimental.pallas import tpu as pltpu

    batch = x.shape[:-2]
    (mp, kp), np_ = x.shape[-2:], y.shape[-1]
    lead = (None,) * len(batch)  # the batch axis is squeezed out of every block
    parallel = (*batch, mp // bm, np_ // bn)
    grid = mosaic_tpu.ParallelGrid.of(parallel)
    return pl.pallas_call(
        functools.partial(_tpu_kernel, k_axis=len(parallel), precision=precision),
        out_shape=out_struct((*batch, mp, np_), x.dtype, x, y),
        grid=grid.grid(parallel, kp // bk),
        in_specs=[
            pl.BlockSpec((*lead, bm, bk), grid.index_map(lambda *g: (*g[:-3], g[-3], g[-1]))),
            pl.BlockSpec((*lead, bk, bn), grid.index_map(lambda *g: (*g[:-3], g[-1], g[-2]))),
        ],
        out_specs=pl.BlockSpec((*lead, bm, bn), grid.index_map(lambda *g: g[:-1])),
        scratch_shapes=[pltpu.VMEM((bm, bn), ACC_DTYPE)],
        compiler_params=mosaic_tpu.compiler_params(
            ("parallel",) * len(parallel) + ("arbitrary",),
            tpu_vmem(bm, bn, bk, x.dtype.itemsize),
        ),
    )(x, y)


def tile_kernel(x_ref, y_ref, o_ref, *, block_k: int, n_k: int, precision: str):
    """The GPU (and interpret-mode) body: one output tile, the row block of x times the
    column block of y, K walked in `n_k` steps of `block_k`; bmm runs it per batch entry."""

    def step(i, acc):
        x = x_ref[:, pl.ds(i * block_k, block_k)]
        y = y_ref[pl.ds(i * block_k, block_k), :]
        return acc + jnp.dot(x, y, precision=precision, preferred_element_type=ACC_DTYPE)

    acc = jax.lax.fori_loop(0, n_k, step, jnp.zeros(o_ref.shape, ACC_DTYPE))
    o_ref[...] = acc.astype(o_ref.dtype)


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
    reference=matmul_reference,
    tuned="tuned",
    split=Split("mk,kn->mn", along="mn"),
)
@differentiable(_bwd)
def matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    block_m: int = 128,
    block_n: int = 128,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 2,
    group_m: int = 1,
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
    (bm, bn, bk), xp, yp = padded_operands(x, y, (block_m, block_n, block_k), platform)
    if mosaic_tpu.targets_tpu(platform, interpret):
        return unpadded(tpu_call(xp, yp, bm, bn, bk, precision), m, n)
    (mp, kp), np_ = xp.shape, yp.shape[1]
    tiles_m, tiles_n = mp // bm, np_ // bn
    if group_m > 1:
        grid = (tiles_m * tiles_n,)

        def tile(pid):
            return grouped_tile(pid, tiles_m, tiles_n, group_m)
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
        compiler_params=triton.compiler_params(num_warps, num_stages, platform),
        interpret=interpret,
    )(xp, yp)
    return unpadded(out, m, n)
