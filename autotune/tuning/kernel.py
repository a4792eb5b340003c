"""Tuning one kernel for one task: oracle -> search (measure + verify) -> database.

The public entry (autotune.tuning.tune) comes here for a kernel, and a variant group's tuning
(autotune.tuning.group) for each of its members. The task comes bound to a device, with the
inputs it is measured on (autotune.tuning.task.BoundTask, made once by the entry); it is
measured on the device its worker owns (autotune.tuning.worker's `task_worker`), every trial
stored as it is measured, the finalists re-measured side by side, the winner stored
(autotune.tuning.storing). One search's shared state, and its parts, are a `_Run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autotune import registry
from autotune.db.schema import encode_config
from autotune.errors import DatabaseError, KernelError, SpaceError
from autotune.measure.compiling import MEMORY_FIELDS
from autotune.measure.finalists import Finalist, remeasure
from autotune.measure.oracle import make_oracle
from autotune.registry.spec import KernelSpec
from autotune.search.loop import LISTED_UP_TO, programs_note, run_search
from autotune.search.studies import SharedStudy, delete_study, study_name_of
from autotune.signature import TuningKey
from autotune.trial import Config, Evaluation, StoredEntry, TrialRecord, config_id
from autotune.tuning.context import TuneContext
from autotune.tuning.result import TuneResult
from autotune.tuning.storing import decide_and_store
from autotune.tuning.task import BoundTask, bind
from autotune.tuning.transfer import other_devices, transferred_leads
from autotune.tuning.warmstart import warm_starts
from autotune.tuning.worker import Worker, task_workers

log = logging.getLogger(__name__)


def tune_kernel(bound: BoundTask, context: TuneContext) -> TuneResult:
    """Tune `bound`'s kernel with the context's settings (its budget, strategy and seed
    included) on the inputs it is called with (BoundTask.measured); the rest as in
    autotune.tuning.tune.tune."""
    settings, worker = context.settings, context.worker
    start = time.perf_counter()
    restarts_before = worker.restarts if worker is not None else 0
    worker_start = time.perf_counter()
    # a worker given, or several devices, imply isolation
    isolated = settings.isolate or worker is not None or settings.devices != 1
    with (
        task_workers(bound.spec, bound.task, bound.args, settings, worker) as measurers,
        _studies_written(settings.storage),
    ):
        start_s = time.perf_counter() - worker_start if isolated else 0.0
        # bound to the device its workers measure on: again only where that is another one
        # (a caller whose own process keeps to another platform than its workers)
        on = bind(bound, measurers[0].device)
        result = _tune(on, measurers, context)
    result.worker_start_s = start_s
    result.restarts = sum(m.restarts for m in measurers) - restarts_before
    result.wall_s = time.perf_counter() - start
    return result


@contextlib.contextmanager
def _studies_written(storage: str | None) -> Any:
    """A studies storage that stops taking writes (a full disk) mid-run: one line. The tuning
    database's own failures are DatabaseErrors already; SQLAlchemy's here are Optuna's."""
    import optuna
    import sqlalchemy

    try:
        yield
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as e:
        if storage is None:
            raise
        cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) else e
        reason = str(getattr(cause, "orig", None) or cause or e).splitlines()[0]
        raise DatabaseError(
            f"the studies storage {storage} cannot be written ({reason}): free space there or "
            "give --storage another database; the trials measured so far are in the tuning "
            "database"
        ) from e


def _tune(bound: BoundTask, workers: Sequence[Worker], context: TuneContext) -> TuneResult:
    """`bound`'s candidates searched on `workers`, each checked against the oracle (its
    default's answer), and the winner decided and stored."""
    spec, sig = bound.spec, bound.signature
    valid = _valid_configs(spec, sig, bound.space)
    default = spec.default_config(sig)
    kwargs = bound.task.static_dict
    oracle_start = time.perf_counter()
    oracle = make_oracle(spec, default, bound.args, kwargs, sig.backend or None, bound.device)
    oracle_s = time.perf_counter() - oracle_start
    for w in workers:
        w.set_oracle(oracle.output)
    run = _Run(bound, workers, context, valid, default, oracle.name)
    try:
        # with a storage, these are every worker's trials of the study, resumed ones included
        trials = [ev.record for ev in run.search()]
        result = run.decide(trials)
    finally:
        run.leave()
    if context.forget and run.study is not None:  # unless another worker searches it
        delete_study(context.settings.storage, run.study, unless_in_use=True)
    result.oracle_s, result.oracle, result.resumed = oracle_s, oracle.name, run.resumed
    return result


class _Run:
    """One kernel's search, on one worker or side by side on several (one search each), and
    what its searches share: the configurations measured first, the budget and how much of it
    is spent, the programs measured, the study it joins and the database each trial is stored
    in as it is measured."""

    def __init__(
        self,
        bound: BoundTask,
        workers: Sequence[Worker],
        context: TuneContext,
        valid: list[Config] | None,
        default: Config,
        oracle: str,
    ) -> None:
        settings, db = context.settings, context.db
        key, sig, space, storage = bound.key, bound.signature, bound.space, settings.storage
        self.bound, self.workers, self.settings = bound, workers, settings
        self.progress = context.progress
        self.valid, self.default, self.oracle = valid, default, oracle
        self.run_id = uuid.uuid4().hex
        self.handle = db if context.store else None  # opened by the tuner's entry
        self.warm = warm_starts(db, key, sig, space) if settings.warm_start else []
        # what other device kinds measured of this kernel: their best configurations measured
        # after the default and the warm starts, their times the search's prior
        tuned = bound.spec.tuned
        self.others = other_devices(db, key, sig, space, tuned) if settings.transfer else []
        self.leads = transferred_leads(self.others, space, sig, [default, *self.warm])
        self._join_study(storage, context.fresh)
        n_trials = settings.n_trials
        self.budget = n_trials if valid is None else min(n_trials, len(valid))
        self.started = self.n_measured = self.resumed  # trials begun, and measured, these included
        self.counting = threading.Lock()  # the devices' searches count and report in turn
        # an interrupt: the devices' searches end before their next trial
        self.stop = threading.Event()
        # the programs measured in the study, by fingerprint: a config that compiles to one of
        # them is stored as its duplicate, not measured (this process's devices' and, in a
        # shared study, every worker's)
        self.programs: dict[str, TrialRecord] = {}

    def _join_study(self, storage: str | None, fresh: bool) -> None:
        """The run's study, in `storage` (none without one): deleted first where `fresh`
        (nothing of an earlier run's search is resumed), then joined. The trials earlier runs
        (or other workers) measured in it count against the budget (`resumed`), those they
        stored but never told it are asked first (`untold`), and this run is named in it
        (`view`) before its first trial is stored (see _stored_untold)."""
        self.study: str | None = None
        self.joined: SharedStudy | None = None
        self.view: SharedStudy | None = None
        self.resumed = 0
        self.untold: list[Config] = []
        if storage is None:
            return
        key, handle = self.bound.key, self.handle
        self.study = self.settings.study_name or study_name_of(key)
        if fresh:
            delete_study(storage, self.study)
        self.resumed, self.joined = _resumed(storage, self.study, handle, key)
        self.view = self.joined or SharedStudy(storage, self.study, None)
        if handle is not None:
            if self.joined is not None:
                self.untold = _untold(handle, key, self.joined)
            self.view.add_run(self.run_id)

    def search(self) -> list[Evaluation]:
        """Every trial's evaluation: the one worker's search, or one per worker sharing the
        study (_search_on_devices)."""
        storage = self.settings.storage
        if len(self.workers) == 1:
            return self.search_on(self.workers[0], storage)
        return _search_on_devices(self.search_on, self.workers, storage, self.stop)

    def search_on(self, on: Worker, storage: str | None) -> list[Evaluation]:
        """One search, measuring on `on`, in the study of `storage`."""
        settings, key = self.settings, self.bound.key
        return run_search(
            self.bound.space,
            self.bound.signature,
            self.evaluate_on(on),
            n_trials=settings.n_trials,
            strategy=settings.strategy,
            seed=settings.seed,
            # the untold: told from their rows at once
            initial=[
                self.default,
                *self.untold,
                *self.warm,
                *(c for c, _ in self.leads.values()),
            ],
            valid=self.valid,
            time_limit_s=settings.time_limit_s,
            patience=settings.patience,
            storage=storage,
            study_name=self.study or study_name_of(key),
            upcoming=on.prefetch,
            others=self.others,
        )

    def evaluate_on(self, on: Worker) -> Callable[[Config], Evaluation]:
        """The search's objective on `on`: a config measured there, counted against the
        budget (a duplicate is not), and told to `progress`."""

        def evaluate(config: Config) -> Evaluation:
            with self.counting:
                # the devices of this process never overrun the budget: a claim made beside
                # the budget's last one is given back, and that device's search ends
                if self.stop.is_set() or (len(self.workers) > 1 and self.started >= self.budget):
                    raise _LaneEnds
                self.started += 1
            record = self.measure(config, on=on)
            with self.counting:
                if record.status == "duplicate":  # not measured: its program's figure
                    self.started -= 1
                    of = self.programs.get(record.fingerprint)  # None: an untold one's, lost
                    evaluation = Evaluation(record, _value(of) if of else None)
                else:
                    self.n_measured += 1
                    evaluation = Evaluation(record, _value(record))
                if self.progress:
                    try:
                        self.progress(record, self.n_measured, self.budget)
                    except BaseException as e:  # an interrupt: the search counts what was stored
                        e.evaluation = evaluation  # type: ignore[attr-defined]
                        raise
            return evaluation

        return evaluate

    def measure(
        self, config: Config, is_default: bool = False, on: Worker | None = None
    ) -> TrialRecord:
        """`config` measured on `on` (default: the first worker), or, where a run of the study
        stored it and never told the study, its stored trial; stored at once."""
        on = self.workers[0] if on is None else on
        handle, key, view = self.handle, self.bound.key, self.view
        with self.counting:
            if view is not None:
                for fp, first in view.programs().items():
                    self.programs.setdefault(fp, first)
            known = dict(self.programs)
        stored = None
        if view is not None and handle is not None:
            stored = _stored_untold(handle, key, view, config)
        if stored is not None:  # measured and stored already: the study hears of it now
            record = stored
        else:
            record = on.measure(config, known.keys(), self.settings.max_memory)
            record.device = on.device_id
            record.workload = self.bound.workload
            record.is_default = is_default or config == self.default
            lead = self.leads.get(config_id(config))
            if lead is not None:
                record.transferred_from = ", ".join(lead[1])
            if record.status == "duplicate":  # the program's trial, and its memory figures
                of = known[record.fingerprint]
                record.duplicate_of = of.db_id
                for column in MEMORY_FIELDS:
                    setattr(record, column, getattr(of, column))
            else:
                record.oracle = self.oracle
        if handle is not None and stored is None:  # at once: an interrupted run loses none
            try:
                (record.db_id,) = handle.add_trials(key, self.run_id, [record])
            except DatabaseError as e:
                spec, sig = self.bound.spec, self.bound.signature
                raise DatabaseError(
                    f"{e} ({spec.name} {sig.text}: this run's trials and best entry are not saved)"
                ) from e
        if record.fingerprint and record.status != "duplicate":
            with self.counting:
                self.programs.setdefault(record.fingerprint, record)
        return record

    def decide(self, trials: list[TrialRecord]) -> TuneResult:
        """The winner among `trials`, after the finalists' re-measurement on the first worker,
        stored where the run stores (beside what other workers of a shared study stored)."""
        settings, bound, worker = self.settings, self.bound, self.workers[0]

        def winner(rival: StoredEntry | None) -> TuneResult:
            return _result(
                bound.spec,
                bound.signature,
                bound.key,
                trials,
                self.default,
                self.measure,
                self.run_id,
                worker,
                settings.finalists,
                rival,
            )

        shared = settings.storage is not None
        result = decide_and_store(
            winner, bound.key, trials, self.handle, settings.strategy, worker.device, shared
        )
        n_valid = None if self.valid is None else len(self.valid)
        statuses = [t.status for t in trials]
        result.programs_note = programs_note(statuses, n_valid, settings.n_trials)
        if self.handle is not None:
            result.db_url = self.handle.url
            registry.entry_stored()
        return result

    def leave(self) -> None:
        """The study joined, left (its claims released for other workers)."""
        if self.joined is not None:
            self.joined.leave()


class _LaneEnds(Exception):
    """A device's search ends before measuring its claim: the budget is spent by the others,
    or the run is interrupted (see evaluate_on)."""


def _search_on_devices(
    search: Callable[[Worker, str | None], list[Evaluation]],
    workers: Sequence[Worker],
    storage: str | None,
    stop: threading.Event,
) -> list[Evaluation]:
    """One search per worker, each in a thread, sharing the budget through one study (in
    `storage`, else in a studies file of this run's own); every worker's trials."""
    with contextlib.ExitStack() as stack:
        if storage is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="autotune-studies-"))
            storage = str(Path(folder) / "studies.db")

        def lane(on: Worker) -> list[Evaluation] | None:
            try:
                return search(on, storage)
            except _LaneEnds:
                return None  # the others' searches hold every trial

        pool = stack.enter_context(ThreadPoolExecutor(len(workers)))
        lanes = [pool.submit(lane, w) for w in workers]
        try:
            results = [f.result() for f in lanes]
        except BaseException:
            stop.set()  # the others end after the trial they measure
            raise
        return next(r for r in results if r is not None)


def _resumed(
    storage: str, study: str, handle: Any, key: TuningKey
) -> tuple[int, SharedStudy | None]:
    """How many trials of `study` earlier runs (or other workers) measured, and the study,
    joined (this run leaves it when it ends) unless it was deleted. A study whose trials the
    tuning database does not hold (it was deleted, or another file moved over it, since they
    were stored) is not resumed: it is deleted, and the run tunes afresh, rather than count
    trials and name a best trial that are not there."""
    shared = SharedStudy(storage, study, None)
    shared.join()  # counted once joined: a study that is joined is deleted by no other worker
    records = shared.records()
    # what counts against the budget: distinct programs measured (a duplicate is not measured)
    n_measured = sum(r is None or r.status != "duplicate" for r in records)
    if handle is None or not records:  # a run that stores nothing has nothing to agree with
        return n_measured, shared
    held = {t.db_id: config_id(t.config) for t in handle.trials(**key.as_dict())}
    if all(r is not None and held.get(r.db_id) == config_id(r.config) for r in records):
        return n_measured, shared
    lacking = f"the tuning database {handle.url} lacks trials of the study {study!r}"
    shared.leave()
    if shared.in_use():
        raise DatabaseError(
            f"{lacking}, which another worker is searching: give this run the database that "
            "worker stores in, or another --storage"
        )
    log.warning("%s (replaced since they were stored): tuning afresh", lacking)
    delete_study(storage, study, unless_in_use=True)
    return 0, None


def _stored_untold(
    handle: Any, key: TuningKey, study: SharedStudy, config: Config
) -> TrialRecord | None:
    """The trial of `config` that a run of `study` stored in the tuning database and never
    told the study of (it was killed between the two, or its telling failed), or None. The
    study released that run's claim on it, and its search hands it out again: it is measured
    already, and is not to be measured, nor stored, twice."""
    stored = handle.trials(**key.as_dict(), config=encode_config(config))
    if not stored:  # the common case: one query, nothing more
        return None
    told = {r.db_id for r in study.records() if r is not None}
    runs = study.runs()
    for t in stored:
        if t.run_id in runs and t.db_id not in told:
            return TrialRecord(
                **{f.name: getattr(t, f.name) for f in dataclasses.fields(TrialRecord)}
            )
    return None


def _untold(handle: Any, key: TuningKey, study: SharedStudy) -> list[Config]:
    """The configurations of trials that runs of `study` stored in the tuning database and
    never told it of, to be asked for first (and then told from their rows: _stored_untold).
    A run interrupted between storing a trial and telling the study tells it the trial was not
    measured (its claim released, nothing queued again: the run lives on), and a run killed
    then may leave no claim behind; unless the search happened to propose the configuration
    again, its row was neither counted nor reused, and the rerun measured a whole budget's
    worth besides it."""
    runs = study.runs()
    if not runs:
        return []
    told = {r.db_id for r in study.records() if r is not None}
    stored = handle.trials(**key.as_dict())
    return [t.config for t in stored if t.run_id in runs and t.db_id not in told]


def _value(record: TrialRecord) -> float | None:
    """A measured trial's objective: its median time, None where it failed."""
    return record.time_s if record.status == "ok" else None


def _valid_configs(spec: KernelSpec, sig: Any, space: Any) -> list[Config] | None:
    """The valid configurations of `space` for `sig`; None for a space too large to list,
    which the search draws from instead (search.LISTED_UP_TO)."""
    valid = space.valid_configs(sig) if space.size <= LISTED_UP_TO else None
    if valid == []:
        raise SpaceError(
            f"no configuration of {spec.name}'s {sig.platform} space ({space.size} candidates) "
            f"fits {sig.text}: widen the space (space= of @autotuned, or its search_spaces file) "
            "or check its constraints"
        )
    return valid


def _result(
    spec: Any,
    sig: Any,
    key: TuningKey,
    trials: list[TrialRecord],
    default: dict[str, Any],
    measure: Callable[..., TrialRecord],
    run_id: str,
    worker: Any,
    n_finalists: int,
    rival: StoredEntry | None = None,
) -> TuneResult:
    """The winner among `trials`, after the finalists' interleaved re-measurement (`rival`,
    another worker's stored entry, among them)."""
    if not trials:  # the budget has at least one trial and one valid config: time ran out
        raise KernelError(
            f"the time limit ran out before any candidate of {spec.name} for {sig.text} was "
            "measured: give more time (--time-limit / time_limit_s)"
        )
    default_trial = next((t for t in trials if t.is_default), None)
    if default_trial is None:
        # the default lies outside the space, or a worker measuring it was killed: measure it
        # as the baseline; it takes part in the finalists like any measured candidate
        default_trial = measure(default, is_default=True)
        trials = [*trials, default_trial]
    if default_trial.status == "duplicate":
        # the trial that measured the default's program stands for it, the finalists included
        default_trial = next(
            t
            for t in trials
            if t.fingerprint == default_trial.fingerprint and t.status != "duplicate"
        )
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        raise KernelError(
            f"no candidate of {spec.name} for {sig.text} ran and matched the oracle "
            f"({', '.join(sorted({t.status for t in trials}))}): see `autotune db trials --kernel {spec.name}`"
        )
    best = min(ok, key=lambda t: (t.time_s, trials.index(t)))
    best_time_s = best.time_s
    default_time_s = default_trial.time_s if default_trial.status == "ok" else None
    ranked: list[Finalist] = []
    finalists_start = time.perf_counter()
    if n_finalists > 0:
        also = [default_trial.config, *([rival.config] if rival else [])]
        ranked = remeasure(worker, ok, default, n_finalists, also)  # the default too, if ok
        best = next(t for t in ok if t.config == ranked[0].config)
        best_time_s = ranked[0].time_s
        default_time_s = next(
            (f.time_s for f in ranked if f.config == default_trial.config), default_time_s
        )
    result = TuneResult(
        kernel=spec.name,
        key=key,
        best_config=best.config,
        best_time_s=best_time_s,
        default_config=default,
        default_time_s=default_time_s,
        trials=trials,
        run_id=run_id,
        finalists=ranked,
        finalists_s=time.perf_counter() - finalists_start,
    )
    return result
