"""Each backend module holds the same facts, and the package derives the platforms' backends,
recognition and interpret-mode dispatch from them."""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from autotune import backends
from autotune.backends import mosaic_gpu
from autotune.backends.platforms import PLATFORMS, platform_of
from autotune.measure.timing import TIMERS


def test_each_platform_has_its_backends_the_default_first():
    assert backends.PLATFORM_BACKENDS == {
        "cpu": ("interpret",),
        "tpu": ("mosaic_tpu",),
        "gpu": ("triton", "mosaic_gpu"),
    }
    assert [backends.default(p) for p in PLATFORMS] == ["interpret", "mosaic_tpu", "triton"]
    assert backends.default("metal") == "metal"  # a platform without Pallas backends of ours
    assert backends.key_backend("mosaic_gpu", "gpu") == "mosaic_gpu"
    assert backends.key_backend("mosaic_gpu", "cpu") == "interpret"
    assert [platform_of(p) for p in ("cuda", "rocm", "gpu", "tpu", "cpu")] == [
        "gpu",
        "gpu",
        "gpu",
        "tpu",
        "cpu",
    ]


@pytest.mark.parametrize("module", backends.MODULES, ids=lambda m: m.NAME)
def test_every_backend_states_the_same_facts(module):
    assert module.PLATFORM in PLATFORMS and backends.BY_NAME[module.NAME] == backends.Backend.of(
        module
    )
    assert set(module.TIMERS) <= set(TIMERS) and module.TIMERS[-1] == "wall"
    # the timer is chosen by platform: every backend of one shares its device's clocks
    assert backends.timers(module.PLATFORM) == module.TIMERS
    assert callable(module.interpret_mode) and callable(module.reset_interpret_state)
    if module.COMPILER_PARAMS is None:
        assert module.KNOBS == () and module.MARKER is None
        return
    if module is mosaic_gpu:
        pytest.importorskip("absl", reason="Mosaic GPU imports absl: pip install absl-py")
    path, _, name = module.COMPILER_PARAMS.rpartition(".")
    params = getattr(importlib.import_module(path), name)
    # recognition reads the module a kernel's compiler parameters come from
    assert module.MARKER in params.__module__
    assert set(module.KNOBS) <= {f.name for f in dataclasses.fields(params)}


def _double(x, compiler_params=None):
    return pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=compiler_params,
    )(x)


def _triton_double(x):
    return _double(x, pltriton.CompilerParams(num_warps=4))


def test_a_triton_kernel_is_recognised_by_its_compiler_parameters():
    x = jnp.ones((8, 128), jnp.float32)
    assert backends.recognise(_triton_double, [x]) == "triton"
    assert backends.recognise(_double, [x]) is None  # a plain pallas_call says nothing


def test_a_plain_kernel_runs_on_the_cpu_under_the_interpret_mode_of_any_non_mosaic_gpu_key():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    for backend in (None, "interpret", "triton", "mosaic_tpu"):  # all TPU interpret mode
        with backends.interpret_mode(backend):
            assert (_double(x) == x * 2).all()
        backends.reset_interpret_state(backend)
