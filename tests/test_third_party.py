"""Tuning a kernel we did not write: tests/third_party_kernels.py, registered without edits.

It takes a tuple `block_shape` and a dataclass `block_sizes`, has no `interpret` argument and
uses a TPU-only grid spec (scalar prefetch, VMEM scratch): on the CPU it runs, and is tuned and
verified, under TPU interpret mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from third_party_kernels import BlockSizes, scaled_matmul

import autotune
from autotune.errors import SpaceError
from autotune.measure.lowering import tpu_lowering_error
from autotune.measure.timing import TimingPolicy

DEFAULT_BLOCKS = BlockSizes()
QUICK = TimingPolicy(warmup=1, min_reps=2, max_reps=3, max_time_s=0.05)
SPACE = {"block_m": [8, 16], "block_n": [128], "block_k": [128, 256]}


def blocks_divide(config, sig):
    """The kernel refuses partial blocks (they would read padding, NaN in interpret mode)."""
    (m, k), (_, n) = sig.shapes[0], sig.shapes[1]
    return not (m % config["block_m"] or n % config["block_n"] or k % config["block_k"])


def reference(x, y, scale):
    return (scale[0] * jnp.dot(x, y, preferred_element_type=jnp.float32)).astype(x.dtype)


@pytest.fixture(scope="module")
def inputs():
    # numpy's generator: jax.random compiles a program at each new shape
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 256), np.float32))
    y = jnp.asarray(np.random.default_rng(1).standard_normal((256, 128), np.float32))
    return x, y, jnp.array([3], jnp.int32)


@pytest.fixture
def kernel():
    return autotune.register(
        scaled_matmul,
        name="third_party_scaled_matmul",
        space=SPACE,
        constraints=[blocks_divide],
        reference=reference,
        bind={"block_shape": ("block_m", "block_n"), "block_sizes": BlockSizes},
        defaults={"block_m": 8},  # the kernel's (128, 128) does not fit the space
    )


def test_declarative_bind_maps_flat_parameters_and_reads_defaults(kernel):
    spec = kernel.spec
    assert spec.defaults == {"block_m": 8, "block_n": 128, "block_k": 128}
    assert spec.kernel_kwargs({"block_m": 16, "block_n": 128, "block_k": 256}) == {
        "block_shape": (16, 128),
        "block_sizes": BlockSizes(block_k=256),
    }
    assert not spec.takes_interpret


def test_third_party_kernel_tunes_end_to_end_and_serves_the_result(kernel, inputs, db_url):
    x, y, scale = inputs
    result = autotune.tune(kernel, [x, y, scale], n_trials=3, strategy="grid", policy=QUICK)
    assert len(result.trials) == 3 and {t.status for t in result.trials} == {"ok"}
    info = kernel.explain(x, y, scale)
    assert info["source"] == "db" and info["config"] == result.best_config
    expected = 3 * np.asarray(x) @ np.asarray(y)
    np.testing.assert_allclose(np.asarray(kernel(x, y, scale)), expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(
        np.asarray(jax.jit(kernel)(x, y, scale)), expected, rtol=1e-4, atol=1e-3
    )


def test_a_wrong_candidate_of_a_third_party_kernel_is_rejected(inputs, db_url):
    def buggy(x, y, scale, *, block_shape=(8, 128), block_sizes=DEFAULT_BLOCKS):
        out = scaled_matmul(x, y, scale, block_shape=block_shape, block_sizes=block_sizes)
        return out + 1.0 if block_shape[0] == 16 else out  # wrong at one config only

    kernel = autotune.register(
        buggy,
        name="third_party_buggy",
        space=SPACE,
        constraints=[blocks_divide],
        bind=lambda c: {
            "block_shape": (c["block_m"], c["block_n"]),
            "block_sizes": BlockSizes(c["block_k"]),
        },
        defaults={"block_m": 8, "block_n": 128, "block_k": 128},
    )
    result = autotune.tune(kernel, list(inputs), n_trials=4, strategy="grid", policy=QUICK)
    status = {t.config["block_m"]: t.status for t in result.trials if t.config["block_k"] == 128}
    assert status == {8: "ok", 16: "rejected"}
    assert result.best_config["block_m"] == 8


def test_third_party_kernel_lowers_for_tpu(kernel, inputs):
    x, y, scale = inputs
    assert (
        tpu_lowering_error(kernel, {"block_m": 8, "block_n": 128, "block_k": 128}, [x, y, scale])
        is None
    )
    # (4, 128) x-blocks break the TPU (8, 128) rule: the lowering says so on this CPU host
    assert "divisible by 8 and 128" in tpu_lowering_error(
        kernel, {"block_m": 4, "block_n": 128, "block_k": 128}, [x, y, scale]
    )


def test_bad_declarative_bind_is_a_clear_error():
    with pytest.raises(SpaceError, match="neither a tuple of parameter names nor a dataclass"):
        autotune.register(scaled_matmul, name="bad_bind", space=SPACE, bind={"block_shape": 128})
    with pytest.raises(SpaceError, match="does not take"):
        autotune.register(scaled_matmul, name="bad_bind", space=SPACE, bind={"blocks": BlockSizes})


def test_declarative_bind_passes_plain_tunable_arguments_through():
    from jax.experimental.pallas.ops.tpu.matmul import matmul as jax_tpu_matmul

    kernel = autotune.register(
        jax_tpu_matmul,
        name="jax_tpu_matmul",
        space={"block_m": [128, 256], "block_n": [128], "block_k": [128, 256]},
        bind={"block_shape": ("block_m", "block_n")},
        defaults={"block_m": 128, "block_n": 128},  # block_shape has no default to read
    )
    assert kernel.spec.defaults == {"block_m": 128, "block_n": 128, "block_k": 256}
    config = {"block_m": 256, "block_n": 128, "block_k": 128}
    assert kernel.spec.kernel_kwargs(config) == {"block_shape": (256, 128), "block_k": 128}
