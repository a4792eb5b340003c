"""Flash attention's references, in plain JAX and float32 whatever the inputs: the forward's
(`attention_reference`, also JAX's Mosaic GPU attention's), and the backward kernels', the VJP
of the forward's written in the saved lse and delta, so that it is defined for any inputs (the
oracle draws them at random); `lse_backward_reference` is that of JAX's backward kernels that take
their forward's lse (splash, Triton, Mosaic GPU attention), each keeping it in its own way.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

F32 = jnp.float32


def softmax_scale(head_dim: int, sm_scale: float | None) -> float:
    """What the scores are scaled by: `sm_scale`, by default 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def reference_scores(q: jax.Array, k: jax.Array, *, causal: bool, scale: float, precision: str):
    """The references' float32 scores q k^T * `scale`, [B, H, Sq, Sk]; causal, those of keys
    after a row's own are -inf (the backward's references recompute the forward's)."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(F32), k.astype(F32), precision=precision) * scale
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((q.shape[2], k.shape[2]), bool)), s, -jnp.inf)
    return s


def attention_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: str | None = None,
) -> jax.Array:
    # in float32 whatever the inputs: None is "highest" here (dot_precision's 16-bit "default"
    # would be TF32 on a GPU for these float32 copies)
    precision = precision or "highest"
    scale = softmax_scale(q.shape[-1], sm_scale)
    s = reference_scores(q, k, causal=causal, scale=scale, precision=precision)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(F32), precision=precision).astype(q.dtype)


def _reference_parts(q, k, v, do, lse, delta, causal, sm_scale, precision):
    precision = precision or "highest"  # in float32 whatever the inputs, as attention_reference
    scale = softmax_scale(q.shape[-1], sm_scale)
    q, k, v, do = (a.astype(F32) for a in (q, k, v, do))
    s = reference_scores(q, k, causal=causal, scale=scale, precision=precision)
    p = jnp.exp(s - lse[..., None])
    dp = jnp.einsum("bhqd,bhkd->bhqk", do, v, precision=precision)
    return scale, q, k, do, p, p * (dp - delta[..., None])


def attention_dq_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: str | None = None,
) -> jax.Array:
    scale, _, kf, _, _, ds = _reference_parts(q, k, v, do, lse, delta, causal, sm_scale, precision)
    return (jnp.einsum("bhqk,bhkd->bhqd", ds, kf, precision=precision) * scale).astype(q.dtype)


def attention_dkv_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    scale, qf, _, dof, p, ds = _reference_parts(
        q, k, v, do, lse, delta, causal, sm_scale, precision
    )
    dk = jnp.einsum("bhqk,bhqd->bhkd", ds, qf, precision=precision) * scale
    dv = jnp.einsum("bhqk,bhqd->bhkd", p, dof, precision=precision)
    return dk.astype(k.dtype), dv.astype(v.dtype)


def check_qkv(name: str, q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    """The layout every attention here takes, q [B, H, Sq, D] and k, v [B, H, Sk, D], or a
    ValueError naming `name` and the shapes given."""
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(
            f"{name} needs q [B, H, Sq, D] and k, v [B, H, Sk, D], got {q.shape=} "
            f"{k.shape=} {v.shape=}"
        )


def scaled_query(q: jax.Array, scale: float) -> jax.Array:
    """q * scale, computed in float32 and rounded once to q's dtype (exact for a power of two):
    for JAX's attentions that apply no scale of their own."""
    return (q.astype(jnp.float32) * scale).astype(q.dtype)


def lse_backward_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    out: jax.Array,
    lse: jax.Array,
    do: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: str | None = None,
    lse_base2: bool,
    rounded_q: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) as a JAX backward kernel computes them from its forward's output and
    log-sum-exp, whatever these are (the oracle draws them at random), in float32: p = exp(s -
    lse), or 2^(s log2(e) - lse) where the kernel keeps lse in base 2 (`lse_base2`); delta =
    rowsum(dO * O). s is from q scaled as the forward scales it: rounded to q's dtype
    (`rounded_q`, scaled_query) or in float32. `precision` is the forward's: accepted, unused."""
    scale = softmax_scale(q.shape[-1], sm_scale)
    qs = scaled_query(q, scale).astype(F32) if rounded_q else q.astype(F32) * scale
    kf, vf, of, dof = (a.astype(F32) for a in (k, v, out, do))
    s = jnp.einsum("bhqd,bhkd->bhqk", qs, kf, precision="highest")
    p = jnp.exp2(s * jnp.log2(jnp.e) - lse[..., None]) if lse_base2 else jnp.exp(s - lse[..., None])
    if causal:
        p = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), p, 0.0)
    dp = jnp.einsum("bhqd,bhkd->bhqk", dof, vf, precision="highest")
    ds = p * (dp - jnp.sum(of * dof, axis=-1)[..., None])
    dq = jnp.einsum("bhqk,bhkd->bhqd", ds, kf, precision="highest") * scale
    dk = jnp.einsum("bhqk,bhqd->bhkd", ds, qs, precision="highest")
    dv = jnp.einsum("bhqk,bhqd->bhkd", p, dof, precision="highest")
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
