"""JAX's Hopper grouped matmul (`jax.experimental.pallas.ops.gpu.ragged_dot_mgpu.ragged_dot`, Mosaic
GPU: TMA and wgmma, a persistent grid over the SMs), called unedited, with its blocks, pipeline
depth and grid walk tuned: the `ragged_dot` group's member on Hopper GPUs. JAX's argument order
(lhs [m, k], rhs [groups, k, n], group sizes int32 [groups]), 16-bit inputs of one dtype.

Differentiable: d lhs is ragged_dot_mgpu of the cotangent with rhs transposed (tuned, under its
own key); d rhs is XLA's (the VJP of jax.lax.ragged_dot). The rows past the groups' sum are 0.
No GPU here: on a CPU host its candidates are lowered for a Hopper GPU (`autotune check
--platform gpu`), as Mosaic GPU's lowering runs anywhere.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from autotune import Example, autotuned
from autotune.backends import mosaic_gpu as backend
from autotune.kernels.differentiable import differentiable
from autotune.kernels.megablox.megablox import gmm_reference
from autotune.kernels.megablox.workloads import group_size_workloads
from autotune.kernels.ragged_dot.backward import lhs_by_kernel
from autotune.registry.varying import vary_like

DTYPES = ("bfloat16", "float16")
WGMMA_M = 64  # block_m: whole warpgroup MMA rows
WGMMA_N = 8  # block_n: wgmma's N step
EXAMPLE = "f16[256,128],f16[4,128,256],s32[4]"


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """JAX's tunables: the output tile, the K step, the pipeline's depth, the output tiles a
    grid column walks (`grid_block_n`)."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    max_concurrent_steps: int = 2
    grid_block_n: int = 1


def smem_bytes(config: dict, itemsize: int) -> int:
    """JAX's kernel's shared memory: `max_concurrent_steps` lhs and rhs tiles, the output tile,
    the pipeline's barriers."""
    bm, bn, bk, steps = (
        config[f] for f in ("block_m", "block_n", "block_k", "max_concurrent_steps")
    )
    return (steps * (bm * bk + bk * bn) + bm * bn) * itemsize + 2 * steps * backend.BARRIER_BYTES


def fits_hopper(config: dict, sig) -> bool:
    """JAX's rules (16-bit, k a multiple of block_k), wgmma's (block_m whole 64-row MMAs,
    block_n a multiple of 8 up to 256, block_k a whole swizzle), shared memory within the
    limit."""
    if len(sig.shapes) != 3 or len(sig.shapes[0]) != 2 or len(sig.shapes[1]) != 3:
        return True
    k = sig.shapes[0][1]
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
    return (
        sig.dtypes[0] in DTYPES
        and k % bk == 0
        and bm % WGMMA_M == 0
        and bn % WGMMA_N == 0
        and bn <= 256
        and backend.swizzle_bytes(bk * itemsize) is not None
        and smem_bytes(config, itemsize) <= backend.smem_limit(sig.device_kind)
    )


@autotuned(
    name="ragged_dot_mgpu",
    space="ragged_dot_mgpu",
    constraints=[fits_hopper],
    reference=gmm_reference,
    backend="mosaic_gpu",
    tuned="../tuned",
    example=Example(EXAMPLE),
    backward=("ragged_dot_mgpu",),
    workloads=group_size_workloads(lambda args: args[0].shape[0], 2),
)
@differentiable(lhs_by_kernel(lambda: ragged_dot_mgpu))
def ragged_dot_mgpu(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """JAX's Hopper ragged_dot(lhs [m, k], rhs [groups, k, n], group_sizes) -> [m, n] at the
    tuned blocks; rhs [groups, n, k] with `transpose_rhs`; the rows past the groups 0.
    `interpret=True` runs it in GPU interpret mode (very slow: it simulates the GPU)."""
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as jax_ragged

    with backend.interpret_mode() if interpret else _nothing():
        out = jax_ragged.ragged_dot(
            lhs,
            rhs,
            group_sizes=group_sizes,
            transpose_rhs=transpose_rhs,
            **dataclasses.asdict(block_sizes),
        )
    routed = jnp.arange(lhs.shape[0]) < jnp.sum(group_sizes)
    out = jnp.where(routed[:, None], out, jnp.zeros((), out.dtype))
    # inside shard_map, typed to vary as its inputs do: Mosaic GPU's kernels lose the type
    return vary_like(out, lhs, rhs, group_sizes)


def _nothing():
    import contextlib

    return contextlib.nullcontext()
