"""Backward kernels of softmax, rms_norm and layer_norm: Pallas kernels over row blocks.

Each takes the forward's inputs and the output's cotangent `g` and recomputes the row
statistics (max and sum, mean square, mean and variance) from x, so the forward keeps nothing
but its inputs. A row block writes its rows of dx; the weight's (and bias's) gradient, a sum
over all rows, is summed per block in float32 into a (blocks, 1, cols) array and the blocks
are summed after the kernel. Layout, padding and masking are kernels/rowwise.py's.

Each is a registered kernel with its own `block_rows` (and `num_warps` on GPU), tuned apart
from the forward's; its reference is the VJP of the forward's reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Split, autotuned, out_struct
from autotune.backends import kernel_platform
from autotune.kernels.norms import (
    inverse_rms,
    layer_norm_reference,
    rms_norm_reference,
    standardised,
)
from autotune.kernels.rowwise import (
    F32,
    RowLayout,
    check_rows,
    fits_rowwise,
    gpu_compiler_params,
)
from autotune.kernels.softmax import row_softmax, softmax_reference


def fits_platform(config: dict, sig) -> bool:
    """The row-block rules of kernels/rowwise.py, for x and g in, dx out and float32 temporaries."""
    return fits_rowwise(config, sig, f32_temps=6, row_arrays=3)


def softmax_bwd_reference(x: jax.Array, g: jax.Array) -> jax.Array:
    return jax.vjp(softmax_reference, x)[1](g)[0]


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


def _softmax_bwd_kernel(x_ref, g_ref, dx_ref, *, n_cols: int):
    y = row_softmax(x_ref[...].astype(F32), n_cols)
    g = g_ref[...].astype(F32)
    dx_ref[...] = (y * (g - jnp.sum(g * y, axis=-1, keepdims=True))).astype(dx_ref.dtype)


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


def row_grads_call(
    kernel,
    rows: list[jax.Array],
    vectors: list[jax.Array],
    n_sums: int,
    *,
    block_rows: int,
    num_warps: int,
    interpret: bool,
) -> list[jax.Array]:
    """Run `kernel(*row_refs, *vector_refs, dx_ref, *sum_refs)` over row blocks; returns dx in
    the rows' shape and `n_sums` column sums (float32, one per vector gradient)."""
    shape = rows[0].shape
    n_rows, cols = check_rows("row gradient", rows[0])
    platform = kernel_platform(interpret)
    layout = RowLayout.of(n_rows, cols, block_rows, platform)
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
        compiler_params=gpu_compiler_params(num_warps, platform),
        interpret=interpret,
    )(*(layout.pad(a.reshape(n_rows, cols)) for a in rows), *map(layout.pad_vector, vectors))
    dx = layout.unpad(outs[0], shape)
    return [dx] + [s.sum(axis=(0, 1))[:cols] for s in outs[1:]]


def _check_like(name: str, x: jax.Array, g: jax.Array, *vectors: jax.Array) -> None:
    if g.shape != x.shape or g.dtype != x.dtype:
        raise ValueError(f"{name} needs g of x's shape and dtype, got {x.shape=} {g.shape=}")
    for v in vectors:
        if v.shape != (x.shape[-1],):
            raise ValueError(f"{name} needs a weight of shape ({x.shape[-1]},), got {v.shape=}")


def _norm_grads(
    name: str,
    kernel,
    n_sums: int,
    x: jax.Array,
    weight: jax.Array,
    g: jax.Array,
    *,
    eps: float,
    block_rows: int,
    num_warps: int,
    interpret: bool,
) -> tuple[jax.Array, ...]:
    """A norm's gradients: dx, and the `n_sums` vector gradients (dweight; layer_norm's dbias
    too) in the weight's dtype, from `kernel(x_ref, g_ref, w_ref, dx_ref, *sum_refs, n_cols,
    eps)`."""
    _check_like(name, x, g, weight)
    if x.size == 0:
        return (x, *(jnp.zeros_like(weight) for _ in range(n_sums)))
    dx, *sums = row_grads_call(
        functools.partial(kernel, n_cols=x.shape[-1], eps=float(eps)),
        [x, g],
        [weight],
        n_sums,
        block_rows=block_rows,
        num_warps=num_warps,
        interpret=interpret,
    )
    return (dx, *(s.astype(weight.dtype) for s in sums))


@autotuned(
    name="softmax_bwd",
    space="softmax_bwd",
    constraints=[fits_platform],
    reference=softmax_bwd_reference,
    tuned="tuned",
    split=Split("...c,...c->...c", along="..."),
)
def softmax_bwd(
    x: jax.Array, g: jax.Array, *, block_rows: int = 64, num_warps: int = 4, interpret: bool = False
) -> jax.Array:
    """The gradient of softmax(x) (last axis) for the output's cotangent g."""
    _check_like("softmax_bwd", x, g)
    if x.size == 0:
        return x
    n_cols = x.shape[-1]
    (dx,) = row_grads_call(
        functools.partial(_softmax_bwd_kernel, n_cols=n_cols),
        [x, g],
        [],
        0,
        block_rows=block_rows,
        num_warps=num_warps,
        interpret=interpret,
    )
    return dx


@autotuned(
    name="rms_norm_bwd",
    space="rms_norm_bwd",
    constraints=[fits_platform],
    reference=rms_norm_bwd_reference,
    tuned="tuned",
)
def rms_norm_bwd(
    x: jax.Array,
    weight: jax.Array,
    g: jax.Array,
    *,
    eps: float = 1e-6,
    block_rows: int = 64,
    num_warps: int = 4,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The gradients (dx, dweight) of rms_norm(x, weight) for the output's cotangent g."""
    options = dict(eps=eps, block_rows=block_rows, num_warps=num_warps, interpret=interpret)
    return _norm_grads("rms_norm_bwd", _rms_bwd_kernel, 1, x, weight, g, **options)


@autotuned(
    name="layer_norm_bwd",
    space="layer_norm_bwd",
    constraints=[fits_platform],
    reference=layer_norm_bwd_reference,
    tuned="tuned",
)
def layer_norm_bwd(
    x: jax.Array,
    weight: jax.Array,
    g: jax.Array,
    *,
    eps: float = 1e-5,
    block_rows: int = 64,
    num_warps: int = 4,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The gradients (dx, dweight, dbias) of layer_norm(x, weight, bias) for the output's
    cotangent g (the bias's value changes none of them)."""
    options = dict(eps=eps, block_rows=block_rows, num_warps=num_warps, interpret=interpret)
    return _norm_grads("layer_norm_bwd", _layer_bwd_kernel, 2, x, weight, g, **options)
