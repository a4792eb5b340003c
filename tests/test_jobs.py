"""Job files, sharding, recorded misses and resume: real subprocesses, a real SQLite file."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import optuna
import pytest
from toy_kernels import make_input, scale

from autotune import TuningDB, configure
from autotune.cli.tune import parse_shard
from autotune.device import current_device
from autotune.errors import JobError
from autotune.search.strategies import DEFAULT_STRATEGY, STRATEGIES
from autotune.service.jobfile import load_job
from autotune.service.jobs import shard
from autotune.signature import TuningKey
from autotune.tuning.settings import TuneSettings

JOB = """
[defaults]
trials = 2
[[task]]
kernel = "toy_kernels:scale"
shapes = ["32x128", "16x128"]
[[task]]
kernel = "vector_add"
shape = "256,256"
seed = 0
"""


def write(tmp_path, text, name="job.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_job_runs_every_task_then_skips_tuned_ones_unless_forced(tmp_path, cli, db_url):
    job = write(tmp_path, JOB)
    out = cli(["tune", "--job", job, "--no-isolate"]).stdout  # no device worker: not the subject
    assert "task 1/3 trial 2/2" in out and "best " in out and "eta " in out
    assert "task 3/3 tuned   vector_add f32[256],f32[256]" in out
    assert out.strip().endswith("3 tuned, 0 skipped, 0 failed")
    entries = TuningDB(db_url).query()
    assert sorted(e.key.signature for e in entries) == [
        "f32[16,128]",
        "f32[256],f32[256]",
        "f32[32,128]",
    ]
    assert len(TuningDB(db_url).trials()) == 6

    again = cli(["tune", "--job", job, "--no-isolate"]).stdout
    assert again.strip().endswith("0 tuned, 3 skipped, 0 failed")
    assert len(TuningDB(db_url).trials()) == 6  # nothing measured again

    forced = cli(["tune", "--job", job, "--shard", "0/3", "--force", "--no-isolate"]).stdout
    assert forced.strip().endswith("1 tuned, 0 skipped, 0 failed")
    assert len(TuningDB(db_url).trials(signature="f32[32,128]")) == 4  # a fresh study: 2 more


def test_shards_split_a_job_deterministically(tmp_path):
    job = write(
        tmp_path,
        """
        [[task]]
        kernel = "matmul"
        shapes = ["32x32,32x32", "64x32,32x32", "64x64,64x64"]
        dtypes = ["float32", "bfloat16"]
        """,
    )
    tasks = load_job(job)
    assert len(tasks) == 6 and len(set(tasks)) == 6
    shards = [shard(tasks, i, 4) for i in range(4)]
    flat = [t for s in shards for t in s]
    assert len(flat) == len(set(flat)) and set(flat) == set(tasks)  # disjoint and covering
    assert [len(s) for s in shards] == [2, 2, 1, 1]
    assert shards == [shard(load_job(job), i, 4) for i in range(4)]  # same on every machine
    assert parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "1", "a/2", "0/0"):
        with pytest.raises(JobError, match="malformed --shard"):
            parse_shard(bad)


def test_a_job_takes_every_strategy_and_defaults_to_the_default(tmp_path):
    def strategy(line):
        (task,) = load_job(
            write(tmp_path, f"[[task]]\nkernel = 'vector_add'\nshapes = ['8,8']\n{line}")
        )
        return task.strategy

    assert strategy("") == DEFAULT_STRATEGY
    assert [strategy(f"strategy = '{s}'") for s in STRATEGIES] == list(STRATEGIES)


def test_a_jobs_memory_bound_reaches_its_tasks_settings(tmp_path):
    text = "[defaults]\nmax_memory = 4096\n[[task]]\nkernel = 'vector_add'\nshapes = ['8,8']\n"
    (task,) = load_job(write(tmp_path, text))
    assert task.max_memory == 4096
    assert task.settings(TuneSettings(max_memory=10**9)).max_memory == 4096  # the task's own
    (task,) = load_job(write(tmp_path, "[[task]]\nkernel = 'vector_add'\nshapes = ['8,8']\n"))
    assert task.settings(TuneSettings(max_memory=10**9)).max_memory == 10**9  # the run's


def test_a_jobs_workload_reaches_its_tasks_settings(tmp_path):
    gmm = "kernel = 'megablox_gmm'\nshapes = ['32x128,4x128x128,4']\ndtypes = ['float32,float32,int32']"
    (task,) = load_job(write(tmp_path, f"[defaults]\nworkload = 'skewed'\n[[task]]\n{gmm}\n"))
    assert task.workload == "skewed" and task.settings(TuneSettings()).workload == "skewed"
    with pytest.raises(JobError, match="'decode' is not a workload of megablox_gmm .*balanced"):
        load_job(write(tmp_path, f"[[task]]\n{gmm}\nworkload = 'decode'\n"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[task]]\nshapes = ['8']", "needs kernel"),
        ("[[task]]\nkernel = 'matmul'", "needs shapes"),
        ("[[task]]\nkernel = 'matmul'\nshapes = ['8x8,8x8']\ntrials = 0", "trials must be"),
        ("[[task]]\nkernel = 'matmul'\nshapes = ['8y8']", "malformed --shape"),
        (
            "[defaults]\nmax_memory = -1\n[[task]]\nkernel = 'matmul'\nshapes = ['8x8,8x8']",
            "max_memory must be a positive",
        ),
        ("[[task]]\nkernel = 'matmul'\nshapes = ['8']\nblock = 2", "unknown field(s) block"),
        ("[[tasks]]\nkernel = 'matmul'", "unknown table(s) tasks"),
        ("[[task]\n", "is not valid TOML"),
        ("x = " + "[" * 200_000 + "]" * 200_000, "nested too deeply"),
        ("[[task]]\nkernel = 'matmul'\nshapes = ['8x8,8x8']\nstrategy = 'bayes'", "tpe, gp, cmaes"),
        ("import = ['no_such_module_x']\n[[task]]\nkernel = 'm'\nshapes = ['8']", "cannot import"),
    ],
)
def test_bad_job_files_name_the_problem(tmp_path, text, message):
    with pytest.raises(JobError, match="job file|cannot import") as e:
        load_job(write(tmp_path, text))
    assert message in str(e.value)


def test_bad_job_file_is_one_line_with_exit_2(tmp_path, cli):
    proc = cli(["tune", "--job", str(tmp_path / "missing.toml")], rc=2)
    assert proc.stderr.startswith("autotune: error: cannot read job file") and proc.stdout == ""
    proc = cli(["tune", "matmul", "--job", "x.toml"], rc=2)
    assert "drop the kernel and --shape" in proc.stderr


def test_pending_tunes_what_model_code_missed(cli, db_url):
    configure(db=db_url)
    x = make_input(rows=48)
    scale(x)
    scale(x)  # memoised: one miss per new key, not per call
    scale(make_input(rows=32))
    misses = json.loads(cli(["db", "misses", "--format", "json"]).stdout)
    assert sorted((m["signature"], m["count"]) for m in misses) == [
        ("f32[32,128]", 1),
        ("f32[48,128]", 1),
    ]
    pending = ["tune", "--pending", "--kernel", "scale", "--import", "toy_kernels"]
    out = cli([*pending, "--trials", "2", "--no-isolate"]).stdout
    assert out.strip().endswith("2 tuned, 0 skipped, 0 failed")
    configure(db=db_url)
    assert scale.explain(x)["source"] == "db"
    assert cli(["db", "misses"]).stdout.strip() == "(no rows)"  # answered
    again = cli(["tune", "--pending", "--import", "toy_kernels", "--no-isolate"]).stdout
    assert again.startswith("0 task(s)")


def test_pending_never_imports_a_module_that_a_miss_names(tmp_path, cli, db_url, monkeypatch):
    # whoever can write a shared database must not run code on the tuning hosts
    (tmp_path / "planted.py").write_text("open('ran', 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable, as the working directory is
    device = current_device()
    with TuningDB(db_url) as db:
        for kernel in ("planted:kernel", "planted"):
            db.record_miss(
                TuningKey(
                    kernel, "1", device.platform, device.device_kind, device.backend, "f32[8]"
                )
            )
    proc = cli(["tune", "--pending"], rc=1, cwd=tmp_path)  # misses left untuned: no success
    assert not (tmp_path / "ran").exists()
    assert "skipped 1 pending miss(es) of kernel 'planted:kernel': not registered" in proc.stdout
    assert "--import MODULE" in proc.stdout
    assert proc.stdout.strip().endswith(
        "0 tuned, 0 skipped, 0 failed, 2 skipped-unknown (kernels planted, planted:kernel not "
        "registered here: --import MODULE)"
    )


# A suite run in the background inherits SIGINT ignored, and Python then installs no Ctrl-C
# handler: the child takes Ctrl-C again before it runs the CLI (no preexec_fn: a fork of this
# multithreaded process must exec at once).
CTRL_C_TAKEN = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'autotune'; runpy.run_module('autotune.cli', run_name='__main__')"
)


# SIGTERM that the child sends itself from inside a garbage-collector callback (where its
# handler's exception is swallowed) once the test creates the marker file
TERM_IN_A_GC_CALLBACK = """
import gc, os, runpy, signal, sys
marker = sys.argv.pop(1)
def callback(phase, info):
    if phase == "start" and os.path.exists(marker) and callback in gc.callbacks:
        gc.callbacks.remove(callback)
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(10))  # the handler runs here, inside the callback
gc.callbacks.append(callback)
sys.argv[0] = "autotune"
runpy.run_module("autotune.cli", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, returncode",
    [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130), ("gc", 143)],
    ids=["kill-9", "ctrl-c", "sigterm-in-a-gc-callback"],
)
def test_interrupt_mid_task_then_rerun_resumes_without_remeasuring(
    tmp_path, subprocess_env, db_url, cli, sig, returncode
):
    # 27 distinct programs (blocks clamp to the shape): 4 trials never run out of them, so the
    # rerun measures exactly what the study had left; at 32x64,64x32 (8 programs) it could end
    # early on duplicates. Killed after trial 2 of 4, a rerun that measured again what was
    # measured would still exceed the budget's remainder
    job = write(
        tmp_path,
        """
        [[task]]
        kernel = "matmul"
        shape = "64x128,128x64"
        trials = 4
        seed = 0
        """,
    )
    env = dict(subprocess_env, PYTHONUNBUFFERED="1")
    marker = tmp_path / "terminate"
    launcher = [TERM_IN_A_GC_CALLBACK, str(marker)] if sig == "gc" else [CTRL_C_TAKEN]
    # measured in the process that is interrupted (the device worker is not the subject here:
    # tests/test_worker.py kills workers), which spares a second JAX start-up
    cmd = [sys.executable, "-c", *launcher, "tune", "--job", job, "--no-isolate"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "trial 2/4" in line:
            if sig == "gc":
                marker.touch()
            else:
                os.kill(proc.pid, sig)  # kill -9: no cleanup of any kind runs
            break
    proc.wait(timeout=60)
    proc.stdout.close()
    assert proc.returncode == returncode, "".join(seen)
    assert TuningDB(db_url).query() == []  # the task did not finish

    storage = f"sqlite:///{tmp_path / 'tuning-studies.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    before = optuna.load_study(study_name=summary.study_name, storage=storage)
    done_before = {  # measured: a config compiling to a program measured already is not
        json.dumps(t.params, sort_keys=True)
        for t in before.trials
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["status"] != "duplicate"
    }
    # trial 2 was stored and printed; the kill may land before the study was told of it
    assert len(done_before) >= 1

    out = cli(["tune", "--job", job, "--no-isolate"]).stdout
    assert out.strip().endswith("1 tuned, 0 skipped, 0 failed")
    (entry,) = TuningDB(db_url).query()
    trials = [t for t in TuningDB(db_url).trials() if t.status != "duplicate"]
    resumed = [t for t in trials if t.run_id != trials[0].run_id]
    # only what the study had left of its budget; a trial stored and printed before the kill
    # but not yet told to the study is told now, not measured again
    assert len(resumed) <= 4 - len(done_before)
    configs = {json.dumps(t.config, sort_keys=True) for t in trials}
    assert entry.n_trials == 4 and len(configs) == len(trials) == 4
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert {json.dumps(t.params, sort_keys=True) for t in finished} >= done_before
    # the best entry is one of the study's trials (an extra row left by the kill is not one);
    # its time is the finalists' re-measurement, so compare the trial's first measurement
    best_row = next(t for t in trials if t.db_id == entry.trial_id)
    assert best_row.config == entry.config and best_row.status == "ok"
    assert best_row.time_s in {t.value for t in finished}


def test_a_failing_task_is_reported_and_the_job_exits_1(tmp_path, cli, db_url):
    job = write(tmp_path, '[[task]]\nkernel = "toy_kernels:scale"\nshapes = ["7x128"]\n')
    out = cli(["tune", "--job", job, "--no-isolate"], rc=1).stdout
    assert "task 1/1 failed  toy_kernels:scale f32[7,128]: no configuration of scale" in out
    assert out.strip().endswith("0 tuned, 0 skipped, 1 failed")
    assert TuningDB(db_url).query() == []


def test_time_limit_and_patience_bound_each_task_of_a_job(tmp_path, cli, db_url):
    job = write(tmp_path, '[[task]]\nkernel = "toy_kernels:scale"\nshapes = ["32x128"]\n')
    cmd = ["tune", "--job", job, "--time-limit", "1e-9", "--patience", "1", "--no-isolate"]
    out = cli(cmd, rc=1).stdout
    assert "the time limit ran out before any candidate of scale" in out
    assert TuningDB(db_url).query() == []


# The CLI keeps its own process to the CPU while its device workers own the accelerator. No
# accelerator here: an H200 stands for what the job's own process would see instead of the
# workers' device, which is all these two tests replace.
H200 = dataclasses.replace(
    current_device(), platform="gpu", device_kind="NVIDIA H200", backend="triton"
)


def test_a_jobs_tasks_are_keyed_by_the_device_its_workers_measure_on(monkeypatch):
    import autotune.tuning.worker.parent
    from autotune.tuning.settings import TuneSettings
    from autotune.tuning.worker.parent import tuning_device

    worker_device = current_device()
    monkeypatch.setattr(autotune.tuning.worker.parent, "current_device", lambda: H200)
    apart = TuneSettings(isolate=True, worker_platforms="cpu")  # as the CLI runs a job
    assert tuning_device(apart) == worker_device  # asked of a real worker child
    assert tuning_device(TuneSettings(isolate=True)) == H200  # the worker inherits ours
    assert tuning_device(TuneSettings(isolate=False)) == H200


def test_a_task_tuned_on_the_workers_device_is_skipped(db_url):
    from test_db_tools import put

    from autotune.registry import resolve
    from autotune.service.jobs import run_tasks
    from autotune.tuning.task import make_task

    task = make_task("toy_kernels:scale", "32x128")
    spec = resolve(task.kernel).spec
    for device in (H200, current_device()):  # an entry keyed by each device in turn
        key = spec.key(spec.signature(task.inputs(), {}, device), device)
        with TuningDB(db_url) as db:
            put(db, key, block_rows=8, time_s=1e-3)
            (outcome,) = run_tasks([task], device, db=db)
        assert outcome.status == "skipped", device


def test_progress_counts_duplicates_names_a_small_space_and_explains_the_summarys_figure():
    import io
    import re

    import toy_kernels
    from rich.console import Console

    from autotune import autotuned
    from autotune.service.jobs import run_tasks
    from autotune.service.progress import Display
    from autotune.tuning.task import make_task

    # `spare` changes no program: of the 6 valid configurations, 4 compile to one measured
    @autotuned(
        name="spare_scale",
        space={"block_rows": [8, 16], "spare": [1, 2, 3]},
        constraints=[toy_kernels.rows_divide],
    )
    def spare_scale(x, *, block_rows=8, spare=1, interpret=False):
        return toy_kernels._scale_call(x, block_rows, interpret)

    out = io.StringIO()
    task = make_task("spare_scale", "32x128", trials=16, strategy="grid")
    run = TuneSettings(isolate=False, n_trials=16, strategy="grid", finalists=2)
    with TuningDB() as db, Display(Console(file=out, width=400), "task") as display:
        (outcome,) = run_tasks([task], current_device(), db=db, settings=run, show=display)
    lines = out.getvalue().splitlines()
    trials = [line for line in lines if " trial " in line]
    assert len(set(trials)) == len(trials) == 6, lines  # each line says something new
    assert (
        "the space holds only 6 valid configurations for this call: the budget is 6 trials, not 16"
        in trials[0]
    )
    assert "trial 2/6 +4 duplicates (not measured)" in trials[-1]
    assert "2 trials (+4 duplicates)" in outcome.detail
    # the progress shows the first pass's best; the summary, the side-by-side figure, saying so
    best = re.search(r"best (\S+) ms \(first pass\)", trials[-1]).group(1)
    assert f"(re-measured side by side with the default; first pass {best} ms)" in outcome.detail


def test_pending_misses_of_a_kernel_not_registered_fail_the_run_and_name_import(db_url, capsys):
    from autotune.cli import main

    device = current_device()
    with TuningDB(db_url) as db:
        db.record_miss(
            TuningKey(
                "scale_rows",
                "1",
                device.platform,
                device.device_kind,
                device.backend,
                "f32[512,256]",
            )  # fmt: skip
        )
    rc = main(["tune", "--pending", "--kernel", "scale_rows", "--no-isolate"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "skipped 1 pending miss(es) of kernel 'scale_rows': not registered here" in out
    assert out.strip().endswith(
        "0 tuned, 0 skipped, 0 failed, 1 skipped-unknown (kernel scale_rows not registered "
        "here: --import MODULE)"
    )
