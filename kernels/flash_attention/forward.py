"""Flash attention forward: softmax(q k^T * sm_scale [+ causal mask]) v, online softmax in float32.

Inputs are [batch, heads, seq, head_dim]. A grid step holds `block_q` query rows and walks the
keys `block_k` at a time, keeping the running max, sum and output in float32 (so the scores
matrix never exists in full). Sequences that are not multiples of the blocks are zero-padded:
padded query rows are computed and dropped, padded keys are masked out of the softmax. Causal
masking is top-left aligned (query i sees keys 0..i), and a causal step stops at the last key
block its rows can see; only the key blocks that cross the diagonal or hold padded keys are
masked (tiles.py), and the query blocks that see the most keys run first. The
softmax runs in base 2: the scale and log2(e) multiply the float32 scores, and exp2 replaces exp.
On GPU head_dim is zero-padded to a power of two (zeros change no dot product). On a TPU the
kernel has its own body (tpu.py).

Differentiable: under jax.grad the forward also keeps each row's log-sum-exp, and the backward
is two kernels of their own (backward.py).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned, out_struct
from autotune.backends import kernel_platform, mosaic_tpu, triton
from autotune.backends.hardware import gpu_smem_bytes
from autotune.kernels.differentiable import differentiable
from autotune.kernels.flash_attention.backward import flash_attention_dkv, flash_attention_dq
from autotune.kernels.flash_attention.reference import attention_reference, softmax_scale
from autotune.kernels.flash_attention.tiles import (
    F32,
    NT,
    BlockSizes,
    check_shapes,
    gpu_tiles_in_registers,
    gpu_tiles_ok,
    key_blocks_walked,
    layout,
    mask_scores,
    padded_keys,
    tpu_tiles_ok,
)
from autotune.kernels.flash_attention.tpu import attention_tpu, tpu_vmem
from autotune.kernels.precision import Precision, dot_precision

LOG2_E = math.log2(math.e)
# a small call: padded rows and keys (on a GPU, blocks of at least 16 rows and head_dim)
EXAMPLE = "f32[1,2,19,16],f32[1,2,23,16],f32[1,2,23,16]"


def fits_platform(config: dict, sig) -> bool:
    """TPU: (8, 128) tiling of the q, k and v blocks and of the (block_q, block_k) score tile,
    the step's VMEM (`tpu_vmem`) within the chip's budget; GPU: power-of-two tiles of at least
    16 (tl.dot), stages of q, k and v tiles within shared memory, the float32 output sum and
    score tile within the registers of the config's warps."""
    if len(sig.shapes) != 3 or any(len(s) != 4 for s in sig.shapes):
        return True  # the kernel itself rejects such calls with a clear message
    bq, bk, sqp, skp, dp = layout(sig.shapes, config, sig.platform)
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    if sig.platform == "tpu":
        return tpu_tiles_ok(bq, bk, sqp, skp, dp) and tpu_vmem(
            bq, bk, dp, itemsize
        ) <= mosaic_tpu.vmem_budget(sig.device_kind)
    if sig.platform == "gpu":
        stages = config["num_stages"]
        smem = (bq * dp + stages * 2 * bk * dp) * itemsize
        return (
            gpu_tiles_ok(bq, bk, dp)
            and smem <= gpu_smem_bytes(sig.device_kind)
            # the float32 output sum and scores, and the q tile: at 128 query rows and head_dim
            # 128 on 4 warps Triton spills whatever the key block (sm_90: 1.3-2.8 KB)
            and gpu_tiles_in_registers(bq * dp + bq * bk + bq * dp * itemsize / 4, config)
        )
    return True


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    lse_ref=None,
    *,
    sm_scale,
    causal,
    block_k,
    seq_k,
    n_k,
    precision,
    q_block,
):
    block_q = q_ref.shape[0]
    q_start = q_block(pl.program_id(2)) * block_q
    # scores in base 2: exp2 replaces exp. The scale and log2(e) multiply the float32 scores,
    # not q: a bf16 q scaled and rounded again would no longer give the scores the backward
    # recomputes from the saved log-sum-exp (bf16 dq off by 2%)
    q = q_ref[...]
    scale = sm_scale * LOG2_E
    rows = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    lanes = jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def step(j, carry, masked: bool):
        m, denom, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :]
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = scale * jax.lax.dot_general(q, k, NT, precision=precision, preferred_element_type=F32)
        if masked:
            cols = j * block_k + lanes
            s = mask_scores(s, rows, cols, causal=causal, seq_k=padded_keys(seq_k, block_k))
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new)
        denom = alpha * denom + p.sum(axis=-1, keepdims=True)
        pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=F32)
        return m_new, denom, alpha * acc + pv

    # Only the blocks that cross the diagonal or hold padded keys are masked; the blocks before
    # them are seen whole by every row of this block. Key 0 is in block 0 and visible to every
    # row, so each row's denominator is positive.
    n_whole, n_steps = key_blocks_walked(q_start, block_q, block_k, n_k, causal=causal, seq_k=seq_k)
    init = (
        jnp.full((block_q, 1), -jnp.inf, F32),
        jnp.zeros((block_q, 1), F32),
        jnp.zeros(o_ref.shape, F32),
    )
    carry = jax.lax.fori_loop(0, n_whole, functools.partial(step, masked=False), init)
    m, denom, acc = jax.lax.fori_loop(n_whole, n_steps, functools.partial(step, masked=True), carry)
    o_ref[...] = (acc / denom).astype(o_ref.dtype)
    if lse_ref is not None:  # kept for the backward (backward.py), base e
        lse_ref[...] = m / LOG2_E + jnp.log(denom)


def attention_on(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    sm_scale: float | None,
    block_sizes: BlockSizes,
    platform: str,
    interpret: bool,
    precision: str | None = None,
    with_lse: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The kernel laid out for `platform` (tests run the GPU layout in interpret mode); with
    `with_lse`, also each query row's log-sum-exp of its scaled scores, [B, H, Sq] float32."""
    check_shapes(q, k, v)
    precision = dot_precision(precision, q.dtype)
    if q.size == 0:
        return (q, jnp.zeros(q.shape[:3], F32)) if with_lse else q
    (b, h, sq, d), sk = q.shape, k.shape[2]
    blocks = {"block_q": block_sizes.block_q, "block_k": block_sizes.block_k}
    bq, bk, sqp, skp, dp = layout((q.shape, k.shape), blocks, platform)
    scale = softmax_scale(d, sm_scale)
    if mosaic_tpu.targets_tpu(platform, interpret):
        return attention_tpu(q, k, v, bool(causal), scale, bq, bk, precision, with_lse)

    def pad(x, s, sp):
        return jnp.pad(x, ((0, 0), (0, 0), (0, sp - s), (0, dp - d))) if (sp, dp) != (s, d) else x

    n_q = sqp // bq

    def q_block(t):  # causal: the last query blocks, which see the most keys, run first
        return n_q - 1 - t if causal else t

    q_spec = pl.BlockSpec((None, None, bq, dp), lambda i, j, t: (i, j, q_block(t), 0))
    kv_spec = pl.BlockSpec((None, None, skp, dp), lambda i, j, t: (i, j, 0, 0))
    out_shape = [out_struct((b, h, sqp, dp), q.dtype, q, k, v)]
    out_specs = [q_spec]
    if with_lse:
        # a trailing axis of 1: a [block_q, 1] block meets the TPU tiling rule, a [block_q] one not
        out_shape.append(out_struct((b, h, sqp, 1), F32, q, k, v))
        out_specs.append(pl.BlockSpec((None, None, bq, 1), lambda i, j, t: (i, j, q_block(t), 0)))
    outs = pl.pallas_call(
        functools.partial(
            _kernel,
            sm_scale=scale,
            causal=bool(causal),
            block_k=bk,
            seq_k=sk,
            n_k=skp // bk,
            precision=precision,
            q_block=q_block,
        ),
        out_shape=out_shape,
        grid=(b, h, n_q),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=out_specs,
        compiler_params=triton.compiler_params(
            block_sizes.num_warps, block_sizes.num_stages, platform
        ),
        interpret=interpret,
    )(pad(q, sq, sqp), pad(k, sk, skp), pad(v, sk, skp))
    out = outs[0][:, :, :sq, :d] if (sqp, dp) != (sq, d) else outs[0]
    return (out, outs[1][:, :, :sq, 0]) if with_lse else out


def _fwd(forward, q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool, **options):
    # the forward again, keeping what the backward needs: the log-sum-exp of each query row
    out, lse = attention_on(
        q, k, v, platform=kernel_platform(interpret), interpret=interpret, with_lse=True, **options
    )
    return out, (q, k, v, out, lse)


def _bwd(residuals: tuple, do: jax.Array, *, causal, sm_scale, precision, interpret, **_) -> tuple:
    q, k, v, out, lse = residuals
    delta = jnp.sum(out.astype(F32) * do.astype(F32), axis=-1)  # rowsum(dO * O), [B, H, Sq]
    options = dict(causal=causal, sm_scale=sm_scale, precision=precision, interpret=interpret)
    dq = flash_attention_dq(q, k, v, do, lse, delta, **options)
    dk, dv = flash_attention_dkv(q, k, v, do, lse, delta, **options)
    return dq, dk, dv


@autotuned(
    name="flash_attention",
    space="flash_attention",
    constraints=[fits_platform],
    reference=attention_reference,
    tuned="../tuned",
    split=Split("bhsd,bhtd,bhtd->bhsd", along="bh"),
    example=Example(EXAMPLE, sm_scale=0.3),
    backward=("flash_attention_dq", "flash_attention_dkv"),
)
@differentiable(_bwd, _fwd)
def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    block_sizes: BlockSizes = BlockSizes(),
    precision: Precision = None,
    interpret: bool = False,
) -> jax.Array:
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D]; sm_scale defaults to 1/sqrt(D);
    the dots at `precision` (None: "highest" for float32, the native pass for 16-bit floats;
    see autotune.kernels.precision.dot_precision).
    Differentiable: the backward is the tuned kernels flash_attention_dq and _dkv."""
    platform = kernel_platform(interpret)
    options = dict(causal=causal, sm_scale=sm_scale, precision=precision, interpret=interpret)
    return attention_on(q, k, v, block_sizes=block_sizes, platform=platform, **options)
