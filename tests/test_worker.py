"""The device worker in real subprocesses: crashes and hangs become trials, never an abort."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB
from autotune.errors import KernelError
from autotune.measure.timing import TimingPolicy
from autotune.tuning.task import task_of_call
from autotune.tuning.worker import DeviceWorker, WorkerLimits

FAST = TimingPolicy(warmup=1, min_reps=3, max_reps=20, max_time_s=0.05)
LIMITS = WorkerLimits(compile_s=5.0, run_s=5.0, start_s=60.0)


def test_crash_and_hangs_are_recorded_and_the_run_carries_on(db_url):
    x = make_input(rows=64)
    start = time.monotonic()
    result = autotune.tune(
        "toy_kernels:fragile_scale",
        [x],
        n_trials=4,
        db=db_url,
        strategy="grid",
        policy=FAST,
        isolate=True,
        limits=LIMITS,
    )
    wall = time.monotonic() - start
    by_block = {t.config["block_rows"]: t for t in result.trials}
    assert by_block[8].status == "ok"
    assert by_block[16].status == "crashed" and "SIGABRT" in by_block[16].error
    assert by_block[32].status == "timeout" and "compile time limit" in by_block[32].error
    assert by_block[64].status == "timeout" and "run time limit" in by_block[64].error
    assert by_block[64].compile_s is None  # the worker died with what it knew
    assert result.best_config == {"block_rows": 8}
    # grid order 8, 16, 32, 64: the deaths at 16 and 32 needed a fresh worker, the last did not
    assert result.restarts == 2 and result.n_crashed == 3
    # the hangs last an hour: the run is bounded by the limits plus restarts, not by them
    assert wall < LIMITS.compile_s + LIMITS.run_s + 60
    stored = {t.config["block_rows"]: t.status for t in TuningDB(db_url).trials()}
    assert stored == {8: "ok", 16: "crashed", 32: "timeout", 64: "timeout"}
    (entry,) = TuningDB(db_url).query(kernel="fragile_scale")
    assert entry.config == {"block_rows": 8}


def test_isolated_tuning_finds_the_kernel_by_its_import_path(db_url):
    x = make_input(rows=32)
    result = autotune.tune(
        scale, [x], n_trials=3, db=db_url, strategy="grid", policy=FAST, isolate=True
    )
    assert {t.status for t in result.trials} == {"ok"} and result.restarts == 0
    assert len(result.trials) == 3  # 8, 16, 32 divide 32 rows; 12 and 24 do not
    assert result.key.platform == "cpu"


def test_a_worker_that_cannot_import_the_kernel_is_a_clear_error():
    with pytest.raises(KernelError, match="cannot set up 'no_such_module:kernel'"):
        x = make_input()
        DeviceWorker(task_of_call("no_such_module:kernel", [x]), [x], FAST, LIMITS)


def test_kernel_defined_where_a_worker_cannot_import_it_is_refused():
    @autotune.autotuned(name="local_scale", space={"block_rows": [8]})
    def local_scale(x, *, block_rows=8, interpret=False):
        return x * 2.0

    with pytest.raises(KernelError, match="cannot import kernel 'local_scale'"):
        autotune.tune(local_scale, [make_input()], n_trials=1, isolate=True, store=False)


def test_one_worker_serves_several_tasks_and_survives_a_crash_between(db_url):
    with DeviceWorker(task_of_call("toy_kernels:scale", []), [], FAST, LIMITS) as worker:
        pid = worker._proc.pid
        first = autotune.tune(
            "toy_kernels:scale", [make_input(rows=32)], n_trials=3, db=db_url, worker=worker
        )
        assert worker._proc.pid == pid and first.restarts == 0  # no second start-up
        crashy = autotune.tune(
            "toy_kernels:fragile_scale",
            [make_input(rows=16)],  # 8 and 16 divide 16 rows: 16 aborts the worker
            n_trials=2,
            db=db_url,
            strategy="grid",
            worker=worker,
        )
        assert sorted(t.status for t in crashy.trials) == ["crashed", "ok"]
        again = autotune.tune(
            "toy_kernels:scale", [make_input(rows=16)], n_trials=2, db=db_url, worker=worker
        )
        assert again.restarts == 1 and {t.status for t in again.trials} == {"ok"}


PARENT = """
from toy_kernels import make_input
from autotune.tuning.task import task_of_call
from autotune.tuning.worker import DeviceWorker
x = make_input(rows=32)
w = DeviceWorker(task_of_call("toy_kernels:fragile_scale", [x]), [x])
print(w._proc.pid, flush=True)
w.measure({"block_rows": 32})  # hangs for an hour in the worker
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_hung_worker_dies_with_a_search_process_killed_outright(subprocess_env):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=subprocess_env
    )
    worker = int(parent.stdout.readline())
    time.sleep(1.0)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    orphaned = _alive(worker)
    if orphaned:  # leave no hour-long hang behind on the machine
        os.kill(worker, signal.SIGKILL)
    assert not orphaned


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except FileNotFoundError:
        return False
    return "Z" not in state.split()[1]  # a zombie has died; only its reaping is left


def test_a_worker_killed_between_trials_is_replaced_and_the_candidate_measured():
    # an OOM kill or a crash in a compile thread ends the worker while it waits for a request
    x = make_input(rows=32)
    with DeviceWorker(task_of_call("toy_kernels:scale", [x]), [x], FAST, LIMITS) as worker:
        worker.set_oracle(make_input(rows=32) * 2)
        assert worker.measure({"block_rows": 8}).status == "ok"
        os.killpg(worker._proc.pid, signal.SIGKILL)
        worker._proc.wait()
        record = worker.measure({"block_rows": 16})
        # the candidate was never sent to the dead worker: it is not to blame
        assert record.status == "ok" and worker.restarts == 1


# A worker that finds the marker file as it starts (it imports this module at set-up) takes it
# and kills itself (SIGKILL), as the OOM killer or an operator would kill it then.
DIES_STARTING = """
import os, signal
from toy_kernels import _scale_call, rows_divide, scale_reference
from autotune import autotuned

try:
    os.unlink(os.environ["TOY_RESTART_MARKER"])
except FileNotFoundError:
    pass
else:
    os.kill(os.getpid(), signal.SIGKILL)


@autotuned(
    name="restart_scale",
    space={"block_rows": [8, 16, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def restart_scale(x, *, block_rows=8, interpret=False):
    return _scale_call(x, block_rows, interpret)
"""


def _worker_child(pin):
    """The pid of this process's device worker child pinned to `pin` (None: not pinned)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")[:-1]
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        mine = ppid == os.getpid() and "worker.child" in " ".join(argv)
        if mine and argv[3:] == ([] if pin is None else [str(pin)]):
            return int(proc.name)
    raise AssertionError(f"no worker child pinned to {pin}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("devices", [1, 2])  # one worker, or one of several side by side
def test_a_worker_killed_while_it_restarts_is_started_again_and_the_run_stores_its_entry(
    devices, tmp_path, monkeypatch, db_url
):
    from conftest import FORCED_DEVICES

    from autotune.tuning.worker.parent import worker_devices

    (tmp_path / "dies_starting.py").write_text(DIES_STARTING)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers import it too (child_env)
    marker = tmp_path / "marker"
    monkeypatch.setenv("TOY_RESTART_MARKER", str(marker))
    # the workers see four host devices (two of them measure), this process keeps its one: the
    # count is the workers' (worker_platforms set: a child reports it)
    platforms = None
    if devices > 1:
        monkeypatch.setenv("XLA_FLAGS", FORCED_DEVICES)
        platforms = "cpu"
        worker_devices.cache_clear()

    def kill_the_first_worker(record, i, n):
        # after the first trial: the first device's worker killed between trials, and its
        # replacement killed as it starts (the finalists, measured there, need one)
        if i == 1:
            marker.touch()
            os.kill(_worker_child(None if devices == 1 else 0), signal.SIGKILL)

    try:
        result = autotune.tune(
            "dies_starting:restart_scale",
            [make_input(rows=32)],
            n_trials=3,
            db=db_url,
            strategy="grid",
            policy=FAST,
            isolate=True,
            limits=LIMITS,
            devices=devices,
            worker_platforms=platforms,
            finalists=2,
            progress=kill_the_first_worker,
        )
    finally:
        worker_devices.cache_clear()
    assert not marker.exists()  # a replacement took it: it died while it started
    assert result.restarts >= 2  # the one that died starting, and the one after it
    assert {t.config["block_rows"] for t in result.trials} == {8, 16, 32}
    (entry,) = TuningDB(db_url).query(kernel="restart_scale")
    assert entry.config == result.best_config
