"""Flash attention backward: dq, and dk with dv, as two Pallas kernels of their own.

Both read what the forward kept: the log-sum-exp of each query row's scaled scores (`lse`),
so probabilities are recomputed block by block as exp(s - lse) without a running softmax, and
delta = rowsum(dO * O), computed once before them. With s = q k^T * sm_scale, p = exp(s - lse),
dp = dO v^T and ds = p * (dp - delta): dq = ds k * sm_scale, dk = ds^T q * sm_scale, dv = p^T dO.

- `flash_attention_dq`: a grid step holds `block_q` query rows and walks the keys `block_k` at
  a time (causal: up to the last key block its rows see, as the forward stops).
- `flash_attention_dkv`: a grid step holds `block_k` keys and walks the query rows `block_q`
  at a time (causal: from the first query block that sees its keys).

On a TPU each takes its own body (tpu.py), laid out as the forward's:
the walked side is the last grid axis, "arbitrary", and the float32 accumulators live in VMEM
scratch, so a step holds one block of each side whatever the sequence lengths.

Their block sizes are tuned apart from the forward's and from each other's (the two loops run
in opposite directions). Padding and masking are the forward's (tiles.py): padded keys are
masked out, padded query rows carry a zero dO and add nothing. Each kernel's reference is the
VJP of attention_reference written in the saved lse and delta (reference.py).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned, out_struct
from autotune.backends import kernel_platform, mosaic_tpu, triton
from autotune.backends.hardware import gpu_smem_bytes
from autotune.kernels.flash_attention.reference import (
    attention_dkv_reference,
    attention_dq_reference,
    softmax_scale,
)
from autotune.kernels.flash_attention.tiles import (
    F32,
    NT,
    TN,
    BlockSizes,
    check_shapes,
    gpu_tiles_in_registers,
    gpu_tiles_ok,
    key_blocks_walked,
    layout,
    padded_keys,
    probs,
    tpu_tiles_ok,
)
from autotune.kernels.flash_attention.tpu import backward_tpu, tpu_vmem_dkv, tpu_vmem_dq
from autotune.kernels.precision import Precision, dot_precision

# both kernels' arrays: q, k, v, dO, and the forward's log-sum-exp and delta, [B, H, Sq] float32
ARRAYS = "bhsd,bhtd,bhtd,bhsd,bhs,bhs"
# a small call, the forward's example's: 19 queries over 23 keys, causal (padded rows and keys,
# blocks past the diagonal)
EXAMPLE = Example(
    "f32[1,2,19,16],f32[1,2,23,16],f32[1,2,23,16],f32[1,2,19,16],f32[1,2,19],f32[1,2,19]",
    causal=True,
)


@dataclasses.dataclass(frozen=True)
class DkvBlockSizes:
    """flash_attention_dkv's tunables: keys per grid step (block_k), query rows per inner step
    (block_q); on a GPU Triton's warps and pipeline stages."""

    block_q: int = 64  # on a GPU 64 keys too (DKV_GPU_DEFAULTS): 128 spill at head_dim 128
    block_k: int = 128
    num_warps: int = 8
    num_stages: int = 2


# What a thread may hold of `_fits`'s tiles, in float32 registers, calibrated against Triton's
# compile for sm_90 at the hardware check's call, bf16 4x16x2048x128 causal
# (benchmarks/register_check.py): dq spills from 288 (128 query rows on 4 warps) and not at 256;
# dkv, whose one warpgroup on 4 warps holds both the dk and dv accumulators, spills from 160
# on 4 warps (keys 32, query rows 128) and from 208 on 8 (keys 128), and not at 128 and 160.
DQ_REGISTERS = 256
DKV_REGISTERS = {4: 128, 8: 160}
# dkv's GPU default: the block sizes' own (64 query rows, 128 keys, 8 warps) spill 4.6 KB
# there; 64 keys a step do not (240 registers)
DKV_GPU_DEFAULTS = {"block_q": 64, "block_k": 64, "num_warps": 8, "num_stages": 2}


def dkv_defaults(sig) -> dict | None:
    return DKV_GPU_DEFAULTS if sig.platform == "gpu" else None


def _fits(config: dict, sig, tpu_vmem, streamed: str) -> bool:
    """On a TPU the forward's tiling rules (tiles.tpu_tiles_ok) and the step's VMEM (`tpu_vmem`); on
    a GPU the forward's tiles, the shared memory of two resident blocks (q and dO for dq, k and
    v for dkv) and `num_stages` copies of the two blocks `streamed` along the loop, and in
    registers the float32 accumulators (dq; dk and dv) beside the probability and dp tiles."""
    if len(sig.shapes) != 6:
        return True  # the kernel itself rejects such calls with a clear message
    bq, bk, _, _, dp = layout(sig.shapes[:2], config, sig.platform)
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    if sig.platform == "tpu":
        _, _, sqp, skp, _ = layout(sig.shapes[:2], config, sig.platform)
        return tpu_tiles_ok(bq, bk, sqp, skp, dp) and tpu_vmem(
            bq, bk, dp, itemsize
        ) <= mosaic_tpu.vmem_budget(sig.device_kind)
    if sig.platform == "gpu":
        resident, step = (bq, bk) if streamed == "k" else (bk, bq)
        stages = config["num_stages"]
        smem = 2 * (resident + stages * step) * dp * itemsize
        accumulators = bq * dp if streamed == "k" else 2 * bk * dp
        # the float32 accumulators, the probability and dp tiles, and the two resident blocks
        tiles = accumulators + 2 * bq * bk + 2 * resident * dp * itemsize / 4
        if streamed == "k":
            budget = DQ_REGISTERS
        else:
            budget = DKV_REGISTERS.get(config["num_warps"], max(DKV_REGISTERS.values()))
        return (
            gpu_tiles_ok(bq, bk, dp)
            and smem <= gpu_smem_bytes(sig.device_kind)
            and gpu_tiles_in_registers(tiles, config, budget)
        )
    return True


def fits_platform_dq(config: dict, sig) -> bool:
    """The forward's tiles; on a TPU a step of dq's TPU body (`tpu_vmem_dq`, independent of the
    sequence length) within the chip's budget; on a GPU q and dO held while k and v stream, the
    dq accumulator in registers."""
    return _fits(config, sig, tpu_vmem_dq, streamed="k")


def fits_platform_dkv(config: dict, sig) -> bool:
    """As `fits_platform_dq`, for dkv: its TPU body's VMEM (`tpu_vmem_dkv`); on a GPU k and v
    held while q and dO stream, the dk and dv accumulators in registers."""
    return _fits(config, sig, tpu_vmem_dkv, streamed="q")


def _dq_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dq_ref,
    *,
    sm_scale,
    causal,
    block_k,
    seq_k,
    n_k,
    precision,
):
    block_q = q_ref.shape[0]
    q_start = pl.program_id(2) * block_q
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    rows = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    lanes = jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def step(j, dq, masked: bool):
        k = k_ref[pl.ds(j * block_k, block_k), :]
        v = v_ref[pl.ds(j * block_k, block_k), :]
        p = probs(
            q,
            k,
            lse,
            rows,
            j * block_k + lanes,
            sm_scale=sm_scale,
            causal=causal and masked,
            seq_k=padded_keys(seq_k, block_k) if masked else None,
            precision=precision,
        )
        dp = jax.lax.dot_general(do, v, NT, precision=precision, preferred_element_type=F32)
        ds = p * (dp - delta)
        return dq + jnp.dot(ds.astype(k.dtype), k, precision=precision, preferred_element_type=F32)

    # as the forward: only the key blocks on the diagonal or holding padded keys are masked
    n_whole, n_steps = key_blocks_walked(q_start, block_q, block_k, n_k, causal=causal, seq_k=seq_k)
    dq = jax.lax.fori_loop(
        0, n_whole, functools.partial(step, masked=False), jnp.zeros(dq_ref.shape, F32)
    )
    dq = jax.lax.fori_loop(n_whole, n_steps, functools.partial(step, masked=True), dq)
    dq_ref[...] = (dq * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    *,
    sm_scale,
    causal,
    block_q,
    seq_k,
    n_q,
    precision,
):
    block_k = k_ref.shape[0]
    k_start = pl.program_id(2) * block_k
    k, v = k_ref[...], v_ref[...]
    rows = jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    cols = k_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def step(i, carry, masked: bool):
        dk, dv = carry
        q = q_ref[pl.ds(i * block_q, block_q), :]
        do = do_ref[pl.ds(i * block_q, block_q), :]
        lse = lse_ref[pl.ds(i * block_q, block_q), :]
        delta = delta_ref[pl.ds(i * block_q, block_q), :]
        p = probs(
            q,
            k,
            lse,
            i * block_q + rows,
            cols,
            sm_scale=sm_scale,
            causal=causal and masked,
            seq_k=padded_keys(seq_k, block_k),
            precision=precision,
        )
        dv = dv + jax.lax.dot_general(
            p.astype(do.dtype), do, TN, precision=precision, preferred_element_type=F32
        )
        dp = jax.lax.dot_general(do, v, NT, precision=precision, preferred_element_type=F32)
        ds = p * (dp - delta)
        dk = dk + jax.lax.dot_general(
            ds.astype(q.dtype), q, TN, precision=precision, preferred_element_type=F32
        )
        return dk, dv

    # causal: rows before k_start see none of these keys, and from the query block whose first
    # row is the block's last key on, every row sees them all (no mask). (lax.div: a floor
    # division's sign fix-up asks the device for its TPU generation.)
    first, whole = 0, 0
    if causal:
        first = jax.lax.div(k_start, block_q)
        whole = jnp.minimum(n_q, jax.lax.div(k_start + block_k - 1 + block_q - 1, block_q))
    zeros = jnp.zeros(dk_ref.shape, F32)
    carry = jax.lax.fori_loop(first, whole, functools.partial(step, masked=True), (zeros, zeros))
    dk, dv = jax.lax.fori_loop(whole, n_q, functools.partial(step, masked=False), carry)
    dk_ref[...] = (dk * sm_scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _check_grads(q, k, v, do, lse, delta) -> None:
    check_shapes(q, k, v)
    if do.shape != q.shape or do.dtype != q.dtype:
        raise ValueError(
            f"flash attention backward needs do of q's shape and dtype, got {do.shape=}"
        )
    for name, a in (("lse", lse), ("delta", delta)):
        if a.shape != q.shape[:3]:
            raise ValueError(
                f"flash attention backward needs {name} of shape {q.shape[:3]}, got {a.shape}"
            )


def _check_grads(q, k, v, do, lse, delta) -> None:
    check_shapes(q, k, v)
    if do.shape != q.shape or do.dtype != q.dtype:
        raise ValueError(
            f"flash attention backward needs do of q's shape and dtype, got {do.shape=}"
        )
    for name, a in (("lse", lse), ("delta", delta)):
        if a.shape != q.shape[:3]:
            raise ValueError(
                f"flash attention backward needs {name} of shape {q.shape[:3]}, got {a.shape}"
            )


def backward_on(
    which: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    *,
    causal: bool,
    sm_scale: float | None,
    block_sizes: BlockSizes | DkvBlockSizes,
    precision: str | None,
    platform: str,
    interpret: bool,
) -> list[jax.Array]:
    """[dq] ("dq") or [dk, dv] ("dkv"), the inputs laid out for `platform` as the forward lays
    them out (tests run the GPU layout in interpret mode)."""
    _check_grads(q, k, v, do, lse, delta)
    precision = dot_precision(precision, q.dtype)
    if q.size == 0 or k.size == 0:
        return [jnp.zeros_like(q)] if which == "dq" else [jnp.zeros_like(k), jnp.zeros_like(v)]
    kernel = _dq_kernel if which == "dq" else _dkv_kernel
    (b, h, sq, d), sk = q.shape, k.shape[2]
    blocks = {"block_q": block_sizes.block_q, "block_k": block_sizes.block_k}
    bq, bk, sqp, skp, dp = layout((q.shape, k.shape), blocks, platform)

    def pad(x, s, sp):
        return jnp.pad(x, ((0, 0), (0, 0), (0, sp - s), (0, dp - d))) if (sp, dp) != (s, d) else x

    def pad_rows(x):  # [B, H, Sq] -> [B, H, Sq padded, 1]: a TPU-tileable block, as the forward's
        x = x.astype(F32)[..., None]
        return jnp.pad(x, ((0, 0), (0, 0), (0, sqp - sq), (0, 0))) if sqp != sq else x

    scale = softmax_scale(d, sm_scale)
    if mosaic_tpu.targets_tpu(platform, interpret):
        return backward_tpu(which, q, k, v, do, lse, delta, bool(causal), scale, bq, bk, precision)
    q_all = pl.BlockSpec((None, None, sqp, dp), lambda i, j, t: (i, j, 0, 0))
    kv_all = pl.BlockSpec((None, None, skp, dp), lambda i, j, t: (i, j, 0, 0))
    rows_all = pl.BlockSpec((None, None, sqp, 1), lambda i, j, t: (i, j, 0, 0))
    if which == "dq":
        q_blk = pl.BlockSpec((None, None, bq, dp), lambda i, j, t: (i, j, t, 0))
        rows_blk = pl.BlockSpec((None, None, bq, 1), lambda i, j, t: (i, j, t, 0))
        body = functools.partial(kernel, block_k=bk, n_k=skp // bk)
        grid, in_specs = (b, h, sqp // bq), [q_blk, kv_all, kv_all, q_blk, rows_blk, rows_blk]
        out_shape, out_specs = (
            [out_struct((b, h, sqp, dp), q.dtype, q, k, v, do, lse, delta)],
            [q_blk],
        )
    else:
        kv_blk = pl.BlockSpec((None, None, bk, dp), lambda i, j, t: (i, j, t, 0))
        body = functools.partial(kernel, block_q=bq, n_q=sqp // bq)
        grid, in_specs = (b, h, skp // bk), [q_all, kv_blk, kv_blk, q_all, rows_all, rows_all]
        out_shape = [out_struct((b, h, skp, dp), k.dtype, q, k, v, do, lse, delta)] * 2
        out_specs = [kv_blk, kv_blk]
    outs = pl.pallas_call(
        functools.partial(body, sm_scale=scale, causal=bool(causal), seq_k=sk, precision=precision),
        out_shape=out_shape,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        compiler_params=triton.compiler_params(
            block_sizes.num_warps, block_sizes.num_stages, platform
        ),
        interpret=interpret,
    )(
        pad(q, sq, sqp),
        pad(k, sk, skp),
        pad(v, sk, skp),
        pad(do, sq, sqp),
        pad_rows(lse),
        pad_rows(delta),
    )
    return [o[:, :, : (sq if which == "dq" else sk), :d] for o in outs]


@autotuned(
    name="flash_attention_dq",
    space="flash_attention_dq",
    constraints=[fits_platform_dq],
    reference=attention_dq_reference,
    tuned="../tuned",
    split=Split(f"{ARRAYS}->bhsd", along="bh"),
    example=EXAMPLE,
)
def flash_attention_dq(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    block_sizes: BlockSizes = BlockSizes(),  # dq and the probabilities: 192 registers a thread
    precision: Precision = None,
    interpret: bool = False,
) -> jax.Array:
    """dq of flash_attention for the output's cotangent do, from the forward's lse and
    delta = rowsum(do * out) (both [B, H, Sq] float32)."""
    options = dict(causal=causal, sm_scale=sm_scale, precision=precision, interpret=interpret)
    platform = kernel_platform(interpret)
    (dq,) = backward_on(
        "dq", q, k, v, do, lse, delta, block_sizes=block_sizes, platform=platform, **options
    )
    return dq


@autotuned(
    name="flash_attention_dkv",
    space="flash_attention_dkv",
    constraints=[fits_platform_dkv],
    defaults_for=dkv_defaults,
    reference=attention_dkv_reference,
    tuned="../tuned",
    split=Split(f"{ARRAYS}->bhtd,bhtd", along="bh"),
    example=EXAMPLE,
)
def flash_attention_dkv(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    do: jax.Array,
    lse: jax.Array,
    delta: jax.Array,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    block_sizes: DkvBlockSizes = DkvBlockSizes(),
    precision: Precision = None,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """(dk, dv) of flash_attention for the output's cotangent do, from the forward's lse and
    delta = rowsum(do * out) (both [B, H, Sq] float32)."""
    options = dict(causal=causal, sm_scale=sm_scale, precision=precision, interpret=interpret)
    platform = kernel_platform(interpret)
    dk, dv = backward_on(
        "dkv", q, k, v, do, lse, delta, block_sizes=block_sizes, platform=platform, **options
    )
    return dk, dv
