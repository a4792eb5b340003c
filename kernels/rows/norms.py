"""rms_norm and layer_norm over the last axis, with a per-column weight (and bias), and their
backward kernels.

Statistics are computed in float32, `block_rows` rows per grid step; leading axes are flattened
into rows (layout.py pads and masks). Differentiable: each backward is a kernel of its own
(`rms_norm_bwd`, `layer_norm_bwd`, tuned apart from the forward), which takes the forward's
inputs and the output's cotangent g and recomputes the row statistics from x, so the forward
keeps nothing but its inputs; its reference is the VJP of the forward's reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from autotune import Example, Split, autotuned
from autotune.backends import kernel_platform
from autotune.kernels.differentiable import differentiable
from autotune.kernels.rows.layout import (
    F32,
    GPU_ROW_BWD_ELEMS,
    BlockSizes,
    check_like,
    fits_rowwise,
    lane_mask,
    row_grads_call,
    rowwise_on,
)


def fits_platform(config: dict, sig) -> bool:
    """The row-block rules of layout.py (x, the centred x and the output in float32)."""
    return fits_rowwise(config, sig, f32_temps=3)


def fits_platform_bwd(config: dict, sig) -> bool:
    """The row-block rules of layout.py, for x and g in, dx out and float32 temporaries."""
    return fits_rowwise(config, sig, f32_temps=6, row_arrays=3, gpu_thread_elems=GPU_ROW_BWD_ELEMS)


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
# as the forward kernels compute them and their backward kernels recompute them.


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


def rms_norm_bwd_reference(
    x: jax.Array, weight: jax.Array, g: jax.Array, *, eps: float = 1e-6
) -> tuple[jax.Array, jax.Array]:
    return jax.vjp(functools.partial(rms_norm_reference, eps=eps), x, weight)[1](g)


def layer_norm_bwd_reference(
    x: jax.Array, weight: jax.Array, g: jax.Array, *, eps: float = 1e-5
) -> tuple[jax.Array, jax.Array, jax.Array]:
    # the bias's value changes no gradient: zeros stand in for it
    forward = functools.partial(layer_norm_reference, eps=eps)
    return jax.vjp(forward, x, weight, jnp.zeros_like(weight))[1](g)


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
    block_sizes: BlockSizes,
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
        block_sizes=block_sizes,
        platform=platform,
        interpret=interpret,
    )


def _rms_bwd_kernel(x_ref, g_ref, w_ref, dx_ref, dw_ref, *, n_cols: int, eps: float):
    x, g, w = (r[...].astype(F32) for r in (x_ref, g_ref, w_ref))  # padded lanes: zeros
    r = inverse_rms(x, n_cols, eps)
    gw = g * w
    dot = jnp.sum(gw * x, axis=-1, keepdims=True) / n_cols
    dx_ref[...] = (r * (gw - x * (r * r) * dot)).astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(g * x * r, axis=0, keepdims=True)


def _layer_bwd_kernel(x_ref, g_ref, w_ref, dx_ref, dw_ref, db_ref, *, n_cols: int, eps: float):
    x, g, w = (r[...].astype(F32) for r in (x_ref, g_ref, w_ref))
    xhat, r = standardised(x, n_cols, eps)
    gw = g * w
    mean_gw = jnp.sum(gw, axis=-1, keepdims=True) / n_cols
    mean_gwx = jnp.sum(gw * xhat, axis=-1, keepdims=True) / n_cols
    dx_ref[...] = (r * (gw - mean_gw - xhat * mean_gwx)).astype(dx_ref.dtype)
    dw_ref[...] = jnp.sum(g * xhat, axis=0, keepdims=True)
    db_ref[...] = jnp.sum(g, axis=0, keepdims=True)


def _norm_grads(
    name: str,
    kernel,
    n_sums: int,
    x: jax.Array,
    weight: jax.Array,
    g: jax.Array,
    *,
    eps: float,
    block_sizes: BlockSizes,
    interpret: bool,
) -> tuple[jax.Array, ...]:
    """A norm's gradients: dx, and the `n_sums` vector gradients (dweight; layer_norm's dbias
    too) in the weight's dtype, from `kernel(x_ref, g_ref, w_ref, dx_ref, *sum_refs, n_cols,
    eps)`."""
    check_like(name, x, g, weight)
    if x.size == 0:
        return (x, *(jnp.zeros_like(weight) for _ in range(n_sums)))
    dx, *sums = row_grads_call(
        functools.partial(kernel, n_cols=x.shape[-1], eps=float(eps)),
        [x, g],
        [weight],
        n_sums,
        block_sizes=block_sizes,
        interpret=interpret,
    )
    return (dx, *(s.astype(weight.dtype) for s in sums))


def _rms_bwd(inputs: tuple, g: jax.Array, *, eps: float, interpret: bool, **_) -> tuple:
    x, weight = inputs
    return rms_norm_bwd(x, weight, g, eps=eps, interpret=interpret)


def _layer_bwd(inputs: tuple, g: jax.Array, *, eps: float, interpret: bool, **_) -> tuple:
    x, weight, bias = inputs
    dx, dweight, dbias = layer_norm_bwd(x, weight, g, eps=eps, interpret=interpret)
    return dx, dweight, dbias.astype(bias.dtype)


@autotuned(
    name="rms_norm",
    space="rms_norm",
    constraints=[fits_platform],
    reference=rms_norm_reference,
    tuned="../tuned",
    split=Split("...c,c->...c", along="..."),
    example=Example("f32[3,5,37],f32[37]"),
    backward=("rms_norm_bwd",),
)
@differentiable(_rms_bwd)
def rms_norm(
    x: jax.Array,
    weight: jax.Array,
    *,
    eps: float = 1e-6,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """x / sqrt(mean(x**2, last axis) + eps) * weight, in float32, returned in x's dtype.
    Differentiable: the backward is the tuned kernel rms_norm_bwd."""
    _check_vectors("rms_norm", x, weight=weight)
    platform = kernel_platform(interpret)
    options = dict(eps=eps, block_sizes=block_sizes, platform=platform, interpret=interpret)
    return norm_on("rms_norm", x, [weight], **options)


@autotuned(
    name="layer_norm",
    space="layer_norm",
    constraints=[fits_platform],
    reference=layer_norm_reference,
    tuned="../tuned",
    split=Split("...c,c,c->...c", along="..."),
    example=Example("f32[3,5,37],f32[37],f32[37]"),
    backward=("layer_norm_bwd",),
)
@differentiable(_layer_bwd)
def layer_norm(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array,
    *,
    eps: float = 1e-5,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, in float32.
    Differentiable: the backward is the tuned kernel layer_norm_bwd."""
    _check_vectors("layer_norm", x, weight=weight, bias=bias)
    platform = kernel_platform(interpret)
    options = dict(eps=eps, block_sizes=block_sizes, platform=platform, interpret=interpret)
    return norm_on("layer_norm", x, [weight, bias], **options)


@autotuned(
    name="rms_norm_bwd",
    space="rms_norm_bwd",
    constraints=[fits_platform_bwd],
    reference=rms_norm_bwd_reference,
    tuned="../tuned",
    example=Example("f32[3,5,37],f32[37],f32[3,5,37]"),
)
def rms_norm_bwd(
    x: jax.Array,
    weight: jax.Array,
    g: jax.Array,
    *,
    eps: float = 1e-6,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The gradients (dx, dweight) of rms_norm(x, weight) for the output's cotangent g."""
    options = dict(eps=eps, block_sizes=block_sizes, interpret=interpret)
    return _norm_grads("rms_norm_bwd", _rms_bwd_kernel, 1, x, weight, g, **options)


@autotuned(
    name="layer_norm_bwd",
    space="layer_norm_bwd",
    constraints=[fits_platform_bwd],
    reference=layer_norm_bwd_reference,
    tuned="../tuned",
    example=Example("f32[3,5,37],f32[37],f32[3,5,37]"),
)
def layer_norm_bwd(
    x: jax.Array,
    weight: jax.Array,
    g: jax.Array,
    *,
    eps: float = 1e-5,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The gradients (dx, dweight, dbias) of layer_norm(x, weight, bias) for the output's
    cotangent g (the bias's value changes none of them)."""
    options = dict(eps=eps, block_sizes=block_sizes, interpret=interpret)
    return _norm_grads("layer_norm_bwd", _layer_bwd_kernel, 2, x, weight, g, **options)
