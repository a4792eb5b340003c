"""The hello-world of Pallas: x + y, blocked over a 1-D grid with a tunable block size.

A length that is not a multiple of the block is zero-padded up to it and sliced back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import autotuned
from autotune.hardware import is_pow2, tpu_block_1d_ok


def fits_platform(config: dict, sig) -> bool:
    """TPU: the rank-1 block rule; GPU (Triton): power-of-two blocks."""
    n = sig.shapes[0][0] if sig.shapes and len(sig.shapes[0]) == 1 else None
    if n is None:
        return True  # the kernel itself rejects such calls with a clear message
    block = min(config["block"], n)
    if sig.platform == "tpu":
        bits = 8 * jnp.dtype(sig.dtypes[0]).itemsize
        return tpu_block_1d_ok(block, pl.cdiv(n, block) * block, bits)
    if sig.platform == "gpu":
        return is_pow2(block)
    return True


def vector_add_reference(x: jax.Array, y: jax.Array) -> jax.Array:
    return x + y


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@autotuned(
    name="vector_add",
    space="vector_add",
    constraints=[fits_platform],
    reference=vector_add_reference,
)
def vector_add(
    x: jax.Array, y: jax.Array, *, block: int = 1024, interpret: bool = False
) -> jax.Array:
    """x + y for 1-D arrays of one shape and dtype."""
    if x.ndim != 1 or x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"vector_add needs two 1-D arrays of one shape and dtype, got {x.shape=} {y.shape=}"
        )
    n = x.shape[0]
    b = min(block, n)
    padded = pl.cdiv(n, b) * b
    if padded != n:
        x, y = (jnp.pad(a, (0, padded - n)) for a in (x, y))
    spec = pl.BlockSpec((b,), lambda i: (i,))
    out = pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((padded,), x.dtype),
        grid=(padded // b,),
        in_specs=[spec, spec],
        out_specs=spec,
        interpret=interpret,
    )(x, y)
    return out[:n] if padded != n else out
