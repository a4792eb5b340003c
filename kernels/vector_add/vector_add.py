"""The hello-world of Pallas: x + y, blocked over a 1-D grid with a tunable block size.

The vector is laid out as rows of 128 lanes and blocked by whole rows: lane-dense on a TPU,
and a rank-2 block, whose (8, 128) rule Pallas checks without asking the device (its rank-1
rule reads the TPU generation, so a rank-1 kernel cannot be lowered for TPU on a CPU host).
A length that is not a multiple of the block is zero-padded up to it and sliced back.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned, out_struct
from autotune.backends import clamp_block, kernel_platform, mosaic_tpu, triton
from autotune.backends.hardware import TPU_LANES, is_pow2, tpu_block_ok
from autotune.kernels.differentiable import differentiable


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """vector_add's tunables: elements per block (whole rows of 128 lanes); Triton's warps."""

    block: int = 1024
    num_warps: int = 4


def _block(block: int, n: int, platform: str) -> int:
    """Elements per block: whole rows of lanes, no more than the block that holds the
    row-padded vector (on a GPU a power of two of them: Triton's arrays are)."""
    return clamp_block(block, pl.cdiv(n, TPU_LANES) * TPU_LANES, platform)


def fits_platform(config: dict, sig) -> bool:
    """Whole rows of lanes; TPU: the (8, 128) rule on rows and VMEM; GPU: power-of-two blocks."""
    n = sig.shapes[0][0] if sig.shapes and len(sig.shapes[0]) == 1 else None
    if n is None:
        return True  # the kernel itself rejects such calls with a clear message
    if config["block"] % TPU_LANES:
        return False
    block = _block(config["block"], n, sig.platform)
    if sig.platform == "tpu":
        rows = pl.cdiv(n, block) * block // TPU_LANES
        vmem = 3 * 2 * block * jnp.dtype(sig.dtypes[0]).itemsize  # x, y, out; double-buffered
        return tpu_block_ok((block // TPU_LANES, TPU_LANES), (rows, TPU_LANES)) and (
            vmem <= mosaic_tpu.scoped_vmem_bytes(sig.device_kind)
        )
    if sig.platform == "gpu":
        return is_pow2(block)
    return True


def vector_add_reference(x: jax.Array, y: jax.Array) -> jax.Array:
    return x + y


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _fwd(forward, x: jax.Array, y: jax.Array, **options) -> tuple[jax.Array, None]:
    return forward(x, y, **options), None  # the backward needs neither input


def _bwd(_: None, g: jax.Array, **__) -> tuple:
    return g, g  # d(x + y) = dx + dy: no kernel to run


@autotuned(
    name="vector_add",
    space="vector_add",
    constraints=[fits_platform],
    reference=vector_add_reference,
    tuned="../tuned",
    split=Split("n,n->n", along="n"),
    example=Example("f32[300],f32[300]"),
    backward=(),
)
@differentiable(_bwd, _fwd)
def vector_add(
    x: jax.Array, y: jax.Array, *, block_sizes: BlockSizes = BlockSizes(), interpret: bool = False
) -> jax.Array:
    """x + y for 1-D arrays of one shape and dtype; `block` is a multiple of 128."""
    block = block_sizes.block
    if x.ndim != 1 or x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"vector_add needs two 1-D arrays of one shape and dtype, got {x.shape=} {y.shape=}"
        )
    if block <= 0 or block % TPU_LANES:
        raise ValueError(
            f"vector_add needs a block that is a multiple of {TPU_LANES}, got {block=}"
        )
    n = x.shape[0]
    platform = kernel_platform(interpret)
    b = _block(block, n, platform)
    padded = pl.cdiv(n, b) * b
    if padded != n:
        x, y = (jnp.pad(a, (0, padded - n)) for a in (x, y))
    x, y = (a.reshape(padded // TPU_LANES, TPU_LANES) for a in (x, y))
    spec = pl.BlockSpec((b // TPU_LANES, TPU_LANES), lambda i: (i, 0))
    out = pl.pallas_call(
        _kernel,
        out_shape=out_struct(x.shape, x.dtype, x, y),
        grid=(padded // b,),
        in_specs=[spec, spec],
        out_specs=spec,
        compiler_params=triton.compiler_params(block_sizes.num_warps, None, platform),
        interpret=interpret,
    )(x, y)
    out = out.reshape(padded)
    return out[:n] if padded != n else out
