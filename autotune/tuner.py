"""One tuning task end to end: inputs -> oracle -> search (measure + verify) -> database."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune import registry, runtime
from autotune.device import current_device
from autotune.errors import KernelError, SignatureError, SpaceError
from autotune.measure import DEFAULT_POLICY, TimingPolicy, compile_ahead, time_compiled
from autotune.search import Evaluation, run_search
from autotune.signature import TuningKey, is_array
from autotune.verify import compare
from autotune.warmstart import warm_starts

log = logging.getLogger(__name__)


@dataclass
class TrialRecord:
    """One measured candidate, as stored in the database's trials table."""

    config: dict[str, Any]
    status: str  # ok | rejected | compile_error | runtime_error
    time_s: float | None = None
    time_min_s: float | None = None
    time_p10_s: float | None = None
    time_p90_s: float | None = None
    n_reps: int | None = None
    timer: str | None = None
    compile_s: float | None = None
    max_error: float | None = None
    error: str | None = None
    is_default: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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

    @property
    def speedup(self) -> float | None:
        return self.default_time_s / self.best_time_s if self.default_time_s else None

    @property
    def n_rejected(self) -> int:
        return sum(t.status == "rejected" for t in self.trials)


def random_inputs(args: Sequence[Any], seed: int = 0) -> list[Any]:
    """Concrete arrays for a call: arrays pass through, ShapeDtypeStructs become random data."""
    import jax
    import jax.numpy as jnp

    key = jax.random.key(seed)
    out = []
    for a in args:
        if not is_array(a):
            raise SignatureError(
                f"tune() takes arrays (or jax.ShapeDtypeStruct) as args, got {type(a).__name__}: pass static arguments in kwargs="
            )
        if isinstance(a, jax.ShapeDtypeStruct):
            key, sub = jax.random.split(key)
            dt = jnp.dtype(a.dtype)
            if jnp.issubdtype(dt, jnp.floating):
                a = jax.random.normal(sub, a.shape, jnp.float32).astype(dt)
            elif jnp.issubdtype(dt, jnp.integer):
                a = jax.random.randint(sub, a.shape, -8, 8).astype(dt)
            elif dt == jnp.bool_:
                a = jax.random.bernoulli(sub, 0.5, a.shape)
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
    n_trials: int = 32,
    db: Any = None,
    strategy: str = "tpe",
    seed: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
    store: bool = True,
    policy: TimingPolicy = DEFAULT_POLICY,
    progress: Callable[[TrialRecord, int, int], None] | None = None,
    time_limit_s: float | None = None,
    patience: int | None = None,
    warm_start: bool = True,
) -> TuneResult:
    """Tune `fn` (an autotuned kernel, a registered name or 'pkg.module:fn') for these arguments.

    Every candidate is compiled ahead of time, checked against the interpret-mode oracle
    (the kernel at its default configuration) and timed; the best verified one is stored in
    `db` (a TuningDB, URL or path; default: the per-user database) with every trial.
    Search stops at `n_trials`, after `time_limit_s` seconds, or after `patience` trials
    without improvement. With `warm_start`, the default and the best configs stored for this
    kernel and device at the nearest shapes are measured first.
    """
    kernel = registry.resolve(fn) if isinstance(fn, str) else fn
    if not isinstance(getattr(kernel, "spec", None), registry.KernelSpec):
        raise KernelError(f"{fn!r} is not an autotuned kernel: decorate it with @autotuned(...)")
    spec = kernel.spec
    kwargs = dict(kwargs or {})
    device = current_device()
    args = random_inputs(args, 0 if seed is None else seed)
    sig = spec.signature(args, kwargs, device)
    key = spec.key(sig, device)
    space = spec.space(device.platform)
    valid = space.valid_configs(sig)
    if not valid:
        raise SpaceError(
            f"no configuration of {spec.name}'s {device.platform} space ({space.size} candidates) "
            f"fits {sig.text}: widen search_spaces/{spec.name}.toml or check its constraints"
        )
    default = spec.default_config(sig)
    oracle = _oracle(kernel, default, args, kwargs)
    run_id = uuid.uuid4().hex

    def measure(config: dict[str, Any], is_default: bool = False) -> TrialRecord:
        record = _measure(kernel, config, args, kwargs, oracle, policy)
        record.is_default = is_default or config == default
        return record

    trials: list[TrialRecord] = []

    def evaluate(config: dict[str, Any]) -> Evaluation:
        record = measure(config)
        trials.append(record)
        if progress:
            progress(record, len(trials), min(n_trials, len(valid)))
        return Evaluation(config, record.time_s if record.status == "ok" else None, record.status)

    warm = warm_starts(db, key, sig, space, valid) if warm_start else []
    run_search(
        space,
        sig,
        evaluate,
        n_trials=n_trials,
        strategy=strategy,
        seed=seed,
        initial=[default, *warm],
        valid=valid,
        time_limit_s=time_limit_s,
        patience=patience,
    )

    default_trial = next((t for t in trials if t.is_default), None)
    if default_trial is None:  # the default lies outside the space: measure it as the baseline
        default_trial = measure(default, is_default=True)
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        raise KernelError(
            f"no candidate of {spec.name} for {sig.text} ran and matched the oracle "
            f"({', '.join(sorted({t.status for t in trials}))}): see `autotune db trials --kernel {spec.name}`"
        )
    best = min(ok, key=lambda t: (t.time_s, trials.index(t)))
    result = TuneResult(
        kernel=spec.name,
        key=key,
        best_config=best.config,
        best_time_s=best.time_s,
        default_config=default,
        default_time_s=default_trial.time_s if default_trial.status == "ok" else None,
        trials=trials,
        run_id=run_id,
    )
    if store:
        result.db_url = _store(db, result, default_trial, strategy, seed, device)
        runtime.clear_memo()
    return result


def _oracle(kernel: Any, default: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The kernel's output in interpret mode at its default configuration; checked against the
    kernel's plain-JAX reference when it has one."""
    import jax

    spec = kernel.spec
    fn = functools.partial(runtime.interpreted(spec, spec.kernel_kwargs(default)), **kwargs)
    try:
        oracle = jax.block_until_ready(jax.jit(fn)(*args))
    except Exception as e:
        raise KernelError(
            f"{spec.name} fails in interpret mode at its default configuration {default}: {e}"
        ) from e
    if spec.reference is not None:
        expected = jax.tree_util.tree_map(
            lambda r, o: np.asarray(r).astype(o.dtype), spec.reference(*args, **kwargs), oracle
        )
        verdict = compare(oracle, expected)
        if not verdict.ok:
            raise KernelError(
                f"{spec.name} at its default configuration disagrees with its reference: {verdict.message}"
            )
    return oracle


def _measure(
    kernel: Any, config: dict, args: list, kwargs: dict, oracle: Any, policy: TimingPolicy
) -> TrialRecord:
    """Compile, run once and verify, then time one candidate; failures become the record's status."""
    import jax

    fn = functools.partial(kernel.bound_function(config, interpret=True), **kwargs)
    try:
        compiled, compile_s = compile_ahead(fn, args)
    except Exception as e:
        return TrialRecord(config, "compile_error", error=_one_line(e))
    try:
        output = jax.block_until_ready(compiled(*args))
    except Exception as e:
        return TrialRecord(config, "runtime_error", compile_s=compile_s, error=_one_line(e))
    verdict = compare(output, oracle)
    if not verdict.ok:
        return TrialRecord(
            config,
            "rejected",
            compile_s=compile_s,
            max_error=verdict.max_error,
            error=verdict.message,
        )
    timing = time_compiled(compiled, args, policy)
    return TrialRecord(
        config, "ok", compile_s=compile_s, max_error=verdict.max_error, **timing.as_trial_fields()
    )


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _store(
    db: Any,
    result: TuneResult,
    default_trial: TrialRecord,
    strategy: str,
    seed: int | None,
    device: Any,
) -> str:
    from autotune.db import TuningDB

    handle = db if isinstance(db, TuningDB) else TuningDB(db)
    try:
        records = [t.as_dict() for t in result.trials]
        if default_trial not in result.trials:
            records.append(default_trial.as_dict())
        ids = handle.add_trials(result.key, result.run_id, records)
        best_index = next(i for i, t in enumerate(result.trials) if t.config == result.best_config)
        best = result.trials[best_index]
        handle.put_best(
            result.key,
            {
                "config": result.best_config,
                "time_s": result.best_time_s,
                "default_time_s": result.default_time_s,
                "speedup": result.speedup,
                "n_trials": len(result.trials),
                "n_rejected": result.n_rejected,
                "trial_id": ids[best_index],
                "run_id": result.run_id,
                "strategy": strategy,
                "timer": best.timer or "wall",
                "jax_version": device.jax_version,
                "jaxlib_version": device.jaxlib_version,
                "runtime_version": device.runtime_version,
            },
        )
        log.info("stored %s %s: %s", result.kernel, result.key.signature, result.best_config)
        return handle.url
    finally:
        if handle is not db:
            handle.close()
