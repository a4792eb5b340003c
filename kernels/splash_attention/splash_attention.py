"""JAX's splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, MaxText's TPU
attention), called unedited, its forward and backward block sizes tuned as two kernels with
keys of their own, as flash_attention's dq/dkv are.

q, k and v are [B, H, S, D], flash_attention's layout; `causal=` builds JAX's CausalMask
inside (a static mask, its block-sparsity worked out per block size). JAX's kernel takes one
batch entry [H, S, D] and applies no softmax scale: it is mapped over the batch (jax.vmap)
and q enters scaled in float32, rounded once to q's dtype (exact for a power-of-two scale).

Differentiable: the forward keeps JAX's log-sum-exp, and the backward is JAX's own (its dq and
dk/dv kernels, or the fused one with `use_fused_bwd_kernel`), the kernel
`splash_attention_bwd`, tuned under its own key from the same residuals.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from autotune import Example, Split, autotuned
from autotune.backends import mosaic_tpu
from autotune.backends.hardware import TPU_LANES, TPU_SUBLANES
from autotune.kernels.differentiable import differentiable, through_lse
from autotune.kernels.flash_attention.reference import (
    attention_reference,
    check_qkv,
    lse_backward_reference,
    scaled_query,
    softmax_scale,
)
from autotune.kernels.precision import Precision, check_precision
from autotune.registry.varying import unchecked

ARRAYS = "bhsd,bhtd,bhtd"  # q, k, v
# the smallest call JAX's kernel takes with a choice of blocks: 256 rows, 128-lane key blocks
EXAMPLE = "f32[1,2,256,128],f32[1,2,256,128],f32[1,2,256,128]"
PIPELINE_BUFFERS = 2


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The forward's fields of JAX's BlockSizes: query rows per block, keys per block, keys
    per compute step within it."""

    block_q: int = 128
    block_kv: int = 128
    block_kv_compute: int = 128


@dataclasses.dataclass(frozen=True)
class BackwardBlockSizes:
    """The backward's fields of JAX's BlockSizes: dk/dv's query rows, keys and keys per
    compute step per block; dq's query rows and keys per block (unused by the fused kernel,
    which computes dq beside dk/dv)."""

    block_q_dkv: int = 128
    block_kv_dkv: int = 128
    block_kv_dkv_compute: int = 128
    block_q_dq: int = 128
    block_kv_dq: int = 128
    use_fused_bwd_kernel: bool = False


def _jax_splash():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

    return splash_attention_kernel


def _mask(heads: int, sq: int, sk: int, causal: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    one = masks.CausalMask((sq, sk)) if causal else masks.FullMask((sq, sk))
    return masks.MultiHeadMask([one] * heads)


def _tiles_ok(bq: int, bkv: int, bkv_compute: int, sq: int, sk: int) -> bool:
    """JAX's rules: blocks divide their sequence, key blocks and compute steps are whole
    128-lane tiles (or the whole sequence), the compute step divides its block, query blocks
    whole sublane tiles."""
    return (
        sq % bq == 0
        and sk % bkv == 0
        and bkv % bkv_compute == 0
        and (bkv_compute % TPU_LANES == 0 or bkv_compute == sk)
        and (bq % TPU_SUBLANES == 0 or bq == sq)
    )


def vmem_bytes(bq: int, bkv: int, bkv_compute: int, d: int, itemsize: int) -> int:
    """VMEM of a forward grid step: q, k, v and output blocks double-buffered, and the float32
    accumulator, running max and sum and the scores of one compute step."""
    blocks = (2 * bq * d + 2 * bkv * d) * itemsize
    return PIPELINE_BUFFERS * blocks + (bq * d + 2 * bq * TPU_LANES + bq * bkv_compute) * 4


def _shapes(sig):
    if len(sig.shapes) < 3 or any(len(s) != 4 for s in sig.shapes[:3]):
        return None
    (_, _, sq, d), (_, _, sk, _) = sig.shapes[0], sig.shapes[1]
    return sq, sk, d


def fits(config: dict, sig) -> bool:
    """JAX's block rules, and on a TPU the forward's VMEM within the default scoped limit."""
    shapes = _shapes(sig)
    if shapes is None:
        return True  # the kernel itself rejects such calls
    sq, sk, d = shapes
    bq, bkv, bc = config["block_q"], config["block_kv"], config["block_kv_compute"]
    if not _tiles_ok(bq, bkv, bc, sq, sk):
        return False
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    return sig.platform != "tpu" or vmem_bytes(bq, bkv, bc, d, itemsize) <= (
        mosaic_tpu.scoped_vmem_bytes(sig.device_kind)
    )


def fits_bwd(config: dict, sig) -> bool:
    """JAX's block rules for dk/dv's blocks and (unfused) dq's, and on a TPU each kernel's
    VMEM (counted as the forward's at its blocks) within the default scoped limit."""
    shapes = _shapes(sig)
    if shapes is None:
        return True
    sq, sk, d = shapes
    dkv = (config["block_q_dkv"], config["block_kv_dkv"], config["block_kv_dkv_compute"])
    dq = (config["block_q_dq"], config["block_kv_dq"], config["block_kv_dq"])
    blocks = [dkv] if config["use_fused_bwd_kernel"] else [dkv, dq]
    if config["use_fused_bwd_kernel"] and dq != (128, 128, 128):
        return False  # the fused kernel has no dq blocks: one candidate, not many the same
    if not all(_tiles_ok(*b, sq, sk) for b in blocks):
        return False
    if sig.platform != "tpu":
        return True
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    limit = mosaic_tpu.scoped_vmem_bytes(sig.device_kind)
    # the backward keeps dO and the gradient blocks besides: twice the forward's inputs
    return all(2 * vmem_bytes(*b, d, itemsize) <= limit for b in blocks)


def _jax_blocks(forward: BlockSizes, backward: BackwardBlockSizes | None = None):
    """JAX's BlockSizes of these fields (the fused backward takes no dq blocks)."""
    fields = dataclasses.asdict(forward)
    if backward is not None:
        fields.update(dataclasses.asdict(backward))
        if backward.use_fused_bwd_kernel:
            fields.update(block_q_dq=None, block_kv_dq=None)
    return _jax_splash().BlockSizes(**fields)


def _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals: bool):
    check_qkv("splash_attention", q, k, v)
    _, h, sq, d = q.shape
    kernel = _jax_splash().make_splash_mha(
        _mask(h, sq, k.shape[2], causal),
        block_sizes=_jax_blocks(block_sizes),
        head_shards=1,
        q_seq_shards=1,
        save_residuals=residuals,
        interpret=interpret,
    )
    qs = scaled_query(q, softmax_scale(d, sm_scale))
    out = unchecked(jax.vmap(kernel), qs, k, v)
    if not residuals:
        return out
    out, (lse,) = out
    return out, lse


@autotuned(
    name="splash_attention",
    space="splash_attention",
    constraints=[fits],
    reference=attention_reference,
    backend="mosaic_tpu",
    tuned="../tuned",
    split=Split(f"{ARRAYS}->bhsd", along="bh"),
    example=Example(EXAMPLE, causal=True),
    backward=("splash_attention_bwd",),
)
@differentiable(*through_lse(_forward, lambda: splash_attention_bwd))
def splash_attention(
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
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D] by JAX's splash attention on a TPU
    (`interpret=True`: TPU interpret mode); sm_scale defaults to 1/sqrt(D). `precision` is
    accepted for flash_attention's signature: JAX's kernel multiplies at the inputs' own
    precision. Differentiable: the backward is the tuned kernel splash_attention_bwd."""
    check_precision(precision)
    return _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals=False)


# JAX's splash backward: lse in natural log, of the scores of q as the forward rounds it scaled
splash_attention_bwd_reference = functools.partial(
    lse_backward_reference, lse_base2=False, rounded_q=True
)


@autotuned(
    name="splash_attention_bwd",
    space="splash_attention_bwd",
    constraints=[fits_bwd],
    reference=splash_attention_bwd_reference,
    backend="mosaic_tpu",
    tuned="../tuned",
    split=Split(f"{ARRAYS},bhsd,bhs,bhsd->bhsd,bhtd,bhtd", along="bh"),
    example=Example(f"{EXAMPLE},f32[1,2,256,128],f32[1,2,256],f32[1,2,256,128]", causal=True),
)
def splash_attention_bwd(
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
    """(dq, dk, dv) of splash_attention for the output's cotangent do, from its output and the
    log-sum-exp JAX's forward keeps ([B, H, Sq] float32), by JAX's backward kernels."""
    check_precision(precision)
    check_qkv("splash_attention_bwd", q, k, v)
    splash = _jax_splash()
    _, h, sq, d = q.shape
    scale = softmax_scale(d, sm_scale)
    # the masks' block-sparsity for the backward's blocks, as JAX's kernel object makes them
    # (its forward's blocks are not read by the backward: the defaults stand in)
    made = splash.make_splash_mha(
        _mask(h, sq, k.shape[2], causal),
        block_sizes=_jax_blocks(BlockSizes(), block_sizes),
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )
    kw = made.kwargs
    backward = functools.partial(
        splash._splash_attention_bwd,
        False,  # save_residuals
        kw["mask_value"],
        False,  # is_mqa
        kw["block_sizes"],
        None,  # residual_checkpoint_name
        kw["mask_function"],
        kw["attn_logits_soft_cap"],
        interpret,
    )

    def one(qs, k, v, out, lse, do):
        res = (qs, k, v, None, None, out, lse, made.dq_mask_info, made.dkv_mask_info)
        return backward(res, do)[3:6]

    dqs, dk, dv = unchecked(jax.vmap(one), scaled_query(q, scale), k, v, out, lse, do)
    dq = (dqs.astype(jnp.float32) * scale).astype(q.dtype)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype)
