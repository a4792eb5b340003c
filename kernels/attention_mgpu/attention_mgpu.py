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

Differentiable: the backward is JAX's own (its dq and dk/dv kernels, one after the other), the
kernel `attention_mgpu_bwd`, tuned under its own key with its own block sizes
(search_spaces/attention_mgpu_bwd.toml), from the log-sum-exp JAX's forward keeps. JAX's
backward has no causal masking (jax 0.10.2 raises NotImplementedError for causal=True): a causal
call's gradient is a KernelError that says so and names flash_attention, which has one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp

from autotune import Example, Split, autotuned
from autotune.backends import mosaic_gpu as backend
from autotune.errors import KernelError
from autotune.kernels.differentiable import differentiable, through_lse
from autotune.kernels.flash_attention.reference import (
    attention_reference,
    check_qkv,
    lse_backward_reference,
    scaled_query,
    softmax_scale,
)
from autotune.kernels.precision import Precision, check_precision
from autotune.registry.varying import vary_like

DTYPES = ("bfloat16", "float16")  # what JAX's kernel takes
BLOCK_MULTIPLE = 64  # block_q and block_kv: multiples of a wgmma tile's 64 rows
HEAD_DIM_MULTIPLE = 64  # head_dim: whole 128-byte swizzles of 16-bit values
COMPUTE_WARPGROUPS = 2  # each takes block_q rows: a grid step holds 2 * block_q query rows
# Shared memory Mosaic GPU adds to this kernel's buffers and barriers (seen in its own count
# when it lowers for "cuda": 2,048 bytes at every configuration tried)
RESERVED_SMEM = 2048
# Mosaic GPU places each of the backward's shared buffers at a multiple of 1,024 bytes (seen in
# its own count when it lowers for "cuda")
SMEM_ALIGN = 1024
ARRAYS = "bhsd,bhtd,bhtd"  # q, k, v
# a small call: what JAX's kernel takes (16-bit; float16 is what jax 0.10.2's lowers), not causal
EXAMPLE = "f16[1,2,256,64],f16[1,2,256,64],f16[1,2,256,64]"


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The forward's tunables, JAX's TuningConfig's: query rows per compute warpgroup (a grid
    step holds two warpgroups' worth), keys per pipeline step, the pipeline's depth."""

    block_q: int = 64
    block_kv: int = 128
    max_concurrent_steps: int = 2


@dataclasses.dataclass(frozen=True)
class BackwardBlockSizes:
    """The backward's tunables, JAX's TuningConfig's backward fields: dq's query rows per
    compute warpgroup and keys per pipeline step, dk/dv's keys per compute warpgroup and query
    rows per step, both pipelines' depth, and the compute warpgroups of both."""

    block_q_dq: int = 64
    block_kv_dq: int = 64
    block_q_dkv: int = 64
    block_kv_dkv: int = 64
    max_concurrent_steps: int = 2
    compute_wgs_bwd: int = 1


def _steps(config: dict, seq_k: int) -> int:
    """The pipeline's depth as JAX's kernel takes it: no deeper than the key loop."""
    return min(config["max_concurrent_steps"], seq_k // config["block_kv"])


def smem_bytes(
    config: dict, head_dim: int, seq_k: int, itemsize: int = 2, residuals: bool = False
) -> int:
    """The shared memory JAX's forward allocates: a q (and output) block per compute
    warpgroup, `steps` slots of k and v blocks, their barriers (k, v and consumed per slot; q
    per warpgroup; one scheduling barrier) and Mosaic GPU's reserve; with `residuals` (under
    jax.grad), each warpgroup's rows of the log-sum-exp the backward takes. Tested against
    Mosaic GPU's own count when it lowers for "cuda"."""
    steps = _steps(config, seq_k)
    q_blocks = COMPUTE_WARPGROUPS * config["block_q"] * head_dim * itemsize
    kv_slots = 2 * steps * config["block_kv"] * head_dim * itemsize
    barriers = (4 * steps + COMPUTE_WARPGROUPS + 1) * backend.BARRIER_BYTES
    lse = _aligned(COMPUTE_WARPGROUPS * config["block_q"] * 4) if residuals else 0
    return q_blocks + kv_slots + barriers + RESERVED_SMEM + lse


def _aligned(n: int) -> int:
    return -(-n // SMEM_ALIGN) * SMEM_ALIGN


def smem_bytes_dq(config: dict, head_dim: int, seq_q: int, itemsize: int = 2) -> int:
    """The shared memory of JAX's dq kernel: per compute warpgroup a block of q and of dO and
    their rows of lse and delta (float32), the pipeline's slots of k and v blocks (no deeper
    than the query tiles, as JAX takes it), the barriers (four per warpgroup, three a slot).
    Tested against Mosaic GPU's own count when it lowers for "cuda"."""
    wgs, bq = config["compute_wgs_bwd"], config["block_q_dq"]
    steps = min(config["max_concurrent_steps"], seq_q // (bq * wgs))
    held = 2 * _aligned(wgs * bq * head_dim * itemsize) + 2 * _aligned(wgs * bq * 4)
    slots = 2 * _aligned(steps * config["block_kv_dq"] * head_dim * itemsize)
    return held + slots + (4 * wgs + 3 * steps) * backend.BARRIER_BYTES


def smem_bytes_dkv(config: dict, head_dim: int, seq_k: int, itemsize: int = 2) -> int:
    """The shared memory of JAX's dk/dv kernel: per compute warpgroup a block of k and of v,
    the pipeline's slots of q and dO blocks and of their lse and delta rows (no deeper than the
    key tiles, as JAX takes it), the barriers (two per warpgroup, five a slot). Tested against
    Mosaic GPU's own count when it lowers for "cuda"."""
    wgs, bkv, bq = config["compute_wgs_bwd"], config["block_kv_dkv"], config["block_q_dkv"]
    steps = min(config["max_concurrent_steps"], seq_k // (bkv * wgs))
    held = 2 * _aligned(wgs * bkv * head_dim * itemsize)
    slots = 2 * _aligned(steps * bq * head_dim * itemsize) + 2 * _aligned(steps * bq * 4)
    return held + slots + (2 * wgs + 5 * steps) * backend.BARRIER_BYTES


def fits_hopper(config: dict, sig) -> bool:
    """JAX's kernel's rules for the call (16-bit inputs, head_dim a multiple of 64, Sq a multiple
    of the two warpgroups' 2 * block_q rows, Sk of block_kv, a pipeline of at least two steps)
    and its shared memory within the limit, the log-sum-exp a differentiated call keeps too."""
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
        and smem_bytes(config, d, sk, itemsize, residuals=True)
        <= backend.smem_limit(sig.device_kind)
    )


def heads_as_batch(x: jax.Array) -> jax.Array:
    """[B, H, S, D] viewed as [B * H, S, 1, D] (the [batch, seq, heads, head_dim] layout of
    JAX's attention kernels, one head per batch entry): a reshape, no transpose."""
    b, h, s, d = x.shape
    return x.reshape(b * h, s, 1, d)


def fits_hopper_bwd(config: dict, sig) -> bool:
    """JAX's backward's rules for the call (16-bit inputs, head_dim a multiple of 64; Sq a
    multiple of dq's rows per step, block_q_dq times the compute warpgroups, and of dk/dv's
    block_q_dkv; Sk of dk/dv's keys per step and of dq's block_kv_dq) and each kernel's shared
    memory within the limit. (Registers are not checked: a spilling candidate is slow, and
    measured so.)"""
    if len(sig.shapes) != 6 or any(len(s) != 4 for s in sig.shapes[:4]):
        return True  # the kernel itself rejects such calls with a clear message
    (_, _, sq, d), (_, _, sk, _) = sig.shapes[0], sig.shapes[1]
    wgs = config["compute_wgs_bwd"]
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    limit = backend.smem_limit(sig.device_kind)
    return (
        sig.dtypes[0] in DTYPES
        and d % HEAD_DIM_MULTIPLE == 0
        and all(config[b] % BLOCK_MULTIPLE == 0 for b in ("block_q_dq", "block_kv_dq"))
        and all(config[b] % BLOCK_MULTIPLE == 0 for b in ("block_q_dkv", "block_kv_dkv"))
        and sq % (config["block_q_dq"] * wgs) == 0
        and sq % config["block_q_dkv"] == 0
        and sk % (config["block_kv_dkv"] * wgs) == 0
        and sk % config["block_kv_dq"] == 0
        and smem_bytes_dq(config, d, sq, itemsize) <= limit
        and smem_bytes_dkv(config, d, sk, itemsize) <= limit
    )


def _interpreted(interpret: bool):
    """GPU interpret mode for JAX's kernels, which take no `interpret` argument, where asked."""
    return backend.interpret_mode() if interpret else contextlib.nullcontext()


def _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals: bool):
    """JAX's forward in this layout: the output, and with `residuals` each query row's
    log-sum-exp as JAX keeps it for its backward, [B, H, Sq] float32."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as jax_attention

    check_qkv("attention_mgpu", q, k, v)
    b, h, sq, d = q.shape
    config = jax_attention.TuningConfig(**dataclasses.asdict(block_sizes), causal=bool(causal))
    qs = scaled_query(q, softmax_scale(d, sm_scale))
    with _interpreted(interpret):
        outs = jax_attention.attention(
            heads_as_batch(qs), heads_as_batch(k), heads_as_batch(v), config, residuals
        )
    if not residuals:
        return outs.reshape(q.shape)
    out, (lse,) = outs
    return out.reshape(q.shape), lse.reshape(b, h, sq)


@autotuned(
    name="attention_mgpu",
    space="attention_mgpu",
    constraints=[fits_hopper],
    reference=attention_reference,
    backend="mosaic_gpu",
    tuned="../tuned",
    split=Split(f"{ARRAYS}->bhsd", along="bh"),
    example=Example(EXAMPLE),
    backward=("attention_mgpu_bwd",),
)
@differentiable(*through_lse(_forward, lambda: attention_mgpu_bwd))
def attention_mgpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: Precision = None,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D] of one 16-bit dtype on a Hopper GPU,
    by JAX's Mosaic GPU kernel; sm_scale defaults to 1/sqrt(D). `precision` is accepted for
    flash_attention's signature: the kernel multiplies 16-bit inputs, at their own precision.
    `interpret=True` runs it in GPU interpret mode (which cannot run it in jax 0.10.2).
    Differentiable (not causal: see the module docstring): the backward is the tuned kernel
    attention_mgpu_bwd."""
    check_precision(precision)
    return _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals=False)


# JAX's Mosaic GPU backward: lse in base 2, of the scores of q as the forward rounds it scaled
attention_mgpu_bwd_reference = functools.partial(
    lse_backward_reference, lse_base2=True, rounded_q=True
)


@autotuned(
    name="attention_mgpu_bwd",
    space="attention_mgpu_bwd",
    constraints=[fits_hopper_bwd],
    reference=attention_mgpu_bwd_reference,
    backend="mosaic_gpu",
    tuned="../tuned",
    split=Split(f"{ARRAYS},bhsd,bhs,bhsd->bhsd,bhtd,bhtd", along="bh"),
    example=Example(f"{EXAMPLE},f16[1,2,256,64],f32[1,2,256],f16[1,2,256,64]"),
)
def attention_mgpu_bwd(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    out: jax.Array,
    lse: jax.Array,
    do: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    precision: Precision = None,
    block_sizes: BackwardBlockSizes = BackwardBlockSizes(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) of attention_mgpu for the output's cotangent do, from its output and the
    log-sum-exp JAX's forward keeps ([B, H, Sq] float32), by JAX's backward kernels."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as jax_attention

    check_precision(precision)
    check_qkv("attention_mgpu_bwd", q, k, v)
    b, h, sq, d = q.shape
    scale = softmax_scale(d, sm_scale)
    # the forward's fields are not read by the backward: the smallest JAX takes stand in
    config = jax_attention.TuningConfig(
        block_q=BLOCK_MULTIPLE,
        block_kv=BLOCK_MULTIPLE,
        causal=bool(causal),
        **dataclasses.asdict(block_sizes),
    )
    arrays = (scaled_query(q, scale), k, v, out)
    residuals = (*map(heads_as_batch, arrays), lse.reshape(b * h, 1, sq))
    try:
        with _interpreted(interpret):
            dqs, dk, dv = jax_attention.attention.bwd(config, False, residuals, heads_as_batch(do))
    except NotImplementedError as e:
        if not causal:
            raise
        raise KernelError(
            f"attention_mgpu has no gradient for causal=True: JAX {jax.__version__}'s Mosaic GPU "
            f"attention implements its backward without causal masking ({e}); differentiate "
            "flash_attention for causal attention, or call attention_mgpu with causal=False"
        ) from None
    # q was scaled before JAX's kernel saw it: dq = d(scaled q) * scale; JAX's dk, dv are f16
    dq = (dqs.reshape(q.shape).astype(jnp.float32) * scale).astype(q.dtype)
    grads = (dq, dk.reshape(k.shape).astype(k.dtype), dv.reshape(v.shape).astype(v.dtype))
    # inside shard_map, typed to vary as its inputs do: Mosaic GPU's kernels lose the type
    return vary_like(grads, q, k, v, out, lse, do)
