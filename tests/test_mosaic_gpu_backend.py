"""Mosaic GPU as a backend: recognised from what a kernel traces to, part of the tuning key,
run under GPU interpret mode on this CPU (a third-party kernel without an `interpret`
argument included), checked for a GPU by its own lowering."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from third_party_kernels import BlockSizes, scaled_matmul
from third_party_mgpu import double_rows, double_rows_reference
from toy_kernels import rows_divide

import autotune
from autotune import BestEntry, TuningDB
from autotune.device import DeviceInfo, current_device
from autotune.kernels import matmul, matmul_mgpu
from autotune.measure.timing import TimingPolicy
from autotune.runtime import lookup
from autotune.runtime import state as runtime_state

pytest.importorskip("absl", reason="Mosaic GPU imports absl: pip install absl-py")
QUICK = TimingPolicy(warmup=1, min_reps=2, max_reps=3, max_time_s=0.05)
H200 = DeviceInfo("gpu", "NVIDIA H200", "triton", jax.__version__, "", "")  # no GPU here


def register_double_rows():
    return autotune.register(
        double_rows,
        name="third_party_double_rows",
        space={"block_rows": [32, 64]},
        constraints=[rows_divide],
        reference=double_rows_reference,
    )


def test_the_key_names_the_backend_a_kernel_lowers_through():
    x = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)
    mgpu = matmul_mgpu.spec
    assert mgpu.key(mgpu.signature([x, x], {}, H200), H200).backend == "mosaic_gpu"
    assert matmul.spec.key(matmul.spec.signature([x, x], {}, H200), H200).backend == "triton"
    undeclared = register_double_rows().spec  # recognised from its trace, not declared
    sig = undeclared.signature([x], {}, H200)
    assert sig.backend == "mosaic_gpu" and undeclared.key(sig, H200).backend == "mosaic_gpu"
    cpu = current_device()
    assert mgpu.key(mgpu.signature([x, x], {}, cpu), cpu).backend == "interpret"
    # a TPU kernel from another library: recognised, so it runs under TPU interpret mode here
    tpu = autotune.register(
        scaled_matmul,
        name="third_party_scaled_matmul",
        space={"block_m": [8], "block_n": [128], "block_k": [128]},
        bind={"block_shape": ("block_m", "block_n"), "block_sizes": BlockSizes},
        defaults={"block_m": 8, "block_n": 128},
    ).spec
    args = [
        jax.ShapeDtypeStruct(s, d)
        for s, d in (((16, 256), jnp.float32), ((256, 128), jnp.float32), ((1,), jnp.int32))
    ]
    assert tpu.signature(args, {}, cpu).backend == "mosaic_tpu"


def test_an_entry_tuned_for_another_backend_is_not_served(monkeypatch, db_url):
    kernel = register_double_rows()
    x = jnp.ones((128, 128), jnp.float32)
    monkeypatch.setattr(lookup, "current_device", lambda: H200)  # a GPU cannot run here
    key = kernel.spec.key(kernel.spec.signature([x], {}, H200), H200)
    assert key.backend == "mosaic_gpu"
    entry = BestEntry(
        {"block_rows": 32}, time_s=1e-5, n_trials=1, run_id="test", strategy="grid", timer="device"
    )
    with TuningDB(db_url) as db:
        db.put_best(dataclasses.replace(key, backend="triton"), entry)
    runtime_state.clear_memo()
    assert kernel.explain(x)["source"] == "default"
    with TuningDB(db_url) as db:
        db.put_best(key, entry)
    runtime_state.clear_memo()
    assert kernel.explain(x)["source"] == "db"


def test_a_third_party_mosaic_gpu_kernel_tunes_under_gpu_interpret_mode(db_url):
    kernel = register_double_rows()
    assert not kernel.spec.takes_interpret
    # numpy's generator: jax.random compiles a program at each new shape
    x = jnp.asarray(np.random.default_rng(0).standard_normal((128, 128), np.float32))
    result = autotune.tune(kernel, [x], n_trials=2, strategy="grid", policy=QUICK)
    assert {t.status for t in result.trials} == {"ok"} and len(result.trials) == 2
    assert kernel.explain(x)["source"] == "db"
    np.testing.assert_array_equal(np.asarray(jax.jit(kernel)(x)), np.asarray(x) * 2)


def run_check(*args):
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_platform_gpu_lowers_mosaic_gpu_and_triton_candidates():
    shape = ["--shape", "4096x4096,4096x4096", "--dtype", "bfloat16"]
    proc = run_check("matmul_mgpu", "--platform", "gpu", *shape, "--sample", "12")
    assert proc.returncode == 0, proc.stderr
    assert "exceeds available shared memory" in proc.stdout  # refused ones are lowered too
    assert "12 candidates" in proc.stdout and "0 of those do not lower" in proc.stdout
    proc = run_check("matmul", "--platform", "gpu", *shape, "--sample", "6")  # Triton
    assert proc.returncode == 0, proc.stderr
    assert "6 candidates" in proc.stdout and "0 of those do not lower" in proc.stdout


def test_a_persistent_kernel_launches_one_block_per_sm_and_one_under_gpu_interpret_mode():
    from autotune.backends import mosaic_gpu

    assert not mosaic_gpu.interpreting()
    assert mosaic_gpu.num_sms(mosaic_gpu.interpreting()) == mosaic_gpu.NUM_SMS_DEFAULT  # no GPU
    with mosaic_gpu.interpret_mode():
        assert mosaic_gpu.interpreting()
        assert mosaic_gpu.num_sms(mosaic_gpu.interpreting()) == mosaic_gpu.INTERPRET_SMS
