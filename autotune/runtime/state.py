"""The runtime's process state: its settings, the database model code is served from (opened
on first use, and reopened in the background after a failure), the lookup memo, the misses
counted and the causes warned about.

The database can never break model code: any failure to open, read or trust it warns once per
cause and the call runs the fallback (or raises AutotuneError in strict mode). Dropping the memo
drops every kernel's jitted entry too (their traces hold the configurations looked up before):
kernels register here (`add_kernel`), and an overlay that begins or ends drops them through
`drop_lookups`.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, DatabaseError
from autotune.runtime.settings import Settings
from autotune.signature import TuningKey

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


@dataclass
class RuntimeState:
    """Process-wide lookup state: settings, the database handle, the memo, warned causes."""

    settings: Settings = field(default_factory=Settings.from_env)
    db: Any = None  # TuningDB once opened; False after it failed to open
    # (kernel, call shape, overlays) -> the Resolution of calls of that shape (autotune.runtime.decorator)
    memo: dict[tuple, Any] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    # memo keys of calls resolved while the database could not be opened: dropped (with
    # their kernels' jitted entries) once a retry opens it
    unopened: set[tuple] = field(default_factory=set)
    recorded: set[TuningKey] = field(default_factory=set)  # misses counted by this process
    # the database's entries of a kernel on this device, searched for the nearest tuned shape
    # (autotune.runtime.nearest: checked against the database before each search)
    shapes: dict[tuple, Any] = field(default_factory=dict)


_STATE = RuntimeState()

# Every kernel, so that dropping the lookups drops the jitted entries traced with them. A
# kernel has `_drop_entry()` (autotune.runtime.decorator.AutotunedKernel).
_KERNELS: weakref.WeakSet[Any] = weakref.WeakSet()


@dataclass(eq=False)
class Listing:
    """A listing in progress (calls_in, explain): the kernels it traced, whose entries are
    dropped after it; what XLA's partitioner traced for each device's part of a call while it
    compiled (autotune.runtime.partitioned): a jaxpr, by the scope of the call."""

    traced: set[Any] = field(default_factory=set)
    partitioned: dict[str, Any] = field(default_factory=dict)
    # its value of the jit context: each listing's traces are its own (those of a program
    # compiled later carry the listing they were traced in: see `resumed`)
    number: int = field(default_factory=lambda: next(_LISTINGS))


_LISTINGS = itertools.count()


# The listing in progress here, None outside one.
_LISTING: contextvars.ContextVar[Listing | None] = contextvars.ContextVar(
    "autotune_listing", default=None
)
# A jax.make_user_context (made on the first listing): jit keys its caches by its value, which
# a listing sets. So a function jitted by the caller and traced inside a listing (whose kernel
# calls look up without counting misses) is traced again for a real call, which counts them,
# and a listing never reuses a real call's trace either.
_JIT_CONTEXT: list[Any] = []
_JIT_CONTEXT_LOCK = threading.Lock()


def _jit_context() -> Any:
    with _JIT_CONTEXT_LOCK:
        if not _JIT_CONTEXT:
            import jax

            _JIT_CONTEXT.append(jax.make_user_context(None))
    return _JIT_CONTEXT[0]


@contextlib.contextmanager
def listing() -> Iterator[Listing]:
    """Lookups that only read (calls_in, explain): no miss is counted, no database is created,
    no memo entry kept, and what jit traces meanwhile is cached apart from real calls' traces;
    the kernels' entries traced meanwhile are dropped after, so that a call of them traces
    again and counts its miss then."""
    outer = _LISTING.get()
    if outer is not None:  # within one: the outermost drops the entries
        yield outer
        return
    current = Listing()
    token = _LISTING.set(current)
    try:
        with _jit_context()(current.number):
            yield current
    finally:
        _LISTING.reset(token)
        for kernel in current.traced:
            kernel._drop_entry()


@contextlib.contextmanager
def resumed(listing: Listing | None) -> Iterator[None]:
    """Within: the listing `listing` (None: none) is in progress again, in another thread or
    after it began: XLA's partitioner traces each device's call of a program traced inside a
    listing when it compiles it, on a thread of its own in JAX 0.10."""
    if listing is None:
        yield
        return
    token = _LISTING.set(listing)
    try:
        with _jit_context()(listing.number):
            yield
    finally:
        _LISTING.reset(token)


def in_listing() -> Listing | None:
    """The listing in progress here, if one is."""
    return _LISTING.get()


def listed(kernel: Any) -> bool:
    """Whether a listing is in progress here: `kernel`, traced by it, is then noted."""
    current = _LISTING.get()
    if current is not None:
        current.traced.add(kernel)
    return current is not None


def current() -> RuntimeState:
    """The state lookups read now (`configure` replaces it)."""
    return _STATE


def add_kernel(kernel: Any) -> None:
    """Have `kernel`'s jitted entry dropped whenever the lookups are."""
    _KERNELS.add(kernel)


def configure(
    *, db: str | Path | None = None, strict: bool | None = None, fallback: str | None = None
) -> None:
    """Point model code at a database and policy (default: from the environment); clears the memo."""
    global _STATE
    base = Settings.from_env()
    if _STATE.db:
        _STATE.db.close()
    _drop_entries()
    _STATE = RuntimeState(
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


def _drop_entries() -> None:
    for kernel in list(_KERNELS):
        kernel._drop_entry()


def warn_once(cause: str, message: str) -> None:
    if cause not in _STATE.warned:
        _STATE.warned.add(cause)
        log.warning("%s", message)


def database() -> Any:
    """The runtime's TuningDB, opened on first use; None if it cannot be opened (warned once,
    and tried again in the background)."""
    state = _STATE
    if state.db is None:
        from autotune.db import TuningDB
        from autotune.sql import default_db_path, normalize_url, sqlite_file

        listing = _LISTING.get() is not None
        try:
            if listing and state.settings.db_url is None and not default_db_path().exists():
                return None  # a listing creates nothing, not even the default file's folder
            file = sqlite_file(normalize_url(state.settings.db_url))
            missing = file is not None and not file.exists()
            if missing and listing:
                return None
            state.db = TuningDB(state.settings.db_url, busy_timeout_s=RUNTIME_BUSY_TIMEOUT_S)
        except Exception as e:  # whatever the database does, model code goes on
            if state.settings.strict:
                raise as_autotune_error(e) from e
            warn_once(f"open:{e}", f"pallas-autotune: {e}; using default configurations")
            state.db = False
            _schedule_reopen(state, REOPEN_FIRST_S)
        else:
            if missing:
                warn_once(
                    "created",
                    f"pallas-autotune: tuning database {file} did not exist: created it empty; "
                    "calls use the fallback until kernels are tuned (`autotune tune ...`)",
                )
    return state.db or None


def _schedule_reopen(state: RuntimeState, delay_s: float) -> None:
    timer = threading.Timer(delay_s, _reopen, (state, delay_s))
    timer.daemon = True
    timer.start()


def _reopen(state: RuntimeState, delay_s: float) -> None:
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


def db_call(what: str, fn: Callable[[], Any]) -> Any:
    """Run a database read or write for model code: failures warn once (or raise if strict)."""
    try:
        return fn()
    except Exception as e:  # a tampered row can fail below SQLAlchemy's error types too
        if _STATE.settings.strict:
            raise as_autotune_error(e) from e
        # the cause is the error, not the operation: a bad row fails lookup and nearest alike
        warn_once(f"db:{e}", f"pallas-autotune: {what} failed: {e}; using the fallback")
        return None


def as_autotune_error(e: Exception) -> AutotuneError:
    if isinstance(e, AutotuneError):
        return e
    return DatabaseError(
        f"tuning database {_STATE.settings.db_url or '(default)'}: {type(e).__name__}: {e} "
        "(strict mode): check it with `autotune db check`"
    )


def record_miss(key: TuningKey) -> None:
    """Count a miss for `autotune tune --pending`, once per key per process, and only for a
    call that ran: one that the kernel refused (a TypeError, a shape no candidate fits) could
    never be tuned and would stay pending forever."""
    if key in _STATE.recorded or _LISTING.get() is not None:
        return
    _STATE.recorded.add(key)
    db = database()
    if db:
        db_call("recording a miss", lambda: db.record_miss(key))
