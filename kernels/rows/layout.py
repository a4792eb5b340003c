"""What the row kernels share (softmax, rms_norm, layer_norm and their backward kernels): each
row of the last axis is independent.

Leading axes are flattened into rows; a grid step handles `block_rows` whole rows. Rows are
zero-padded up to a multiple of the block and sliced back (padded rows are computed and dropped).
On GPU the row length is also padded, to the power of two Triton needs, and the kernels mask
the padded lanes out of every reduction. A backward kernel writes its rows of dx per block, and
sums the weight's (and bias's) gradient per block in float32 (`row_grads_call`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import out_struct
from autotune.backends import clamp_block, kernel_platform, mosaic_tpu, triton, whole_block
from autotune.backends.hardware import (
    GPU_MAX_REGISTERS_PER_THREAD,
    GPU_WARP,
    TRITON_MAX_NUMEL,
    gpu_smem_bytes,
    gpu_thread_register_cap,
    is_pow2,
    tpu_block_ok,
)

F32 = jnp.float32


@dataclass(frozen=True)
class BlockSizes:
    """A row kernel's tunables: rows per grid step; on a GPU Triton's warps. Each row kernel
    (each backward kernel too) is tuned on its own, from these defaults."""

    block_rows: int = 64
    num_warps: int = 4


@dataclass(frozen=True)
class RowLayout:
    rows: int
    cols: int
    block_rows: int
    rows_padded: int
    cols_padded: int

    @classmethod
    def of(cls, rows: int, cols: int, block_rows: int, platform: str) -> RowLayout:
        br = clamp_block(block_rows, rows, platform)
        cols_p = whole_block(cols, platform)
        return cls(rows, cols, br, pl.cdiv(rows, br) * br, cols_p)

    def pad(self, x2d: jax.Array) -> jax.Array:
        pad = ((0, self.rows_padded - self.rows), (0, self.cols_padded - self.cols))
        return jnp.pad(x2d, pad) if any(p for _, p in pad) else x2d

    def pad_vector(self, w: jax.Array) -> jax.Array:
        """A per-column vector (weight, bias) as a (1, cols) array: 2-D blocks lower everywhere."""
        w = w.reshape(1, self.cols)
        return jnp.pad(w, ((0, 0), (0, self.cols_padded - self.cols))) if self.padded_lanes else w

    @property
    def padded_lanes(self) -> bool:
        return self.cols_padded != self.cols

    def unpad(self, out: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        if (self.rows_padded, self.cols_padded) != (self.rows, self.cols):
            out = out[: self.rows, : self.cols]
        return out.reshape(shape)


def lane_mask(shape: tuple[int, int], n_cols: int) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, shape, 1) < n_cols


def check_rows(name: str, x: jax.Array) -> tuple[int, int]:
    if x.ndim < 1:
        raise ValueError(f"{name} needs an array with a last axis, got {x.shape=}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} needs a floating-point array, got {x.dtype=}")
    cols = x.shape[-1]
    return math.prod(x.shape[:-1]), cols


def rowwise_on(
    name: str,
    kernel,
    x: jax.Array,
    vectors: list[jax.Array],
    *,
    block_sizes: BlockSizes,
    platform: str,
    interpret: bool,
) -> jax.Array:
    """Run `kernel(x_ref, *vector_refs, o_ref, n_cols=<x's row length>)` over row blocks of x
    (leading axes flattened into rows), laid out for `platform`; the output has x's shape and
    dtype (an empty x is returned as it is). `name` is the kernel's, for the error messages."""
    rows, cols = check_rows(name, x)
    if x.size == 0:
        return x
    layout = RowLayout.of(rows, cols, block_sizes.block_rows, platform)
    br, cols_p = layout.block_rows, layout.cols_padded
    row_spec = pl.BlockSpec((br, cols_p), lambda i: (i, 0))
    vec_spec = pl.BlockSpec((1, cols_p), lambda i: (0, 0))
    x2d = x.reshape(rows, cols)
    out = pl.pallas_call(
        functools.partial(kernel, n_cols=cols),
        out_shape=out_struct((layout.rows_padded, cols_p), x2d.dtype, x2d, *vectors),
        grid=(layout.rows_padded // br,),
        in_specs=[row_spec] + [vec_spec] * len(vectors),
        out_specs=row_spec,
        compiler_params=gpu_compiler_params(block_sizes.num_warps, platform),
        interpret=interpret,
    )(layout.pad(x2d), *(layout.pad_vector(v) for v in vectors))
    return layout.unpad(out, x.shape)


# The row block's elements a thread may hold (as float32) before Triton spills, where a thread
# has its 255 registers (fewer at 16 warps: in proportion), calibrated against its compile for
# sm_90 at 8 x 4096 float32 (benchmarks/register_check.py): softmax, rms_norm and layer_norm
# spill at 256 (the default 64 rows, clamped to 8, on 4 warps: 344 B to 1.6 KB) and not at
# 128; their backward kernels (x, g and their products) at 128, and at 64 on 16 warps, not at
# 64 on fewer nor at 32 on 16.
GPU_ROW_ELEMS = 128
GPU_ROW_BWD_ELEMS = 64


def fits_rowwise(
    config: dict,
    sig,
    *,
    f32_temps: int = 3,
    row_arrays: int = 2,
    gpu_thread_elems: int | None = GPU_ROW_ELEMS,
) -> bool:
    """TPU: (8, 128) tiling of the row block and `row_arrays` double-buffered row blocks (in
    and out) plus float32 temporaries in VMEM; GPU: power-of-two blocks within Triton's element
    cap, the float32 working tile within shared memory (where Triton's reductions go), and at
    most `gpu_thread_elems` of the block's elements a thread (scaled down where the warps
    leave a thread fewer than 255 registers; None: no register model)."""
    if not sig.shapes or len(sig.shapes[0]) < 1:
        return True  # the kernel itself rejects such calls with a clear message
    shape = sig.shapes[0]
    layout = RowLayout.of(math.prod(shape[:-1]), shape[-1], config["block_rows"], sig.platform)
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    tile = layout.block_rows * layout.cols_padded
    if sig.platform == "tpu":
        vmem = 2 * row_arrays * tile * itemsize + f32_temps * tile * 4
        return tpu_block_ok(
            (layout.block_rows, layout.cols_padded), (layout.rows_padded, layout.cols_padded)
        ) and vmem <= mosaic_tpu.scoped_vmem_bytes(sig.device_kind)
    if sig.platform == "gpu":
        return (
            is_pow2(layout.block_rows)
            and tile <= TRITON_MAX_NUMEL
            and tile * 4 <= gpu_smem_bytes(sig.device_kind)
            and (gpu_thread_elems is None or _in_registers(layout, gpu_thread_elems, config))
        )
    return True


def _in_registers(layout: RowLayout, per_thread: int, config: dict) -> bool:
    """Whether the row block fits the registers of the config's warps; a row too long for the
    registers of any block (MOST_ROW_WARPS) spills whatever the block, and one row a block
    stays a candidate for it, so that such calls still tune."""
    if layout.block_rows * layout.cols_padded <= _row_elems(per_thread, config):
        return True
    widest = _row_elems(per_thread, {"num_warps": MOST_ROW_WARPS})
    return layout.block_rows == 1 and layout.cols_padded > widest


MOST_ROW_WARPS = 16  # the row kernels' GPU spaces' most warps (search_spaces/*.toml)


def _row_elems(per_thread: int, config: dict) -> float:
    """The row block's elements a block of the config's warps may hold (see GPU_ROW_ELEMS)."""
    warps = config["num_warps"]
    share = gpu_thread_register_cap(warps) / GPU_MAX_REGISTERS_PER_THREAD
    return per_thread * share * GPU_WARP * warps


def gpu_compiler_params(num_warps: int, platform: str, num_stages: int = 1):
    """Triton knobs on GPU; the TPU and interpret paths take the compiler's defaults."""
    return triton.compiler_params(num_warps, num_stages, platform)


def row_grads_call(
    kernel,
    rows: list[jax.Array],
    vectors: list[jax.Array],
    n_sums: int,
    *,
    block_sizes: BlockSizes,
    interpret: bool,
) -> list[jax.Array]:
    """Run `kernel(*row_refs, *vector_refs, dx_ref, *sum_refs)` over row blocks; returns dx in
    the rows' shape and `n_sums` column sums (float32, one per vector gradient)."""
    shape = rows[0].shape
    n_rows, cols = check_rows("row gradient", rows[0])
    platform = kernel_platform(interpret)
    layout = RowLayout.of(n_rows, cols, block_sizes.block_rows, platform)
    br, cols_p = layout.block_rows, layout.cols_padded
    blocks = layout.rows_padded // br
    row_spec = pl.BlockSpec((br, cols_p), lambda i: (i, 0))
    vec_spec = pl.BlockSpec((1, cols_p), lambda i: (0, 0))
    sum_spec = pl.BlockSpec((None, 1, cols_p), lambda i: (i, 0, 0))
    outs = pl.pallas_call(
        kernel,
        out_shape=[out_struct((layout.rows_padded, cols_p), rows[0].dtype, *rows, *vectors)]
        + [out_struct((blocks, 1, cols_p), F32, *rows, *vectors)] * n_sums,
        grid=(blocks,),
        in_specs=[row_spec] * len(rows) + [vec_spec] * len(vectors),
        out_specs=[row_spec] + [sum_spec] * n_sums,
        compiler_params=gpu_compiler_params(block_sizes.num_warps, platform),
        interpret=interpret,
    )(*(layout.pad(a.reshape(n_rows, cols)) for a in rows), *map(layout.pad_vector, vectors))
    dx = layout.unpad(outs[0], shape)
    return [dx] + [s.sum(axis=(0, 1))[:cols] for s in outs[1:]]


def check_like(name: str, x: jax.Array, g: jax.Array, *vectors: jax.Array) -> None:
    if g.shape != x.shape or g.dtype != x.dtype:
        raise ValueError(f"{name} needs g of x's shape and dtype, got {x.shape=} {g.shape=}")
    for v in vectors:
        if v.shape != (x.shape[-1],):
            raise ValueError(f"{name} needs a weight of shape ({x.shape[-1]},), got {v.shape=}")
