"""The tuning service, `autotune tune --pending --watch`, in real processes: watchers started
before model code misses, on a real SQLite file and on the real PostgreSQL server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import pytest
from conftest import FORCED_DEVICES

import autotune
from autotune import TuningDB
from autotune.cli import main
from autotune.kernels import softmax
from autotune.service.claims import claim
from autotune.signature import TuningKey

MODEL = """
import sys
import jax.numpy as jnp
from autotune.kernels import softmax
for rows in map(int, sys.argv[1:]):
    softmax(jnp.ones((rows, 128), jnp.float32))  # a miss per new shape, recorded once it ran
    print(softmax.explain(jnp.ones((rows, 128), jnp.float32))["source"])
"""


def model(env, *rows):
    """A fresh model process calling softmax on these row counts: each call's source."""
    cmd = [sys.executable, "-c", MODEL, *map(str, rows)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def missed(*rows):
    """Model code in this process calling softmax on these row counts, on the database
    configured here: each call's source. The misses reach the watchers through the database,
    as another process's would; only what a fresh process is served needs one (`model`)."""
    sources = []
    for n in rows:
        softmax(jnp.ones((n, 128), jnp.float32))  # a miss per new shape, recorded once it ran
        sources.append(softmax.explain(jnp.ones((n, 128), jnp.float32))["source"])
    return sources


def start_watcher(env, out: Path, *flags):
    """A watcher process, once it says it is watching (its output goes to `out`)."""
    cmd = [sys.executable, "-m", "autotune.cli", "tune", "--pending", "--watch", "--poll", "1"]
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [*cmd, "--trials", "2", *flags], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    wait_for(lambda: "watching" in out.read_text() or proc.poll() is not None, 120)
    assert proc.poll() is None, out.read_text()
    return proc


def stop(proc, out: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, out.read_text()
    text = out.read_text()
    assert "Traceback" not in text and "Exception ignored" not in text, text
    return text


def wait_for(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def entries(url: str) -> list:
    with TuningDB(url) as db:
        return db.query(kernel="softmax")


def test_a_watcher_tunes_misses_as_they_arrive_and_a_fresh_model_is_served_them(
    tmp_path, subprocess_env, db_url
):
    out = tmp_path / "watcher.log"
    env = {**subprocess_env, "XLA_FLAGS": FORCED_DEVICES}
    # in device workers, as deployed: one on each of two (forced host) devices
    watcher = start_watcher(env, out, "--devices", "2")
    try:
        assert missed(8, 16) == ["default", "default"]  # misses, recorded
        wait_for(lambda: len(entries(db_url)) == 2, 240)
        assert model(subprocess_env, 8, 16) == ["db", "db"]  # the next process is served
    finally:
        text = stop(watcher, out)  # SIGTERM, as a Deployment stops a pod
    assert "stopped watching: 2 tuned, 0 skipped, 0 failed" in text
    with TuningDB(db_url) as db:
        devices = {t.device for t in db.trials(kernel="softmax")}
    assert devices == {"cpu:0", "cpu:1"}  # every device of the watcher tuned


def test_two_watchers_never_tune_one_key_twice_on_postgresql(tmp_path, subprocess_env, pg_url):
    env = {**subprocess_env, "PALLAS_AUTOTUNE_DB": pg_url}
    TuningDB(pg_url).close()  # the schema, made once: watchers and the model only open it
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    watchers = [start_watcher(env, log, "--no-isolate") for log in logs]
    try:
        autotune.configure(db=pg_url)
        missed(8, 16, 24)  # three misses for the two watchers
        wait_for(lambda: len(entries(pg_url)) == 3, 300)
    finally:
        texts = [stop(w, log) for w, log in zip(watchers, logs)]
    tuned = [int(t.split("stopped watching: ")[1].split()[0]) for t in texts]
    assert sum(tuned) == 3, texts  # each key tuned once, by one watcher
    with TuningDB(pg_url) as db:
        trials = db.trials(kernel="softmax")
    runs = {}
    for t in trials:
        runs.setdefault(t.key.signature, set()).add(t.run_id)
    assert sorted(runs) == ["f32[16,128]", "f32[24,128]", "f32[8,128]"]
    assert all(len(r) == 1 for r in runs.values()), runs  # one tuning run per key
    assert model(env, 8, 16, 24) == ["db", "db", "db"]


def test_a_key_claimed_by_one_process_is_refused_to_another(tmp_path, subprocess_env, db_url):
    key = TuningKey("softmax", "v1", "cpu", "cpu", "interpret", "f32[8,128]", "{}")
    other = (
        "import sys; from autotune import TuningDB; from autotune.service.claims import claim; "
        "from autotune.signature import TuningKey; "
        f"key = TuningKey(*{tuple(key.as_dict().values())!r}); "
        "db = TuningDB(sys.argv[1]); "
        "print(claim(db, key).__enter__())"
    )

    def elsewhere() -> str:
        cmd = [sys.executable, "-c", other, db_url]
        proc = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    with TuningDB(db_url) as db, claim(db, key) as mine:
        assert mine
        assert elsewhere() == "False"  # held here
    assert elsewhere() == "True"  # released when the context ended


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--job", "job.toml", "--watch"], "--watch watches for misses: give it with --pending"),
        (["--pending", "--watch", "--poll", "0"], "--poll must be a positive number of seconds"),
    ],
)
def test_watch_flags_out_of_place_are_one_line(tmp_path, capsys, argv, message):
    db = tmp_path / "never.db"
    assert main(["tune", *argv, "--db", str(db)]) == 2
    assert capsys.readouterr().err.startswith(f"autotune: error: {message}")
    assert not db.exists()
