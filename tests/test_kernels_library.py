"""softmax, rms_norm, layer_norm and bmm against their plain-JAX references, in interpret mode."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from kernel_checks import TPU, close, rand, tpu_configs_lower

from autotune import registry
from autotune.kernels import (
    bmm,
    bmm_reference,
    layer_norm,
    layer_norm_reference,
    rms_norm,
    rms_norm_reference,
    softmax,
    softmax_reference,
)
from autotune.kernels.rows.layout import BlockSizes
from autotune.kernels.rows.norms import norm_on
from autotune.kernels.rows.softmax import softmax_on

S = jax.ShapeDtypeStruct
DTYPES = [jnp.float32, jnp.bfloat16]
ROW_CASES = [
    ((16, 128), 8),  # rows a multiple of the block
    ((3, 5, 200), 16),  # 15 rows in blocks of 16 (padded), a row length no power of two
    ((1, 1), 8),  # one element: the block clamps to the single row
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block_rows", ROW_CASES)
def test_softmax_matches_reference(shape, block_rows, dtype):
    x = rand(shape, dtype, scale=30.0)  # large logits: only a max-subtracted softmax survives
    close(softmax(x, block_rows=block_rows), softmax_reference(x), dtype)


def test_softmax_gpu_layout_masks_padded_lanes():
    # The GPU layout pads the 200-wide rows to 256 lanes; run it in interpret mode here.
    x = rand((3, 5, 200), scale=5.0)
    out = softmax_on(
        x, block_sizes=BlockSizes(block_rows=4, num_warps=4), platform="gpu", interpret=True
    )
    close(out, softmax_reference(x), jnp.float32)


def test_softmax_under_jit_and_vmap_and_empty():
    x = rand((4, 6, 130), seed=3)
    close(jax.jit(jax.vmap(softmax))(x), softmax_reference(x), jnp.float32)
    assert softmax(jnp.zeros((0, 8))).shape == (0, 8)
    with pytest.raises(ValueError, match="floating-point"):
        softmax(jnp.zeros((4, 8), jnp.int32))


def _norm_args(name, shape, dtype):
    cols = shape[-1]
    vectors = [rand((cols,), dtype, 1) + 1]
    if name == "layer_norm":
        vectors.append(rand((cols,), dtype, 2))
    return rand(shape, dtype, 0, scale=3.0) + 0.5, vectors


NORMS = {
    "rms_norm": (rms_norm, rms_norm_reference),
    "layer_norm": (layer_norm, layer_norm_reference),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, block_rows", ROW_CASES[:2])
@pytest.mark.parametrize("name", NORMS)
def test_norm_matches_reference(name, shape, block_rows, dtype):
    kernel, reference = NORMS[name]
    x, vectors = _norm_args(name, shape, dtype)
    close(kernel(x, *vectors, block_rows=block_rows), reference(x, *vectors), dtype)


def test_layer_norm_gpu_layout_keeps_padded_lanes_out_of_the_variance():
    x, vectors = _norm_args("layer_norm", (3, 5, 200), jnp.float32)
    out = norm_on(
        "layer_norm",
        x,
        vectors,
        eps=1e-5,
        block_sizes=BlockSizes(block_rows=8, num_warps=4),
        platform="gpu",
        interpret=True,
    )
    close(out, layer_norm_reference(x, *vectors), jnp.float32)


def test_norms_tiny_eps_jit_and_bad_weight():
    x, (w,) = _norm_args("rms_norm", (1, 1), jnp.float32)
    close(rms_norm(x, w, eps=1e-3), rms_norm_reference(x, w, eps=1e-3), jnp.float32)
    x, (w, b) = _norm_args("layer_norm", (16, 128), jnp.float32)
    close(jax.jit(layer_norm)(x, w, b), layer_norm_reference(x, w, b), jnp.float32)
    with pytest.raises(ValueError, match=r"weight of shape \(128,\)"):
        rms_norm(x, w[:64])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "b, m, k, n, blocks",
    [
        (2, 64, 128, 64, (32, 32, 64)),  # multiples of the blocks
        (3, 40, 70, 50, (16, 16, 32)),  # partial blocks everywhere: padded
        (1, 1, 1, 1, (16, 16, 32)),  # degenerate: blocks clamp to the dims
    ],
)
def test_bmm_matches_reference(b, m, k, n, blocks, dtype):
    x, y = rand((b, m, k), dtype, 1), rand((b, k, n), dtype, 2)
    bm, bn, bk = blocks
    close(bmm(x, y, block_m=bm, block_n=bn, block_k=bk), bmm_reference(x, y), dtype)


def test_bmm_jit_empty_and_bad_shapes():
    x, y = rand((2, 32, 64)), rand((2, 64, 16), seed=1)
    close(jax.jit(bmm)(x, y), bmm_reference(x, y), jnp.float32)
    assert bmm(jnp.zeros((0, 4, 8)), jnp.zeros((0, 8, 2))).shape == (0, 4, 2)
    with pytest.raises(ValueError, match="x.shape=.*y.shape="):
        bmm(x, rand((3, 64, 16)))


# ------------------------------------------------------------ every admitted TPU config lowers


def _rows(shape):
    return lambda c: min(c["block_rows"], jnp.prod(jnp.array(shape[:-1])).item())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 256), (3, 5, 200)])
def test_every_admitted_tpu_config_of_the_row_kernels_lowers(shape, dtype):
    x = S(shape, dtype)
    vec = S(shape[-1:], dtype)
    for kernel, args in ((softmax, [x]), (rms_norm, [x, vec]), (layer_norm, [x, vec, vec])):
        assert tpu_configs_lower(kernel, args, {}, _rows(shape)) >= 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 256, 512, 256), (2, 200, 300, 130)])
def test_every_admitted_tpu_config_of_bmm_lowers(shape, dtype):
    b, m, k, n = shape
    args = [S((b, m, k), dtype), S((b, k, n), dtype)]

    def effective(c):
        return min(c["block_m"], m), min(c["block_n"], n), min(c["block_k"], k)

    assert tpu_configs_lower(bmm, args, {}, effective) >= 1


# ------------------------------------------------------------ GPU constraints (no GPU here)

GPU = dataclasses.replace(
    TPU, platform="gpu", device_kind="NVIDIA H100 80GB HBM3", backend="triton"
)


@pytest.mark.parametrize(
    "kernel, shapes",
    [
        ("matmul", [(96, 200), (200, 72)]),
        ("bmm", [(2, 96, 200), (2, 200, 72)]),
        ("softmax", [(3, 5, 200)]),
        ("layer_norm", [(3, 5, 200), (200,), (200,)]),
        ("flash_attention", [(1, 2, 50, 24)] * 3),
    ],
)
def test_gpu_spaces_admit_power_of_two_layouts_for_odd_shapes(kernel, shapes):
    # Only the constraint logic runs here: no GPU to compile on. A block larger than an odd
    # dim clamps to the power of two above it (the dim is padded), so the defaults stay valid
    # (in bfloat16: float32 128-tiles at two stages would exceed shared memory). The defaults
    # are the call's own where the kernel gives a GPU call its own (defaults_for), unadapted.
    spec = registry.resolve(kernel).spec
    sig = spec.signature([S(s, jnp.bfloat16) for s in shapes], {}, GPU)
    space = spec.space("gpu")
    defaults = spec.call_defaults(sig)
    assert space.violations(defaults, sig) == []
