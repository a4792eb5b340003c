"""What flash attention's bodies share (forward and backward, GPU and TPU layouts): the blocks
laid out for a platform and the rules they keep, the shapes a call must have, which scores a row
must not see, and which (query block, key block) tiles hold any.

A row must not see a padded key (past the sequence: zeros, which would otherwise take a share of
the softmax) nor, causal and top-left aligned, a key after its own (query i sees keys 0..i). Such
scores become a finite "minus infinity". Only the tiles that hold one need the mask: the one key
block with padded keys and, causal, the key blocks that cross the diagonal; every other tile a
row block sees is seen whole by each of its rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune.backends import clamp_block, whole_block
from autotune.backends.hardware import (
    GPU_TILE_REGISTERS,
    TPU_LANES,
    gpu_registers_ok,
    is_pow2,
    tpu_block_ok,
)

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Flash attention's tunables (the forward's and flash_attention_dq's): query rows per grid step (block_q)
    and keys per inner step (block_k); on a GPU Triton's warps and pipeline stages."""

    block_q: int = 128
    block_k: int = 128
    num_warps: int = 8  # 4 would spill past head_dim 64 (tiles.gpu_tiles_in_registers)
    num_stages: int = 2


# A finite "minus infinity" for masked scores: exp(MASK - m) is exactly 0 for any real max m,
# and a block with every key masked cannot turn the running max into NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(F32).max)
NT = (((1,), (1,)), ((), ()))  # dot_general's a @ b^T
TN = (((0,), (0,)), ((), ()))  # dot_general's a^T @ b


def mask_scores(s, rows, cols, *, causal: bool, seq_k: int | None):
    """`s` with the scores of keys at or past `seq_k` (None: no padded keys here) and, if
    `causal`, of keys after a row's own set to MASK_VALUE; `rows` and `cols` are each score's
    query and key positions."""
    if seq_k is not None:
        s = jnp.where(cols < seq_k, s, MASK_VALUE)
    if causal:
        s = jnp.where(cols <= rows, s, MASK_VALUE)
    return s


def padded_keys(seq_k: int, block_k: int) -> int | None:
    """`seq_k` where the last key block holds padded keys (what `mask_scores` takes), else None."""
    return seq_k if seq_k % block_k else None


def tile_needs_mask(q_block, kv_block, block_q: int, block_k: int, *, causal: bool, seq_k: int):
    """Whether the tile of query block `q_block` and key block `kv_block` holds a score some row
    must not see: causal, its last key is after its first row; or it is the last key block and
    holds padded keys (no tile needs one where neither can happen: check `masks_any` first)."""
    crosses = (kv_block + 1) * block_k - 1 > q_block * block_q
    padded = kv_block == pl.cdiv(seq_k, block_k) - 1
    if causal and seq_k % block_k:
        return jnp.logical_or(crosses, padded)
    return crosses if causal else padded


def key_blocks_walked(q_start, block_q: int, block_k: int, n_k: int, *, causal: bool, seq_k: int):
    """(whole, steps): how the GPU bodies of the forward and of dq walk the key blocks for the
    query rows from `q_start` (a block of `block_q`): blocks 0 to `whole` - 1 are seen whole by
    every row (no mask), the rest up to `steps` (causal: up to the last block its last row
    sees) cross the diagonal or hold padded keys. (lax.div: a floor division's sign fix-up asks
    the device for its TPU generation.)"""
    whole = n_k - 1 if seq_k % block_k else n_k
    if not causal:
        return whole, n_k
    whole = jnp.minimum(whole, jax.lax.div(q_start + 1, block_k))
    return whole, jnp.minimum(n_k, pl.cdiv(q_start + block_q, block_k))


def masks_any(causal: bool, seq_k: int, block_k: int) -> bool:
    """Whether any tile of a call needs the mask (`tile_needs_mask`)."""
    return causal or seq_k % block_k != 0


def probs(q, k, lse, rows, cols, *, sm_scale, causal, seq_k, precision):
    """exp(s - lse) of one (query block, key block) tile (the backward's probabilities, from the
    forward's log-sum-exp), the scores `mask_scores` masks at exactly 0."""
    s = jax.lax.dot_general(q, k, NT, precision=precision, preferred_element_type=F32) * sm_scale
    return jnp.exp(mask_scores(s, rows, cols, causal=causal, seq_k=seq_k) - lse)


def layout(shapes, config: dict, platform: str) -> tuple[int, int, int, int, int]:
    """(block_q, block_k, padded seq_q, padded seq_k, padded head_dim)."""
    (_, _, sq, d), (_, _, sk, _) = shapes[0], shapes[1]
    bq = clamp_block(config["block_q"], sq, platform)
    bk = clamp_block(config["block_k"], sk, platform)
    dp = whole_block(d, platform)
    return bq, bk, pl.cdiv(sq, bq) * bq, pl.cdiv(sk, bk) * bk, dp


def tpu_tiles_ok(bq: int, bk: int, sqp: int, skp: int, dp: int) -> bool:
    """The TPU's (8, 128) tiling of the q, k and v blocks and of the (block_q, block_k) score
    tile (its lanes: block_k a multiple of 128, or every key)."""
    return (
        tpu_block_ok((bq, dp), (sqp, dp))
        and tpu_block_ok((bk, dp), (skp, dp))
        and (bk % TPU_LANES == 0 or bk == skp)
    )


def gpu_tiles_ok(bq: int, bk: int, dp: int) -> bool:
    """Triton's tiles: powers of two of at least 16 (tl.dot)."""
    return all(is_pow2(b) and b >= 16 for b in (bq, bk, dp))


def gpu_tiles_in_registers(
    f32_elems: float, config: dict, budget: int = GPU_TILE_REGISTERS
) -> bool:
    """Whether tiles of `f32_elems` float32 elements (a 16-bit tile counts half) in all, live at
    once, fit the `budget` registers a thread gives its tiles (hardware.GPU_TILE_REGISTERS) at
    the config's `num_warps`. Each kernel's count and budget are calibrated against Triton's
    compile for sm_90 (benchmarks/register_check.py): no candidate it accepts at the
    hardware check's call spills, bar those the README lists."""
    return gpu_registers_ok(int(f32_elems), config["num_warps"], budget=budget)


def check_shapes(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"flash_attention needs q, k, v of shape [batch, heads, seq, head_dim], "
            f"got {q.shape=} {k.shape=} {v.shape=}"
        )
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"flash_attention needs k and v of one shape, with q's batch, heads and head_dim, "
            f"got {q.shape=} {k.shape=} {v.shape=}"
        )
    if not (q.dtype == k.dtype == v.dtype) or not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(
            f"flash_attention needs q, k, v of one float dtype, got {q.dtype=} {k.dtype=} {v.dtype=}"
        )
    if k.shape[2] == 0 and q.shape[2] > 0:
        raise ValueError(f"flash_attention needs at least one key, got {k.shape=}")
