"""JAX's own Triton decode attention (`jax.experimental.pallas.ops.gpu.decode_attention.gqa`),
called unedited, with its block sizes, key splits, warps and stages tuned.

One query token per sequence attends over its whole key/value cache, the cache split in
`k_splits` parts that run in parallel and are combined at the end (flash-decoding), each query
head group (`block_h` heads sharing a key/value head) one grid step. The layout is JAX's:
q [batch, q_heads, head_dim], k and v [batch, seq, kv_heads, head_dim], q_heads a multiple of
kv_heads (grouped-query attention; kv_heads == q_heads is plain multi-head attention).

The cache is taken whole: JAX's `start_idx` and `kv_seq_len` (each sequence's filled part) are
data a tuning run cannot draw at random, so this wrapper does not take them; a call with ragged
lengths calls JAX's gqa itself with the block sizes this kernel's entries hold
(`decode_attention.explain(q, k, v)["config"]`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned
from autotune.backends.hardware import gpu_registers_ok, gpu_smem_bytes, is_pow2
from autotune.registry.varying import unchecked

MIN_BLOCK = 16  # tl.dot's smallest tile; JAX's kernel also needs each split's keys >= 16
EXAMPLE = "f32[2,4,32],f32[2,64,2,32],f32[2,64,2,32]"


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """JAX's gqa's tunables: query heads per grid step (block_h, padded to 16 inside), keys per
    step (block_k), the parts the cache is split into (k_splits), Triton's warps and stages."""

    block_h: int = 16
    block_k: int = 32
    k_splits: int = 2
    num_warps: int = 4
    num_stages: int = 2


def decode_attention_reference(
    q: jax.Array, k: jax.Array, v: jax.Array, *, sm_scale: float | None = None
) -> jax.Array:
    """Plain JAX in float32: softmax(q k^T * scale) v per query head, over its key/value head."""
    b, hq, d = q.shape
    hkv = k.shape[2]
    scale = d**-0.5 if sm_scale is None else sm_scale
    qf = q.astype(jnp.float32).reshape(b, hkv, hq // hkv, d)
    kf, vf = k.astype(jnp.float32), v.astype(jnp.float32)
    s = jnp.einsum("bkgd,bskd->bkgs", qf, kf, precision="highest") * scale
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bkgs,bskd->bkgd", p, vf, precision="highest")
    return out.reshape(b, hq, d).astype(q.dtype)


def fits_gpu(config: dict, sig) -> bool:
    """JAX's rules: k_splits divides the cache, each split holds at least 16 keys and a whole
    number of block_k steps (block_k clamped to the split, a power of two of at least 16),
    block_h a power of two; on a GPU a stage of k and v tiles per stage within shared memory
    and the output sum and score tile (float32, block_h padded to 16) within the registers."""
    if len(sig.shapes) != 3 or len(sig.shapes[0]) != 3 or len(sig.shapes[1]) != 4:
        return True  # JAX's kernel raises its own message
    (_, hq, d), (_, seq, hkv, _) = sig.shapes[0], sig.shapes[1]
    splits = config["k_splits"]
    if seq % splits or seq // splits < MIN_BLOCK:
        return False
    per_split = seq // splits
    bk = min(config["block_k"], per_split)
    if per_split % bk or not is_pow2(bk) or bk < MIN_BLOCK or not is_pow2(config["block_h"]):
        return False
    if config["block_h"] > max(MIN_BLOCK, pl.next_power_of_2(hq // hkv)):
        return False  # heads past the group's are padding: a larger block only wastes them
    if sig.platform != "gpu":
        return True
    dp, bh = pl.next_power_of_2(d), max(config["block_h"], MIN_BLOCK)
    smem = config["num_stages"] * 2 * bk * dp * jnp.dtype(sig.dtypes[0]).itemsize
    return smem <= gpu_smem_bytes(sig.device_kind) and gpu_registers_ok(
        bh * dp + bh * bk, config["num_warps"]
    )


@autotuned(
    name="decode_attention",
    space="decode_attention",
    constraints=[fits_gpu],
    reference=decode_attention_reference,
    backend="triton",
    tuned="../tuned",
    split=Split("bhd,bskd,bskd->bhd", along="b"),
    example=Example(EXAMPLE),
)
def decode_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    sm_scale: float | None = None,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """One query token per sequence, q [B, Hq, D], over the whole cache k, v [B, S, Hkv, D], by
    JAX's Triton decode kernel; sm_scale defaults to 1/sqrt(D)."""
    from jax.experimental.pallas.ops.gpu import decode_attention as jax_decode

    if q.ndim != 3 or k.ndim != 4 or k.shape != v.shape or q.shape[2] != k.shape[3]:
        raise ValueError(
            f"decode_attention needs q [B, Hq, D] and k, v [B, S, Hkv, D], got {q.shape=} "
            f"{k.shape=} {v.shape=}"
        )
    if q.shape[1] % k.shape[2]:
        raise ValueError(
            f"decode_attention: q's {q.shape[1]} heads must be a multiple of k's {k.shape[2]}"
        )
    return unchecked(
        jax_decode.gqa,
        q,
        k,
        v,
        sm_scale=sm_scale,
        interpret=interpret,
        **dataclasses.asdict(block_sizes),
    )
