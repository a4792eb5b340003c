"""Tuning on several local devices at once (`--devices`): a device worker pinned to each,
sharing a task's budget through one study. On a CPU host the devices are forced host devices,
each worker a real process pinned to its own."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest
from conftest import FORCED_DEVICES

import autotune
from autotune import TuningDB, backends
from autotune.errors import SettingsError


def forced_devices_cli(args, env, rc=0):
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc


def test_two_devices_measure_exactly_the_budget_between_them(subprocess_env, db_url, cli):
    # the devices are counted before jax starts: the tune runs in a process given four
    env = {**subprocess_env, "XLA_FLAGS": FORCED_DEVICES}
    out = forced_devices_cli(
        ["tune", "matmul", "--shape", "64x64,64x64", "--trials", "4", "--devices", "2"], env
    ).stdout
    trials = json.loads(cli(["db", "trials", "--format", "json"]).stdout)
    # one study's budget of distinct programs, not one per device (a config compiling to a
    # program measured already, e.g. block_m 128 clamped to 64 rows, is a duplicate, not measured)
    assert len([t for t in trials if t["status"] != "duplicate"]) == 4, out
    assert len({config_text(t) for t in trials}) == len(trials)  # no configuration twice
    assert {t["device"] for t in trials} == {"cpu:0", "cpu:1"}  # each measured some
    lines = [line for line in out.splitlines() if line.startswith("trial")]
    shown = [word for line in lines for word in line.split() if word.startswith("cpu:")]
    assert sorted(shown) == sorted(t["device"] for t in trials)  # each line names its device
    with TuningDB(db_url) as db:
        (entry,) = db.query(kernel="matmul")
    assert entry.config in [t["config"] for t in trials]


def test_a_jobs_tasks_are_spread_over_the_devices_one_device_each(
    tmp_path, monkeypatch, db_url, cli
):
    from autotune.db import TuningDB
    from autotune.device import current_device
    from autotune.service.jobfile import load_job
    from autotune.service.jobs import run_tasks
    from autotune.tuning.settings import TuneSettings
    from autotune.tuning.worker.parent import worker_devices

    job = tmp_path / "job.toml"
    job.write_text(
        '[defaults]\ntrials = 2\n[[task]]\nkernel = "softmax"\nshapes = ["8x128", "16x128"]\n'
    )
    # the job runs here, as `tune --job FILE --devices 2` runs it; its workers (real processes)
    # see four host devices, this process keeps its one: the count is the workers' (asked of a
    # child, worker_platforms set as the command line sets it)
    device = current_device()  # this process's JAX starts before the flag, with one device
    monkeypatch.setenv("XLA_FLAGS", FORCED_DEVICES)
    worker_devices.cache_clear()
    settings = TuneSettings(isolate=True, devices=2, worker_platforms="cpu")
    try:
        with TuningDB(db_url) as db:
            outcomes = run_tasks(load_job(job), device, db=db, settings=settings)
    finally:
        worker_devices.cache_clear()
    assert [o.status for o in outcomes] == ["tuned", "tuned"], outcomes
    trials = json.loads(cli(["db", "trials", "--format", "json"]).stdout)
    devices = {}
    for t in trials:
        devices.setdefault(t["signature"], set()).add(t["device"])
    assert sorted(devices) == ["f32[16,128]", "f32[8,128]"]
    assert all(len(d) == 1 for d in devices.values()), devices  # a task on one device
    assert set.union(*devices.values()) == {"cpu:0", "cpu:1"}  # side by side, on both


def config_text(trial):
    return json.dumps(trial["config"], sort_keys=True)


def test_more_devices_than_the_host_has_is_one_line_and_nothing_is_written(tmp_path, cli):
    db = tmp_path / "never.db"
    args = ["tune", "matmul", "--shape", "64x64,64x64", "--db", str(db), "--devices"]
    err = cli([*args, "2"], rc=2).stderr  # one host device here
    assert err.strip().splitlines() == [
        "autotune: error: --devices asks for 2 devices and this host has 1 local device: "
        "give at most 1, or all"
    ]
    assert "neither a number" in cli([*args, "two"], rc=2).stderr
    assert not db.exists()


def test_a_worker_pinned_to_a_forced_host_device_computes_there(subprocess_env):
    code = (
        "from autotune.tuning.worker.child import pinned_device; import jax.numpy as jnp; "
        "d = pinned_device(2); print(d.id, jnp.ones(3).devices().pop().id)"
    )
    env = {**subprocess_env, "XLA_FLAGS": FORCED_DEVICES}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "2"]


def test_a_pinned_worker_sees_one_gpu_or_tpu_chip_counted_within_the_hosts_own_list():
    env = backends.pinned_env(1, {"CUDA_VISIBLE_DEVICES": "4,6"})
    assert env["CUDA_VISIBLE_DEVICES"] == "6"  # the second of the GPUs this host may use
    assert backends.pinned_env(3, {})["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["TPU_VISIBLE_CHIPS"] == "1" and env["TPU_PROCESS_BOUNDS"] == "1,1,1"
    ports = {backends.pinned_env(i, {})["TPU_PROCESS_PORT"] for i in range(4)}
    assert len(ports) == 4  # workers beside each other never share libtpu's port


def test_tune_from_python_refuses_more_devices_than_a_worker_sees():
    x = jax.ShapeDtypeStruct((64, 64), "float32")
    with pytest.raises(SettingsError, match="devices asks for 2 devices and this host has 1"):
        autotune.tune("matmul", [x, x], devices=2, n_trials=2)


def test_shared_cores_are_said_where_more_cpu_devices_measure_than_there_are_cores(tmp_path):
    from autotune.device import available_cores, shared_cores

    note = shared_cores("cpu", 4, cores=2)
    assert note.startswith("4 CPU devices measure side by side on 2 cores: they share cores")
    assert "--devices 2 or fewer" in note
    assert shared_cores("cpu", 2, cores=2) is None and shared_cores("gpu", 8, cores=2) is None
    quota = tmp_path / "cpu.max"  # a container's --cpus 1.5
    quota.write_text("150000 100000\n")
    assert available_cores(quota) == min(available_cores(tmp_path / "none"), 2)
    quota.write_text("max 100000\n")
    assert available_cores(quota) == available_cores(tmp_path / "none")


def test_a_run_on_devices_that_share_cores_says_so_once_at_its_start(monkeypatch, caplog):
    import contextlib
    import logging

    import autotune.device
    import autotune.tuning.worker as workers
    from autotune.db import TuningDB
    from autotune.device import current_device, warn_shared_cores
    from autotune.errors import KernelError
    from autotune.service.jobs import run_tasks
    from autotune.tuning.settings import TuneSettings
    from autotune.tuning.task import make_task

    class Started(contextlib.nullcontext):  # a worker started on a CPU device, measuring nothing
        device = current_device()

    monkeypatch.setattr(autotune.device, "available_cores", lambda: 2)
    monkeypatch.setattr(workers, "device_count", lambda settings: 4)
    monkeypatch.setattr(workers, "device_worker", lambda *a: Started())
    warn_shared_cores.cache_clear()
    task = make_task("softmax", "8x128")
    settings = TuneSettings(devices=4)
    with caplog.at_level(logging.WARNING, logger="autotune.device"):
        for _ in range(2):  # a task on every device: once per run, not per task
            with workers.task_workers(None, task, [], settings) as started:
                assert len(started) == 4
        assert len(caplog.records) == 1
        assert "4 CPU devices measure side by side on 2 cores" in caplog.records[0].getMessage()
        # a job's tasks side by side, one device each: said at its start too
        warn_shared_cores.cache_clear()

        def no_worker(task, settings, index):
            raise KernelError("no worker here")

        monkeypatch.setattr(workers, "task_device_worker", no_worker)
        with TuningDB() as db:
            outcomes = run_tasks([task] * 4, current_device(), db=db, settings=settings)
        assert [o.status for o in outcomes] == ["failed"] * 4
        assert len(caplog.records) == 2
    warn_shared_cores.cache_clear()


def test_devices_count_a_tpus_chips_not_a_v7x_chips_two_tensorcores():
    # a worker is pinned by chip (mosaic_tpu.pinned_env): `--devices all` on a v7x host of 4
    # chips means 4 workers, not its 8 jax devices. No TPU runs here: the devices are stand-ins
    # with the attributes jax's TPU devices carry (platform, core_on_chip)
    from types import SimpleNamespace

    from autotune.device import local_device_units

    v7x = [SimpleNamespace(platform="tpu", core_on_chip=i % 2) for i in range(8)]
    v5e = [SimpleNamespace(platform="tpu", core_on_chip=0) for _ in range(4)]
    assert local_device_units(v7x) == 4 and local_device_units(v5e) == 4
    # elsewhere every device takes a worker: this host's forced CPU devices are real ones
    assert local_device_units() == len(jax.local_devices())
