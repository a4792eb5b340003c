"""A configuration, its identity, the record of one measured candidate, and the best entry a
tuning run stores; both as read back.

A trial keeps one form from the worker that measures it to the database that stores it: the
worker returns a `TrialRecord` (pickled across the process boundary), the tuner annotates it,
the search carries it in an `Evaluation`, `TuningDB.add_trials` stores it, and reads it back as
a `StoredTrial` (the record with its key, run and date). A shared study keeps it as data among
its trial's attributes (`as_dict`, read back by `from_dict`: the one place it is serialised), so
every worker's trials come back as records too. A run's winner is a `BestEntry`, which
`TuningDB.put_best` stores; read back (from a database, an exported table or an overlay) it is
a `StoredEntry`, which adds its key, host and date.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.signature import TuningKey

Config = dict[str, Any]  # tunable parameter name -> value: what a candidate is
ConfigId = tuple  # config_id's result


def config_text(config: Mapping[str, Any]) -> str:
    """'block_k=64 block_m=128': a config as one line of text, its parameters sorted."""
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def config_id(config: Mapping[str, Any]) -> ConfigId:
    """A hashable identity of a config (types included: True is not 1 here, nor 8 8.0)."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in config.items()))


@dataclass
class TrialRecord:
    """One measured candidate, as stored in the database's trials table."""

    config: Config
    # ok | rejected | compile_error | runtime_error | crashed | timeout | duplicate | over_memory
    status: str
    time_s: float | None = None
    time_min_s: float | None = None
    time_p10_s: float | None = None
    time_p90_s: float | None = None
    n_reps: int | None = None
    timer: str | None = None
    compile_s: float | None = None
    run_s: float | None = None  # verifying and timing it, warm-up included (not stored)
    max_error: float | None = None
    error: str | None = None
    is_default: bool = False
    oracle: str | None = (
        None  # which oracle judged it (autotune.measure.oracle); None before schema v2
    )
    # schema v3 (None in older trials): the device that measured it ("gpu:3"), the fingerprint
    # of the program it compiled to, the trial it duplicates, the compiler's memory figures
    device: str | None = None
    fingerprint: str | None = None
    duplicate_of: int | None = None
    memory_argument_bytes: int | None = None
    memory_output_bytes: int | None = None
    memory_temp_bytes: int | None = None
    memory_peak_bytes: int | None = None
    # schema v4: the workload that made the kernel's integer data arguments (None: it has none)
    workload: str | None = None
    # schema v5: the device kinds whose results made it one of the first measured (transfer),
    # comma-separated; None where the search chose it from this device's own
    transferred_from: str | None = None
    db_id: int | None = None  # its row in the trials table, once stored

    def as_dict(self) -> dict[str, Any]:
        """Its fields as JSON data, the form a shared study keeps (autotune.search.studies)."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> TrialRecord:
        """The record `as_dict` wrote."""
        return cls(**fields)


@dataclass(kw_only=True)
class StoredTrial(TrialRecord):
    """A trial as a database reads it back: the record, under its key and run. Its config is
    data a tampering hand may have written (callers validate it before use)."""

    key: TuningKey
    run_id: str = ""
    created_at: str | None = None  # ISO 8601

    def as_row(self) -> dict[str, Any]:
        """Its columns, as the tools print them."""
        fields = {k: v for k, v in vars(self).items() if k not in _NOT_TRIAL_COLUMNS}
        return {"id": self.db_id, "run_id": self.run_id, **fields, **self.key.as_dict()}


_NOT_TRIAL_COLUMNS = {"key", "run_id", "db_id", "run_s"}


@dataclass(frozen=True)
class Evaluation:
    """What a search's `evaluate` reports: the trial's record and its objective (lower is
    better), None for a failure."""

    record: TrialRecord
    value: float | None

    @classmethod
    def of(cls, config: Config, value: float | None, status: str = "ok") -> Evaluation:
        """An evaluation with no measurement behind it (a replayed landscape, a test's
        objective): its record holds the config and status alone."""
        return cls(TrialRecord(config, status), value)

    @property
    def config(self) -> Config:
        return self.record.config

    @property
    def status(self) -> str:
        return self.record.status


@dataclass(frozen=True)
class BestEntry:
    """A key's best configuration as a tuning run stores it, with how it was found."""

    config: Config
    time_s: float
    n_trials: int  # trials measured: duplicates of a program measured already not counted
    run_id: str
    strategy: str  # the search strategy, or "variants" for a variant group's choice
    n_rejected: int = 0
    default_time_s: float | None = None
    speedup: float | None = None
    trial_id: int | None = None  # the winner's row in the trials table
    timer: str = "wall"
    jax_version: str = ""  # "" where unknown
    jaxlib_version: str = ""
    runtime_version: str = ""


@dataclass(frozen=True, kw_only=True)
class StoredEntry(BestEntry):
    """A key's best entry as read back, from a database, a shipped table or an overlay: the
    BestEntry under its key, with its row's id, host and date where it has them. Its config is
    data (callers validate it against today's space before use)."""

    key: TuningKey
    id: int | None = None  # its row in a database's results table
    host: str = ""
    tuned_at: str | None = None  # ISO 8601

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredEntry:
        """The entry of a row (a database's, or an export document's entry: a field it leaves
        out takes its default)."""
        key = TuningKey(**{k: row[k] for k in TuningKey.__dataclass_fields__})
        fields = {k: row[k] for k in _ENTRY_FIELDS if k in row}
        return cls(key=key, **{**ENTRY_DEFAULTS, **fields})

    def as_row(self) -> dict[str, Any]:
        """Its fields as one flat record (an export document's entry, a row the tools print)."""
        fields = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "key"
        }
        return {"id": fields.pop("id"), **fields, **self.key.as_dict()}


_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(StoredEntry) if f.name != "key")
# every field an entry may leave out, with the value it then takes (from_row; an import fills
# them in): the dataclass defaults, and these for the fields that have none
ENTRY_DEFAULTS = {
    **{
        f.name: f.default
        for f in dataclasses.fields(StoredEntry)
        if f.default is not dataclasses.MISSING
    },
    "n_trials": 0,
    "run_id": "",
    "strategy": "",
}


class EntrySource(Protocol):
    """What serves tuned configurations by key: the tuning database (autotune.db.TuningDB), a
    table shipped with a kernel and an overlay (autotune.db.tables.EntryTable). The runtime
    asks them in its lookup order (autotune.runtime.lookup); what they return is data, checked
    against today's space before it is served."""

    def best(self, key: TuningKey) -> StoredEntry | None:
        """The entry of exactly this key (kernel version and device kind included), or None."""
        ...

    def query(self, **filters: Any) -> list[StoredEntry]:
        """The entries whose key fields equal every filter given."""
        ...
