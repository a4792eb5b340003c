"""JAX's megablox grouped matmuls (`jax.experimental.pallas.ops.tpu.megablox`), called
unedited, with their tiling tuned: `megablox_gmm` (lhs [m, k] times each group's rhs [k, n],
the rows of group i the i-th run of `group_sizes`: a mixture-of-experts layer's expert
projection) and `megablox_tgmm` (its transpose, per group lhs [k, rows] @ rhs [rows, n]: the
rhs gradient). The arguments are JAX's, in JAX's order; the tunables are JAX's `tiling=(tm,
tk, tn)`, as a `Tiling`.

Differentiable as JAX's own megablox ops are: d lhs is a gmm of the cotangent with rhs
transposed, d rhs a tgmm, each tuned under its own key. The group sizes are data the tuner
makes by a workload (kernels/megablox/workloads.py): balanced or skewed.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp

from autotune import Example, autotuned
from autotune.backends import mosaic_tpu
from autotune.backends.hardware import tpu_block_ok
from autotune.kernels.differentiable import differentiable
from autotune.kernels.megablox.workloads import group_size_workloads
from autotune.registry.varying import unchecked

# the example: 32 tokens of width 128 over 4 experts of 128 outputs
EXAMPLE = "f32[32,128],f32[4,128,128],s32[4]"
EXAMPLE_T = "f32[128,32],f32[32,128],s32[4]"
PIPELINE_BUFFERS = 2  # each input tile is double-buffered by the TPU pipeline


def _jax_gmm():
    # the module, not the package's custom-VJP `gmm`: the VJP is ours, tuned per call
    return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


@dataclasses.dataclass(frozen=True)
class Tiling:
    """JAX's `tiling=(tm, tk, tn)`: rows of lhs per tile (within a group's run), the k and
    n tiles."""

    tm: int = 128
    tk: int = 128
    tn: int = 128

    def __iter__(self):
        return iter((self.tm, self.tk, self.tn))


def vmem_bytes(tm: int, tk: int, tn: int, itemsize: int, out_itemsize: int) -> int:
    """VMEM of one grid step of JAX's kernels: the lhs and rhs tiles and the output tile
    double-buffered, and the float32 accumulator."""
    inputs = (tm * tk + tk * tn) * itemsize + tm * tn * out_itemsize
    return PIPELINE_BUFFERS * inputs + tm * tn * 4


def _fits(tm: int, tk: int, tn: int, m: int, k: int, n: int, tiles, sig) -> bool:
    """JAX's rule (tm divides m), no tile past its dimension, and on a TPU the (8, 128) rule
    for every block and the step's VMEM within the default scoped limit (JAX's kernels set
    none)."""
    if m % tm or tm > m or tk > k or tn > n:
        return False
    if sig.platform != "tpu":
        return True
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    return all(tpu_block_ok(b, a) for b, a in tiles) and vmem_bytes(
        tm, tk, tn, itemsize, itemsize
    ) <= mosaic_tpu.scoped_vmem_bytes(sig.device_kind)


def fits_gmm(config: dict, sig) -> bool:
    if len(sig.shapes) != 3 or len(sig.shapes[0]) != 2 or len(sig.shapes[1]) != 3:
        return True  # JAX's kernel rejects such calls with its own message
    (m, k), (_, k1, n1) = sig.shapes[0], sig.shapes[1]
    n = k1 if sig.static.get("transpose_rhs") else n1
    tm, tk, tn = config["tm"], config["tk"], config["tn"]
    rhs = ((tn, tk), (n, k)) if sig.static.get("transpose_rhs") else ((tk, tn), (k, n))
    return _fits(tm, tk, tn, m, k, n, [((tm, tk), (m, k)), rhs, ((tm, tn), (m, n))], sig)


def fits_tgmm(config: dict, sig) -> bool:
    if len(sig.shapes) != 3 or len(sig.shapes[0]) != 2 or len(sig.shapes[1]) != 2:
        return True
    (k, m), (_, n) = sig.shapes[0], sig.shapes[1]
    tm, tk, tn = config["tm"], config["tk"], config["tn"]
    # JAX's tgmm swaps lhs to [m, k] before its Pallas call: its blocks are (tm, tk)
    tiles = [((tm, tk), (m, k)), ((tm, tn), (m, n)), ((tk, tn), (k, n))]
    return _fits(tm, tk, tn, m, k, n, tiles, sig)


def group_ids(group_sizes: jax.Array, m: int) -> jax.Array:
    """Each of the m rows' group (len(group_sizes) for the rows past their sum)."""
    ends = jnp.cumsum(group_sizes)
    return jnp.searchsorted(ends, jnp.arange(m), side="right")


def gmm_reference(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool = False
) -> jax.Array:
    """Plain JAX: jax.lax.ragged_dot at full float32 precision (rows past the groups: 0)."""
    if transpose_rhs:
        rhs = jnp.swapaxes(rhs, 1, 2)
    out = jax.lax.ragged_dot(
        lhs, rhs, group_sizes, precision="highest", preferred_element_type=jnp.float32
    )
    return out.astype(lhs.dtype)


def tgmm_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Plain JAX: per group g, lhs[:, rows of g] @ rhs[rows of g] ([groups, k, n])."""
    groups, m = group_sizes.shape[0], lhs.shape[1]
    member = group_ids(group_sizes, m)[None, :] == jnp.arange(groups)[:, None]
    f32 = jnp.float32
    out = jnp.einsum(
        "km,gm,mn->gkn", lhs.astype(f32), member.astype(f32), rhs.astype(f32), precision="highest"
    )
    return out.astype(lhs.dtype)


def _gmm_bwd(inputs: tuple, g: jax.Array, *, transpose_rhs: bool, interpret: bool, **_) -> tuple:
    """JAX's megablox VJP: d lhs = g @ rhs^T per group (a gmm), d rhs = lhs^T @ g per group
    (a tgmm); the group sizes are integers (no cotangent)."""
    lhs, rhs, group_sizes = inputs
    dlhs = megablox_gmm(
        g.astype(lhs.dtype), rhs, group_sizes, transpose_rhs=not transpose_rhs, interpret=interpret
    )
    drhs = megablox_tgmm(lhs.swapaxes(0, 1), g.astype(lhs.dtype), group_sizes, interpret=interpret)
    if transpose_rhs:
        drhs = drhs.swapaxes(1, 2)
    return dlhs, drhs.astype(rhs.dtype), None


@autotuned(
    name="megablox_gmm",
    space="megablox_gmm",
    constraints=[fits_gmm],
    reference=gmm_reference,
    backend="mosaic_tpu",
    tuned="../tuned",
    example=Example(EXAMPLE),
    backward=("megablox_gmm", "megablox_tgmm"),
    workloads=group_size_workloads(lambda args: args[0].shape[0], 2),
)
@differentiable(_gmm_bwd)
def megablox_gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    block_sizes: Tiling = Tiling(),
    interpret: bool = False,
) -> jax.Array:
    """JAX's megablox `gmm(lhs [m, k], rhs [groups, k, n], group_sizes int32 [groups])` ->
    [m, n] in lhs's dtype, at the tuned tiling; rhs [groups, n, k] with `transpose_rhs`. The
    rows past the groups' sum are 0 (JAX's kernel leaves them unwritten)."""
    out = unchecked(
        _jax_gmm().gmm,
        lhs,
        rhs,
        group_sizes,
        preferred_element_type=lhs.dtype,
        tiling=tuple(block_sizes),
        transpose_rhs=transpose_rhs,
        interpret=interpret,
    )
    routed = jnp.arange(lhs.shape[0]) < jnp.sum(group_sizes)
    return jnp.where(routed[:, None], out, jnp.zeros((), out.dtype))


@autotuned(
    name="megablox_tgmm",
    space="megablox_tgmm",
    constraints=[fits_tgmm],
    reference=tgmm_reference,
    backend="mosaic_tpu",
    tuned="../tuned",
    example=Example(EXAMPLE_T),
    workloads=group_size_workloads(lambda args: args[0].shape[1], 2),
)
def megablox_tgmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    block_sizes: Tiling = Tiling(),
    interpret: bool = False,
) -> jax.Array:
    """JAX's megablox `tgmm(lhs [k, m], rhs [m, n], group_sizes int32 [groups])` ->
    [groups, k, n] in lhs's dtype, at the tuned tiling."""
    return unchecked(
        _jax_gmm().tgmm,
        lhs,
        rhs,
        group_sizes,
        preferred_element_type=lhs.dtype,
        tiling=tuple(block_sizes),
        interpret=interpret,
    )
