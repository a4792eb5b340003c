"""The shipped vector_add and matmul against their plain-JAX references, in interpret mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from autotune.errors import AutotuneError
from autotune.kernels import matmul, matmul_reference, vector_add, vector_add_reference

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def rand(shape, dtype, seed=0):
    # numpy's generator: jax.random compiles a program at each new shape, a second or more
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32), dtype)


def close(a, b, dtype):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= TOL[dtype] * max(1.0, np.abs(b).max())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "m, k, n, blocks",
    [
        (64, 128, 64, (32, 32, 64)),  # multiples of the blocks
        (96, 200, 72, (64, 32, 64)),  # partial blocks everywhere: padded
        (1, 1, 1, (16, 16, 32)),  # degenerate: blocks clamp to the dims
        (8, 300, 16, (128, 128, 128)),  # blocks larger than M and N
    ],
)
def test_matmul_matches_reference(m, k, n, blocks, dtype):
    x, y = rand((m, k), dtype, 1), rand((k, n), dtype, 2)
    bm, bn, bk = blocks
    out = matmul(x, y, block_m=bm, block_n=bn, block_k=bk)
    assert out.dtype == dtype
    close(out, matmul_reference(x, y), dtype)


def test_matmul_under_jit_and_rejects_bad_shapes():
    x, y = rand((32, 64), jnp.float32), rand((64, 16), jnp.float32)
    close(jax.jit(matmul)(x, y), matmul_reference(x, y), jnp.float32)
    with pytest.raises(ValueError, match="x.shape=.*y.shape="):
        matmul(x, rand((32, 16), jnp.float32))


@pytest.mark.parametrize(
    "n, block", [(1024, 256), (1000, 256), (3, 128), (1, 1024), (130, 128), (5000, 2048)]
)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_vector_add_matches_reference(n, block, dtype):
    x, y = rand((n,), dtype, 1), rand((n,), dtype, 2)
    out = vector_add(x, y, block=block)
    close(out, vector_add_reference(x, y), dtype)


def test_vector_add_refuses_blocks_that_are_not_whole_rows_of_lanes():
    x = rand((256,), jnp.float32)
    with pytest.raises(ValueError, match="multiple of 128, got block=64"):
        blocks = vector_add.spec.block_sizes(block=64)
        vector_add.spec.fn(x, x, block_sizes=blocks, interpret=True)  # the kernel's own check
    # called as a tunable kernel, its constraints refuse the caller's block first
    with pytest.raises(AutotuneError, match="block=64 breaks fits_platform.*block 128, 256"):
        vector_add(x, x, block=64)


def test_default_blocks_adapt_on_a_miss():
    # M = 96 with the default block of 128: the kernel clamps and pads, the result is right.
    x, y = rand((96, 64), jnp.float32), rand((64, 48), jnp.float32)
    info = matmul.explain(x, y)
    assert info["source"] == "default"
    close(matmul(x, y), matmul_reference(x, y), jnp.float32)


@pytest.mark.parametrize("group_m", [4, 8])
def test_matmul_in_grouped_tile_order_matches_reference(group_m):
    # 6 x 5 output tiles: with group_m 4 the last group has 2 rows; with 8, one short group
    x, y = rand((96, 40), jnp.float32, 1), rand((40, 72), jnp.float32, 2)
    out = matmul(x, y, block_m=16, block_n=16, block_k=32, group_m=group_m)
    close(out, matmul_reference(x, y), jnp.float32)


def test_the_grouped_order_visits_every_output_tile_once_a_group_of_rows_at_a_time():
    from autotune.kernels.matmul.matmul import grouped_tile

    tiles = [tuple(int(t) for t in grouped_tile(pid, 6, 5, 4)) for pid in range(30)]
    assert sorted(tiles) == [(i, j) for i in range(6) for j in range(5)]
    assert tiles[:6] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1)]  # down a column first
    assert tiles[20:24] == [(4, 0), (5, 0), (4, 1), (5, 1)]  # the short last group
