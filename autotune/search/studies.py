"""A tuning task's Optuna study, its whole life: its name (one per tuning key), its storage
(beside a SQLite tuning database by default), its creation or resumption, shared by several
workers, and its deletion (a fresh start).

The search loop (autotune.search) asks and tells; this module holds what sharing adds: claims
on configurations being measured, heartbeats, and the release of dead workers' claims.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import logging
import os
import socket
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState

from autotune.errors import DatabaseError, SpaceError
from autotune.signature import TuningKey
from autotune.sql import (
    GuardedConnection,
    close_interrupted_cursors,
    create_private_file,
    normalize_url,
    sqlite_file,
    sqlite_url,
)
from autotune.trial import Evaluation, TrialRecord, config_id

log = logging.getLogger(__name__)

HEARTBEAT_S = 30  # a shared study's running trial whose worker is silent 3x this long is failed
# Heartbeats are how a shared study releases the claims of dead workers; Optuna marks them
# experimental and meant for Study.optimize, which an ask/tell loop cannot use: say it once here.
for _message in ("Argument ``heartbeat_interval``", ".*fail_stale_trials is experimental"):
    warnings.filterwarnings(
        "ignore", message=_message, category=optuna.exceptions.ExperimentalWarning
    )
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


# On SQLite, Optuna's claim of a WAITING trial (read its state, then set it RUNNING) is two
# statements that its row lock does not make atomic there: two workers could both claim one
# trial, measure it twice, and the second `tell` fails. Every transaction of a SQLite studies
# file begins IMMEDIATE instead (the driver's own BEGIN is turned off), holding the write lock
# from the read on: claims are serialised, and concurrent workers wait on the busy timeout.
_SQLITE_ENGINE = {
    "connect_args": {"isolation_level": None, "timeout": 30.0, "factory": GuardedConnection}
}


def _begin_immediate(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


class SharedStudy:
    """A study in an Optuna RDB storage that several workers (and a resumed run) share.

    Claims: Optuna writes a trial's parameters to the storage when it is asked for, so a
    RUNNING trial is a claim on its configuration that every worker can see. A worker that
    finds another live claim on the configuration it was just given, or a finished measurement
    of it, gives it up (see `taken`).
    Claims of dead workers are released: at once for a dead process on this host, and after
    missed heartbeats for other hosts.
    """

    def __init__(self, storage: str, study_name: str | None, sampler: Any) -> None:
        if not study_name:
            raise SpaceError("a study in a storage needs a study_name")
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        if threading.current_thread() is not threading.main_thread():
            # one of this process's searches on several devices (autotune.tuning.kernel)
            self.worker += f"/{threading.get_ident()}"
        # Optuna's INFO lines ("A new study created ...") only where ours are shown (-v)
        verbose = logging.getLogger("autotune").isEnabledFor(logging.INFO)
        optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)
        self.name, self.sampler = study_name, sampler
        self.file = sqlite_file(optuna_url(storage))
        try:
            with _one_at_a_time(self.file):
                self._open(storage, self.file)
        except (OSError, sqlalchemy.exc.SQLAlchemyError) as e:
            reason = str(getattr(e, "orig", None) or e).splitlines()[0]
            raise DatabaseError(
                f"cannot open the studies storage {storage}: {reason}: give --storage a "
                "database that can be written (or free space beside the tuning database)"
            ) from e

    def _open(self, storage: str, file: Path | None) -> None:
        for attempt in range(5):
            try:
                if file is not None and attempt == 0:
                    _set_aside_if_corrupt(file)
                self.storage = optuna.storages.RDBStorage(
                    optuna_url(storage),
                    engine_kwargs=_SQLITE_ENGINE if file is not None else None,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=3 * HEARTBEAT_S,
                )
                break
            except sqlalchemy.exc.SQLAlchemyError:
                # workers starting together race to create Optuna's tables: the loser retries
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        if file is not None:
            sqlalchemy.event.listen(self.storage.engine, "begin", _begin_immediate)
            close_interrupted_cursors(self.storage.engine)
        self._create()

    def _create(self) -> None:
        self.study = optuna.create_study(
            storage=self.storage,
            study_name=self.name,
            direction="minimize",
            sampler=self.sampler,
            load_if_exists=True,
        )

    def join(self) -> None:
        """Say that this worker searches the study now (see `in_use`): from then on no other
        worker deletes it (delete_study). Dead workers' claims are released, and what they
        were measuring (the default, say) is queued again: first, where no other worker
        searches the study, so that it is measured within the budget, not beyond it."""
        with _one_at_a_time(self.file):
            try:
                self.study.set_user_attr(f"worker {self.worker}", True)
            except KeyError:  # deleted since it was opened, by the last worker to leave it
                self._create()
                self.study.set_user_attr(f"worker {self.worker}", True)
            released = self._release_dead()
            if released and not self.in_use():
                # Optuna asks for the oldest waiting trial first: those waiting are failed and
                # queued again behind the released ones (no other worker is asking for them)
                waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                released += [_params(t) for t in waiting if self._fail(t)]
            for params in released:
                self.study.enqueue_trial(params)

    def add_run(self, run_id: str) -> None:
        """Say that run `run_id` stores its trials for this study (see `runs`): before it
        stores any, so that a run killed between storing a trial and telling the study of it
        leaves a trial that the next run finds (autotune.tuning.kernel), never measures again."""
        self.study.set_user_attr(f"run {run_id}", True)

    def runs(self) -> set[str]:
        """The runs that stored trials for this study (add_run), this one's included."""
        return {name.removeprefix("run ") for name in self.study.user_attrs if name[:4] == "run "}

    def leave(self) -> None:
        with contextlib.suppress(KeyError):  # a study deleted already has no one in it
            self.study.set_user_attr(f"worker {self.worker}", False)

    def in_use(self) -> bool:
        """Whether another worker has joined the study and not left it (a dead process on this
        host has left it). Set-then-check: a worker leaves before it asks, so of two that
        finish together, at least the later one finds the study unused."""
        return _in_use(self.study, self.worker)

    def records(self) -> list[TrialRecord | None]:
        """What the study's workers (this one's earlier runs included) have measured so far:
        each measurement's record, None where the study kept only its status."""
        states = (TrialState.COMPLETE, TrialState.PRUNED)
        trials = self.study.get_trials(deepcopy=False, states=states)
        return [
            TrialRecord.from_dict(t.user_attrs["detail"]) if "detail" in t.user_attrs else None
            for t in trials
            if "status" in t.user_attrs
        ]

    def programs(self) -> dict[str, TrialRecord]:
        """The programs the study's workers measured: fingerprint -> the first trial of it."""
        out: dict[str, TrialRecord] = {}
        for record in self.records():
            if record is not None and record.fingerprint and record.status != "duplicate":
                out.setdefault(record.fingerprint, record)
        return out

    def refresh(self, enc: Any) -> tuple[dict[tuple, Evaluation], set[tuple]]:
        """The study's measured configs (the first measurement of each, its record read back)
        and its live claims."""
        measured, claimed, _ = self.snapshot(enc)
        return measured, claimed

    def snapshot(self, enc: Any) -> tuple[dict[tuple, Evaluation], set[tuple], list[int]]:
        """What `refresh` gives, and the numbers of the study's running trials, all from one
        read of its trials: a trial another worker finishes meanwhile is in one or the other,
        never in neither (see search.loop's budget check)."""
        for params in self._release_dead():
            self.study.enqueue_trial(params)  # what a dead worker was measuring, queued again
        measured: dict[tuple, Evaluation] = {}
        claimed: set[tuple] = set()
        running: list[int] = []
        for t in self.study.get_trials(deepcopy=False):
            if t.state == TrialState.RUNNING:
                running.append(t.number)
            if (
                t.state == TrialState.RUNNING
                and "worker" in t.user_attrs  # a claim whose owner can be found dead (see taken)
                and t.params.keys() == enc.distributions.keys()
            ):
                claimed.add(config_id(enc.decode(t.params)))
            elif t.state in (TrialState.COMPLETE, TrialState.PRUNED) and "status" in t.user_attrs:
                config = enc.decode(t.params)
                detail = t.user_attrs.get("detail")
                record = (
                    TrialRecord(config, t.user_attrs["status"])
                    if detail is None
                    else TrialRecord.from_dict(detail)
                )
                value = t.value if t.state == TrialState.COMPLETE else None
                measured.setdefault(config_id(config), Evaluation(record, value))
        return measured, claimed - set(measured), running

    def taken(self, trial: optuna.Trial, cid: tuple, enc: Any) -> bool:
        """Whether another worker holds a claim on this trial's config, or has measured it.

        Set-then-check: our parameters are committed (by ask) before we look, so of two workers
        given one config at the same moment, at least the later to commit sees the other. Both
        may see each other and both give it up (a wasted ask, never a duplicate measurement);
        the config stays unmeasured and can be proposed again. Finished measurements count too:
        the other worker may have measured the config and finished since our last refresh.
        """
        trial.set_user_attr("worker", self.worker)
        self.storage.record_heartbeat(trial._trial_id)  # from now on a dead owner is detected
        states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
        for t in self.study.get_trials(deepcopy=False, states=states):
            if (
                t.number != trial.number
                and (t.state == TrialState.RUNNING or "status" in t.user_attrs)
                and t.params.keys() == enc.distributions.keys()
                and config_id(enc.decode(t.params)) == cid
            ):
                return True
        return False

    def keep(self, trial: optuna.Trial, ev: Evaluation) -> None:
        """Keep a measured trial's status and record in the study, where every worker (and a
        resumed run) reads them back (refresh)."""
        trial.set_user_attr("status", ev.status)
        trial.set_user_attr("detail", ev.record.as_dict())

    def heartbeat(self, trial: optuna.Trial) -> _Heartbeat:
        return _Heartbeat(self.storage, trial._trial_id)

    def close_queue(self) -> None:
        """Fail the trials still queued (WAITING): the study's budget is spent, and nobody
        will ask for them; left alone they would read as work still to do."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            self._fail(t)

    def _release_dead(self) -> list[dict[str, Any]]:
        """Fail the running trials of dead workers; the configurations of those failed here
        that were queued or being measured (for the caller to queue again: they were not
        measured)."""
        released = []
        optuna.storages.fail_stale_trials(self.study)
        host = socket.gethostname()
        grace = datetime.timedelta(seconds=3 * HEARTBEAT_S)
        alone = None  # whether no other live worker searches the study (looked up when needed)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            claimed = "worker" in t.user_attrs
            if claimed:
                worker_host, pid = _host_pid(str(t.user_attrs["worker"]))
                dead = worker_host == host and pid.isdigit() and not _alive(int(pid))
            else:
                # asked for, then its worker was interrupted or killed before it claimed the
                # trial (in the middle of the ask, say, its parameters half written): no claim
                # and no heartbeat will ever release it. A worker joins before it asks, so
                # where no other live worker is in the study (looked at after the trial was
                # read), no one is asking for it; else it is released once older than the grace
                if alone is None:
                    alone = not self.in_use()
                dead = alone or _age(t) > grace
            # an unclaimed trial was never measured: only a configuration it took from the
            # queue is queued again, never parameters the sampler was still giving it
            params = _params(t) if claimed else t.system_attrs.get("fixed_params")
            if dead and self._fail(t) and params:
                released.append(params)
        return released

    def _fail(self, trial: Any) -> bool:
        """Fail `trial`; False where another worker finished it first."""
        try:
            self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True


class _Heartbeat:
    """Records the trial's heartbeat while its configuration is measured."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            self.storage.record_heartbeat(self.trial_id)
            if self.stop.wait(HEARTBEAT_S):
                return

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


_CHECKED: set[Path] = set()  # studies files this process found readable


def _set_aside_if_corrupt(file: Path) -> None:
    """A studies file is a cache of progress: one that SQLite cannot read as a database is
    renamed (with its -wal and -shm files) for inspection, with a warning, and the run
    starts afresh instead of failing every later run on it. Checked once per process: a
    job opens the file for every task, and the check reads all of it."""
    if file in _CHECKED:
        return
    try:
        conn = sqlite3.connect(file, timeout=30.0)
        try:
            problem = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # locked, or unreadable: the caller's open says why
        return
    except sqlite3.DatabaseError as e:  # not a database, malformed
        problem = str(e)
    if problem == "ok":
        _CHECKED.add(file)
        return
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = file.with_name(f"{file.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{file}{suffix}", f"{aside}{suffix}")
    create_private_file(file)  # the fresh one as private as the one set aside
    log.warning(
        "studies file %s cannot be read (%s): set aside as %s; tuning starts afresh",
        file,
        problem,
        aside,
    )


def _params(trial: Any) -> dict[str, Any]:
    """A trial's parameters: those it was queued with, else those it was given when asked."""
    return trial.system_attrs.get("fixed_params", trial.params)


def _in_use(study: optuna.Study, worker: str | None) -> bool:
    """Whether a worker other than `worker` has joined `study` and not left it (a dead
    process on this host has left it)."""
    host = socket.gethostname()
    for name, joined in study.user_attrs.items():
        owner = name.removeprefix("worker ")
        worker_host, pid = _host_pid(owner)
        if not joined or owner in (name, worker):
            continue
        if worker_host != host or not pid.isdigit() or _alive(int(pid)):
            return True
    return False


@contextlib.contextmanager
def _one_at_a_time(file: Path | None) -> Iterator[None]:
    """Opening or joining a study, and deleting it, one process at a time per SQLite studies
    file (a lock file beside it, `.lock`). Each of Optuna's calls is a transaction of its own:
    unlocked, a worker finding a study unused could delete it between another's creating it
    and reading it back, or opening it and joining it. A server's studies (PostgreSQL) are
    deleted by the last worker of a single `autotune tune` (unless in use), and when a job is
    forced to tune afresh."""
    if file is None or not file.parent.is_dir():
        yield
        return
    create_private_file(file)  # as private as the tuning database beside it
    lock = file.with_name(f"{file.name}.lock")
    create_private_file(lock)
    with open(lock, "rb") as f:  # flock: not SQLite's own (POSIX) locks, which it never touches
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # released as the file is closed


def _age(trial: Any) -> datetime.timedelta:
    """How long ago a running trial was started (Optuna stores local naive times)."""
    return datetime.datetime.now() - (trial.datetime_start or datetime.datetime.now())


def _host_pid(worker: str) -> tuple[str, str]:
    """A worker's host and process id ("host:pid", or "host:pid/thread")."""
    host, _, pid = worker.partition(":")
    return host, pid.partition("/")[0]


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def optuna_url(url: str) -> str:
    """Optuna's storage takes SQLAlchemy URLs; PostgreSQL through psycopg 3 (the postgres extra)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        return sqlite_url(Path(url).expanduser().resolve())
    return url


def default_storage(db_url: str | None) -> str | None:
    """Where a task's study lives unless a storage is given: beside a SQLite tuning database
    (tuning.db -> tuning-studies.db), or in a server's tuning database itself (Optuna's tables
    beside ours, which are all prefixed `autotune_`), so that concurrent runs of one key share
    its budget there too; None for a database in memory."""
    url = normalize_url(db_url)
    file = sqlite_file(url)
    if file is not None:
        return sqlite_url(file.with_name(file.stem + "-studies.db"))
    return None if url.startswith("sqlite") else url


def delete_study(storage: str, name: str, unless_in_use: bool = False) -> None:
    """Delete a study (a fresh start for its key); nothing happens if there is none, nor,
    `unless_in_use`, while another worker searches it (the last one out deletes it)."""
    url = optuna_url(storage)
    # KeyError: no such study, or another worker deleted it first
    with _one_at_a_time(sqlite_file(url)), contextlib.suppress(KeyError):
        if unless_in_use and _in_use(optuna.load_study(study_name=name, storage=url), None):
            return
        optuna.delete_study(study_name=name, storage=url)


def study_name_of(key: TuningKey) -> str:
    """The Optuna study of a key: every worker tuning that key on that device kind joins it."""
    name = "/".join(
        (
            f"{key.kernel}@{key.kernel_version}",
            key.platform,
            key.device_kind,
            key.backend,
            key.signature,
            key.static,
        )
    )
    if len(name) <= 500:  # Optuna's limit is 512 characters
        return name
    return f"{key.kernel}@{key.kernel_version}/" + hashlib.sha256(name.encode()).hexdigest()
