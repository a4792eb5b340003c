"""Schema versions: a v1 file (the first released schema) opens with every row kept; the
Alembic revisions of autotune/migrations upgrade in place; a newer schema is never written to."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from autotune.db import TuningDB, migrations, schema
from autotune.db import connection as dbmod
from autotune.db.migrations.versions.v3_trial_device_memory import COLUMNS as V3_COLUMNS
from autotune.db.migrations.versions.v5_trial_transferred_from import COLUMNS as V5_COLUMNS
from autotune.errors import DatabaseError

FIXTURES = Path(__file__).parent / "fixtures"
ROLES = ("trials", "results", "misses")


def raw_rows(path, version=1):
    """Every row of a schema-`version` file, by table role (and schema_info)."""
    names = {**schema.table_names(version), "schema_info": "schema_info"}
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    out = {
        role: [dict(r) for r in conn.execute(f"SELECT * FROM {name} ORDER BY id")]
        for role, name in names.items()
    }
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


def schema_drift(conn):
    """How the database's schema differs from the models (Alembic's autogenerate comparison);
    tables that are not ours (Optuna's) are left out."""
    ours = set(schema.Base.metadata.tables)
    opts = {"include_name": lambda name, kind, _parent: kind != "table" or name in ours}
    return compare_metadata(MigrationContext.configure(conn, opts=opts), schema.Base.metadata)


@pytest.fixture
def next_revision(tmp_path, monkeypatch):
    """Install `source` as the revision after the newest, beside copies of the shipped ones,
    and make it this code's schema version; returns that version."""

    def install(source):
        scripts = tmp_path / "migrations"
        shutil.copytree(migrations.SCRIPTS / "versions", scripts / "versions")
        version = dbmod.SCHEMA_VERSION + 1
        header = f"revision = {str(version)!r}\ndown_revision = {str(version - 1)!r}\n"
        (scripts / "versions" / f"v{version}_next.py").write_text(header + source)
        monkeypatch.setattr(migrations, "SCRIPTS", scripts)
        monkeypatch.setattr(dbmod, "SCHEMA_VERSION", version)
        return version

    return install


def test_committed_fixture_is_what_the_script_makes(tmp_path):
    fresh = tmp_path / "fresh.db"
    subprocess.run([sys.executable, str(FIXTURES / "make_v1_db.py"), str(fresh)], check=True)
    assert raw_rows(fresh) == raw_rows(FIXTURES / "v1.db")


def test_v1_database_opens_with_every_row_kept(v1_copy):
    before = raw_rows(v1_copy)
    assert before["schema_info"] == [{"id": 1, "version": 1}]
    with TuningDB(v1_copy) as db:
        assert [r.config for r in db.query()] == [
            {"block": 512},
            {"block_k": 64, "block_m": 64, "block_n": 64},
        ]
        assert len(db.trials()) == 4 and [m["count"] for m in db.misses()] == [3, 1]
    after = raw_rows(v1_copy, version=dbmod.SCHEMA_VERSION)
    for role in ROLES:  # later schemas add columns: compare v1's
        assert [{k: r[k] for k in before[role][0]} for r in after[role]] == before[role]
    assert {r["oracle"] for r in after["trials"]} == {None}  # v2: not recorded before
    for column in ("device", "fingerprint", "duplicate_of", "memory_peak_bytes"):  # v3
        assert {r[column] for r in after["trials"]} == {None}
    assert {r["workload"] for r in after["trials"]} == {None}  # v4: not recorded before
    assert {r["transferred_from"] for r in after["trials"]} == {None}  # v5
    assert after["schema_info"] == [{"id": 1, "version": dbmod.SCHEMA_VERSION}]


def test_a_v4_database_gains_transferred_from_with_its_trials_kept(tmp_path):
    from autotune.signature import TuningKey
    from autotune.trial import TrialRecord

    path = tmp_path / "v4.db"
    key = TuningKey("scale", "v", "cpu", "cpu", "interpret", "f32[8,8]")
    with TuningDB(path) as db:
        db.add_trials(key, "r", [TrialRecord({"block_rows": 8}, "ok", time_s=1e-3)])
    conn = sqlite3.connect(path)  # back to v4: without v5's column
    conn.execute("ALTER TABLE autotune_trials DROP COLUMN transferred_from")
    conn.execute("UPDATE schema_info SET version = 4")
    conn.commit()
    conn.close()
    with TuningDB(path) as db:
        led = TrialRecord({"block_rows": 16}, "ok", time_s=1e-3, transferred_from="TPU v5e")
        db.add_trials(key, "r", [led])
        assert [(t.config, t.transferred_from) for t in db.trials()] == [
            ({"block_rows": 8}, None),
            ({"block_rows": 16}, "TPU v5e"),
        ]
        with db.engine.connect() as conn:
            assert schema_drift(conn) == []


def test_v1_tables_are_renamed_so_optuna_can_share_the_database(v1_copy):
    TuningDB(v1_copy).close()
    conn = sqlite3.connect(v1_copy)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type != 'view'")}
    conn.close()
    assert {"autotune_trials", "autotune_results", "autotune_misses", "schema_info"} <= names
    assert not names & {"trials", "results", "misses", "ix_trials_kernel", "ix_trials_run_id"}
    assert {"ix_autotune_trials_kernel", "ix_autotune_trials_run_id"} <= names


def test_revisions_end_at_the_schema_version_and_build_the_models(v1_copy):
    assert ScriptDirectory(str(migrations.SCRIPTS)).get_current_head() == str(dbmod.SCHEMA_VERSION)
    with TuningDB(v1_copy) as db, db.engine.connect() as conn:
        assert schema_drift(conn) == []  # upgraded from v1: what a new file is created as


def test_opening_a_current_database_does_not_load_alembic(tmp_path, subprocess_env):
    path = tmp_path / "current.db"
    TuningDB(path).close()
    script = (
        "import sys; from autotune.db import TuningDB; "
        f"TuningDB({str(path)!r}).close(); print('alembic' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


NOTE = """
import sqlalchemy as sa
from alembic import op


def upgrade():
    op.add_column("autotune_results", sa.Column("note", sa.String(200), nullable=True))
"""


def test_next_schema_bump_is_one_revision_script(v1_copy, next_revision, monkeypatch):
    before = raw_rows(v1_copy)
    current = dbmod.SCHEMA_VERSION
    next_revision(NOTE)
    with TuningDB(v1_copy) as db:  # v1 -> ... -> the next revision, in one transaction
        assert len(db.query()) == 2
        columns = {c["name"] for c in inspect(db.engine).get_columns("autotune_results")}
    assert "note" in columns
    after = raw_rows(v1_copy, version=current)
    assert after["schema_info"] == [{"id": 1, "version": current + 1}]
    assert [{k: r[k] for k in before["results"][0]} for r in after["results"]] == before["results"]
    for role in ("trials", "misses"):
        assert [{k: r[k] for k in before[role][0]} for r in after[role]] == before[role]

    # this code meets the newer file: refused, and nothing is written
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", current)
    untouched = digest(v1_copy)
    with pytest.raises(DatabaseError, match=f"schema v{current + 1}, newer than this"):
        TuningDB(v1_copy)
    assert digest(v1_copy) == untouched


def test_a_v1_pallas_autotune_refuses_a_newer_file(v1_copy, monkeypatch):
    TuningDB(v1_copy).close()  # upgraded to the current schema
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", 1)  # the v1 code reads schema_info, as before
    untouched = digest(v1_copy)
    newest = f"schema v{ScriptDirectory(str(migrations.SCRIPTS)).get_current_head()}"
    with pytest.raises(DatabaseError, match=f"{newest}, newer than this pallas-autotune"):
        TuningDB(v1_copy)
    assert digest(v1_copy) == untouched


def test_failed_migration_leaves_the_old_schema(v1_copy, next_revision):
    before = raw_rows(v1_copy)
    next_revision('\ndef upgrade():\n    raise RuntimeError("migration bug")\n')
    with pytest.raises(RuntimeError, match="migration bug"):
        TuningDB(v1_copy)  # v2's renames ran, then the next revision failed
    assert raw_rows(v1_copy) == before  # one transaction: the renames went with it


def test_open_handle_never_writes_into_a_schema_upgraded_under_it(v1_copy):
    from autotune.signature import TuningKey

    db = TuningDB(v1_copy)
    conn = sqlite3.connect(v1_copy)
    newer = dbmod.SCHEMA_VERSION + 1
    with conn:  # a newer pallas-autotune upgrades the file while we hold it open
        conn.execute("UPDATE schema_info SET version = ?", (newer,))
    conn.close()
    key = TuningKey("vector_add", "v1kernel0001", "cpu", "cpu", "interpret", "f32[8],f32[8]")
    with pytest.raises(DatabaseError, match=f"upgraded to schema v{newer}"):
        db.record_miss(key)
    db.close()
    assert len(raw_rows(v1_copy, version=dbmod.SCHEMA_VERSION)["misses"]) == 2


@pytest.mark.postgres
def test_tuning_database_and_studies_share_one_postgres_database(pg_url):
    import optuna
    from sqlalchemy import create_engine
    from toy_kernels import make_input, scale

    import autotune
    from autotune.search.studies import optuna_url

    result = autotune.tune(
        scale, [make_input(rows=16)], n_trials=2, db=pg_url, storage=pg_url, strategy="grid"
    )
    (entry,) = TuningDB(pg_url).query(kernel="scale")
    assert entry.config == result.best_config and len(TuningDB(pg_url).trials()) == 2
    (summary,) = optuna.get_all_study_summaries(optuna_url(pg_url))
    assert summary.n_trials >= 2
    engine = create_engine(optuna_url(pg_url))
    assert {"trials", "studies", "autotune_trials", "schema_info"} <= set(
        inspect(engine).get_table_names()
    )
    with engine.connect() as conn:
        assert schema_drift(conn) == []
    engine.dispose()


@pytest.mark.postgres
def test_an_upgrade_beside_optuna_leaves_its_alembic_version_alone(pg_url, next_revision):
    import optuna
    from sqlalchemy import create_engine

    from autotune.search.studies import optuna_url

    storage = optuna.storages.RDBStorage(optuna_url(pg_url))  # Optuna's alembic_version too
    storage.engine.dispose()
    TuningDB(pg_url).close()
    engine = create_engine(dbmod.normalize_url(pg_url))
    optunas = "SELECT version_num FROM alembic_version"
    with engine.connect() as conn:
        optuna_version = conn.exec_driver_sql(optunas).all()
    version = next_revision(NOTE)
    TuningDB(pg_url).close()  # our upgrade runs Alembic in Optuna's database
    with engine.connect() as conn:
        assert conn.exec_driver_sql(optunas).all() == optuna_version
        assert conn.exec_driver_sql("SELECT version FROM schema_info").all() == [(version,)]
        assert "note" in {c["name"] for c in inspect(conn).get_columns("autotune_results")}
        tables = inspect(conn).get_table_names()
        assert [t for t in tables if "alembic" in t] == ["alembic_version"]  # Optuna's only
    engine.dispose()


@pytest.mark.postgres
def test_a_v1_postgres_database_is_upgraded_in_place(pg_url):
    from sqlalchemy import create_engine

    from autotune.signature import TuningKey

    key = TuningKey("vector_add", "v", "cpu", "cpu", "interpret", "f32[8],f32[8]")
    with TuningDB(pg_url) as db:
        db.record_miss(key)
        db.record_miss(key)
    engine = create_engine(dbmod.normalize_url(pg_url))
    with engine.begin() as conn:  # back to v1's names, as the first release wrote them
        for role in ROLES:
            conn.exec_driver_sql(f"ALTER TABLE autotune_{role} RENAME TO {role}")
        for index in ("trials_kernel", "trials_run_id", "results_kernel", "misses_kernel"):
            conn.exec_driver_sql(f"ALTER INDEX ix_autotune_{index} RENAME TO ix_{index}")
        conn.exec_driver_sql("ALTER TABLE trials DROP COLUMN oracle")  # v2's new column
        for column, _ in (*V3_COLUMNS, *V5_COLUMNS):  # v3's and v5's
            conn.exec_driver_sql(f"ALTER TABLE trials DROP COLUMN {column}")
        conn.exec_driver_sql("ALTER TABLE trials DROP COLUMN workload")  # v4's
        conn.exec_driver_sql("UPDATE schema_info SET version = 1")
    with TuningDB(pg_url) as db:
        assert [m["count"] for m in db.misses()] == [2]
    names = set(inspect(engine).get_table_names())
    assert {"autotune_misses", "schema_info"} <= names and "misses" not in names
    with engine.connect() as conn:
        assert schema_drift(conn) == []
    engine.dispose()
