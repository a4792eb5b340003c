"""Every test gets its own real SQLite file as the runtime's database."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import autotune


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
