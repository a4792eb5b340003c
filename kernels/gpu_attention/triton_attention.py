"""JAX's own Triton attention (`jax.experimental.pallas.ops.gpu.attention.mha`), called
unedited, with its forward's and its backward's block sizes tuned, each under its own key.

JAX's kernel takes [batch, seq, heads, head_dim]; here q, k and v are [B, H, S, D], as
flash_attention's, and enter it viewed as [B * H, S, 1, D] (`heads_as_batch`: a reshape, no
transpose). JAX's `BlockSizes` holds the forward's blocks and the backward's; its `mha` takes
the forward's warps and stages beside them. Tuned as one call, the backward's blocks would be
chosen by the forward's time: so the forward (`triton_attention`) is tuned on its own blocks,
and its VJP calls `triton_attention_bwd`, JAX's backward (its `mha.bwd`: one fused kernel
for dq, dk and dv after a small one for delta) with the backward's blocks, tuned on its own
time, as our flash_attention_dq/_dkv are.

Segment ids are not taken (JAX's `segment_ids=None`): a call with packed sequences calls JAX's
kernel itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned
from autotune.backends.hardware import gpu_registers_ok, gpu_smem_bytes, is_pow2
from autotune.kernels.attention_mgpu.attention_mgpu import heads_as_batch
from autotune.kernels.differentiable import differentiable
from autotune.kernels.flash_attention.reference import attention_reference, softmax_scale
from autotune.kernels.precision import Precision, check_precision
from autotune.registry.varying import unchecked

ARRAYS = "bhsd,bhtd,bhtd"  # q, k, v
EXAMPLE = "f32[1,2,64,32],f32[1,2,64,32],f32[1,2,64,32]"
MIN_BLOCK = 16  # tl.dot's smallest tile
# A thread gives its float32 tiles at most this many registers (the rest go to operands and
# addresses): the budget backends.hardware states for the flash kernels' tiles.
TILE_REGISTERS = 192


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The forward's tunables: JAX's BlockSizes' block_q and block_k, and the Triton warps and
    pipeline stages its `mha` takes."""

    block_q: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class BackwardBlockSizes:
    """The backward's tunables: JAX's BlockSizes' four backward blocks (dk/dv's query and key
    blocks, dq's query and key blocks) and the backward kernel's warps."""

    block_q_dkv: int = 32
    block_kv_dkv: int = 32
    block_q_dq: int = 32
    block_kv_dq: int = 32
    num_warps: int = 4


def _dims(sig) -> tuple[int, int, int] | None:
    """(seq_q, seq_k, head_dim padded to a power of two) of a call, or None where the call is
    not this kernel's (it raises its own message)."""
    if len(sig.shapes) < 3 or any(len(s) != 4 for s in sig.shapes[:3]):
        return None
    (_, _, sq, d), (_, _, sk, _) = sig.shapes[0], sig.shapes[1]
    return sq, sk, pl.next_power_of_2(d)


def _divides(block: int, seq: int) -> bool:
    """JAX clamps a block to the sequence, then needs it to divide the sequence; Triton needs a
    power of two of at least 16."""
    b = min(block, seq)
    return seq % b == 0 and is_pow2(b) and b >= MIN_BLOCK


def fits_gpu(config: dict, sig) -> bool:
    """The forward's rules: blocks that divide their sequences (after JAX clamps them), power-
    of-two tiles of at least 16; on a GPU the stages of k and v tiles and the q tile within
    shared memory, the output sum and score tile (float32) within the warps' registers."""
    dims = _dims(sig)
    if dims is None:
        return True
    sq, sk, dp = dims
    bq, bk = min(config["block_q"], sq), min(config["block_k"], sk)
    if not (_divides(config["block_q"], sq) and _divides(config["block_k"], sk)):
        return False
    if sig.platform != "gpu":
        return True
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    smem = (bq * dp + config["num_stages"] * 2 * bk * dp) * itemsize
    return smem <= gpu_smem_bytes(sig.device_kind) and gpu_registers_ok(
        bq * dp + bq * bk, config["num_warps"], budget=TILE_REGISTERS
    )


def fits_gpu_bwd(config: dict, sig) -> bool:
    """The backward's rules: each block divides its sequence (after JAX clamps it), power-of-
    two tiles of at least 16, and the one rule of JAX's fused backward: dq's query blocks and
    dk/dv's key blocks as many (seq_q / block_q_dq == seq_k / block_kv_dkv); on a GPU, the
    float32 tiles of its larger pass (dk and dv sums and a score tile) within the registers."""
    dims = _dims(sig)
    if dims is None:
        return True
    sq, sk, dp = dims
    blocks = {"block_q_dkv": sq, "block_kv_dkv": sk, "block_q_dq": sq, "block_kv_dq": sk}
    if not all(_divides(config[b], seq) for b, seq in blocks.items()):
        return False
    if sq // min(config["block_q_dq"], sq) != sk // min(config["block_kv_dkv"], sk):
        return False
    if sig.platform != "gpu":
        return True
    bq, bkv = min(config["block_q_dkv"], sq), min(config["block_kv_dkv"], sk)
    return gpu_registers_ok(2 * bkv * dp + bq * bkv, config["num_warps"], budget=TILE_REGISTERS)


def _check_shapes(name: str, q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(
            f"{name} needs q [B, H, Sq, D] and k, v [B, H, Sk, D], got {q.shape=} "
            f"{k.shape=} {v.shape=}"
        )


def _jax_block_sizes(**blocks: int):
    from jax.experimental.pallas.ops.gpu import attention as jax_attention

    return jax_attention.BlockSizes(**blocks)


def _forward(q, k, v, causal, sm_scale, block_sizes: BlockSizes, interpret, residuals: bool):
    """JAX's forward in this layout: the output and, with `residuals`, each query row's
    log-sum-exp as JAX keeps it for its backward (in base 2), [B, H, Sq] float32."""
    from jax.experimental.pallas.ops.gpu import attention as jax_attention

    _check_shapes("triton_attention", q, k, v)
    b, h, sq, d = q.shape
    outs = unchecked(
        jax_attention.mha,
        *map(heads_as_batch, (q, k, v)),
        None,
        sm_scale=softmax_scale(d, sm_scale),
        causal=bool(causal),
        block_sizes=_jax_block_sizes(block_q=block_sizes.block_q, block_k=block_sizes.block_k),
        num_warps=block_sizes.num_warps,
        num_stages=block_sizes.num_stages,
        interpret=interpret,
        return_residuals=residuals,
    )
    if not residuals:
        return outs.reshape(q.shape)
    out, lse = outs
    return out.reshape(q.shape), lse.reshape(b, h, sq)


def _fwd(forward, q, k, v, *, causal, sm_scale, precision, block_sizes, interpret):
    out, lse = _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals=True)
    return out, (q, k, v, out, lse)


def _bwd(residuals: tuple, do: jax.Array, *, causal, sm_scale, precision, interpret, **_):
    q, k, v, out, lse = residuals
    options = dict(causal=causal, sm_scale=sm_scale, precision=precision, interpret=interpret)
    return triton_attention_bwd(q, k, v, out, lse, do, **options)


@autotuned(
    name="triton_attention",
    space="triton_attention",
    constraints=[fits_gpu],
    reference=attention_reference,
    backend="triton",
    tuned="../tuned",
    split=Split(f"{ARRAYS}->bhsd", along="bh"),
    example=Example(EXAMPLE, sm_scale=0.3),
    backward=("triton_attention_bwd",),
)
@differentiable(_bwd, _fwd)
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
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D] by JAX's Triton kernel; sm_scale
    defaults to 1/sqrt(D). `precision` is accepted for flash_attention's signature: JAX's
    kernel multiplies its inputs at their own precision (TF32 on a GPU for float32).
    Differentiable: the backward is the tuned kernel triton_attention_bwd."""
    check_precision(precision)
    return _forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals=False)


def triton_attention_bwd_reference(
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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """What JAX's backward computes from these inputs, whatever they are (the oracle draws them
    at random): p = 2^(s log2(e) - lse) with s the scaled (and masked) scores and lse in base 2
    as JAX's forward keeps it, delta = rowsum(dO * O), in float32."""
    f32 = jnp.float32
    scale = softmax_scale(q.shape[-1], sm_scale)
    qf, kf, vf, of, dof = (a.astype(f32) for a in (q, k, v, out, do))
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf, precision="highest") * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = jnp.where(jnp.arange(sq)[:, None] >= jnp.arange(sk)[None, :], s, -jnp.inf)
    p = jnp.exp2(s * jnp.log2(jnp.e) - lse[..., None])
    dp = jnp.einsum("bhqd,bhkd->bhqk", dof, vf, precision="highest")
    ds = p * (dp - jnp.sum(of * dof, axis=-1)[..., None])
    dq = jnp.einsum("bhqk,bhkd->bhqd", ds, kf, precision="highest") * scale
    dk = jnp.einsum("bhqk,bhqd->bhkd", ds, qf, precision="highest") * scale
    dv = jnp.einsum("bhqk,bhqd->bhkd", p, dof, precision="highest")
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@autotuned(
    name="triton_attention_bwd",
    space="triton_attention_bwd",
    constraints=[fits_gpu_bwd],
    reference=triton_attention_bwd_reference,
    backend="triton",
    tuned="../tuned",
    split=Split(f"{ARRAYS},bhsd,bhs,bhsd->bhsd,bhtd,bhtd", along="bh"),
    example=Example(f"{EXAMPLE},f32[1,2,64,32],f32[1,2,64],f32[1,2,64,32]", sm_scale=0.3),
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
    log-sum-exp JAX's forward keeps ([B, H, Sq] float32), by JAX's backward kernel."""
    from jax.experimental.pallas.ops.gpu import attention as jax_attention

    check_precision(precision)
    _check_shapes("triton_attention_bwd", q, k, v)
    b, h, sq, d = q.shape
    blocks = dataclasses.asdict(block_sizes)
    num_warps = blocks.pop("num_warps")
    # the forward's blocks size only the backward's delta kernel here: dq's stand in
    jax_blocks = _jax_block_sizes(
        block_q=blocks["block_q_dq"], block_k=blocks["block_kv_dq"], **blocks
    )
    residuals = (
        *map(heads_as_batch, (q, k, v)),
        None,
        heads_as_batch(out),
        lse.reshape(b * h, 1, sq),
    )
    # JAX's mha.bwd: its nondiff arguments (sm_scale, causal, block_sizes, backward_pass_impl,
    # num_warps, num_stages, grid, interpret, debug, return_residuals), residuals, cotangent
    dq, dk, dv, _ = unchecked(
        jax_attention.mha.bwd,
        softmax_scale(d, sm_scale),
        bool(causal),
        jax_blocks,
        "triton",
        num_warps,
        2,
        None,
        interpret,
        False,
        False,
        residuals,
        heads_as_batch(do),
    )
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
