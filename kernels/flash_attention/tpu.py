"""Flash attention's TPU bodies, forward and backward (on a TPU, and when lowered for one or run
under TPU interpret mode), and the VMEM each step of them holds.

The layout is that of JAX's ops/tpu/flash_attention.py: the grid is (batch, heads, blocks of the
held side, blocks of the walked side), the walked side last and "arbitrary", so a step holds one
query block and one key block whatever the sequence lengths, and the float32 running values live
in VMEM scratch across the walked axis. The forward and dq hold a query block and walk the keys;
dkv holds a key block and walks the queries. The parallel axes are laid out for megacore
(`mosaic_tpu.ParallelGrid`: one of more than one block first).

A causal tile that no row of its query block sees is skipped, and its index map repeats a block
fetched anyway, so the pipeline fetches nothing for it. Of the tiles that run, only those that
need it are masked (`tiles.tile_needs_mask`: the diagonal's and the one with padded
keys); the rest skip the iota, compare and select. Sequences are zero-padded to the blocks;
head_dim stays whole.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import out_struct
from autotune.backends import mosaic_tpu
from autotune.backends.hardware import TPU_LANES
from autotune.kernels.flash_attention.tiles import (
    F32,
    NT,
    TN,
    mask_scores,
    masks_any,
    padded_keys,
    probs,
    tile_needs_mask,
)

# the kernel's grid axes (before ParallelGrid lays the parallel ones out)
BATCH, HEADS, HELD, WALKED = 0, 1, 2, 3


def tpu_vmem(bq: int, bk: int, d: int, itemsize: int) -> int:
    """VMEM bytes of the forward's step: q, k, v and out blocks double-buffered by the
    pipeline; the float32 scratch (running max and sum, 128 lanes each, and the output sum);
    float32 temporaries: the score tile, its exponentials and a block of p @ v. The lse output
    that the backward keeps ([block_q, 1] float32, a row of 128 lanes per row, double-buffered)
    is counted too: one tuned configuration serves calls under jax.grad and without."""
    blocks = 2 * (2 * bq * d + 2 * bk * d) * itemsize + 2 * bq * TPU_LANES * 4
    scratch = (2 * bq * TPU_LANES + bq * d) * 4
    return blocks + scratch + (2 * bq * bk + bq * d) * 4


def tpu_vmem_dq(bq: int, bk: int, d: int, itemsize: int) -> int:
    """VMEM bytes of a step of dq's body: the q, dO and dq blocks and the k and v blocks,
    double-buffered; lse and delta, [block_q, 1] float32 blocks that take a row of 128 lanes
    per row, double-buffered; the float32 dq accumulator (scratch); float32 temporaries: the
    scores, probabilities, dp and ds tiles and a block of ds @ k."""
    blocks = 2 * (3 * bq + 2 * bk) * d * itemsize + 2 * 2 * bq * TPU_LANES * 4
    return blocks + bq * d * 4 + (4 * bq * bk + bq * d) * 4


def tpu_vmem_dkv(bq: int, bk: int, d: int, itemsize: int) -> int:
    """VMEM bytes of a step of dkv's body: the k, v, dk and dv blocks and the q and dO blocks,
    double-buffered; lse and delta as in `tpu_vmem_dq`; the float32 dk and dv accumulators
    (scratch); float32 temporaries: the scores, probabilities, dp and ds tiles and a block
    each of ds^T @ q and p^T @ dO."""
    blocks = 2 * (4 * bk + 2 * bq) * d * itemsize + 2 * 2 * bq * TPU_LANES * 4
    return blocks + 2 * bk * d * 4 + (4 * bq * bk + 2 * bk * d) * 4


# ------------------------------------------------------------------ causal block geometry


def last_visible_block(q_block, block_q: int, block_k: int):
    """The last key block that a causal q block's rows can see (its last row's)."""
    # lax.div: `//` on integers lowers through sign(), which Mosaic lowers only on a TPU host
    return jax.lax.div((q_block + 1) * block_q - 1, block_k)


def kv_block_fetched(q_block, kv_block, block_q: int, block_k: int):
    """The key block a causal step fetches: its own, or for a step the kernel skips (past the
    last block the q block's rows see) that last one again: a step whose block index repeats
    the previous step's makes the pipeline fetch nothing."""
    return jnp.minimum(kv_block, last_visible_block(q_block, block_q, block_k))


def first_visible_q_block(kv_block, block_q: int, block_k: int):
    """The first q block whose rows see a causal key block (its last row's key is the block's
    first or later)."""
    return jax.lax.div(kv_block * block_k, block_q)


def q_block_fetched(kv_block, q_block, block_q: int, block_k: int, n_q: int):
    """The q block a causal dkv step fetches: its own, or for a step the kernel skips (before
    the first q block that sees the key block) that first one, fetched once ahead of its turn;
    kept within the grid for key blocks past every query (which no step computes)."""
    first = first_visible_q_block(kv_block, block_q, block_k)
    return jnp.minimum(jnp.maximum(q_block, first), n_q - 1)


def run_tile(step, q_block, kv_block, block_q: int, block_k: int, *, causal: bool, seq_k: int):
    """Run `step(masked)` for the tile of these blocks if any of its rows sees a key of it, with
    `masked` True only where the tile needs the mask."""
    if not masks_any(causal, seq_k, block_k):
        step(False)
        return
    needs = tile_needs_mask(q_block, kv_block, block_q, block_k, causal=causal, seq_k=seq_k)
    visible = kv_block <= last_visible_block(q_block, block_q, block_k) if causal else True
    pl.when(jnp.logical_and(visible, needs))(lambda: step(True))
    pl.when(jnp.logical_and(visible, jnp.logical_not(needs)))(lambda: step(False))


def _positions(q_block, kv_block, block_q: int, block_k: int):
    """Each score's query row and key position in the tile of these blocks."""
    shape = (block_q, block_k)
    rows = q_block * block_q + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = kv_block * block_k + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return rows, cols


# ------------------------------------------------------------------ forward


def _forward_kernel(q_ref, k_ref, v_ref, o_ref, *refs, sm_scale, causal, seq_k, precision, grid):
    # refs: the lse output when the backward needs it, then the m, l and acc scratch
    lse_ref = refs[0] if len(refs) == 4 else None
    m_ref, l_ref, acc_ref = refs[-3:]
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    q_block, kv_block = pl.program_id(grid.position(HELD)), pl.program_id(WALKED)

    @pl.when(kv_block == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, F32)
        l_ref[...] = jnp.zeros(l_ref.shape, F32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    def step(masked: bool):
        s = jax.lax.dot_general(
            q_ref[...], k_ref[...], NT, precision=precision, preferred_element_type=F32
        )
        s = s * sm_scale
        if masked:
            rows, cols = _positions(q_block, kv_block, block_q, block_k)
            s = mask_scores(s, rows, cols, causal=causal, seq_k=padded_keys(seq_k, block_k))
        # m and l are kept on all 128 lanes of a row (a whole vreg row); column 0 is the value
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, :1])
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=-1, keepdims=True)
        m_ref[...] = m_next
        pv = jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], precision=precision, preferred_element_type=F32
        )
        acc_ref[...] = alpha[:, :1] * acc_ref[...] + pv

    run_tile(step, q_block, kv_block, block_q, block_k, causal=causal, seq_k=seq_k)

    # Key 0 is in block 0 and visible to every row, so each row's sum is positive.
    @pl.when(kv_block == pl.num_programs(WALKED) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[:, :1]).astype(o_ref.dtype)
        if lse_ref is not None:  # kept for the backward, base e as the GPU layout's
            lse_ref[...] = m_ref[:, :1] + jnp.log(l_ref[:, :1])


def _pad(x, s: int, sp: int):
    return jnp.pad(x, ((0, 0), (0, 0), (0, sp - s), (0, 0))) if sp != s else x


def attention_tpu(
    q, k, v, causal: bool, scale: float, bq: int, bk: int, precision: str, with_lse: bool
):
    """The forward's TPU body: grid (batch, heads, q blocks, key blocks); the output, and with
    `with_lse` each query row's log-sum-exp ([B, H, Sq] float32) too."""
    from jax.experimental.pallas import tpu as pltpu

    (b, h, sq, d), sk = q.shape, k.shape[2]
    sqp, skp = pl.cdiv(sq, bq) * bq, pl.cdiv(sk, bk) * bk
    grid = mosaic_tpu.ParallelGrid.of((b, h, sqp // bq))

    def kv_index(i, j, t, u):
        return (i, j, kv_block_fetched(t, u, bq, bk) if causal else u, 0)

    q_spec = pl.BlockSpec((None, None, bq, d), grid.index_map(lambda i, j, t, u: (i, j, t, 0)))
    kv_spec = pl.BlockSpec((None, None, bk, d), grid.index_map(kv_index))
    out_shape = [out_struct((b, h, sqp, d), q.dtype, q, k, v)]
    out_specs = [q_spec]
    if with_lse:  # [B, H, Sq, 1], as the GPU layout keeps it
        out_shape.append(out_struct((b, h, sqp, 1), F32, q, k, v))
        out_specs.append(
            pl.BlockSpec((None, None, bq, 1), grid.index_map(lambda i, j, t, u: (i, j, t, 0)))
        )
    outs = pl.pallas_call(
        functools.partial(
            _forward_kernel,
            sm_scale=scale,
            causal=causal,
            seq_k=sk,
            precision=precision,
            grid=grid,
        ),
        out_shape=out_shape,
        grid=grid.grid((b, h, sqp // bq), skp // bk),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=out_specs,
        scratch_shapes=[
            pltpu.VMEM((bq, TPU_LANES), F32),
            pltpu.VMEM((bq, TPU_LANES), F32),
            pltpu.VMEM((bq, d), F32),
        ],
        compiler_params=mosaic_tpu.compiler_params(
            ("parallel", "parallel", "parallel", "arbitrary"),
            tpu_vmem(bq, bk, d, q.dtype.itemsize),
        ),
    )(_pad(q, sq, sqp), _pad(k, sk, skp), _pad(v, sk, skp))
    out = outs[0][:, :, :sq] if sqp != sq else outs[0]
    return (out, outs[1][:, :, :sq, 0]) if with_lse else out


# ------------------------------------------------------------------ backward


def _dq_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dq_ref,
    acc_ref,
    *,
    sm_scale,
    causal,
    seq_k,
    precision,
    grid,
):
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    q_block, kv_block = pl.program_id(grid.position(HELD)), pl.program_id(WALKED)

    @pl.when(kv_block == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    def step(masked: bool):
        k = k_ref[...]
        rows, cols = _positions(q_block, kv_block, block_q, block_k)
        p = probs(
            q_ref[...],
            k,
            lse_ref[...],
            rows,
            cols,
            sm_scale=sm_scale,
            causal=causal and masked,
            seq_k=padded_keys(seq_k, block_k) if masked else None,
            precision=precision,
        )
        dp = jax.lax.dot_general(
            do_ref[...], v_ref[...], NT, precision=precision, preferred_element_type=F32
        )
        ds = p * (dp - delta_ref[...])
        acc_ref[...] += jnp.dot(
            ds.astype(k.dtype), k, precision=precision, preferred_element_type=F32
        )

    run_tile(step, q_block, kv_block, block_q, block_k, causal=causal, seq_k=seq_k)

    @pl.when(kv_block == pl.num_programs(WALKED) - 1)
    def _store():
        dq_ref[...] = (acc_ref[...] * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    dk_acc,
    dv_acc,
    *,
    sm_scale,
    causal,
    seq_k,
    precision,
    grid,
):
    block_q, block_k = q_ref.shape[0], k_ref.shape[0]
    kv_block, q_block = pl.program_id(grid.position(HELD)), pl.program_id(WALKED)

    @pl.when(q_block == 0)
    def _init():
        dk_acc[...] = jnp.zeros(dk_acc.shape, F32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, F32)

    def step(masked: bool):
        q, do = q_ref[...], do_ref[...]
        rows, cols = _positions(q_block, kv_block, block_q, block_k)
        p = probs(
            q,
            k_ref[...],
            lse_ref[...],
            rows,
            cols,
            sm_scale=sm_scale,
            causal=causal and masked,
            seq_k=padded_keys(seq_k, block_k) if masked else None,
            precision=precision,
        )
        dv_acc[...] += jax.lax.dot_general(
            p.astype(do.dtype), do, TN, precision=precision, preferred_element_type=F32
        )
        dp = jax.lax.dot_general(
            do, v_ref[...], NT, precision=precision, preferred_element_type=F32
        )
        ds = p * (dp - delta_ref[...])
        dk_acc[...] += jax.lax.dot_general(
            ds.astype(q.dtype), q, TN, precision=precision, preferred_element_type=F32
        )

    run_tile(step, q_block, kv_block, block_q, block_k, causal=causal, seq_k=seq_k)

    @pl.when(q_block == pl.num_programs(WALKED) - 1)
    def _store():
        dk_ref[...] = (dk_acc[...] * sm_scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def backward_tpu(which, q, k, v, do, lse, delta, causal, scale, bq, bk, precision):
    """dq's ("dq") or dk's and dv's ("dkv") TPU body: a step holds one q block (q, dO, lse,
    delta) and one key block (k, v), the side that is walked (keys for dq, queries for dkv)
    the last grid axis, with the float32 accumulators in VMEM scratch across it."""
    from jax.experimental.pallas import tpu as pltpu

    (b, h, sq, d), sk = q.shape, k.shape[2]
    sqp, skp = pl.cdiv(sq, bq) * bq, pl.cdiv(sk, bk) * bk
    n_q, n_k = sqp // bq, skp // bk

    def pad_rows(x):  # [B, H, Sq] -> [B, H, Sq padded, 1], as the GPU layout has them
        return _pad(x.astype(F32)[..., None], sq, sqp)

    if which == "dq":  # grid (b, h, q blocks, key blocks)

        def q_index(i, j, t, u):
            return (i, j, t, 0)

        def kv_index(i, j, t, u):
            return (i, j, kv_block_fetched(t, u, bq, bk) if causal else u, 0)

        sizes, walked, kernel = (b, h, n_q), n_k, _dq_kernel
        out_shape = [out_struct((b, h, sqp, d), q.dtype, q, k, v, do, lse, delta)]
        scratch, vmem = [pltpu.VMEM((bq, d), F32)], tpu_vmem_dq(bq, bk, d, q.dtype.itemsize)
    else:  # grid (b, h, key blocks, q blocks)

        def q_index(i, j, u, t):
            return (i, j, q_block_fetched(u, t, bq, bk, n_q) if causal else t, 0)

        def kv_index(i, j, u, t):
            return (i, j, u, 0)

        sizes, walked, kernel = (b, h, n_k), n_q, _dkv_kernel
        out_shape = [out_struct((b, h, skp, d), k.dtype, q, k, v, do, lse, delta)] * 2
        scratch = [pltpu.VMEM((bk, d), F32)] * 2
        vmem = tpu_vmem_dkv(bq, bk, d, q.dtype.itemsize)
    grid = mosaic_tpu.ParallelGrid.of(sizes)
    q_spec = pl.BlockSpec((None, None, bq, d), grid.index_map(q_index))
    rows_spec = pl.BlockSpec((None, None, bq, 1), grid.index_map(q_index))
    kv_spec = pl.BlockSpec((None, None, bk, d), grid.index_map(kv_index))
    outs = pl.pallas_call(
        functools.partial(
            kernel, sm_scale=scale, causal=causal, seq_k=sk, precision=precision, grid=grid
        ),
        out_shape=out_shape,
        grid=grid.grid(sizes, walked),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, rows_spec, rows_spec],
        out_specs=[q_spec] if which == "dq" else [kv_spec, kv_spec],
        scratch_shapes=scratch,
        compiler_params=mosaic_tpu.compiler_params(
            ("parallel", "parallel", "parallel", "arbitrary"), vmem
        ),
    )(
        _pad(q, sq, sqp),
        _pad(k, sk, skp),
        _pad(v, sk, skp),
        _pad(do, sq, sqp),
        pad_rows(lse),
        pad_rows(delta),
    )
    return [o[:, :, : (sq if which == "dq" else sk)] for o in outs]
