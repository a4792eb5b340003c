"""Tuning one kernel for one task: inputs -> oracle -> search (measure + verify) -> database.

The public entry (autotune.tuning) comes here for a kernel, and a variant group's tuning
(autotune.variant_tuning) for each of its members. The task comes bound to a device
(autotune.task.BoundTask); it is measured on the device its worker owns (autotune.worker's
`task_worker`), every trial stored as it is measured, the finalists re-measured side by side,
the winner stored (autotune.storing).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

from autotune import registry
from autotune.errors import DatabaseError, KernelError, SpaceError
from autotune.finalists import Finalist, remeasure
from autotune.inputs import random_inputs
from autotune.oracle import make_oracle
from autotune.search import LISTED_UP_TO, programs_note, run_search
from autotune.signature import TuningKey
from autotune.storing import decide_and_store, open_db
from autotune.studies import SharedStudy, study_name_of
from autotune.task import BoundTask
from autotune.trial import Config, Evaluation, StoredEntry, TrialRecord
from autotune.tune_result import TuneResult
from autotune.tune_settings import TuneSettings
from autotune.warmstart import warm_starts
from autotune.worker import DeviceWorker, Worker, task_worker


def tune_kernel(
    bound: BoundTask,
    settings: TuneSettings,
    *,
    db: Any = None,
    store: bool = True,
    progress: Callable[[TrialRecord, int, int], None] | None = None,
    worker: DeviceWorker | None = None,
) -> TuneResult:
    """Tune `bound`'s kernel with `settings` (its budget, strategy and seed included) on random
    inputs of its arguments; the rest as in autotune.tuning.tune."""
    start = time.perf_counter()
    args = random_inputs(bound.args, 0 if settings.seed is None else settings.seed)
    restarts_before = worker.restarts if worker is not None else 0
    worker_start = time.perf_counter()
    isolated = settings.isolate or worker is not None  # a worker given implies isolation
    with (
        task_worker(bound.spec, bound.task, args, settings, worker) as measurer,
        _studies_written(settings.storage),
    ):
        start_s = time.perf_counter() - worker_start if isolated else 0.0
        # the device its worker measures on (a job bound the task to it already)
        result = _tune(bound.on(measurer.device), measurer, args, settings, db, store, progress)
    result.worker_start_s = start_s
    result.restarts = measurer.restarts - restarts_before
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


def _tune(
    bound: BoundTask,
    worker: Worker,
    args: list[Any],
    settings: TuneSettings,
    db: Any,
    store: bool,
    progress: Callable[[TrialRecord, int, int], None] | None,
) -> TuneResult:
    spec, sig, key, space = bound.spec, bound.signature, bound.key, bound.space
    kwargs = bound.task.static_dict
    n_trials, storage = settings.n_trials, settings.storage
    valid = _valid_configs(spec, sig, space)
    default = spec.default_config(sig)
    oracle_start = time.perf_counter()
    oracle = make_oracle(spec, default, args, kwargs, sig.backend or None)
    oracle_s = time.perf_counter() - oracle_start
    worker.set_oracle(oracle.output)
    run_id = uuid.uuid4().hex
    handle = open_db(db) if store else None

    study = (settings.study_name or study_name_of(key)) if storage else None
    view = SharedStudy(storage, study, None) if storage else None
    # the programs measured in the study, by fingerprint: a config that compiles to one of them
    # is stored as its duplicate, not measured (a shared study's: every worker's)
    programs: dict[str, TrialRecord] = {}

    def measure(config: Config, is_default: bool = False) -> TrialRecord:
        if view is not None:
            for fp, first in view.programs().items():
                programs.setdefault(fp, first)
        record = worker.measure(config, programs.keys())
        record.is_default = is_default or config == default
        if record.status == "duplicate":
            record.duplicate_of = programs[record.fingerprint].db_id
        else:
            record.oracle = oracle.name
        if handle is not None:  # stored at once: an interrupted run loses no measurement
            try:
                (record.db_id,) = handle.add_trials(key, run_id, [record])
            except DatabaseError as e:
                raise DatabaseError(
                    f"{e} ({spec.name} {sig.text}: this run's trials and best entry are not saved)"
                ) from e
        if record.fingerprint and record.status != "duplicate":
            programs.setdefault(record.fingerprint, record)
        return record

    # trials an interrupted run (or another worker) measured: they count against the budget
    resumed = view.n_measured() if view is not None else 0
    measured = resumed

    def evaluate(config: Config) -> Evaluation:
        nonlocal measured
        record = measure(config)
        if record.status == "duplicate":  # its program's figures, for the search's model
            evaluation = Evaluation(record, _value(programs[record.fingerprint]))
        else:
            measured += 1
            evaluation = Evaluation(record, _value(record))
        if progress:
            try:
                progress(record, measured, n_trials if valid is None else min(n_trials, len(valid)))
            except BaseException as e:  # an interrupt: the search still counts what was stored
                e.evaluation = evaluation  # type: ignore[attr-defined]
                raise
        return evaluation

    warm = warm_starts(handle or db, key, sig, space) if settings.warm_start else []
    try:
        evaluations = run_search(
            space,
            sig,
            evaluate,
            n_trials=n_trials,
            strategy=settings.strategy,
            seed=settings.seed,
            initial=[default, *warm],
            valid=valid,
            time_limit_s=settings.time_limit_s,
            patience=settings.patience,
            storage=storage,
            study_name=study,
            upcoming=worker.prefetch,
        )
        # with a storage, these are every worker's trials of the study, resumed ones included
        trials = [ev.record for ev in evaluations]

        def winner(rival: StoredEntry | None) -> TuneResult:
            return _result(
                spec, sig, key, trials, default, measure, run_id, worker, settings.finalists, rival
            )

        shared = storage is not None
        result = decide_and_store(
            winner, key, trials, handle, settings.strategy, worker.device, shared
        )
        result.oracle_s, result.oracle, result.resumed = oracle_s, oracle.name, resumed
        n_valid = None if valid is None else len(valid)
        result.programs_note = programs_note([t.status for t in trials], n_valid, n_trials)
        if handle is not None:
            result.db_url = handle.url
            registry.entry_stored()
    finally:
        if handle is not None and handle is not db:
            handle.close()
    return result


def _value(record: TrialRecord) -> float | None:
    """A measured trial's objective: its median time, None where it failed."""
    return record.time_s if record.status == "ok" else None


def _valid_configs(spec: registry.KernelSpec, sig: Any, space: Any) -> list[Config] | None:
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
