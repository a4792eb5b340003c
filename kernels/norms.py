"""rms_norm and layer_norm over the last axis, with a per-column weight (and bias).

Statistics are computed in float32, `block_rows` rows per grid step; leading axes are flattened
into rows (kernels/rowwise.py pads and masks).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from autotune import Split, autotuned
from autotune.backends import kernel_platform
from autotune.kernels.differentiable import differentiable
from autotune.kernels.rowwise import F32, fits_rowwise, lane_mask, rowwise_on


def fits_platform(config: dict, sig) -> bool:
    """The row-block rules of kernels/rowwise.py (x, the centred x and the output in float32)."""
    return fits_rowwise(config, sig, f32_temps=3)


def rms_norm_reference(x: jax.Array, weight: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    xf = x.astype(F32)
    rms = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * rms * weight.astype(F32)).astype(x.dtype)


def layer_norm_reference(
    x: jax.Array, weight: jax.Array, bias: jax.Array, *, eps: float = 1e-5
) -> jax.Array:
    xf = x.astype(F32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean((xf - mean) ** 2, axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return (y * weight.astype(F32) + bias.astype(F32)).astype(x.dtype)


# The row statistics of a float32 row block whose lanes from `n_cols` on are padding (zeros),
# as the forward kernels compute them and their backward kernels (kernels/row_grads.py)
# recompute them.


def inverse_rms(x: jax.Array, n_cols: int, eps: float) -> jax.Array:
    """1 / sqrt(mean(x**2) + eps) of each row (padded lanes are zeros: they add nothing)."""
    return jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) / n_cols + eps)


def standardised(x: jax.Array, n_cols: int, eps: float) -> tuple[jax.Array, jax.Array]:
    """(x - mean) / sqrt(var + eps) of each row, with 0 in its padded lanes, and the
    1 / sqrt(var + eps) it was scaled by."""
    centred = x - jnp.sum(x, axis=-1, keepdims=True) / n_cols
    if n_cols != x.shape[-1]:  # a padded lane is 0 - mean, not 0: keep it out of the sums
        centred = jnp.where(lane_mask(x.shape, n_cols), centred, 0.0)
    r = jax.lax.rsqrt(jnp.sum(centred * centred, axis=-1, keepdims=True) / n_cols + eps)
    return centred * r, r


def _rms_kernel(x_ref, w_ref, o_ref, *, n_cols: int, eps: float):
    x = x_ref[...].astype(F32)
    o_ref[...] = (x * inverse_rms(x, n_cols, eps) * w_ref[...].astype(F32)).astype(o_ref.dtype)


def _layer_kernel(x_ref, w_ref, b_ref, o_ref, *, n_cols: int, eps: float):
    y, _ = standardised(x_ref[...].astype(F32), n_cols, eps)
    o_ref[...] = (y * w_ref[...].astype(F32) + b_ref[...].astype(F32)).astype(o_ref.dtype)


def _check_vectors(name: str, x: jax.Array, **vectors: jax.Array) -> None:
    for vname, v in vectors.items():
        if v.shape != (x.shape[-1],):
            raise ValueError(f"{name} needs {vname} of shape ({x.shape[-1]},), got {v.shape=}")


def norm_on(
    name: str,
    x: jax.Array,
    vectors: list[jax.Array],
    *,
    eps: float,
    block_rows: int,
    num_warps: int,
    platform: str,
    interpret: bool,
) -> jax.Array:
    """rms_norm (one vector: weight) or layer_norm (weight, bias) laid out for `platform`."""
    body = _rms_kernel if name == "rms_norm" else _layer_kernel
    return rowwise_on(
        name,
        functools.partial(body, eps=float(eps)),
        x,
        vectors,
        block_rows=block_rows,
        num_warps=num_warps,
        platform=platform,
        interpret=interpret,
    )


def _rms_bwd(inputs: tuple, g: jax.Array, *, eps: float, interpret: bool, **_) -> tuple:
    # imported here: row_grads imports this module for the forward's reference
    from autotune.kernels.row_grads import rms_norm_bwd

    x, weight = inputs
    return rms_norm_bwd(x, weight, g, eps=eps, interpret=interpret)


def _layer_bwd(inputs: tuple, g: jax.Array, *, eps: float, interpret: bool, **_) -> tuple:
    from autotune.kernels.row_grads import layer_norm_bwd

    x, weight, bias = inputs
    dx, dweight, dbias = layer_norm_bwd(x, weight, g, eps=eps, interpret=interpret)
    return dx, dweight, dbias.astype(bias.dtype)


@autotuned(
    name="rms_norm",
    space="rms_norm",
    constraints=[fits_platform],
    reference=rms_norm_reference,
    tuned="tuned",
    split=Split("...c,c->...c", along="..."),
)
@differentiable(_rms_bwd)
def rms_norm(
    x: jax.Array,
    weight: jax.Array,
    *,
    eps: float = 1e-6,
    block_rows: int = 64,
    num_warps: int = 4,
    interpret: bool = False,
) -> jax.Array:
    """x / sqrt(mean(x**2, last axis) + eps) * weight, in float32, returned in x's dtype.
    Differentiable: the backward is the tuned kernel rms_norm_bwd."""
    _check_vectors("rms_norm", x, weight=weight)
    platform = kernel_platform(interpret)
    options = dict(eps=eps, block_rows=block_rows, num_warps=num_warps)
    return norm_on("rms_norm", x, [weight], platform=platform, interpret=interpret, **options)


@autotuned(
    name="layer_norm",
    space="layer_norm",
    constraints=[fits_platform],
    reference=layer_norm_reference,
    tuned="tuned",
    split=Split("...c,c,c->...c", along="..."),
)
@differentiable(_layer_bwd)
def layer_norm(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array,
    *,
    eps: float = 1e-5,
    block_rows: int = 64,
    num_warps: int = 4,
    interpret: bool = False,
) -> jax.Array:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, in float32.
    Differentiable: the backward is the tuned kernel layer_norm_bwd."""
    _check_vectors("layer_norm", x, weight=weight, bias=bias)
    platform = kernel_platform(interpret)
    options = dict(eps=eps, block_rows=block_rows, num_warps=num_warps)
    return norm_on(
        "layer_norm", x, [weight, bias], platform=platform, interpret=interpret, **options
    )
