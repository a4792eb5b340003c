"""What matmul and bmm share: an [M, K] x [K, N] product tiled into (block_m, block_n)
output tiles and block_k steps of K, per platform.

Shapes that are not multiples of the block sizes are zero-padded up to them (zeros add nothing
to a dot product) and the result is sliced back, so every block size is valid for every shape;
a block larger than its dimension is clamped to the dimension (on GPU, to the power of two
that covers it: Triton blocks are powers of two).

On a TPU (and when lowered for one, or run under TPU interpret mode) the product has its own
body, `tpu_call`: the grid walks (M, N, K) tiles with K last, and the float32 sum lives in VMEM
scratch, so VMEM holds three tiles whatever K is (the layout of JAX's ops/tpu/matmul.py). The
GPU (and interpret-mode) body is `tile_kernel`: one output tile, K walked inside it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import out_struct
from autotune.backends import clamp_block, mosaic_tpu
from autotune.backends.hardware import (
    GPU_TILE_REGISTERS,
    gpu_registers_ok,
    gpu_smem_bytes,
    is_pow2,
    tpu_block_ok,
)
from autotune.kernels.precision import ACC_DTYPE


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
        stages = config["num_stages"]
        smem = stages * (bm * bk + bk * bn) * itemsize
        return (
            all(is_pow2(b) and b >= 16 for b in (bm, bn, bk))
            and smem <= gpu_smem_bytes(sig.device_kind)
            # the float32 accumulator and the output tile's 64-bit addresses (jax's Triton store
            # takes one a element): 3 registers an element, 64 elements a thread at most
            # (128 x 128 on 4 warps spills on sm_90, on 8 warps it does not: register_check.py)
            and gpu_registers_ok(3 * bm * bn, config["num_warps"], budget=GPU_TILE_REGISTERS)
        )
    return True


# A GPU's default where the block sizes' own spill registers: 128 x 128 x 128 on 4 warps holds
# its float32 accumulator and the output tile's addresses in 255 registers a thread only by
# spilling (Triton's compile for sm_90, autotune check --registers); 64-deep K steps on 8
# warps, 3 stages, spill nothing (157 registers), Triton's own Hopper choice for bf16.
GPU_DEFAULTS = {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}
# A TPU's: tiles as large as JAX's own TPU matmul takes at large shapes (fewer grid steps, each
# amortising its DMA), clamped to the call's dimensions; where they overflow the chip's VMEM the
# constraints refuse them and the nearest that fits is taken (KernelSpec.default_config).
TPU_DEFAULTS = {"block_m": 512, "block_n": 512, "block_k": 1024}


def platform_defaults(sig) -> dict | None:
    """matmul's and bmm's defaults on a GPU and on a TPU (see GPU_DEFAULTS, TPU_DEFAULTS);
    elsewhere (interpret mode) the block sizes' own."""
    return {"gpu": GPU_DEFAULTS, "tpu": TPU_DEFAULTS}.get(sig.platform)


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
