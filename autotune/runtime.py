"""@autotuned: call -> key -> lookup (memo, database, fallback) -> compiled kernel call.

The lookup runs once per distinct call signature in a process (at trace time under jax.jit);
later calls with the same shapes and dtypes cost one dict lookup before the jitted kernel runs.
The database can never break model code: any failure to open, read or trust it warns once per
cause and the call runs the fallback (or raises AutotuneError in strict mode).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import registry
from autotune.device import DeviceInfo, current_device
from autotune.errors import AutotuneError, DatabaseError
from autotune.registry import KernelSpec, make_spec
from autotune.settings import Settings
from autotune.signature import Signature, TuningKey, is_array, parse_args, shape_distance
from autotune.space import Constraint

log = logging.getLogger(__name__)

# How long a lookup's write (recording a miss, creating a new file) waits for another process's
# write transaction before giving up with a warning. Reads never wait in SQLite's WAL mode; tools
# (tuner, CLI) keep the database's long default.
RUNTIME_BUSY_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class Resolution:
    """The configuration a call uses, and where it came from."""

    config: dict[str, Any]
    source: str  # "db", "nearest" or "default"
    key: TuningKey
    signature: Signature
    detail: str = ""  # e.g. the signature a nearest entry was tuned for


@dataclass
class _Runtime:
    """Process-wide lookup state: settings, the database handle, the memo, warned causes."""

    settings: Settings = field(default_factory=Settings.from_env)
    db: Any = None  # TuningDB once opened; False after it failed to open
    # (kernel, *call shape) -> (Resolution, executable); see AutotunedKernel.__call__
    memo: dict[tuple, tuple[Resolution, Callable]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)


_STATE = _Runtime()


def configure(
    *, db: str | Path | None = None, strict: bool | None = None, fallback: str | None = None
) -> None:
    """Point model code at a database and policy (default: from the environment); clears the memo."""
    global _STATE
    base = Settings.from_env()
    _close_db()
    _STATE = _Runtime(
        settings=Settings(
            db_url=str(db) if db is not None else base.db_url,
            strict=base.strict if strict is None else strict,
            fallback=base.fallback if fallback is None else fallback,
        )
    )


def clear_memo() -> None:
    """Forget every resolved call, e.g. after new results were stored."""
    _STATE.memo.clear()


def _close_db() -> None:
    if _STATE.db:
        _STATE.db.close()


def _warn_once(cause: str, message: str) -> None:
    if cause not in _STATE.warned:
        _STATE.warned.add(cause)
        log.warning("%s", message)


def _database() -> Any:
    """The runtime's TuningDB, opened on first use; None if it cannot be opened (warned once)."""
    if _STATE.db is None:
        from autotune.db import TuningDB, _sqlite_file, normalize_url

        try:
            file = _sqlite_file(normalize_url(_STATE.settings.db_url))
            missing = file is not None and not file.exists()
            _STATE.db = TuningDB(_STATE.settings.db_url, busy_timeout_s=RUNTIME_BUSY_TIMEOUT_S)
        except Exception as e:  # whatever the database does, model code goes on
            if _STATE.settings.strict:
                raise _as_autotune_error(e) from e
            _warn_once(f"open:{e}", f"pallas-autotune: {e}; using default configurations")
            _STATE.db = False
        else:
            if missing:
                _warn_once(
                    "created",
                    f"pallas-autotune: tuning database {file} did not exist: created it empty; "
                    "calls use the fallback until kernels are tuned (`autotune tune ...`)",
                )
    return _STATE.db or None


def _db_call(what: str, fn: Callable[[], Any]) -> Any:
    """Run a database read or write for model code: failures warn once (or raise if strict)."""
    try:
        return fn()
    except Exception as e:  # a tampered row can fail below SQLAlchemy's error types too
        if _STATE.settings.strict:
            raise _as_autotune_error(e) from e
        # the cause is the error, not the operation: a bad row fails lookup and nearest alike
        _warn_once(f"db:{e}", f"pallas-autotune: {what} failed: {e}; using the fallback")
        return None


def _as_autotune_error(e: Exception) -> AutotuneError:
    if isinstance(e, AutotuneError):
        return e
    return DatabaseError(
        f"tuning database {_STATE.settings.db_url or '(default)'}: {type(e).__name__}: {e} "
        "(strict mode): check it with `autotune db check`"
    )


class AutotunedKernel:
    """A kernel wrapper that calls its function with the tuned configuration."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self._executables: dict[tuple, Callable] = {}
        functools.update_wrapper(self, spec.fn)

    def __repr__(self) -> str:
        return f"<autotuned kernel {self.spec.name!r} version {self.spec.version}>"

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:  # the hot path: positional arrays of a shape resolved before
            try:
                hit = _STATE.memo.get((self, *map(_shape_dtype, args)))
            except (AttributeError, TypeError):  # a non-array argument: the general path
                hit = None
            if hit is not None:
                return hit[1](*args)
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        overrides = {k: kwargs.pop(k) for k in self.spec.tunables & kwargs.keys()}
        if not kwargs and all(is_array(a) for a in args):
            memo_key: tuple | None = (self, *map(_shape_dtype, args))  # as in __call__
        else:
            memo_key = (self, "general", _call_shape(args, kwargs))
        try:
            hit = _STATE.memo.get(memo_key)
        except TypeError:  # an unhashable static argument: resolve without the memo
            memo_key, hit = None, None
        if hit is None:
            resolution = self.resolve(args, kwargs)
            hit = (resolution, self.executable(resolution.config, args, kwargs))
            if memo_key is not None:
                _STATE.memo[memo_key] = hit
        if overrides:
            config = {**hit[0].config, **overrides}
            return self.executable(config, args, kwargs)(*args, **kwargs)
        return hit[1](*args, **kwargs)

    def explain(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """What a call with these arguments would use: config, source ("db", "nearest",
        "default"), key (a dict) and signature."""
        overrides = {k: kwargs.pop(k) for k in self.spec.tunables & kwargs.keys()}
        r = self.resolve(args, kwargs, record_miss=False)  # a question, not a call to count
        config = {**r.config, **overrides}
        return {
            "config": config,
            "source": "caller" if overrides else r.source,
            "key": r.key.as_dict(),
            "signature": r.key.signature,
            "detail": r.detail,
        }

    def executable(
        self, config: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Callable:
        """The jitted kernel for a config; static (non-array) arguments are jit-static."""
        static_nums = tuple(i for i, a in enumerate(args) if not is_array(a))
        static_names = tuple(sorted(k for k, v in kwargs.items() if not is_array(v)))
        cache_key = (tuple(sorted(config.items())), static_nums, static_names)
        exe = self._executables.get(cache_key)
        if exe is None:
            import jax

            fn = self.bound_function(config, interpret="interpret" not in kwargs)
            exe = jax.jit(fn, static_argnums=static_nums, static_argnames=static_names)
            self._executables[cache_key] = exe
        return exe

    def bound_function(
        self, config: Mapping[str, Any], *, interpret: bool, device: DeviceInfo | None = None
    ) -> Callable:
        """The kernel function with `config` bound; in interpret mode where the platform needs
        it (`interpret=True` if the kernel takes it, TPU interpret mode otherwise)."""
        device = device or current_device()
        kwargs = self.spec.kernel_kwargs(config)
        if not (interpret and device.interpret):
            return functools.partial(self.spec.fn, **kwargs)
        return interpreted(self.spec, kwargs)

    # ------------------------------------------------------------------ lookup

    def resolve(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], record_miss: bool = True
    ) -> Resolution:
        """Look the configuration for a call up: database, then the fallback policy; a miss
        is recorded for `autotune tune --pending` unless `record_miss` is False."""
        device = current_device()
        sig = self.spec.signature(args, kwargs, device)
        key = self.spec.key(sig, device)
        space = self.spec.space(device.platform)
        settings = _STATE.settings
        db = _database()
        entry = _db_call("lookup", lambda: db.best(key)) if db else None
        if entry is not None:
            problem = space.check_stored(entry["config"]) or _broken(space, entry["config"], sig)
            if problem is None:
                return Resolution(dict(entry["config"]), "db", key, sig)
            message = f"stored config of {key.kernel} {key.signature} ignored: {problem}"
            if settings.strict:
                raise AutotuneError(
                    f"{message} (strict mode): re-tune it, or check it with `autotune db check`"
                )
            _warn_once(f"invalid:{key}", f"pallas-autotune: {message}; using the fallback")
        if db and record_miss:
            _db_call("recording a miss", lambda: db.record_miss(key))
        if settings.strict:
            raise AutotuneError(
                f"no tuned configuration for {key.kernel} {key.signature} on {key.device_kind} "
                f"(strict mode): run `autotune tune {key.kernel} ...` or `autotune tune --pending`"
            )
        if settings.fallback == "nearest" and db:
            near = self._nearest(db, key, sig, space)
            if near is not None:
                return near
        return Resolution(self.spec.default_config(sig), "default", key, sig)

    def _nearest(self, db: Any, key: TuningKey, sig: Signature, space: Any) -> Resolution | None:
        """The entry of the nearest tuned shape on this device whose config fits this call.

        Deterministic: ordered by distance, then signature text, so every host picks the same.
        """
        filters = {
            k: v for k, v in key.as_dict().items() if k not in ("signature", "kernel_version")
        }
        rows = _db_call("nearest-shape lookup", lambda: db.query(**filters)) or []
        stale = [
            r
            for r in rows
            if r["kernel_version"] != key.kernel_version and r["signature"] == key.signature
        ]
        if stale:
            _warn_once(
                f"stale:{key}",
                f"pallas-autotune: {key.kernel} {key.signature} was tuned for an older kernel version "
                f"({stale[0]['kernel_version']}); not served: re-tune it",
            )
        scored = []
        for r in rows:
            if r["kernel_version"] != key.kernel_version:
                continue
            try:
                d = shape_distance(parse_args(r["signature"]), sig.args)
            except AutotuneError:
                continue
            if d is not None:
                # rounded: hosts whose libm differs in the last bit still agree on ties
                scored.append((round(d, 9), r["signature"], r))
        for _, signature, r in sorted(scored, key=lambda t: (t[0], t[1])):
            config = r["config"]
            if space.check_stored(config) is None and _broken(space, config, sig) is None:
                return Resolution(
                    dict(config), "nearest", key, sig, detail=f"tuned for {signature}"
                )
        return None


def _broken(space: Any, config: dict, sig: Signature) -> str | None:
    broken = space.violations(config, sig)
    return f"breaks {', '.join(broken)} for {sig.text}" if broken else None


_shape_dtype = operator.attrgetter("shape", "dtype")  # in C: the cheapest memo key of an array


def _call_shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
    """A cheap hashable summary of a call: (shape, dtype) per array, the value otherwise."""
    return (
        tuple((a.shape, a.dtype) if is_array(a) else ("=", a) for a in args),
        tuple(
            (k, (v.shape, v.dtype) if is_array(v) else ("=", v)) for k, v in sorted(kwargs.items())
        ),
    )


def interpreted(spec: KernelSpec, kwargs: Mapping[str, Any]) -> Callable:
    """`spec.fn` with kwargs bound, running in Pallas interpret mode."""
    if spec.takes_interpret:
        return functools.partial(spec.fn, **kwargs, interpret=True)
    inner = functools.partial(spec.fn, **kwargs)

    @functools.wraps(inner)
    def run(*args: Any, **kw: Any) -> Any:
        # Kernels without an `interpret` argument (e.g. TPU-only grid specs) run under TPU
        # interpret mode, which Pallas reads while tracing.
        from jax.experimental.pallas import tpu as pltpu

        with pltpu.force_tpu_interpret_mode():
            return inner(*args, **kw)

    return run


def autotuned(
    *,
    name: str,
    space: Mapping[str, Any] | str | Path,
    constraints: Sequence[Constraint] = (),
    reference: Callable | None = None,
    defaults: Mapping[str, Any] | None = None,
    bind: Callable[[dict[str, Any]], dict[str, Any]] | Mapping[str, Any] | None = None,
) -> Callable[[Callable], AutotunedKernel]:
    """Declare a kernel's tunable parameters and register it under `name`.

    `space` is a dict of candidate lists or the name of a file in search_spaces/; the kernel's
    keyword defaults are the default configuration (or `defaults=` with `bind=`, which maps the
    flat config onto structured arguments such as a tuple or a dataclass of block sizes; a dict
    such as {"block_shape": ("block_m", "block_n"), "block_sizes": BlockSizes} does so
    declaratively and reads the defaults from the kernel's own).
    """

    def decorate(fn: Callable) -> AutotunedKernel:
        return register(
            fn,
            name=name,
            space=space,
            constraints=constraints,
            reference=reference,
            defaults=defaults,
            bind=bind,
        )

    return decorate


def register(
    fn: Callable, *, name: str, space: Mapping[str, Any] | str | Path, **options: Any
) -> AutotunedKernel:
    """Register an existing function (e.g. from another library) as an autotuned kernel."""
    kernel = AutotunedKernel(make_spec(fn, name=name, space=space, **options))
    registry.add(kernel)
    return kernel
