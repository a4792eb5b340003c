"""A kernel that fails when run is its trial's error under every timer, never a missing or NaN
time; on an accelerator such a failure replaces the device worker; the worker does not
preallocate GPU memory."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from toy_kernels import make_input, scale

from autotune.measure import timing as measure
from autotune.measure.compiling import Program
from autotune.measure.timing import TimingPolicy, measure_candidate, per_call_seconds
from autotune.tuning.task import task_of_call
from autotune.tuning.worker import DeviceWorker, WorkerLimits
from autotune.tuning.worker.parent import child_env

NO_WARMUP = TimingPolicy(warmup=0, warmup_s=0.0, min_reps=3, max_reps=6, max_time_s=0.05)


class FakeCupti:
    """Mosaic GPU's CUPTI extension, which exists only on a GPU: records one kernel of 10 µs
    per call made while attached (mocked: the GPU part only; the calls are real)."""

    def __init__(self, calls: list) -> None:
        self.calls, self.attached_at = calls, None

    def _cupti_init(self) -> None:
        self.attached_at = len(self.calls)

    def _cupti_get_timings(self, finalize: bool) -> list[tuple[str, float]]:
        return [("scale_kernel", 0.01)] * (len(self.calls) - self.attached_at)


def _failing_at(call: int, calls: list):
    """A compiled call that doubles its input and fails, inside the computation (jax's runtime
    error, as a device fault surfaces), at its `call`-th run only: a timer that swallowed the
    error and fell back would time the runs after it."""

    def host(x):
        calls.append(1)
        if len(calls) == call:
            raise RuntimeError("illegal memory access in the kernel")
        return x

    def fn(x):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2.0)

    x = make_input(rows=32)
    return jax.jit(fn).lower(x).compile(), x


class CompiledAhead:  # the compile pool's part: hands over the executable
    def __init__(self, compiled) -> None:
        self.compiled = compiled

    def take(self, config):
        return Program("fingerprint", self.compiled, 0.01)


@pytest.mark.parametrize("timer", ["cupti", "trace", "wall"])
def test_a_kernel_failing_while_timed_is_the_trials_error_under_every_timer(timer, monkeypatch):
    calls: list = []
    if timer == "cupti":
        monkeypatch.setattr(measure, "cupti_extension", lambda: FakeCupti(calls))
    # run 1 verifies, run 2 is CUPTI's untimed call or the first sample, run 3 fails
    compiled, x = _failing_at(3, calls)
    policy = dataclasses.replace(NO_WARMUP, timer=timer)
    record = measure_candidate(
        scale.spec, {"block_rows": 8}, [x], {}, x * 2.0, policy, pool=CompiledAhead(compiled)
    )
    assert record.status == "runtime_error", record
    # the run's own error (its text ends in the callback's traceback, cut at 2000 characters)
    assert record.error.startswith("JaxRuntimeError: INTERNAL: CpuCallback error")
    assert record.time_s is None and record.timer is None and record.max_error == 0.0


def test_cupti_times_a_healthy_kernel_rotating_its_input_sets(monkeypatch):
    calls: list = []
    monkeypatch.setattr(measure, "cupti_extension", lambda: FakeCupti(calls))
    compiled, x = _failing_at(0, calls)
    sets = [[x], [x + 1.0]]
    seen = []

    def call(a):
        seen.append(float(a[0, 0]))
        return compiled(a)

    assert measure.cupti_samples(call, sets, 1, 4) == pytest.approx([1e-5] * 4)
    # one untimed call, then four timed, rotating from set 1
    assert np.allclose(seen, [float(x[0, 0]) + d for d in (1, 1, 0, 1, 0)])


def test_cupti_records_split_into_calls_or_report_nothing():
    two = [("a", 1.0), ("b", 2.0), ("a", 3.0), ("b", 4.0)]
    assert per_call_seconds(two, 2) == pytest.approx([0.003, 0.007])
    assert per_call_seconds(two, 3) == []  # not n calls of the same kernels: no samples
    assert per_call_seconds([("a", 1.0), ("b", 2.0), ("b", 3.0), ("a", 4.0)], 2) == []
    assert per_call_seconds([], 2) == []


def test_no_time_that_is_not_one_is_summarised():
    assert measure.summarise([2.0, 1.0, 3.0]).median_s == 2.0
    for bad in ([], [1.0, float("nan")], [float("inf")], [-1.0]):
        with pytest.raises(ValueError, match="no valid time"):
            measure.summarise(bad)


def test_a_runtime_error_replaces_the_worker_on_an_accelerator_only():
    x = make_input(rows=32)
    limits = WorkerLimits(compile_s=30.0, run_s=30.0, start_s=60.0)
    task = task_of_call("toy_kernels:faulting_scale", [x])
    with DeviceWorker(task, [x], NO_WARMUP, limits) as worker:
        worker.set_oracle(x * 2.0)
        pid = worker._proc.pid
        failed = worker.measure({"block_rows": 16})
        assert failed.status == "runtime_error" and "illegal memory access" in failed.error
        # on the CPU a failed run leaves nothing behind: the same worker carries on
        assert worker._proc.pid == pid and worker.measure({"block_rows": 8}).status == "ok"
        # on a GPU a fault is sticky (mocked: the platform the worker reports, the GPU part)
        worker.device = dataclasses.replace(worker.device, platform="gpu")
        assert worker.measure({"block_rows": 16}).status == "runtime_error"
        assert worker._proc is None  # replaced: the next request starts a fresh worker
        assert worker.measure({"block_rows": 8}).status == "ok" and worker.restarts == 1


def test_a_runtime_errors_text_keeps_what_the_worker_logged_while_it_ran():
    # the device's own words (XLA logs a CUDA error to stderr; the exception is a summary), of
    # this trial only: a real child process whose kernel logs and fails at each run
    x = make_input(rows=32)
    limits = WorkerLimits(compile_s=30.0, run_s=30.0, start_s=60.0)
    task = task_of_call("toy_kernels:faulting_scale", [x])
    with DeviceWorker(task, [x], NO_WARMUP, limits) as worker:
        worker.set_oracle(x * 2.0)
        first, second = (worker.measure({"block_rows": 16}) for _ in range(2))
    for record, n in ((first, 1), (second, 2)):
        assert record.status == "runtime_error" and "illegal memory access" in record.error
        _, logged = record.error.split("; stderr: ")
        assert f"CUDA_ERROR_ILLEGAL_ADDRESS (fault {n})" in logged
    assert "(fault 1)" not in second.error  # the trial before's is not this one's


def test_the_worker_child_does_not_preallocate_gpu_memory(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert child_env(None)["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3")  # a user's choice stands
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in child_env(None)
