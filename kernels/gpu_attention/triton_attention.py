"""JAX's Triton attention (`jax.experimental.pallas.ops.gpu.attention.mha`), called unedited,
its forward and backward block sizes and warps tuned as two kernels with keys of their own.

q, k and v are [B, H, S, D], flash_attention's layout, and enter JAX's kernel ([batch, seq,
heads, head_dim]) as [B * H, S, 1, D]: a reshape, no transpose. JAX's kernel applies the
softmax scale to the scores itself. Differentiable: the forward keeps JAX's log-sum-exp, and
the backward is JAX's own (its fused dq and dk/dv Triton kernels), `triton_attention_bwd`.
A member of `attention_variants` on a GPU. With `interpret=True` it runs in Pallas interpret
mode (how it is checked on a CPU host: there is no GPU here to time it on).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from autotune import Example, Split, autotuned
from autotune.backends.hardware import gpu_smem_bytes, is_pow2, next_pow2
from autotune.kernels.attention_mgpu.attention_mgpu import heads_as_batch
from autotune.kernels.differentiable import differentiable, through_lse
from autotune.kernels.flash_attention.reference import (
    attention_reference,
    check_qkv,
    lse_backward_reference,
    softmax_scale,
)
from autotune.kernels.flash_attention.tiles import gpu_tiles_in_registers
from autotune.kernels.precision import Precision, check_precision
from autotune.registry.varying import unchecked

ARRAYS = "bhsd,bhtd,bhtd"
EXAMPLE = "f32[1,2,64,32],f32[1,2,64,32],f32[1,2,64,32]"
MIN_TILE = 16  # tl.dot's smallest


def _jax_attention():
    from jax.experimental.pallas.ops.gpu import attention

    return attention


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The forward's fields of JAX's BlockSizes, and its Triton knobs."""

    block_q: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class BackwardBlockSizes:
    """The backward's fields of JAX's BlockSizes (dk/dv's and dq's blocks), its warps."""

    block_q_dkv: int = 32
    block_kv_dkv: int = 32
    block_q_dq: int = 32
    block_kv_dq: int = 32
    num_warps: int = 4


def _tiles_ok(blocks: tuple[int, ...], seqs: tuple[int, ...]) -> bool:
    """Power-of-two tiles of at least 16 that divide their sequences (JAX's kernel clips a
    block to its sequence: a block past it is the same program as the sequence's)."""
    return all(is_pow2(b) and b >= MIN_TILE and b <= s and s % b == 0 for b, s in zip(blocks, seqs))


def fits(config: dict, sig) -> bool:
    """JAX's rules (blocks divide the sequences), Triton's (power-of-two tiles of at least 16),
    shared memory for q and `num_stages` k and v tiles, the float32 output and score tiles in
    registers."""
    if len(sig.shapes) < 3 or any(len(s) != 4 for s in sig.shapes[:3]):
        return True
    (_, _, sq, d), (_, _, sk, _) = sig.shapes[0], sig.shapes[1]
    bq, bk = config["block_q"], config["block_k"]
    if not _tiles_ok((bq, bk), (sq, sk)):
        return False
    if sig.platform != "gpu":
        return True
    dp, itemsize = next_pow2(d), jnp.dtype(sig.dtypes[0]).itemsize
    smem = (bq * dp + config["num_stages"] * 2 * bk * dp) * itemsize
    return smem <= gpu_smem_bytes(sig.device_kind) and gpu_tiles_in_registers(
        bq * dp + bq * bk, config
    )


def fits_bwd(config: dict, sig) -> bool:
    """The rules of JAX's fused backward: its tiles as the forward's, dk and dv (or dq) and a
    score tile in registers."""
    if len(sig.shapes) < 3 or any(len(s) != 4 for s in sig.shapes[:3]):
        return True
    (_, _, sq, d), (_, _, sk, _) = sig.shapes[0], sig.shapes[1]
    blocks = (config["block_q_dkv"], config["block_kv_dkv"], config["block_q_dq"])
    if not _tiles_ok(blocks + (config["block_kv_dq"],), (sq, sk, sq, sk)):
        return False
    if sig.platform != "gpu":
        return True
    dp = next_pow2(d)
    dkv = 2 * config["block_kv_dkv"] * dp + config["block_q_dkv"] * config["block_kv_dkv"]
    dq = config["block_q_dq"] * dp + config["block_q_dq"] * config["block_kv_dq"]
    return gpu_tiles_in_registers(max(dkv, dq), config)


def _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals: bool):
    check_qkv("triton_attention", q, k, v)
    b, h, sq, d = q.shape
    jax_attention = _jax_attention()
    blocks = jax_attention.BlockSizes(block_q=block_sizes.block_q, block_k=block_sizes.block_k)
    outs = unchecked(
        jax_attention.mha,
        *map(heads_as_batch, (q, k, v)),
        None,
        sm_scale=softmax_scale(d, sm_scale),
        causal=bool(causal),
        block_sizes=blocks,
        num_warps=block_sizes.num_warps,
        num_stages=block_sizes.num_stages,
        interpret=interpret,
        return_residuals=residuals,
    )
    if not residuals:
        return outs.reshape(q.shape)
    out, lse = outs
    return out.reshape(q.shape), lse.reshape(b, h, sq)


@autotuned(
    name="triton_attention",
    space="triton_attention",
    constraints=[fits],
    reference=attention_reference,
    backend="triton",
    tuned="../tuned",
    split=Split(f"{ARRAYS}->bhsd", along="bh"),
    example=Example(EXAMPLE, causal=True),
    backward=("triton_attention_bwd",),
)
@differentiable(*through_lse(_forward, lambda: triton_attention_bwd))
def triton_attention(
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
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D] by JAX's Triton kernel on a GPU;
    sm_scale defaults to 1/sqrt(D). `precision` is accepted for flash_attention's signature.
    Differentiable: the backward is the tuned kernel triton_attention_bwd."""
    check_precision(precision)
    return _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals=False)


# JAX's Triton backward: lse in base 2, of the scores of q scaled in float32
attention_bwd_reference = functools.partial(lse_backward_reference, lse_base2=True, rounded_q=False)


@autotuned(
    name="triton_attention_bwd",
    space="triton_attention_bwd",
    constraints=[fits_bwd],
    reference=attention_bwd_reference,
    backend="triton",
    tuned="../tuned",
    split=Split(f"{ARRAYS},bhsd,bhs,bhsd->bhsd,bhtd,bhtd", along="bh"),
    example=Example(f"{EXAMPLE},f32[1,2,64,32],f32[1,2,64],f32[1,2,64,32]", causal=True),
)
def triton_attention_bwd(
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
    """(dq, dk, dv) of triton_attention for the output's cotangent do, from its output and the
    log-sum-exp JAX's forward keeps ([B, H, Sq] float32), by JAX's fused backward kernel."""
    check_precision(precision)
    check_qkv("triton_attention_bwd", q, k, v)
    b, h, sq, d = q.shape
    jax_attention = _jax_attention()
    fields = {f: getattr(block_sizes, f) for f in ("block_q_dkv", "block_kv_dkv")}
    fields.update(block_q_dq=block_sizes.block_q_dq, block_kv_dq=block_sizes.block_kv_dq)
    # the forward's blocks are not read by the backward: its smallest stand in
    blocks = jax_attention.BlockSizes(block_q=MIN_TILE, block_k=MIN_TILE, **fields)
    res = (*map(heads_as_batch, (q, k, v)), None, heads_as_batch(out), lse.reshape(b * h, 1, sq))
    dq, dk, dv, _ = unchecked(
        jax_attention._mha_backward,
        softmax_scale(d, sm_scale),
        bool(causal),
        blocks,
        "triton",
        block_sizes.num_warps,
        None,  # num_stages: the backward takes none
        None,  # grid
        interpret,
        False,  # debug
        False,  # return_residuals
        res,
        heads_as_batch(do),
    )
    return tuple(g.reshape(x.shape).astype(x.dtype) for g, x in ((dq, q), (dk, k), (dv, v)))
