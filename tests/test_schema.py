"""Schema versions: a v1 file (the first released schema) opens with every row kept; a
migration upgrades in place; a newer schema is never written to."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Integer, String, inspect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from autotune import db as dbmod
from autotune.db import TuningDB
from autotune.errors import DatabaseError

FIXTURES = Path(__file__).parent / "fixtures"
TABLES = ("schema_info", "trials", "results", "misses")


def raw_rows(path):
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    out = {t: [dict(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY id")] for t in TABLES}
    conn.close()
    return out


def digest(path):
    return "".join(
        hashlib.sha256(Path(p).read_bytes()).hexdigest()
        for p in (path, f"{path}-wal")
        if Path(p).is_file() and Path(p).stat().st_size  # an empty -wal holds nothing
    )


@pytest.fixture
def v1_copy(tmp_path):
    path = tmp_path / "v1.db"
    shutil.copy(FIXTURES / "v1.db", path)
    return path


def test_committed_fixture_is_what_the_script_makes(tmp_path):
    fresh = tmp_path / "fresh.db"
    subprocess.run([sys.executable, str(FIXTURES / "make_v1_db.py"), str(fresh)], check=True)
    assert raw_rows(fresh) == raw_rows(FIXTURES / "v1.db")


def test_v1_database_opens_with_every_row_kept(v1_copy):
    before = raw_rows(v1_copy)
    assert before["schema_info"] == [{"id": 1, "version": 1}]
    with TuningDB(v1_copy) as db:
        assert [r["config"] for r in db.query()] == [
            {"block": 512},
            {"block_k": 64, "block_m": 64, "block_n": 64},
        ]
        assert len(db.trials()) == 4 and [m["count"] for m in db.misses()] == [3, 1]
    after = raw_rows(v1_copy)
    for table in ("trials", "results", "misses"):  # later schemas add columns: the v1 ones
        assert [{k: r[k] for k in before[table][0]} for r in after[table]] == before[table]
    assert {r["oracle"] for r in after["trials"]} == {None}  # v2: not recorded before
    assert after["schema_info"] == [{"id": 1, "version": dbmod.SCHEMA_VERSION}]


class _NextBase(DeclarativeBase):
    pass


class _ResultV2(_NextBase):
    """What the next schema might add to `results`: one column."""

    __tablename__ = "results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    note: Mapped[str | None] = mapped_column(String(200), nullable=True)


def test_next_schema_bump_is_one_migration_function(v1_copy, monkeypatch):
    before = raw_rows(v1_copy)
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(dbmod, "MIGRATIONS", {1: lambda c: dbmod.add_column(c, _ResultV2, "note")})
    with TuningDB(v1_copy) as db:
        assert len(db.query()) == 2
        columns = {c["name"] for c in inspect(db.engine).get_columns("results")}
    assert "note" in columns
    after = raw_rows(v1_copy)
    assert after["schema_info"] == [{"id": 1, "version": 2}]
    assert [{k: r[k] for k in before["results"][0]} for r in after["results"]] == before["results"]
    assert after["trials"] == before["trials"] and after["misses"] == before["misses"]

    # the v1 code meets the v2 file: refused, and nothing is written
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", 1)
    untouched = digest(v1_copy)
    with pytest.raises(DatabaseError, match="schema v2, newer than this pallas-autotune"):
        TuningDB(v1_copy)
    assert digest(v1_copy) == untouched


def test_failed_migration_leaves_the_old_schema(v1_copy, monkeypatch):
    def broken(conn):
        dbmod.add_column(conn, _ResultV2, "note")
        raise RuntimeError("migration bug")

    before = raw_rows(v1_copy)
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(dbmod, "MIGRATIONS", {1: broken})
    with pytest.raises(RuntimeError):
        TuningDB(v1_copy)
    assert raw_rows(v1_copy) == before  # one transaction: the column went with it
    conn = sqlite3.connect(v1_copy)
    assert "note" not in {r[1] for r in conn.execute("PRAGMA table_info(results)")}


def test_open_handle_never_writes_into_a_schema_upgraded_under_it(v1_copy):
    from autotune.signature import TuningKey

    db = TuningDB(v1_copy)
    conn = sqlite3.connect(v1_copy)
    newer = dbmod.SCHEMA_VERSION + 1
    with conn:  # a newer pallas-autotune upgrades the file while we hold it open
        conn.execute(f"UPDATE schema_info SET version = {newer}")
    conn.close()
    key = TuningKey("vector_add", "v1kernel0001", "cpu", "cpu", "interpret", "f32[8],f32[8]")
    with pytest.raises(DatabaseError, match=f"upgraded to schema v{newer}"):
        db.record_miss(key)
    db.close()
    assert len(raw_rows(v1_copy)["misses"]) == 2
