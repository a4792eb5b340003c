"""Every test gets its own real SQLite file as the runtime's database."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import autotune


def pytest_configure(config) -> None:
    """One XLA compilation cache for the session, cold at its start and removed at its end.

    XLA compiling Pallas's interpreted programs is most of the suite's CPU, and many tests
    compile the same kernel at the same sizes, here and in the processes they start (which
    inherit the variables, as the xdist workers do): each distinct program now compiles once
    per session. What runs is the same executable, so nothing a test checks changes."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # a worker, a child pytest, or the user's own
        return
    config.xla_cache = tempfile.mkdtemp(prefix="pallas-autotune-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = config.xla_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # ours take 0.05-1 s


def pytest_unconfigure(config) -> None:
    if getattr(config, "xla_cache", None):
        shutil.rmtree(config.xla_cache, ignore_errors=True)


def pytest_collection_modifyitems(items) -> None:
    """The files whose tests start processes (marked slow, or given `subprocess_env`) first,
    the most such tests first; then the rest, the most tests first. The two xdist workers take
    whole files in this order (`--dist loadfile --no-loadscope-reorder`): the longest files
    started last would leave one worker running alone at the end."""
    starts: dict[Path, int] = {}
    count: dict[Path, int] = {}
    for item in items:
        slow = "subprocess_env" in item.fixturenames or item.get_closest_marker("slow")
        starts[item.path] = starts.get(item.path, 0) + bool(slow)
        count[item.path] = count.get(item.path, 0) + 1
    items.sort(key=lambda item: (-starts[item.path], -count[item.path], str(item.path)))


@pytest.fixture(autouse=True)
def db_url(tmp_path, monkeypatch) -> str:
    path = tmp_path / "tuning.db"
    monkeypatch.setenv("PALLAS_AUTOTUNE_DB", str(path))
    monkeypatch.delenv("PALLAS_AUTOTUNE_STRICT", raising=False)
    monkeypatch.delenv("PALLAS_AUTOTUNE_FALLBACK", raising=False)
    autotune.configure()
    yield str(path)
    autotune.configure()


@pytest.fixture
def subprocess_env(db_url) -> dict[str, str]:
    """The environment for a child process that should use this test's database."""
    env = dict(os.environ)
    env["PALLAS_AUTOTUNE_DB"] = db_url
    env.setdefault("JAX_PLATFORMS", "cpu")
    tests = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run the `autotune` command in this process, as `autotune ARGS` would in a shell here:
    `cli(args, rc=0, env=None, cwd=None)` asserts its exit code and gives what it printed
    (`.returncode`, `.stdout`, `.stderr`, as subprocess.run's). Its log lines go to stderr as
    the command's own logging set-up sends them (root at WARNING, INFO with -v). Where the
    process boundary is the subject (signals, kills, fresh processes, several at once), the
    tests start `sys.executable -m autotune.cli` themselves."""
    from autotune.cli import main

    def run(args, rc=0, *, env=None, cwd=None):
        with monkeypatch.context() as m:
            for name, value in (env or {}).items():
                m.setenv(name, value)
            if cwd is not None:
                m.chdir(cwd)
            capsys.readouterr()  # what the test printed before is not the command's
            verbose = "-v" in args or "--verbose" in args
            handler = logging.StreamHandler(sys.stderr)  # the capture's stderr, now
            handler.setFormatter(logging.Formatter("%(message)s"))
            root = logging.getLogger()
            level = root.level
            root.addHandler(handler)
            root.setLevel(logging.INFO if verbose else logging.WARNING)
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # --help, --version: argparse's own exit
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            finally:
                root.removeHandler(handler)
                root.setLevel(level)
            out, err = capsys.readouterr()
        assert code == rc, f"exit {code}, not {rc}\n{out[-3000:]}\n{err[-3000:]}"
        return subprocess.CompletedProcess(["autotune", *args], code, out, err)

    return run


# tests/multidevice/ needs several host devices, which XLA_FLAGS gives only before jax starts:
# tests/test_multidevice.py runs it in a child process that sets the flag. Elsewhere it is left
# out, so the rest of the suite keeps one device.
FORCED_DEVICES = "--xla_force_host_platform_device_count=4"


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path.name == "multidevice" and FORCED_DEVICES not in os.environ.get(
        "XLA_FLAGS", ""
    ):
        return True
    return None


PG_ADMIN_URL = os.environ.get("PALLAS_AUTOTUNE_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_url() -> str:
    """A fresh, empty PostgreSQL database on the real server, dropped afterwards.

    Skips with the reason where no server answers, unless PALLAS_AUTOTUNE_REQUIRE_POSTGRES=1
    (CI), where a missing server is a failure.
    """
    import uuid

    import sqlalchemy

    try:
        admin = sqlalchemy.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as e:
        reason = f"PostgreSQL not reachable at {PG_ADMIN_URL} ({type(e).__name__})"
        if os.environ.get("PALLAS_AUTOTUNE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason}, and PALLAS_AUTOTUNE_REQUIRE_POSTGRES=1")
        pytest.skip(reason)
    name = f"pat_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with admin.connect() as conn:
        conn.exec_driver_sql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        )
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
    admin.dispose()
