"""Hopper matmul for Mosaic GPU: TMA into swizzled shared memory, wgmma into float32.

The kernel is persistent: one block per SM walks the output tiles in a planar snake order
(`grid_minor_dim`, `grid_tile_width`: neighbouring blocks share A rows or B columns in L2).
A block holds two consumer warpgroups and one producer: the producer streams (tile_k)-wide
slices of A and B into `max_concurrent_steps` shared-memory slots by TMA; each consumer
warpgroup owns a (tile_m, tile_n) float32 accumulator and issues wgmma on its half of the
block's tile, which is split along `wg_dimension`. A consumer keeps one wgmma group in flight
while it waits for the next step's copies: a slot is released to the producer one step late
(DELAY_RELEASE), when the wgmma that read it has retired. With `cluster_dimension` "m" or "n",
two blocks of a cluster compute neighbouring tiles along that dimension and share the operand
they have in common: each loads half of it and TMA multicasts it to both. The epilogue writes
the accumulator back in (epi_tile_m, epi_tile_n) pieces (at most the warpgroup's tile: a piece
as large as the tile is JAX's untiled epilogue) through two shared-memory slots per warpgroup,
by TMA. These are the levers of JAX's own Hopper matmul (ops/gpu/hopper_matmul_mgpu.py, whose
benchmark sweeps grid tile widths of 4, 8 and 16, both grid orders and both warpgroup splits).

Shapes that are not multiples of the block's tile are zero-padded up to them (zeros add
nothing to a dot product) and the result is sliced back.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from autotune import Example, Split, autotuned, out_struct
from autotune.backends import mosaic_gpu as backend
from autotune.kernels.differentiable import differentiable

ACC_DTYPE = jnp.float32
DTYPES = ("bfloat16", "float16")  # what wgmma multiplies from shared memory at full speed
NUM_CONSUMERS = 2  # consumer warpgroups per block; a third warpgroup issues the TMA copies
PRODUCER_REGISTERS = 40  # registers a thread of the producer warpgroup keeps
DIMS = ("m", "n")
CLUSTER_DIMS = ("none", *DIMS)  # cluster_dimension: "none" is a cluster of one block
DELAY_RELEASE = 1  # wgmma groups a consumer keeps in flight; their slots are released late


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """matmul_mgpu's tunables (see the module docstring): a warpgroup's output tile and K step,
    the pipeline's depth, the tile order, the warpgroups' split, the cluster, the epilogue's
    piece."""

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    max_concurrent_steps: int = 4
    grid_minor_dim: str = "n"
    grid_tile_width: int = 1
    wg_dimension: str = "n"
    cluster_dimension: str = "none"
    epi_tile_m: int = 64
    epi_tile_n: int = 64


def cluster_size(config: dict) -> int:
    return 1 if config["cluster_dimension"] == "none" else 2


def cluster_tile(config: dict) -> tuple[int, int]:
    """The (rows, columns) of the output a cluster computes: its blocks' tiles side by side."""
    rows, cols = block_tile(config)
    along = config["cluster_dimension"]
    return rows * (cluster_size(config) if along == "m" else 1), cols * (
        cluster_size(config) if along == "n" else 1
    )


def epilogue_tile(config: dict) -> tuple[int, int]:
    """The piece of a warpgroup's tile that the epilogue stores at a time."""
    return (
        min(config["epi_tile_m"], config["tile_m"]),
        min(config["epi_tile_n"], config["tile_n"]),
    )


def block_tile(config: dict) -> tuple[int, int]:
    """The (rows, columns) of the output a block computes: two warpgroups' tiles side by side."""
    tile_m, tile_n = config["tile_m"], config["tile_n"]
    if config["wg_dimension"] == "m":
        return NUM_CONSUMERS * tile_m, tile_n
    return tile_m, NUM_CONSUMERS * tile_n


def smem_bytes(config: dict, dtype: str, k: int) -> int:
    """The shared memory one block allocates for a K of `k`: the pipeline's A and B slots (no
    more than the K loop has steps), the epilogue's slots and the pipeline's barriers. Tested
    against Mosaic GPU's own count when it lowers for "cuda"."""
    itemsize = jnp.dtype(dtype).itemsize
    rows, cols = block_tile(config)
    tile_k = config["tile_k"]
    steps = min(config["max_concurrent_steps"], pl.cdiv(k, tile_k))
    pipeline = steps * (rows * tile_k + tile_k * cols) * itemsize
    epi_m, epi_n = epilogue_tile(config)
    out_slots = min(2, config["tile_m"] * config["tile_n"] // (epi_m * epi_n))
    epilogue = NUM_CONSUMERS * out_slots * epi_m * epi_n * itemsize
    return pipeline + epilogue + 2 * steps * backend.BARRIER_BYTES


def fits_hopper(config: dict, sig) -> bool:
    """wgmma's shapes (tile_m a multiple of 64, tile_n of 8 up to 256, tile_k a whole
    swizzle that tile_n is a multiple of), the accumulator within a consumer thread's
    registers, the pipeline deeper than the wgmma groups kept in flight and no deeper than the K
    loop, the epilogue's piece a whole swizzle that tiles the warpgroup's tile, and shared
    memory within the limit."""
    if len(sig.shapes) != 2 or any(len(s) != 2 for s in sig.shapes):
        return True  # the kernel itself rejects such calls with a clear message
    itemsize = jnp.dtype(sig.dtypes[0]).itemsize
    tile_m, tile_n, tile_k = config["tile_m"], config["tile_n"], config["tile_k"]
    k = sig.shapes[0][1]
    swizzle = backend.swizzle_bytes(tile_k * itemsize)
    epi_swizzle = backend.swizzle_bytes(epilogue_tile(config)[1] * itemsize)
    return (
        tile_m % backend.WGMMA_M == 0
        and tile_n % backend.WGMMA_N_STEP == 0
        and tile_n <= backend.WGMMA_N_MAX
        and swizzle is not None
        and tile_n * itemsize % swizzle == 0
        and tile_m * tile_n // backend.WARPGROUP_THREADS <= backend.ACC_REGISTERS_MAX
        and epi_swizzle is not None
        and all(t % e == 0 for t, e in zip((tile_m, tile_n), epilogue_tile(config)))
        and config["max_concurrent_steps"] > DELAY_RELEASE
        and config["max_concurrent_steps"] <= max(pl.cdiv(k, tile_k), 2)  # deeper: the same
        and smem_bytes(config, sig.dtypes[0], k) <= backend.smem_limit(sig.device_kind)
    )


def matmul_mgpu_reference(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.dot(x, y, preferred_element_type=ACC_DTYPE).astype(x.dtype)


def _kernel(a_gmem, b_gmem, out_gmem, *, config, tiles, grid_minor_dim, grid_tile_width):
    plgpu = backend.plgpu()
    dtype = a_gmem.dtype
    tile_m, tile_n, tile_k = config["tile_m"], config["tile_n"], config["tile_k"]
    rows, cols = block_tile(config)
    split_m = config["wg_dimension"] == "m"
    along = config["cluster_dimension"]
    k_steps = a_gmem.shape[1] // tile_k
    # a K loop of one step has no next step to overlap with: a slot released a step late would
    # never be released, and the block's third tile would wait for a slot forever
    delay = DELAY_RELEASE if k_steps > DELAY_RELEASE else 0
    epi_m, epi_n = epilogue_tile(config)
    out_slots = min(2, tile_m * tile_n // (epi_m * epi_n))

    def swizzled(minor_elems: int) -> tuple:
        swizzle = plgpu.find_swizzle(minor_elems * jnp.dtype(dtype).itemsize * 8)
        elems = swizzle // jnp.dtype(dtype).itemsize
        return plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle)

    def pipeline(step_body, compute_context):
        return plgpu.emit_pipeline_warp_specialized(
            step_body,
            grid=(k_steps,),
            memory_registers=PRODUCER_REGISTERS,
            in_specs=[
                # A is common to the blocks of a cluster along N, B to those along M: multicast
                plgpu.BlockSpec(
                    (rows, tile_k),
                    lambda s: (0, s),
                    transforms=swizzled(tile_k),
                    delay_release=delay,
                    collective_axes=("cluster",) if along == "n" else (),
                ),
                plgpu.BlockSpec(
                    (tile_k, cols),
                    lambda s: (s, 0),
                    transforms=swizzled(tile_k),
                    delay_release=delay,
                    collective_axes=("cluster",) if along == "m" else (),
                ),
            ],
            wg_axis="wg",
            num_compute_wgs=NUM_CONSUMERS,
            max_concurrent_steps=config["max_concurrent_steps"],
            compute_context=compute_context,
        )

    # The allocations depend only on the specs, not on the bodies.
    unused = lambda *_, **__: None  # noqa: E731

    @functools.partial(
        pl.run_scoped,
        pipeline_allocs=pipeline(unused, unused).get_allocations(a_gmem, b_gmem),
        out_smem=plgpu.SMEM(
            (NUM_CONSUMERS, out_slots, epi_m, epi_n), dtype, transforms=swizzled(epi_n)
        ),
        collective_axes="wg",
    )
    def scope(pipeline_allocs, out_smem):
        wg = jax.lax.axis_index("wg")
        in_cluster = jax.lax.axis_index("cluster")
        wg_rows = pl.ds(wg * tile_m, tile_m) if split_m else slice(None)
        wg_cols = slice(None) if split_m else pl.ds(wg * tile_n, tile_n)

        @plgpu.nd_loop((tiles[0] * tiles[1],), collective_axes="clusters")
        def tile_loop(info):
            (linear,) = info.index
            if tiles == (1, 1):
                # planar_snake's remainder branch divides by zero once the single tile's index
                # folds to a constant (a SIGFPE under GPU interpret mode, jax 0.10)
                mi = ni = 0
            else:
                mi, ni = plgpu.planar_snake(linear, tiles, grid_minor_dim, grid_tile_width)
            # the cluster's tile, then this block's within it
            mi = mi * cluster_size(config) + in_cluster if along == "m" else mi
            ni = ni * cluster_size(config) + in_cluster if along == "n" else ni
            block_rows, block_cols = pl.ds(mi * rows, rows), pl.ds(ni * cols, cols)

            def mma(_, a_smem, b_smem, acc_ref):
                plgpu.wgmma(acc_ref, a_smem.at[wg_rows], b_smem.at[:, wg_cols])
                plgpu.wgmma_wait(delay)  # the step before has retired: its slot is free
                return acc_ref

            def compute_context(run_pipeline):
                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tile_m, tile_n), ACC_DTYPE))
                def accumulate(acc_ref):
                    run_pipeline(acc_ref)
                    acc = acc_ref[...].astype(dtype)
                    out_wg = out_gmem.at[block_rows, block_cols].at[wg_rows, wg_cols]
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    pieces_n = tile_n // epi_n
                    for pm in range(tile_m // epi_m):
                        for pn in range(pieces_n):
                            piece = (
                                slice(pm * epi_m, (pm + 1) * epi_m),
                                slice(pn * epi_n, (pn + 1) * epi_n),
                            )
                            slot = (pm * pieces_n + pn) % out_slots
                            # the slot's previous copy must have read it before we overwrite
                            plgpu.wait_smem_to_gmem(out_slots - 1, wait_read_only=True)
                            out_smem[wg, slot] = acc[piece]
                            plgpu.commit_smem()
                            plgpu.copy_smem_to_gmem(out_smem.at[wg, slot], out_wg.at[piece])

            pipeline(mma, compute_context)(
                a_gmem.at[block_rows, :],
                b_gmem.at[:, block_cols],
                allocations=pipeline_allocs,
            )

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _bwd(residuals: tuple, g: jax.Array, *, interpret: bool, **_) -> tuple:
    """dx = g y^T and dy = x^T g, each a tuned matmul_mgpu call of its own shapes."""
    x, y = residuals
    return matmul_mgpu(g, y.T, interpret=interpret), matmul_mgpu(x.T, g, interpret=interpret)


@autotuned(
    name="matmul_mgpu",
    space="matmul_mgpu",
    constraints=[fits_hopper],
    reference=matmul_mgpu_reference,
    backend="mosaic_gpu",
    tuned="../tuned",
    split=Split("mk,kn->mn", along="mn"),
    example=Example("bf16[100,200],bf16[200,72]"),
    backward=("matmul_mgpu",),
)
@differentiable(_bwd)
def matmul_mgpu(
    x: jax.Array,
    y: jax.Array,
    *,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
) -> jax.Array:
    """x @ y for 2-D x [M, K] and y [K, N] of one 16-bit float dtype on a Hopper GPU (Mosaic
    GPU); float32 accumulation. `interpret=True` runs it in Pallas's GPU interpret mode.
    Differentiable: the backward's products are matmul_mgpu calls of their own."""
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0]:
        raise ValueError(f"matmul_mgpu needs x [M, K] and y [K, N], got {x.shape=} and {y.shape=}")
    if x.dtype != y.dtype or jnp.dtype(x.dtype).name not in DTYPES:
        raise ValueError(
            f"matmul_mgpu needs x and y of one dtype in {DTYPES}, got {x.dtype=} and {y.dtype=}: "
            "cast them, or use autotune.kernels.matmul for other dtypes"
        )
    config = dataclasses.asdict(block_sizes)  # what the layout helpers read, by name
    for name, allowed in (
        ("grid_minor_dim", DIMS),
        ("wg_dimension", DIMS),
        ("cluster_dimension", CLUSTER_DIMS),
    ):
        if config[name] not in allowed:
            raise ValueError(f"matmul_mgpu: {name}={config[name]!r} must be one of {allowed}")
    tile_k = config["tile_k"]
    rows, cols = cluster_tile(config)
    (m, k), n = x.shape, y.shape[1]
    mp, np_, kp = (pl.cdiv(d, b) * b for d, b in ((m, rows), (n, cols), (k, tile_k)))
    xp = jnp.pad(x, ((0, mp - m), (0, kp - k))) if (mp, kp) != (m, k) else x
    yp = jnp.pad(y, ((0, kp - k), (0, np_ - n))) if (kp, np_) != (k, n) else y
    tiles = (mp // rows, np_ // cols)
    body = functools.partial(
        _kernel,
        config=config,
        tiles=tiles,
        grid_minor_dim=DIMS.index(config["grid_minor_dim"]),
        grid_tile_width=config["grid_tile_width"],
    )
    out = backend.plgpu().kernel(
        body,
        out_type=out_struct((mp, np_), x.dtype, xp, yp),
        grid=(
            max(1, min(backend.num_sms(interpret) // cluster_size(config), tiles[0] * tiles[1])),
        ),
        grid_names=("clusters",),
        cluster=(cluster_size(config),),
        cluster_names=("cluster",),
        num_threads=NUM_CONSUMERS + 1,
        thread_name="wg",
        compiler_params=backend.plgpu().CompilerParams(
            lowering_semantics=backend.plgpu().LoweringSemantics.Warpgroup
        ),
        interpret=backend.interpret_params() if interpret else None,
    )(xp, yp)
    return out[:m, :n] if (mp, np_) != (m, n) else out
