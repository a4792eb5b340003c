"""One tuning task end to end: inputs -> oracle -> search (measure + verify) -> database."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune import registry
from autotune.errors import DatabaseError, KernelError, SignatureError, SpaceError
from autotune.finalists import Finalist, remeasure
from autotune.oracle import make_oracle
from autotune.search import LISTED_UP_TO, run_search
from autotune.signature import TuningKey, is_array
from autotune.studies import SharedStudy, study_name_of
from autotune.task import Task, task_of_call
from autotune.trial import BestEntry, Config, Evaluation, TrialRecord, config_text
from autotune.tune_settings import TuneSettings
from autotune.warmstart import warm_starts
from autotune.worker import DeviceWorker, InProcessWorker, Worker

log = logging.getLogger(__name__)

# A worker of a shared study re-measures its finalists beside each winner another worker
# stored meanwhile; past this many rounds (workers finishing in a stream) it keeps theirs.
MAX_ROUNDS = 3


@dataclass
class TuneResult:
    kernel: str
    key: TuningKey
    best_config: dict[str, Any]
    best_time_s: float
    default_config: dict[str, Any]
    default_time_s: float | None
    trials: list[TrialRecord] = field(default_factory=list)
    run_id: str = ""
    db_url: str | None = None
    finalists: list[Finalist] = field(default_factory=list)  # the winner first
    wall_s: float = 0.0  # the whole tuning run, set-up and storing included
    restarts: int = 0  # device workers started again after a crash or timeout
    finalists_s: float = 0.0  # the interleaved re-measurement, its compiles included
    oracle_s: float = 0.0  # compiling and running the default in interpret mode, checking it
    oracle: str = ""  # which oracle judged the candidates: "interpret" or "reference"
    worker_start_s: float = 0.0  # starting the first device worker (0 in process)
    resumed: int = 0  # trials measured by earlier runs of the study before this one began

    @property
    def speedup(self) -> float | None:
        return self.default_time_s / self.best_time_s if self.default_time_s else None

    @property
    def why_default_kept(self) -> str | None:
        """Why the default won although a candidate measured faster at first (None if none
        did): the side-by-side re-measurement found the difference within the noise."""
        if self.best_config != self.default_config:
            return None
        default = next((f for f in self.finalists if f.config == self.default_config), None)
        faster = [f for f in self.finalists if default and f.first_s < default.first_s]
        if not faster:
            return None
        f = min(faster, key=lambda f: f.first_s)
        return (
            f"{config_text(f.config)} measured faster at first ({f.first_s * 1e3:.4f} ms against the default's "
            f"{default.first_s * 1e3:.4f} ms), but side by side with the default "
            f"({f.time_s * 1e3:.4f} ms against {default.time_s * 1e3:.4f} ms) not beyond the "
            "noise, so the default was kept"
        )

    @property
    def first_pass(self) -> bool:
        """Whether the finalists' side-by-side re-measurement failed (a worker crashed or was
        killed), so that the winner was chosen on first-pass figures."""
        return len(self.finalists) > 1 and all(f.timing is None for f in self.finalists)

    @property
    def n_rejected(self) -> int:
        return sum(t.status == "rejected" for t in self.trials)

    @property
    def n_crashed(self) -> int:
        return sum(t.status in ("crashed", "timeout") for t in self.trials)


def random_inputs(args: Sequence[Any], seed: int = 0) -> list[Any]:
    """Concrete arrays for a call: arrays pass through, ShapeDtypeStructs become random data."""
    import jax
    import jax.numpy as jnp

    # NumPy draws them: jax.random would compile a sampler per shape, harness time per task
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if isinstance(a, jax.ShapeDtypeStruct):
            dt = jnp.dtype(a.dtype)
            if jnp.issubdtype(dt, jnp.floating):
                a = jnp.asarray(rng.standard_normal(a.shape, np.float32), dt)
            elif jnp.issubdtype(dt, jnp.integer):
                a = jnp.asarray(rng.integers(-8, 8, a.shape), dt)
            elif dt == jnp.bool_:
                a = jnp.asarray(rng.random(a.shape) < 0.5)
            else:
                raise SignatureError(
                    f"cannot make random inputs of dtype {dt.name}: pass concrete arrays"
                )
        out.append(a)
    return out


def tune(
    fn: Any,
    args: Sequence[Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    settings: TuneSettings | None = None,
    db: Any = None,
    store: bool = True,
    progress: Callable[[TrialRecord, int, int], None] | None = None,
    worker: DeviceWorker | None = None,
    **overrides: Any,
) -> TuneResult:
    """Tune `fn` (an autotuned kernel, a registered name or 'pkg.module:fn') for these arguments
    (arrays or jax.ShapeDtypeStruct; static arguments in `kwargs`).

    Every candidate is compiled ahead of time, checked against the oracle (autotune.oracle) and
    timed; the best verified one is stored in `db` (a TuningDB, URL or path; default: the
    per-user database) with every trial, unless `store` is False. `progress` is called after
    each trial with it, its number and the budget.

    How it searches, measures and decides is `settings` (a TuneSettings; default: its
    defaults), with `overrides` given by field name: `tune(kernel, args, n_trials=8)`. A
    `worker` given (a DeviceWorker) is used and left running, so that many tuning tasks share
    one start-up; it implies isolation.
    """
    settings = (settings or TuneSettings()).replace(**overrides)
    if is_array(args):
        raise SignatureError(
            "tune() takes the kernel's arguments as a list: write tune(kernel, [x, ...]), "
            "not tune(kernel, x)"
        )
    kernel = _kernel(fn)
    task = task_of_call(fn, args, kwargs, settings)
    return _tune_task(kernel, task, args, settings, db, store, progress, worker)


def tune_task(
    task: Task,
    settings: TuneSettings | None = None,
    *,
    db: Any = None,
    store: bool = True,
    progress: Callable[[TrialRecord, int, int], None] | None = None,
    worker: DeviceWorker | None = None,
) -> TuneResult:
    """Tune a Task (autotune.task: from the command line, a job file, a recorded miss or a
    program's call) on random inputs of its shapes and dtypes, with `settings` and the task's
    own budget, strategy and seed; the rest as in `tune`."""
    settings = task.settings(settings or TuneSettings())
    kernel = _kernel(task.kernel)
    return _tune_task(kernel, task, task.inputs(), settings, db, store, progress, worker)


def _kernel(fn: Any) -> Any:
    kernel = registry.resolve(fn) if isinstance(fn, str) else fn
    if not isinstance(getattr(kernel, "spec", None), registry.KernelSpec):
        raise KernelError(f"{fn!r} is not an autotuned kernel: decorate it with @autotuned(...)")
    return kernel


def _tune_task(
    kernel: Any,
    task: Task,
    args: Sequence[Any],
    settings: TuneSettings,
    db: Any,
    store: bool,
    progress: Callable[[TrialRecord, int, int], None] | None,
    worker: DeviceWorker | None,
) -> TuneResult:
    if hasattr(kernel, "members"):  # a variant group: each member, then side by side
        from autotune.variant_tuning import tune_group

        return tune_group(kernel, task, args, settings, db, store, progress, worker)
    start = time.perf_counter()
    args = random_inputs(args, 0 if settings.seed is None else settings.seed)
    worker_start = time.perf_counter()
    isolated = settings.isolate or worker is not None  # a worker given implies isolation
    owned: Any = None
    restarts_before = worker.restarts if worker is not None else 0
    if worker is not None:
        worker.device = worker.set_task(task, args, settings.policy)
    elif settings.isolate:
        worker = owned = device_worker(task, args, settings)
    else:
        worker = owned = InProcessWorker(
            kernel.spec, task, args, settings.policy, settings.compile_workers
        )
    start_s = time.perf_counter() - worker_start if isolated else 0.0
    with owned or contextlib.nullcontext(), _studies_written(settings.storage):
        result = _tune(kernel.spec, worker, args, task.static_dict, settings, db, store, progress)
    result.worker_start_s = start_s
    result.restarts = worker.restarts - restarts_before
    result.wall_s = time.perf_counter() - start
    return result


def device_worker(task: Task, args: Sequence[Any], settings: TuneSettings) -> DeviceWorker:
    """A device worker process for `task`, with the settings' timing, limits and platforms."""
    return DeviceWorker(
        task,
        args,
        settings.policy,
        settings.limits,
        settings.worker_platforms,
        settings.compile_workers,
    )


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
    spec: registry.KernelSpec,
    worker: Worker,
    args: list[Any],
    kwargs: dict[str, Any],
    settings: TuneSettings,
    db: Any,
    store: bool,
    progress: Callable[[TrialRecord, int, int], None] | None,
) -> TuneResult:
    device = worker.device
    n_trials, storage = settings.n_trials, settings.storage
    sig = spec.signature(args, kwargs, device)
    key = spec.key(sig, device)
    space = spec.space(device.platform)
    valid = _valid_configs(spec, sig, space)
    default = spec.default_config(sig)
    oracle_start = time.perf_counter()
    oracle = make_oracle(spec, default, args, kwargs, sig.backend or None)
    oracle_s = time.perf_counter() - oracle_start
    worker.set_oracle(oracle.output)
    run_id = uuid.uuid4().hex
    handle = open_db(db) if store else None

    def measure(config: Config, is_default: bool = False) -> TrialRecord:
        record = worker.measure(config)
        record.is_default = is_default or config == default
        record.oracle = oracle.name
        if handle is not None:  # stored at once: an interrupted run loses no measurement
            try:
                (record.db_id,) = handle.add_trials(key, run_id, [record])
            except DatabaseError as e:
                raise DatabaseError(
                    f"{e} ({spec.name} {sig.text}: this run's trials and best entry are not saved)"
                ) from e
        return record

    study = (settings.study_name or study_name_of(key)) if storage else None
    # trials an interrupted run (or another worker) measured: they count against the budget
    resumed = SharedStudy(storage, study, None).n_measured() if storage else 0
    measured = resumed

    def evaluate(config: Config) -> Evaluation:
        nonlocal measured
        record = measure(config)
        measured += 1
        value = record.time_s if record.status == "ok" else None
        evaluation = Evaluation(config, value, record.status, record)
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

        def winner(rival: dict[str, Any] | None) -> TuneResult:
            return _result(
                spec, sig, key, trials, default, measure, run_id, worker, settings.finalists, rival
            )

        result = _decide_and_store(winner, key, trials, handle, settings, device)
        result.oracle_s, result.oracle, result.resumed = oracle_s, oracle.name, resumed
        if handle is not None:
            result.db_url = handle.url
            registry.entry_stored()
    finally:
        if handle is not None and handle is not db:
            handle.close()
    return result


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


def _decide_and_store(
    winner: Callable[[dict[str, Any] | None], TuneResult],
    key: TuningKey,
    trials: list[TrialRecord],
    handle: Any,
    settings: TuneSettings,
    device: Any,
) -> TuneResult:
    """The winner (`winner(rival)`: the finalists re-measured, `rival` among them), stored
    unless `handle` is None. Another worker of the study may have stored its winner: it is
    re-measured beside ours, so the entry is decided from side-by-side figures, not from two
    machines' lucky samples; and so is one stored meanwhile, up to MAX_ROUNDS times."""
    shared = settings.storage is not None
    stored = handle.best(key) if handle is not None and shared else None
    rival = stored if stored and stored["trial_id"] in {t.db_id for t in trials} else None
    for _ in range(MAX_ROUNDS):
        result = winner(rival)
        if handle is None:
            return result
        rival = _store(handle, result, settings.strategy, device, shared, rival)
        if rival is None:
            return result
    log.warning(
        "%s %s: other workers of the study kept storing new winners; theirs was kept",
        key.kernel,
        key.signature,
    )
    return result


def open_db(db: Any) -> Any:
    from autotune.db import TuningDB

    return db if isinstance(db, TuningDB) else TuningDB(db)


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
    rival: dict[str, Any] | None = None,
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
        also = [rival["config"]] if rival else []
        ranked = remeasure(worker, ok, default, n_finalists, also)  # the default too, if ok
        best = next(t for t in ok if t.config == ranked[0].config)
        best_time_s = ranked[0].time_s
        default_time_s = next((f.time_s for f in ranked if f.config == default), default_time_s)
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


def best_entry(result: TuneResult, strategy: str, device: Any) -> BestEntry:
    """The entry a run stores for its key: its winner, measured on `device`."""
    best = next(t for t in result.trials if t.config == result.best_config and t.status == "ok")
    return BestEntry(
        config=result.best_config,
        time_s=result.best_time_s,
        default_time_s=result.default_time_s,
        speedup=result.speedup,
        n_trials=len(result.trials),
        n_rejected=result.n_rejected,
        trial_id=best.db_id,
        run_id=result.run_id,
        strategy=strategy,
        timer=best.timer or "wall",
        jax_version=device.jax_version,
        jaxlib_version=device.jaxlib_version,
        runtime_version=device.runtime_summary,
    )


def _store(
    handle: Any,
    result: TuneResult,
    strategy: str,
    device: Any,
    shared: bool,
    rival: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Store the best entry (its trials are stored as they are measured); `rival` is the entry
    another worker of the study had stored when the finalists were chosen. Returns the entry
    another worker stored since, which this one has not judged (nothing is stored then)."""
    entry = best_entry(result, strategy, device)
    if shared:  # workers of one study finish in any order
        ids = {t.db_id for t in result.trials}
        if result.finalists:  # judged side by side: the stored entry re-measured beside ours
            compared = {
                rival["trial_id"]
                for f in result.finalists
                if rival and f.config == rival["config"] and f.timing is not None
            }
        else:  # no re-measurement: the first figures of every trial of the study decided
            compared = ids
        newer = handle.put_best_among(result.key, entry, ids, compared)
        if newer is not None:
            return newer
    else:
        handle.put_best(result.key, entry)
    log.info("stored %s %s: %s", result.kernel, result.key.signature, result.best_config)
    return None
