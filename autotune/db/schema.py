"""The tuning database's tables (SQLAlchemy models), the key columns every table shares, and
how a configuration is stored in a column (JSON text, read back as data that callers validate
against the current space before use)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The newest revision of autotune/db/migrations/versions (a test holds the two equal), known here
# without Alembic so that opening a current database stays cheap. v1: the first released
# schema (tests/fixtures/v1.db); v2: the tables are prefixed (`autotune_trials`, ...), and each
# trial records the oracle that judged it (`oracle`); v3: each trial records the device that
# measured it (`device`), the compiled program's fingerprint and the trial it duplicates
# (`fingerprint`, `duplicate_of`), and the compiler's memory figures (`memory_*_bytes`); v4:
# each trial records the workload that made its kernel's integer data arguments (`workload`);
# v5: a trial measured first because other device kinds' results ranked it best names those
# device kinds (`transferred_from`).
SCHEMA_VERSION = 5

KEY_COLUMNS = (
    "kernel",
    "kernel_version",
    "platform",
    "device_kind",
    "backend",
    "signature",
    "static",
)

TRIAL_STATUSES = (
    "ok",
    "rejected",
    "compile_error",
    "runtime_error",
    "pruned",
    "crashed",
    "timeout",
    "duplicate",  # compiled to a program already measured in its study (`duplicate_of`)
    "over_memory",  # its program's peak memory was above the run's bound (max_memory): not run
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def table_names(version: int) -> dict[str, str]:
    """The tables of schema `version`, by what they hold: results, trials, misses."""
    prefix = "autotune_" if version >= 2 else ""
    return {role: prefix + role for role in ("results", "trials", "misses")}


TABLES = table_names(SCHEMA_VERSION)


class ReadableDateTime(TypeDecorator):
    """A timestamp column that reads a value SQLite holds but cannot parse (a tampering hand
    wrote it) as None, so that one bad row never fails a whole query (`db check` names it)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def result_processor(self, dialect: Any, coltype: Any) -> Callable[[Any], Any] | None:
        inner = self.impl_instance.result_processor(dialect, coltype)
        if inner is None:
            return None

        def process(value: Any) -> Any:
            try:
                return inner(value)
            except (ValueError, TypeError):
                return None

        return process


class Base(DeclarativeBase):
    pass


class _KeyColumns:
    kernel: Mapped[str] = mapped_column(String(200), index=True)
    kernel_version: Mapped[str] = mapped_column(String(64))
    platform: Mapped[str] = mapped_column(String(16))
    device_kind: Mapped[str] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(32))
    signature: Mapped[str] = mapped_column(String(1000))
    static: Mapped[str] = mapped_column(String(1000), default="{}")


class SchemaInfo(Base):
    __tablename__ = "schema_info"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class Trial(_KeyColumns, Base):
    """One measured (or failed) candidate of a tuning run."""

    __tablename__ = TABLES["trials"]
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)
    config: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    time_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # median
    time_min_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_p10_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_p90_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    n_reps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timer: Mapped[str | None] = mapped_column(String(32), nullable=True)
    compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # which oracle judged it: "interpret" or "reference" (autotune.measure.oracle); v2
    oracle: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # v3: the device that measured it ("cpu:0", "gpu:3": platform and local index)
    device: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # v3: a hash of the program it compiled to; a duplicate names the trial that was measured
    fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    duplicate_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # v3: the compiler's memory analysis of its program (None where the backend gives none)
    memory_argument_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_output_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_temp_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # v4: the workload that made its integer data arguments (group sizes, lengths); None where
    # the kernel takes none
    workload: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # v5: the device kinds whose results made it one of the first measured (transfer), comma-
    # separated; None for a trial the search chose from this device's own
    transferred_from: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)


class Result(_KeyColumns, Base):
    """The best configuration of one key, with its provenance."""

    __tablename__ = TABLES["results"]
    __table_args__ = (UniqueConstraint(*KEY_COLUMNS, name="uq_results_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    config: Mapped[str] = mapped_column(Text)
    time_s: Mapped[float] = mapped_column(Float)
    default_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    n_trials: Mapped[int] = mapped_column(Integer)
    n_rejected: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    run_id: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(32))
    timer: Mapped[str] = mapped_column(String(32))
    jax_version: Mapped[str] = mapped_column(String(32))
    jaxlib_version: Mapped[str] = mapped_column(String(32))
    runtime_version: Mapped[str] = mapped_column(String(200), default="")
    host: Mapped[str] = mapped_column(String(200), default="")
    tuned_at: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)


class Miss(_KeyColumns, Base):
    """A key that model code asked for and the database did not have."""

    __tablename__ = TABLES["misses"]
    __table_args__ = (UniqueConstraint(*KEY_COLUMNS, name="uq_misses_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(ReadableDateTime, default=utcnow)


def decode_config(text: Any) -> Any:
    """JSON text to a value; anything undecodable comes back as None (never executed)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
        return None


def encode_config(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
