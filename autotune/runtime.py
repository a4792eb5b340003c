"""@autotuned: call -> key -> lookup (memo, overlay, database, shipped table, fallback) ->
compiled kernel call.

Each kernel has one jitted entry whose body does the lookup, so the lookup runs only while jit
traces it (once per new shapes, dtypes and static arguments) and a repeated eager call costs what
a hand-configured jitted call costs: jit's own C++ dispatch. Arrays are traced, other arguments
are static; where the kernel's signature cannot say which is which, each call is checked first
(see AutotunedKernel.__init__). The lookup is memoised per call shape, so the database is read
once per distinct call in a process; `clear_memo` (after a tune stored an entry: see
`registry.on_entry_stored`) and `configure` drop the memo and every entry. The database can
never break model code: any failure to open, read or trust it warns once per cause and the
call runs the fallback (or raises AutotuneError in strict mode).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import registry
from autotune.device import current_device
from autotune.errors import AutotuneError, DatabaseError
from autotune.overlays import active_overlays, overlay_entry
from autotune.registry import KernelSpec, make_spec
from autotune.settings import Settings
from autotune.signature import Signature, TuningKey, is_array, parse_args, shape_distance
from autotune.space import Constraint
from autotune.tables import shipped_table

log = logging.getLogger(__name__)

# How long a lookup's write (recording a miss, creating a new file) waits for another process's
# write transaction before giving up with a warning. Reads never wait in SQLite's WAL mode; tools
# (tuner, CLI) keep the database's long default.
RUNTIME_BUSY_TIMEOUT_S = 0.5
# A database that failed to open is tried again in the background after this many seconds,
# doubling up to REOPEN_MAX_S: a lock held at a process's first lookup must not make every
# call of its life use the fallback, and no call ever waits for the retry.
REOPEN_FIRST_S = 1.0
REOPEN_MAX_S = 60.0

# Where a call's configuration comes from, asked in this order: an active overlay
# (autotune.overlays), the user's database, the table shipped with the kernel (`tuned=`, see
# autotune.tables); then the fallback policy: the nearest tuned shape, or the default.
LOOKUP_ORDER = ("overlay", "db", "shipped", "nearest", "default")
_STORED = {"overlay": "overlaid", "db": "stored", "shipped": "shipped"}  # in warnings


@dataclass(frozen=True)
class Resolution:
    """The configuration a call uses, and where it came from."""

    config: dict[str, Any]
    source: str  # "overlay", "db", "shipped", "nearest" or "default" (see LOOKUP_ORDER)
    key: TuningKey
    signature: Signature
    detail: str = ""  # e.g. the signature a nearest entry was tuned for
    refused: bool = False  # no candidate fits and the default breaks a constraint: detail says
    miss: bool = False  # the database had no entry: recorded once a call of it has run


@dataclass
class _Runtime:
    """Process-wide lookup state: settings, the database handle, the memo, warned causes."""

    settings: Settings = field(default_factory=Settings.from_env)
    db: Any = None  # TuningDB once opened; False after it failed to open
    # (kernel, call shape) -> the Resolution of calls of that shape; see AutotunedKernel._resolution
    memo: dict[tuple, Resolution] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    # memo keys of calls resolved while the database could not be opened: dropped (with
    # their kernels' jitted entries) once a retry opens it
    unopened: set[tuple] = field(default_factory=set)
    recorded: set[TuningKey] = field(default_factory=set)  # misses counted by this process


_STATE = _Runtime()

# Every kernel, so that clear_memo and configure can drop the jitted entries traced with old lookups.
_KERNELS: weakref.WeakSet[AutotunedKernel] = weakref.WeakSet()


def configure(
    *, db: str | Path | None = None, strict: bool | None = None, fallback: str | None = None
) -> None:
    """Point model code at a database and policy (default: from the environment); clears the memo."""
    global _STATE
    base = Settings.from_env()
    _close_db()
    _drop_entries()
    _STATE = _Runtime(
        settings=Settings(
            db_url=str(db) if db is not None else base.db_url,
            strict=base.strict if strict is None else strict,
            fallback=base.fallback if fallback is None else fallback,
        )
    )


def database_url() -> str | None:
    """The database model code is served from (None: the per-user default file)."""
    return _STATE.settings.db_url


def clear_memo() -> None:
    """Forget every resolved call, e.g. after new results were stored: the next call of each
    shape looks its configuration up again (and counts a miss again)."""
    drop_lookups()
    _STATE.recorded.clear()


def drop_lookups() -> None:
    """Forget the configurations calls were resolved and traced with (an overlay began or
    ended); the misses this process counted stay counted."""
    _STATE.memo.clear()
    _drop_entries()


# a tuning run in this process stored a best entry: serve it from the next call on
registry.on_entry_stored(clear_memo)


def _drop_entries() -> None:
    for kernel in list(_KERNELS):
        kernel._drop_entry()


def _close_db() -> None:
    if _STATE.db:
        _STATE.db.close()


def warn_once(cause: str, message: str) -> None:
    if cause not in _STATE.warned:
        _STATE.warned.add(cause)
        log.warning("%s", message)


def _database() -> Any:
    """The runtime's TuningDB, opened on first use; None if it cannot be opened (warned once)."""
    if _STATE.db is None:
        from autotune.db import TuningDB
        from autotune.dbconnect import normalize_url, sqlite_file

        try:
            file = sqlite_file(normalize_url(_STATE.settings.db_url))
            missing = file is not None and not file.exists()
            _STATE.db = TuningDB(_STATE.settings.db_url, busy_timeout_s=RUNTIME_BUSY_TIMEOUT_S)
        except Exception as e:  # whatever the database does, model code goes on
            if _STATE.settings.strict:
                raise _as_autotune_error(e) from e
            warn_once(f"open:{e}", f"pallas-autotune: {e}; using default configurations")
            _STATE.db = False
            _schedule_reopen(_STATE, REOPEN_FIRST_S)
        else:
            if missing:
                warn_once(
                    "created",
                    f"pallas-autotune: tuning database {file} did not exist: created it empty; "
                    "calls use the fallback until kernels are tuned (`autotune tune ...`)",
                )
    return _STATE.db or None


def _schedule_reopen(state: _Runtime, delay_s: float) -> None:
    timer = threading.Timer(delay_s, _reopen, (state, delay_s))
    timer.daemon = True
    timer.start()


def _reopen(state: _Runtime, delay_s: float) -> None:
    """Try the database again (in a timer thread); once it opens, the calls that fell back
    for want of it are looked up again at their next call."""
    from autotune.db import TuningDB

    if state is not _STATE or state.db is not False:  # configure() replaced the state
        return
    try:
        db = TuningDB(state.settings.db_url, busy_timeout_s=RUNTIME_BUSY_TIMEOUT_S)
    except Exception:
        _schedule_reopen(state, min(2 * delay_s, REOPEN_MAX_S))
        return
    if state is not _STATE:
        db.close()
        return
    state.db = db
    log.info("pallas-autotune: tuning database %s opened on a retry", db.url)
    for memo_key in list(state.unopened):
        state.unopened.discard(memo_key)
        state.memo.pop(memo_key, None)
        memo_key[0]._drop_entry()


def _db_call(what: str, fn: Callable[[], Any]) -> Any:
    """Run a database read or write for model code: failures warn once (or raise if strict)."""
    try:
        return fn()
    except Exception as e:  # a tampered row can fail below SQLAlchemy's error types too
        if _STATE.settings.strict:
            raise _as_autotune_error(e) from e
        # the cause is the error, not the operation: a bad row fails lookup and nearest alike
        warn_once(f"db:{e}", f"pallas-autotune: {what} failed: {e}; using the fallback")
        return None


def _as_autotune_error(e: Exception) -> AutotuneError:
    if isinstance(e, AutotuneError):
        return e
    return DatabaseError(
        f"tuning database {_STATE.settings.db_url or '(default)'}: {type(e).__name__}: {e} "
        "(strict mode): check it with `autotune db check`"
    )


def _is_option(p: inspect.Parameter) -> bool:
    """A keyword-only parameter with a default that is no array: a default other than None, or
    None under an annotation that names no array (`sm_scale: float | None = None`); an
    unannotated None default may stand for an optional array (`bias=None`)."""
    if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
        return False
    if p.default is not None:
        return True
    return p.annotation is not p.empty and "array" not in str(p.annotation).lower()


class AutotunedKernel:
    """A kernel wrapper that calls its function with the tuned configuration."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self._executables: dict[tuple, Callable] = {}
        params = [
            p
            for p in inspect.signature(spec.fn).parameters.values()
            if p.name not in spec.bound_names and p.name != "interpret"
        ]
        # The jitted entry's static arguments: options, and overrides of tunable parameters.
        options = {p.name for p in params if p.kind is p.KEYWORD_ONLY or p.default is not p.empty}
        self._static_names = frozenset(options | spec.tunables | {"interpret"})
        # A signature whose every argument is an array (positional, no default) or an option
        # (keyword-only with a default: see _is_option) says how calls split: they go straight
        # to the entry, which splits them as jax.jit(fn, static_argnames=<options>) would (so
        # a Python scalar in an array's place is traced, an array in an option's is refused).
        # Any other (e.g. `bias=None`, `causal=False` positional) has each call checked first,
        # so that every non-array value is static and every array traced.
        self._direct = all(
            (p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
            or _is_option(p)
            for p in params
        )
        self._drop_entry()
        _KERNELS.add(self)
        functools.update_wrapper(self, spec.fn)

    def __repr__(self) -> str:
        return f"<autotuned kernel {self.spec.name!r} version {self.spec.version}>"

    # ------------------------------------------------------------------ calling

    # Calling the kernel calls `_entry`, with no Python frame in between (a property whose
    # getter is C): for a direct kernel that is the jitted entry itself, so a repeated call
    # costs what jit's C++ dispatch costs; it keys calls by shapes, dtypes and static values.
    __call__ = property(operator.attrgetter("_entry"))

    def _drop_entry(self) -> None:
        """Forget the jitted entry (its traces hold configurations looked up before)."""
        self._jit: Callable | None = None
        self._entry: Callable = self._first_call

    def _first_call(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        def entry(*args: Any, **kwargs: Any) -> Any:  # runs while jit traces a new call
            return self._run(args, kwargs, self._traced_kernel)

        # named as the kernel, as a hand-jitted kernel is named in jaxprs and profiles
        entry.__name__ = entry.__qualname__ = self.spec.fn.__name__
        self._jit = jax.jit(entry, static_argnames=sorted(self._static_names))
        self._entry = self._jit if self._direct else self._checked
        return self._entry(*args, **kwargs)

    def _checked(self, *args: Any, **kwargs: Any) -> Any:
        if self._fits(args, kwargs):
            # (_jit is None only if another thread dropped the entries meanwhile)
            return (self._jit or self._first_call)(*args, **kwargs)
        return self._call(args, kwargs)

    def _fits(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """Whether the jitted entry splits a call as the decorator does: arrays (or None)
        positionally, non-array values of static names by keyword."""
        return _all_arrays(args) and (
            not kwargs
            or (kwargs.keys() <= self._static_names and not any(map(is_array, kwargs.values())))
        )

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The general path: non-array arguments become static ones of a jitted executable."""
        return self._run(args, kwargs, self.executable)

    def _traced_kernel(
        self, config: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Callable:
        # inside the entry's trace: the kernel itself, so the entry holds its pallas_call
        return self.spec.bound_function(config, interpret="interpret" not in kwargs)

    def _run(self, args: Sequence[Any], kwargs: dict[str, Any], kernel_for: Callable) -> Any:
        """A call, in the jitted entry's trace or on the general path: looked up, then run in
        a scope that names the call in jaxprs (`autotune.calls_in` reads it)."""
        with traced_call_scope(self, args, kwargs):
            overrides = {k: kwargs.pop(k) for k in self.spec.tunables & kwargs.keys()}
            resolution = self._resolution(args, kwargs)
            if resolution.refused and not overrides:  # block sizes passed: the caller's choice
                raise AutotuneError(resolution.detail)
            config = {**resolution.config, **overrides}
            out = kernel_for(config, args, kwargs)(*args, **kwargs)
        if resolution.miss:
            _record_miss(resolution.key)
        return out

    def _resolution(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Resolution:
        """resolve(), memoised per call shape: the database is read once per key per process."""
        # an active overlay changes the answer: calls inside and outside one differ
        memo_key = (self, _call_shape(args, kwargs), active_overlays())
        try:
            hit = _STATE.memo.get(memo_key)
        except TypeError:  # an unhashable static argument: resolve without the memo
            return self.resolve(args, kwargs)
        if hit is None:
            hit = _STATE.memo[memo_key] = self.resolve(args, kwargs)
            if _STATE.db is False:
                _STATE.unopened.add(memo_key)
                if _STATE.db:  # a retry opened it meanwhile: this call's trace is stale too
                    _STATE.memo.pop(memo_key, None)
                    self._drop_entry()
        return hit

    def explain(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """What a call with these arguments would use: config, source (one of LOOKUP_ORDER,
        or "caller" for a configuration passed in the call), key (a dict) and signature."""
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

            fn = self.spec.bound_function(config, interpret="interpret" not in kwargs)
            exe = jax.jit(fn, static_argnums=static_nums, static_argnames=static_names)
            self._executables[cache_key] = exe
        return exe

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
        for source, entry in self._entries(key, db):
            problem = space.check_stored(entry["config"]) or _broken(space, entry["config"], sig)
            if problem is None:
                return Resolution(dict(entry["config"]), source, key, sig)
            message = f"{_STORED[source]} config of {key.kernel} {key.signature} ignored: {problem}"
            if settings.strict:
                raise AutotuneError(
                    f"{message} (strict mode): re-tune it, or check it with `autotune db check`"
                )
            warn_once(f"invalid:{source}:{key}", f"pallas-autotune: {message}; using the fallback")
        miss = bool(db) and record_miss
        if settings.fallback == "nearest" and not settings.strict:
            near = self._nearest(db, key, sig, space)
            if near is not None:
                return dataclasses.replace(near, miss=miss)
        default = _default_resolution(space, key, sig, self._default_config(sig, args, kwargs))
        if settings.strict:
            if miss and not default.refused:  # the call will not run: counted now
                _record_miss(key)
            raise AutotuneError(
                f"no tuned configuration for {key.kernel} {key.signature} on {key.device_kind} "
                f"(strict mode): run `autotune tune {key.kernel} ...` or `autotune tune --pending`"
            )
        return dataclasses.replace(default, miss=miss and not default.refused)

    def _default_config(
        self, sig: Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The configuration a call without a tuned entry uses (a variant group overrides it)."""
        return self.spec.default_config(sig)

    def _entries(self, key: TuningKey, db: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """The tuned entries of `key`, in the lookup order (LOOKUP_ORDER), each with its
        source; each is read only if the ones before it were not served."""
        entry = overlay_entry(key)
        if entry is not None:
            yield "overlay", entry
        entry = _db_call("lookup", lambda: db.best(key)) if db else None
        if entry is not None:
            yield "db", entry
        entry = self._shipped_entry(key)
        if entry is not None:
            yield "shipped", entry

    def _shipped_table(self) -> Any:
        """The kernel's shipped table (`tuned=`), or None: it has none, or it cannot be read
        (warned once)."""
        if self.spec.tuned is None:
            return None
        try:
            return shipped_table(self.spec.tuned)
        except AutotuneError as e:
            if _STATE.settings.strict:
                raise
            warn_once(f"shipped:{self.spec.tuned}", f"pallas-autotune: {self.spec.name}: {e}")
            return None

    def _shipped_entry(self, key: TuningKey) -> dict[str, Any] | None:
        """The entry of `key` in the kernel's shipped table, if it has one; a table that has
        the key only for another kernel version warns once."""
        table = self._shipped_table()
        if table is None:
            return None
        entry = table.best(key)
        if entry is None and (stale := table.stale(key)) is not None:
            warn_once(
                f"stale-shipped:{key}",
                f"pallas-autotune: the table shipped with {key.kernel} ({table.where}) has "
                f"{key.signature} only for kernel version {stale['kernel_version']}, not "
                f"{key.kernel_version}; not served: ship a table tuned for this version",
            )
        return entry

    def _nearest(self, db: Any, key: TuningKey, sig: Signature, space: Any) -> Resolution | None:
        """The entry of the nearest tuned shape on this device whose config fits this call,
        from the user's database (`db`, None where it is not open) and the kernel's shipped
        table: a library's table serves the shapes between those it was tuned for too.

        Deterministic: ordered by distance, then the database before the table, then signature
        text, so every host picks the same.
        """
        filters = {
            k: v for k, v in key.as_dict().items() if k not in ("signature", "kernel_version")
        }
        rows = (_db_call("nearest-shape lookup", lambda: db.query(**filters)) or []) if db else []
        stale = [
            r
            for r in rows
            if r["kernel_version"] != key.kernel_version and r["signature"] == key.signature
        ]
        if stale:
            warn_once(
                f"stale:{key}",
                f"pallas-autotune: {key.kernel} {key.signature} was tuned for an older kernel version "
                f"({stale[0]['kernel_version']}); not served: re-tune it",
            )
        table = self._shipped_table()
        shipped = table.query(**filters) if table is not None else []
        scored = []
        for rank, r in [(0, r) for r in rows] + [(1, r) for r in shipped]:
            if r["kernel_version"] != key.kernel_version:
                continue
            try:
                d = shape_distance(parse_args(r["signature"]), sig.args)
            except AutotuneError:
                continue
            if d is not None:
                # rounded: hosts whose libm differs in the last bit still agree on ties
                scored.append((round(d, 9), rank, r["signature"], r))
        for _, rank, signature, r in sorted(scored, key=lambda t: t[:3]):
            config = r["config"]
            if space.check_stored(config) is None and _broken(space, config, sig) is None:
                where = " (shipped table)" if rank else ""
                return Resolution(
                    dict(config), "nearest", key, sig, detail=f"tuned for {signature}{where}"
                )
        return None


def _record_miss(key: TuningKey) -> None:
    """Count a miss for `autotune tune --pending`, once per key per process, and only for a
    call that ran: one that the kernel refused (a TypeError, a shape no candidate fits) could
    never be tuned and would stay pending forever."""
    if key in _STATE.recorded:
        return
    _STATE.recorded.add(key)
    db = _database()
    if db:
        _db_call("recording a miss", lambda: db.record_miss(key))


def _default_resolution(space: Any, key: TuningKey, sig: Signature, config: dict) -> Resolution:
    """The default configuration of a call, refused (never run) where it breaks a constraint:
    then no candidate of the space fits the call, and the kernel would compute garbage."""
    broken = _broken(space, config, sig)
    if broken is None or any(0 in shape for shape in sig.shapes):  # empty: nothing to get wrong
        return Resolution(config, "default", key, sig)
    given = ", ".join(f"{n}=..." for n in space.names)
    detail = (
        f"{key.kernel} {sig.text}: no configuration of its space fits this call, and the default "
        f"{config} {broken}: pass the block sizes explicitly ({given}), or widen its space"
    )
    return Resolution(config, "default", key, sig, detail=detail, refused=True)


def _broken(space: Any, config: dict, sig: Signature) -> str | None:
    broken = space.violations(config, sig)
    return f"breaks {', '.join(broken)} for {sig.text}" if broken else None


@dataclass(frozen=True)
class TracedCall:
    """A call that a kernel's jitted entry traced: arrays as jax.ShapeDtypeStruct."""

    kernel: AutotunedKernel
    args: tuple
    kwargs: dict[str, Any]


# Every call an entry traced in this process, by the name of the scope it was traced in. The
# scope's name stays on the operations of the entry's jaxpr, which jit caches and reuses: so
# `autotune.calls_in` finds a call in a program's jaxpr whether or not this trace ran it.
TRACED_CALLS: dict[str, TracedCall] = {}
TRACED_SCOPE_PREFIX = "autotuned_call_"
_SCOPES: dict[tuple, str] = {}


def traced_call_scope(kernel: AutotunedKernel, args: Sequence[Any], kwargs: Mapping[str, Any]):
    """The named scope a kernel's entry traces a call in (one name per distinct call)."""
    import jax

    try:
        key = (kernel.spec.name, kernel.spec.version, _call_shape(args, kwargs))
        name = _SCOPES.get(key)
    except TypeError:  # an unhashable static argument: not listed by calls_in
        return contextlib.nullcontext()
    if name is None:
        name = _SCOPES[key] = f"{TRACED_SCOPE_PREFIX}{len(_SCOPES)}"

        def abstract(a: Any) -> Any:  # no array (or tracer) outlives the call
            return jax.ShapeDtypeStruct(a.shape, a.dtype) if is_array(a) else a

        named = {k: abstract(v) for k, v in kwargs.items()}
        TRACED_CALLS[name] = TracedCall(kernel, tuple(map(abstract, args)), named)
    return jax.named_scope(name)


# Types whose every value is an array (is_array), or None; learned as calls bring them.
_ARRAY_TYPES: set[type] = {type(None)}


def _all_arrays(values: Sequence[Any]) -> bool:
    """Whether every value is an array or None, judged by its type: one set lookup per value
    once the type is known (an array's `dtype` is a property that costs microseconds). A type
    whose instances alone carry a shape and a dtype is judged not to be one: such calls take
    the general path, which judges each value."""
    if _ARRAY_TYPES.issuperset(map(type, values)):
        return True
    for cls in set(map(type, values)) - _ARRAY_TYPES:
        if not (hasattr(cls, "shape") and hasattr(cls, "dtype")):
            return False
        _ARRAY_TYPES.add(cls)
    return True


def _call_shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
    """A cheap hashable summary of a call: (shape, dtype) per array, the value otherwise."""
    return (
        tuple((a.shape, a.dtype) if is_array(a) else ("=", a) for a in args),
        tuple(
            (k, (v.shape, v.dtype) if is_array(v) else ("=", v)) for k, v in sorted(kwargs.items())
        ),
    )


def autotuned(
    *,
    name: str,
    space: Mapping[str, Any] | str | Path,
    constraints: Sequence[Constraint] = (),
    reference: Callable | None = None,
    defaults: Mapping[str, Any] | None = None,
    bind: Callable[[dict[str, Any]], dict[str, Any]] | Mapping[str, Any] | None = None,
    backend: str | None = None,
    tuned: str | Path | None = None,
) -> Callable[[Callable], AutotunedKernel]:
    """Declare a kernel's tunable parameters and register it under `name`.

    `space` is a dict of candidate lists or the name of a file in search_spaces/; the kernel's
    keyword defaults are the default configuration (or `defaults=` with `bind=`, which maps the
    flat config onto structured arguments such as a tuple or a dataclass of block sizes; a dict
    such as {"block_shape": ("block_m", "block_n"), "block_sizes": BlockSizes} does so
    declaratively and reads the defaults from the kernel's own). `tuned` is a tuned table
    shipped with the kernel: an exported JSON file, or a folder of them, relative to the
    kernel's module; it serves calls the user's own database has no entry for.
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
            backend=backend,
            tuned=tuned,
        )

    return decorate


def register(
    fn: Callable, *, name: str, space: Mapping[str, Any] | str | Path, **options: Any
) -> AutotunedKernel:
    """Register an existing function (e.g. from another library) as an autotuned kernel."""
    kernel = AutotunedKernel(make_spec(fn, name=name, space=space, **options))
    registry.add(kernel)
    return kernel
