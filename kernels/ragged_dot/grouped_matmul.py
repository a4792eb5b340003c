"""grouped_matmul: a grouped matmul of our own for the Triton backend (GPUs without Mosaic GPU's
`ragged_dot_mgpu`), the `ragged_dot` group's GPU member there: lhs [m, k] times each group's rhs
[k, n], the rows of group i the i-th run of `group_sizes`.

One program per output tile: for each group whose rows meet the tile's, K walked in `block_k`
steps, the rows of other groups masked to zero (a tile that straddles two groups reads its rows
twice; a group that meets no row of the tile is skipped). m, k and n are zero-padded to the
blocks; the rows past the groups' sum come out 0. Differentiable: d lhs is grouped_matmul of the
cotangent with rhs transposed (the tuned kernel, under its own key); d rhs is XLA's (the VJP of
jax.lax.ragged_dot). It runs in interpret mode anywhere (how it is checked on a CPU host).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, autotuned, out_struct
from autotune.backends import clamp_block, kernel_platform, triton
from autotune.backends.hardware import gpu_registers_ok, gpu_smem_bytes, is_pow2
from autotune.kernels.differentiable import differentiable
from autotune.kernels.megablox.megablox import gmm_reference
from autotune.kernels.megablox.workloads import group_size_workloads
from autotune.kernels.precision import ACC_DTYPE
from autotune.kernels.ragged_dot.backward import lhs_by_kernel

EXAMPLE = "f32[32,64],f32[4,64,32],s32[4]"
MIN_TILE = 16  # tl.dot's smallest


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The output tile, the K step, Triton's warps and stages."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 2


def fits(config: dict, sig) -> bool:
    """Power-of-two tiles of at least 16 (tl.dot), no larger than their padded dimension needs;
    on a GPU `num_stages` lhs and rhs tiles within shared memory and the float32 accumulator
    in registers."""
    if len(sig.shapes) != 3 or len(sig.shapes[0]) != 2 or len(sig.shapes[1]) != 3:
        return True
    (m, k), rhs = sig.shapes[0], sig.shapes[1]
    n = rhs[1] if sig.static.get("transpose_rhs") else rhs[2]
    bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
    blocks = ((bm, m), (bn, n), (bk, k))
    if not all(is_pow2(b) and b >= MIN_TILE and b // 2 < max(d, MIN_TILE) for b, d in blocks):
        return False
    if sig.platform != "gpu":
        return True
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    smem = config["num_stages"] * (bm * bk + bk * bn) * itemsize
    return smem <= gpu_smem_bytes(sig.device_kind) and gpu_registers_ok(
        bm * bn, config["num_warps"]
    )


def _kernel(ends_ref, lhs_ref, rhs_ref, o_ref, *, groups, block_k, n_k, transpose_rhs):
    block_m = o_ref.shape[0]
    first = pl.program_id(0) * block_m
    rows = first + jnp.arange(block_m)

    def group(g, acc):
        start = jnp.where(g == 0, 0, ends_ref[jnp.maximum(g - 1, 0)])
        end = ends_ref[g]
        member = ((rows >= start) & (rows < end))[:, None]

        def step(i, acc):
            x = jnp.where(member, lhs_ref[:, pl.ds(i * block_k, block_k)], 0)
            if transpose_rhs:
                w = rhs_ref[g, :, pl.ds(i * block_k, block_k)].T
            else:
                w = rhs_ref[g, pl.ds(i * block_k, block_k), :]
            return acc + jnp.dot(x, w, preferred_element_type=ACC_DTYPE)

        meets = (start < first + block_m) & (end > first) & (end > start)
        return jax.lax.cond(meets, lambda a: jax.lax.fori_loop(0, n_k, step, a), lambda a: a, acc)

    acc = jax.lax.fori_loop(0, groups, group, jnp.zeros(o_ref.shape, ACC_DTYPE))
    o_ref[...] = acc.astype(o_ref.dtype)


@autotuned(
    name="grouped_matmul",
    space="grouped_matmul",
    constraints=[fits],
    reference=gmm_reference,
    backend="triton",
    tuned="../tuned",
    example=Example(EXAMPLE),
    backward=("grouped_matmul",),
    workloads=group_size_workloads(lambda args: args[0].shape[0], 2),
)
@differentiable(lhs_by_kernel(lambda: grouped_matmul))
def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """lhs [m, k] times rhs [groups, k, n] ([groups, n, k] with `transpose_rhs`) per group of
    rows (`group_sizes` int32 [groups]) -> [m, n] in lhs's dtype; rows past the groups 0."""
    (m, k), groups = lhs.shape, rhs.shape[0]
    n, k_rhs = (rhs.shape[1], rhs.shape[2]) if transpose_rhs else (rhs.shape[2], rhs.shape[1])
    if k_rhs != k or group_sizes.shape != (groups,):
        raise ValueError(
            f"grouped_matmul needs lhs [m, k], rhs [groups, k, n] ([groups, n, k] with "
            f"transpose_rhs) and group_sizes [groups], got {lhs.shape=} {rhs.shape=} "
            f"{group_sizes.shape=} {transpose_rhs=}"
        )
    platform = kernel_platform(interpret)
    b = block_sizes
    bm, bn, bk = (
        clamp_block(x, d, platform) for x, d in ((b.block_m, m), (b.block_n, n), (b.block_k, k))
    )
    mp, np_, kp = (pl.cdiv(d, x) * x for d, x in ((m, bm), (n, bn), (k, bk)))
    lhs_p = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    pad = (
        ((0, 0), (0, np_ - n), (0, kp - k))
        if transpose_rhs
        else ((0, 0), (0, kp - k), (0, np_ - n))
    )
    rhs_p = jnp.pad(rhs, pad)
    rhs_block = (groups, bn, kp) if transpose_rhs else (groups, kp, bn)
    rhs_index = (lambda i, j: (0, j, 0)) if transpose_rhs else (lambda i, j: (0, 0, j))
    ends = jnp.cumsum(group_sizes).astype(jnp.int32)
    out = pl.pallas_call(
        functools.partial(
            _kernel, groups=groups, block_k=bk, n_k=kp // bk, transpose_rhs=transpose_rhs
        ),
        out_shape=out_struct((mp, np_), lhs.dtype, lhs_p, rhs_p),
        grid=(mp // bm, np_ // bn),
        in_specs=[
            pl.BlockSpec((groups,), lambda i, j: (0,)),
            pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
            pl.BlockSpec(rhs_block, rhs_index),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        compiler_params=triton.compiler_params(b.num_warps, b.num_stages, platform),
        interpret=interpret,
    )(ends, lhs_p, rhs_p)
    return out[:m, :n]
