"""Model code never breaks because of the tuning database: each case is a real file (and, where
the case needs one, a real second process); the call returns the right answer through the
fallback, warns once per cause, raises AutotuneError in strict mode, and `db check` says why."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from toy_kernels import make_input, scale

import autotune
import autotune.runtime.state
from autotune import TuningDB
from autotune.cli import main
from autotune.device import current_device
from autotune.errors import AutotuneError
from autotune.trial import BestEntry, TrialRecord

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def key_of(x):
    device = current_device()
    return scale.spec.key(scale.spec.signature([x], {}, device), device)


def store(path, x, block_rows=16):
    with TuningDB(path) as db:
        (trial_id,) = db.add_trials(
            key_of(x),
            "run",
            [TrialRecord({"block_rows": block_rows}, "ok", time_s=1e-3)],
        )
        db.put_best(
            key_of(x),
            BestEntry(
                {"block_rows": block_rows},
                time_s=1e-3,
                n_trials=1,
                trial_id=trial_id,
                run_id="run",
                strategy="grid",
            ),
        )


def tamper(path, sql, *params):
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, params)
    conn.close()


def calls_survive(path, caplog):
    """Call `scale` on two shapes, twice each and once more after clearing the memo; return
    the runtime's warnings. Every result must be right."""
    autotune.configure(db=path)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        for rows in (64, 64, 32):
            x = make_input(rows=rows)
            np.testing.assert_allclose(scale(x), x * 2)
        autotune.runtime.state.clear_memo()
        x = make_input(rows=64)
        np.testing.assert_allclose(scale(x), x * 2)
    return [r.getMessage() for r in caplog.records if r.name == "autotune.runtime.state"]


def db_check(path, capsys):
    capsys.readouterr()
    rc = main(["db", "check", "--db", str(path)])
    return rc, capsys.readouterr().out


# --------------------------------------------------------------------------- the cases
# Each builds the database at `path` and returns (words in the warning, words of `db check`).


def missing_file(path):
    return "did not exist", "does not exist"


def missing_directory(path):
    return None, None  # path is redirected below


def path_is_a_directory(path):
    os.mkdir(path)  # unreadable as a file, whoever we are
    return "unable to open database file", "not a file"


def random_bytes(path):
    Path(path).write_bytes(np.random.default_rng(0).bytes(8192))
    return "file is not a database", "file is not a database"


def truncated(path):
    for rows in (64, 128, 256, 512):
        store(path, make_input(rows=rows))
    data = Path(path).read_bytes()  # checkpointed into the main file by the last close
    Path(path).write_bytes(data[: len(data) // 2])
    return "malformed", "malformed"


def undecodable_text(path):
    store(path, make_input(rows=64))
    data = bytearray(Path(path).read_bytes())
    data[data.find(b"schema_info") + 2] = 0xFF  # a table's name, no longer UTF-8
    Path(path).write_bytes(data)
    return f"cannot open tuning database sqlite:///{path}: 'utf-8' codec", "cannot read"


def newer_schema(path):
    store(path, make_input(rows=64))
    tamper(path, "UPDATE schema_info SET version = 99")
    tamper(path, "CREATE TABLE from_the_future (id INTEGER)")
    return "schema v99, newer", "schema v99 is newer"


def _tampered_config(config_text):
    def case(path):
        store(path, make_input(rows=64))
        tamper(path, "UPDATE autotune_results SET config = ?", config_text)
        return "ignored", "config not served"

    return case


def wrong_device_kind(path):
    store(path, make_input(rows=64))
    tamper(path, "UPDATE autotune_results SET device_kind = 'TPU v5 lite'")
    return None, "device kind 'TPU v5 lite' is not a cpu device"


CASES = {
    "missing file": missing_file,
    "path is a directory": path_is_a_directory,
    "random bytes": random_bytes,
    "truncated": truncated,
    "newer schema": newer_schema,
    "undecodable text": undecodable_text,
    "unknown parameter": _tampered_config('{"block_rows":16,"bogus":1}'),
    "value outside the space": _tampered_config('{"block_rows":17}'),
    "wrong type": _tampered_config('{"block_rows":"16"}'),
    "bool for an int": _tampered_config('{"block_rows":true}'),
    "huge string": _tampered_config(json.dumps({"block_rows": "x" * 1_000_000})),
    "JSON not an object": _tampered_config("[16]"),
    "not JSON": _tampered_config("{block_rows: 16"),
    "wrong device kind": wrong_device_kind,
}


@pytest.mark.parametrize("case", CASES)
def test_broken_database_never_breaks_the_call(case, tmp_path, caplog, capsys):
    path = str(tmp_path / "tuning.db")
    warning, check = CASES[case](path)
    before = _digest(path)
    warnings = calls_survive(path, caplog)
    if warning is None:
        assert warnings == []
    else:
        # one warning per cause, however many calls
        assert len(warnings) == 1, warnings
        assert warning in warnings[0] and len(warnings[0]) < 400
    assert scale.explain(make_input(rows=64))["source"] != "db"
    if case in ("newer schema", "random bytes", "truncated"):
        assert _digest(path) == before  # never written to

    autotune.configure(db=path, strict=True)
    with pytest.raises(AutotuneError):
        scale(make_input(rows=64))
    autotune.configure(db=path)
    if check is not None and case != "missing file":
        rc, out = db_check(path, capsys)
        assert rc == 1 and check in out, out


def test_missing_file_is_reported_by_check_and_not_created(tmp_path, capsys):
    path = tmp_path / "absent.db"
    rc, out = db_check(path, capsys)
    assert rc == 1 and "does not exist" in out and not path.exists()


def test_missing_directory(tmp_path, caplog):
    warnings = calls_survive(str(tmp_path / "no" / "such" / "tuning.db"), caplog)
    assert len(warnings) == 1 and "does not exist" in warnings[0]


def test_sound_database_checks_clean(tmp_path, capsys):
    path = tmp_path / "tuning.db"
    store(path, make_input(rows=64))
    rc, out = db_check(path, capsys)
    assert rc == 0 and "1 results" in out and "no problems found" in out, out


def _digest(path):
    h = hashlib.sha256()
    for p in (path, f"{path}-wal"):
        if os.path.isfile(p) and os.path.getsize(p):  # an empty -wal holds nothing
            h.update(Path(p).read_bytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- real processes

CHILD = textwrap.dedent(
    """
    import json, logging, sys
    import numpy as np
    import autotune
    from toy_kernels import make_input, scale
    seen = []
    class H(logging.Handler):
        def emit(self, record): seen.append(record.getMessage())
    logging.getLogger("autotune.runtime.state").addHandler(H())
    out = {}
    for rows in (64, 64, 32):
        x = make_input(rows=rows)
        np.testing.assert_allclose(scale(x), x * 2)
    out["source"] = scale.explain(make_input(rows=64))["source"]
    out["warnings"] = seen
    autotune.configure(strict=True)
    try:
        scale(make_input(rows=64))
        out["strict"] = None
    except autotune.AutotuneError as e:
        out["strict"] = str(e)
    print(json.dumps(out))
    """
)


def run_child(env, *prefix):
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def child_env(path):
    env = dict(os.environ, PALLAS_AUTOTUNE_DB=str(path), JAX_PLATFORMS="cpu", HOME="/tmp")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])
    env.pop("PALLAS_AUTOTUNE_STRICT", None)
    return env


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the reader as another user",
)
def test_unreadable_file_for_an_unprivileged_process():
    # Root reads any file whatever its mode, so the reader runs as `nobody`; the file is
    # root's, mode 0600, in a directory nobody may enter (0755) but not write.
    folder = tempfile.mkdtemp()
    try:
        os.chmod(folder, 0o755)
        path = Path(folder) / "tuning.db"
        store(path, make_input(rows=64))
        assert os.stat(path).st_mode & 0o777 == 0o600
        out = run_child(
            child_env(path), "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"
        )
        assert out["source"] == "default"
        assert len(out["warnings"]) == 1 and "unable to open database file" in out["warnings"][0]
        assert out["strict"] and "cannot open tuning database" in out["strict"]
    finally:
        shutil.rmtree(folder)


@contextlib.contextmanager
def read_only_folder(folder):
    """The folder and its files cannot be written, as on a read-only mount. Root writes
    whatever the mode says, so for root the folder is made immutable (chattr +i) instead."""
    files = [p for p in Path(folder).iterdir()]
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("root ignores file modes, and chattr is not here")
        subprocess.run(["chattr", "+i", folder], check=True)
    else:
        for p in files:
            os.chmod(p, 0o400)
        os.chmod(folder, 0o500)
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", folder], check=True)
        else:
            os.chmod(folder, 0o700)


def test_database_in_a_read_only_folder_is_served(tmp_path, caplog, capsys):
    folder = tmp_path / "image"
    folder.mkdir()
    path = folder / "tuning.db"
    store(path, make_input(rows=64))
    assert sorted(p.name for p in folder.iterdir()) == ["tuning.db"]  # checkpointed, no -shm
    before = _digest(path)
    with read_only_folder(folder):
        autotune.configure(db=path)
        with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
            assert scale.explain(make_input(rows=64))["source"] == "db"
            assert scale.explain(make_input(rows=32))["source"] == "nearest"  # a miss: not stored
            np.testing.assert_allclose(scale(make_input(rows=64)), make_input(rows=64) * 2)
        assert [r.getMessage() for r in caplog.records] == []
        rc, out = db_check(path, capsys)
        assert rc == 0 and "no problems found" in out, out
        assert main(["db", "list", "--db", str(path)]) == 0
        assert "block_rows=16" in capsys.readouterr().out
        export = str(tmp_path / "export.json")
        assert main(["db", "export", "--out", export, "--db", str(path)]) == 0
        assert main(["db", "import", export, "--db", str(path)]) == 2  # a write: refused
        assert "is read-only here" in capsys.readouterr().err
    assert _digest(path) == before and sorted(p.name for p in folder.iterdir()) == ["tuning.db"]


LOCKER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("UPDATE autotune_misses SET count = count + 1")
    print("locked", flush=True)
    time.sleep(60)
    """
)


def test_database_locked_by_another_process(tmp_path, caplog):
    path = tmp_path / "tuning.db"
    store(path, make_input(rows=64))
    TuningDB(path).record_miss(key_of(make_input(rows=8)))
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        autotune.configure(db=path)
        # a hit reads the WAL snapshot: served, no wait, no warning
        x = make_input(rows=64)
        with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
            assert scale.explain(x)["source"] == "db"
            np.testing.assert_allclose(scale(x), x * 2)
            # a miss cannot be recorded: the call waits the runtime's short timeout, not 30 s
            start = time.perf_counter()
            assert scale.explain(make_input(rows=32))["source"] == "nearest"
            waited = time.perf_counter() - start
            for _ in range(2):
                np.testing.assert_allclose(scale(make_input(rows=32)), make_input(rows=32) * 2)
        assert waited < 5, waited
        warnings = [r.getMessage() for r in caplog.records if r.name == "autotune.runtime.state"]
        assert len(warnings) == 1 and "database is locked" in warnings[0], warnings
        autotune.configure(db=path, strict=True)
        with pytest.raises(AutotuneError, match="locked"):
            scale(make_input(rows=32))
    finally:
        locker.kill()
        locker.wait()


@pytest.mark.parametrize(
    "sql, words",
    [
        (
            "UPDATE autotune_trials SET status = 'rejected'",
            "points at trial 1 of status 'rejected'",
        ),
        ("DELETE FROM autotune_trials", "points at trial 1, which does not exist"),
        (
            "UPDATE autotune_results SET kernel_version = 'old'",
            "stale: tuned for kernel version old",
        ),
        (
            "UPDATE autotune_results SET signature = 'f32[1,,2]'",
            "unreadable key: malformed signature",
        ),
        (
            "UPDATE autotune_results SET config = '{\"block_rows\":32}'",
            "config differs from that of its trial",
        ),
        (
            "UPDATE autotune_results SET config = '{\"block_rows\":24}'",
            "breaks rows_divide for its own shape",
        ),
    ],
)
def test_check_names_what_is_wrong_with_an_entry(tmp_path, capsys, sql, words):
    path = tmp_path / "tuning.db"
    store(path, make_input(rows=64))
    tamper(path, sql)
    rc, out = db_check(path, capsys)
    assert rc == 1 and words in out, out


@pytest.mark.parametrize("table", ["autotune_results", "autotune_trials"])
def test_a_time_that_is_not_a_number_is_found_by_check_and_listed(table, tmp_path, capsys):
    path = tmp_path / "tuning.db"
    store(path, make_input(rows=64))
    tamper(path, f"UPDATE {table} SET time_s = 'fast'")
    rc, out = db_check(path, capsys)
    assert rc == 1 and "time_s 'fast' is not a positive number" in out, out
    for argv in (["db", "list"], ["db", "trials"], ["db", "show", "1"], ["db", "stats"]):
        assert main([*argv, "--db", str(path)]) == 0, argv
    assert "block_rows=16" in capsys.readouterr().out
    assert main(["report", "--db", str(path), "--out", str(tmp_path / "report")]) == 0
    assert "block_rows=16" in (tmp_path / "report" / "index.html").read_text()


@pytest.mark.postgres
def test_check_reads_a_postgres_database(pg_url, capsys):
    store(pg_url, make_input(rows=64))
    rc, out = db_check(pg_url, capsys)
    assert rc == 0 and "1 results, 1 trials" in out and "no problems found" in out, out
    engine = TuningDB(pg_url).engine
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE autotune_results SET config = '[16]'")
    engine.dispose()
    rc, out = db_check(pg_url, capsys)
    assert rc == 1 and "config [16] is not an object of parameters" in out, out


# Model code, then `autotune tune`, in one process whose database's -shm file can no longer be
# written once it was mapped (a file system turning read-only, made so with the immutable
# flag): SQLite writes that file through its memory map, and a write there was a SIGBUS
SHM_LOST = """
import subprocess, sys
import autotune
from autotune.cli import main
from toy_kernels import make_input, scale
db = sys.argv[1]
autotune.configure(db=db)
scale(make_input(rows=64))  # the database opened, its -shm file mapped writable
subprocess.run(["chattr", "+i", db + "-shm"], check=True)
for rows in (8, 16, 24, 32):
    scale(make_input(rows=rows))  # lookups, and misses to record
print("calls done", flush=True)
argv = ["tune", "toy_kernels:scale", "--shape", "48x128", "--trials", "2", "--no-isolate"]
sys.exit(main([*argv, "--db", db]))
"""


def test_a_shm_file_that_can_no_longer_be_written_is_one_warning_and_one_line(
    tmp_path, subprocess_env
):
    probe = tmp_path / "probe"
    probe.touch()
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode:
        pytest.skip("the immutable flag (chattr +i) needs root and a file system that has it")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    path = tmp_path / "tuning.db"
    store(path, make_input(rows=64))
    shm = Path(f"{path}-shm")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SHM_LOST, str(path)],
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 2, proc.stderr[-3000:]  # the command's own code: no SIGBUS
        assert proc.stdout.startswith("calls done")
        warning, error = proc.stderr.splitlines()
        assert warning.startswith("pallas-autotune: lookup failed") and "-shm" in warning
        assert error.startswith("autotune: error: cannot open tuning database") and "-shm" in error
        # a process that opens it now maps it read-only: the database is served as it is
        with TuningDB(path) as db:
            assert db.read_only and len(db.query()) == 1
    finally:
        if shm.exists():
            subprocess.run(["chattr", "-i", str(shm)], check=True)
