"""JAX's GPU decode attention, called unedited, with its blocks, key splits and Triton knobs
tuned: `decode_attention` (`ops/gpu/decode_attention.gqa`: one query token per sequence over a
contiguous cache; multi-query attention is one kv head) and `paged_attention_gpu`
(`ops/gpu/paged_attention`: over a paged cache). The lengths and page tables are data the tuner
makes by a workload: every cache `full`, or `ragged` lengths (and pages drawn at random from
the pool). Serving kernels: no gradient (JAX's have none). With `interpret=True` they run in
Pallas interpret mode (how they are checked on a CPU host)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from autotune import Example, autotuned
from autotune.backends.hardware import gpu_smem_bytes, is_pow2, next_pow2
from autotune.registry.varying import unchecked

MIN_TILE = 16  # tl.dot's smallest; JAX's split key length and block_h floor
DECODE_EXAMPLE = "f32[2,4,32],f32[2,256,2,32],f32[2,256,2,32],s32[2]"
PAGED_EXAMPLE = "f32[2,4,32],f32[2,16,16,32],f32[2,16,16,32],s32[2,8],s32[2]"


def _full(args: Sequence[Any], rng: np.random.Generator, capacity: int) -> np.ndarray:
    del rng
    return np.full(args[0].shape[0], capacity, np.int32)


def _ragged(args: Sequence[Any], rng: np.random.Generator, capacity: int) -> np.ndarray:
    return rng.integers(1, capacity + 1, args[0].shape[0]).astype(np.int32)


def _decode_workload(lengths):
    def make(args: Sequence[Any], rng: np.random.Generator) -> dict[int, np.ndarray]:
        return {3: lengths(args, rng, args[1].shape[1])}

    return make


def _paged_workload(lengths):
    def make(args: Sequence[Any], rng: np.random.Generator) -> dict[int, np.ndarray]:
        total_pages, page_size = args[1].shape[1:3]
        batch, pages_per_seq = args[3].shape
        pool = rng.permutation(max(total_pages, batch * pages_per_seq)) % total_pages
        tables = pool[: batch * pages_per_seq].reshape(batch, pages_per_seq).astype(np.int32)
        return {3: tables, 4: lengths(args, rng, pages_per_seq * page_size)}

    return make


DECODE_WORKLOADS = {"full": _decode_workload(_full), "ragged": _decode_workload(_ragged)}
PAGED_WORKLOADS = {"full": _paged_workload(_full), "ragged": _paged_workload(_ragged)}


@dataclasses.dataclass(frozen=True)
class DecodeBlockSizes:
    """JAX's tunables: query heads per block, keys per step, key splits (each a program
    reduced at the end), the Triton knobs."""

    block_h: int = 16
    block_k: int = 32
    k_splits: int = 4
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class PagedBlockSizes:
    """JAX's tunables: query heads per block, pages per compute step, page splits, the Triton
    knobs."""

    block_h: int = 16
    pages_per_compute_block: int = 2
    k_splits: int = 4
    num_warps: int = 4
    num_stages: int = 2


def _gpu_tiles_fit(block_h: int, block_k: int, d: int, config: dict, sig) -> bool:
    """On a GPU: q's block and `num_stages` k and v tiles within shared memory."""
    if sig.platform != "gpu":
        return True
    dp, itemsize = next_pow2(d), jnp.dtype(sig.dtypes[0]).itemsize
    smem = (block_h * dp + config["num_stages"] * 2 * block_k * dp) * itemsize
    return smem <= gpu_smem_bytes(sig.device_kind)


def fits_decode(config: dict, sig) -> bool:
    """JAX's rules: the key length splits evenly into `k_splits` parts of at least 16, each a
    whole number of `block_k` steps; power-of-two blocks of at least 16."""
    if len(sig.shapes) != 4 or len(sig.shapes[1]) != 4:
        return True
    _, s, _, d = sig.shapes[1]
    bh, bk, splits = config["block_h"], config["block_k"], config["k_splits"]
    if s % splits or s // splits < MIN_TILE or (s // splits) % bk:
        return False
    return (
        is_pow2(bh)
        and is_pow2(bk)
        and min(bh, bk) >= MIN_TILE
        and _gpu_tiles_fit(bh, bk, d, config, sig)
    )


def fits_paged(config: dict, sig) -> bool:
    """JAX's rules: the pages of a sequence split evenly into `k_splits` partitions, each a whole
    number of compute steps; block_h a multiple of 16; a step's keys a power of two."""
    if len(sig.shapes) != 5 or len(sig.shapes[1]) != 4:
        return True
    _, _, page_size, d = sig.shapes[1]
    pages = sig.shapes[3][1]
    bh, step, splits = config["block_h"], config["pages_per_compute_block"], config["k_splits"]
    if pages % splits or (pages // splits) % step or bh % MIN_TILE:
        return False
    return is_pow2(step * page_size) and _gpu_tiles_fit(bh, step * page_size, d, config, sig)


def decode_attention_reference(
    q: jax.Array, k: jax.Array, v: jax.Array, kv_seq_len: jax.Array, *, sm_scale=None
) -> jax.Array:
    """JAX's own gqa_reference."""
    from jax.experimental.pallas.ops.gpu import decode_attention as jax_decode

    return jax_decode.gqa_reference(q, k, v, kv_seq_len=kv_seq_len, sm_scale=sm_scale)


@autotuned(
    name="decode_attention",
    space="decode_attention",
    constraints=[fits_decode],
    reference=decode_attention_reference,
    backend="triton",
    tuned="../tuned",
    example=Example(DECODE_EXAMPLE),
    workloads=DECODE_WORKLOADS,
)
def decode_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    kv_seq_len: jax.Array,
    *,
    sm_scale: float | None = None,
    block_sizes: DecodeBlockSizes = DecodeBlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """One query token per sequence, q [B, q_heads, D], over k, v [B, S, kv_heads, D] up to
    each sequence's `kv_seq_len` (int32 [B]), by JAX's Triton decode attention (`gqa`)."""
    from jax.experimental.pallas.ops.gpu import decode_attention as jax_decode

    return unchecked(
        jax_decode.gqa,
        q,
        k,
        v,
        kv_seq_len=kv_seq_len,
        sm_scale=sm_scale,
        **dataclasses.asdict(block_sizes),
        interpret=interpret,
    )


def paged_attention_gpu_reference(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    block_tables: jax.Array,
    lengths: jax.Array,
) -> jax.Array:
    """JAX's own paged_attention_reference, on the caches the page tables gather."""
    from jax.experimental.pallas.ops.gpu import paged_attention as jax_paged

    def gathered(pages: jax.Array) -> jax.Array:  # [B, pages_per_seq * page_size, kv_heads, D]
        g = pages[:, block_tables]  # [kv_heads, B, pages_per_seq, page_size, D]
        heads, b, n, size, d = g.shape
        return g.reshape(heads, b, n * size, d).transpose(1, 2, 0, 3)

    return jax_paged.paged_attention_reference(q, gathered(k_pages), gathered(v_pages), lengths)


@autotuned(
    name="paged_attention_gpu",
    space="paged_attention_gpu",
    constraints=[fits_paged],
    reference=paged_attention_gpu_reference,
    backend="triton",
    tuned="../tuned",
    example=Example(PAGED_EXAMPLE),
    workloads=PAGED_WORKLOADS,
)
def paged_attention_gpu(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    block_tables: jax.Array,
    lengths: jax.Array,
    *,
    block_sizes: PagedBlockSizes = PagedBlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """q [B, heads, D] over a paged cache (k, v pages [kv_heads, pages, page_size, D], each
    sequence's pages in `block_tables` [B, pages_per_seq], its length in `lengths` [B]), by
    JAX's Triton paged attention."""
    from jax.experimental.pallas.ops.gpu import paged_attention as jax_paged

    return unchecked(
        jax_paged.paged_attention,
        q,
        k_pages,
        v_pages,
        block_tables,
        lengths,
        **dataclasses.asdict(block_sizes),
        interpret=interpret,
    )
