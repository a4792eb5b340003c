"""JAX's own Mosaic GPU attention (`jax.experimental.pallas.ops.gpu.attention_mgpu`, the
FA3-style Hopper kernel), called unedited, with its block sizes and pipeline depth tuned.

JAX's kernel takes [batch, seq, heads, head_dim] and computes softmax(q k^T) v: it applies no
softmax scale. Here q, k and v are [B, H, S, D], as flash_attention's, and enter it viewed as
[B * H, S, 1, D]: a reshape, no transpose (each (batch, head) pair is one of its batch entries,
with one head). The scale multiplies q in float32, the scale itself unrounded (`q * scale` in
q's dtype would round the scale to bf16 first, then the product), before the one rounding back
to q's dtype: exact where the scale is a power of two (the default one at head_dim 64 or 256),
otherwise the one rounding that flash_attention, which scales the float32 scores, does not
have; JAX's backward differentiates that same scaled q, so its gradients agree with its forward.

Only its forward is differentiable as JAX ships it for a causal call; its own backward needs
backward block sizes, which this wrapper does not tune.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from autotune import Split, autotuned
from autotune.backends import mosaic_gpu as backend
from autotune.kernels.flash_attention import attention_reference
from autotune.kernels.matmul import Precision, check_precision
from autotune.registry.varying import vary_like

DTYPES = ("bfloat16", "float16")  # what JAX's kernel takes
BLOCK_MULTIPLE = 64  # block_q and block_kv: multiples of a wgmma tile's 64 rows
HEAD_DIM_MULTIPLE = 64  # head_dim: whole 128-byte swizzles of 16-bit values
COMPUTE_WARPGROUPS = 2  # each takes block_q rows: a grid step holds 2 * block_q query rows
# Shared memory Mosaic GPU adds to this kernel's buffers and barriers (seen in its own count
# when it lowers for "cuda": 2,048 bytes at every configuration tried)
RESERVED_SMEM = 2048


def _steps(config: dict, seq_k: int) -> int:
    """The pipeline's depth as JAX's kernel takes it: no deeper than the key loop."""
    return min(config["max_concurrent_steps"], seq_k // config["block_kv"])


def smem_bytes(config: dict, head_dim: int, seq_k: int, itemsize: int = 2) -> int:
    """The shared memory JAX's forward allocates: a q (and output) block per compute
    warpgroup, `steps` slots of k and v blocks, their barriers (k, v and consumed per slot; q
    per warpgroup; one scheduling barrier) and Mosaic GPU's reserve. Without the log-sum-exp the
    backward would keep: tested against Mosaic GPU's own count when it lowers for "cuda"."""
    steps = _steps(config, seq_k)
    q_blocks = COMPUTE_WARPGROUPS * config["block_q"] * head_dim * itemsize
    kv_slots = 2 * steps * config["block_kv"] * head_dim * itemsize
    barriers = (4 * steps + COMPUTE_WARPGROUPS + 1) * backend.BARRIER_BYTES
    return q_blocks + kv_slots + barriers + RESERVED_SMEM


def fits_hopper(config: dict, sig) -> bool:
    """JAX's kernel's rules for the call (16-bit inputs, head_dim a multiple of 64, Sq a multiple
    of the two warpgroups' 2 * block_q rows, Sk of block_kv, a pipeline of at least two steps)
    and its shared memory within the limit."""
    if len(sig.shapes) != 3 or any(len(s) != 4 for s in sig.shapes):
        return True  # the kernel itself rejects such calls with a clear message
    (_, _, sq, d), (_, _, sk, _) = sig.shapes[0], sig.shapes[1]
    bq, bkv = config["block_q"], config["block_kv"]
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    return (
        sig.dtypes[0] in DTYPES
        and bq % BLOCK_MULTIPLE == 0
        and bkv % BLOCK_MULTIPLE == 0
        and d % HEAD_DIM_MULTIPLE == 0
        and sq % (COMPUTE_WARPGROUPS * bq) == 0
        and sk % bkv == 0
        and _steps(config, sk) >= 2
        and smem_bytes(config, d, sk, itemsize) <= backend.smem_limit(sig.device_kind)
    )


def heads_as_batch(x: jax.Array) -> jax.Array:
    """[B, H, S, D] viewed as [B * H, S, 1, D] (the [batch, seq, heads, head_dim] layout of
    JAX's attention kernels, one head per batch entry): a reshape, no transpose."""
    b, h, s, d = x.shape
    return x.reshape(b * h, s, 1, d)


def scaled_query(q: jax.Array, scale: float) -> jax.Array:
    """q * scale, computed in float32 and rounded once to q's dtype (exact for a power of two)."""
    return (q.astype(jnp.float32) * scale).astype(q.dtype)


@autotuned(
    name="attention_mgpu",
    space="attention_mgpu",
    constraints=[fits_hopper],
    reference=attention_reference,
    backend="mosaic_gpu",
    tuned="tuned",
    split=Split("bhsd,bhtd,bhtd->bhsd", along="bh"),
)
def attention_mgpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: Precision = None,
    block_q: int = 64,
    block_kv: int = 128,
    max_concurrent_steps: int = 2,
) -> jax.Array:
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D] of one 16-bit dtype on a Hopper GPU,
    by JAX's Mosaic GPU kernel; sm_scale defaults to 1/sqrt(D). `precision` is accepted for
    flash_attention's signature: the kernel multiplies 16-bit inputs, at their own precision."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as jax_attention

    check_precision(precision)
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(
            f"attention_mgpu needs q [B, H, Sq, D] and k, v [B, H, Sk, D], got {q.shape=} "
            f"{k.shape=} {v.shape=}"
        )
    b, h, sq, d = q.shape
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    config = jax_attention.TuningConfig(
        block_q=block_q,
        block_kv=block_kv,
        max_concurrent_steps=max_concurrent_steps,
        causal=bool(causal),
    )
    out = jax_attention.attention(
        heads_as_batch(scaled_query(q, scale)), heads_as_batch(k), heads_as_batch(v), config
    )
    # inside shard_map, typed to vary as its inputs do: Mosaic GPU's kernel loses the type
    return vary_like(out.reshape(b, h, sq, d), q, k, v)
