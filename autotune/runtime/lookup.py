"""The lookup chain: where a call's configuration comes from, asked in LOOKUP_ORDER.

An active overlay (autotune.runtime.overlays), the user's database, the table shipped with the kernel
(`tuned=`, autotune.db.tables): the first entry of the call's key whose config lies in today's
space and keeps its constraints is served (tables and databases are data, never code). Then the
fallback policy: the nearest tuned shape whose config fits the call, from the database or the
shipped table, else the kernel's defaults (refused where they break a constraint); or raise in
strict mode. A miss is reported in the Resolution, for the runtime to record once the call ran.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.db.tables import EntryTable, shipped_table
from autotune.device import current_device
from autotune.errors import AutotuneError
from autotune.registry.spec import KernelSpec
from autotune.runtime import nearest
from autotune.runtime import state as runtime_state
from autotune.runtime.overlays import active_overlays
from autotune.signature import Signature, TuningKey
from autotune.space import Space
from autotune.trial import EntrySource, StoredEntry

# Where a call's configuration comes from, asked in this order: an active overlay
# (autotune.runtime.overlays), the user's database, the table shipped with the kernel (`tuned=`, see
# autotune.db.tables); then the fallback policy: the nearest tuned shape, or the default.
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


def resolve(
    spec: KernelSpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    default_config: Callable[[Signature], dict[str, Any]],
    record_miss: bool = True,
) -> Resolution:
    """Look the configuration of the call `spec.fn(*args, **kwargs)` up (see the module
    docstring); `default_config(sig)` is what a call without an entry uses. The Resolution
    says a miss unless `record_miss` is False or no database is open."""
    state = runtime_state.current()
    device = current_device()
    sig = spec.signature(args, kwargs, device)
    key = spec.key(sig, device)
    space = spec.space(device.platform)
    db = runtime_state.database()
    for source, entry in _entries(spec, key, db):
        problem = space.check_stored(entry.config) or broken(space, entry.config, sig)
        if problem is None:
            return Resolution(dict(entry.config), source, key, sig)
        message = f"{_STORED[source]} config of {key.kernel} {key.signature} ignored: {problem}"
        if state.settings.strict:
            raise AutotuneError(
                f"{message} (strict mode): re-tune it, or check it with `autotune db check`"
            )
        runtime_state.warn_once(
            f"invalid:{source}:{key}", f"pallas-autotune: {message}; using the fallback"
        )
    miss = bool(db) and record_miss
    index = _database_index(db, key) if db else None
    stale = _stale(spec, key, index)
    if stale:
        runtime_state.warn_once(f"stale:{key}", f"pallas-autotune: {stale}; not served: re-tune it")
    if state.settings.fallback == "nearest" and not state.settings.strict:
        near = _nearest(spec, index, key, sig, space)
        if near is not None:
            return dataclasses.replace(near, miss=miss, detail=_joined(near.detail, stale))
    default = _default_resolution(space, key, sig, default_config(sig))
    if state.settings.strict:
        if miss and not default.refused:  # the call will not run: counted now
            runtime_state.record_miss(key)
        raise AutotuneError(
            f"no tuned configuration for {key.kernel} {key.signature} on {key.device_kind} "
            f"(strict mode{'; ' + stale if stale else ''}): run `autotune tune {key.kernel} "
            "...` or `autotune tune --pending`"
        )
    detail = _joined(default.detail, stale)
    return dataclasses.replace(default, miss=miss and not default.refused, detail=detail)


def _joined(*details: str) -> str:
    return "; ".join(filter(None, details))


def _database_index(db: Any, key: TuningKey) -> nearest.ShapeIndex | None:
    """The database's entries of `key`'s kernel on this device (any signature), for the
    nearest tuned shape and to tell a shape tuned for another kernel version: read in memory
    once per process (autotune.runtime.nearest), None where the database cannot be read."""
    filters = {k: v for k, v in key.as_dict().items() if k not in ("signature", "kernel_version")}
    cache = runtime_state.current().shapes
    return runtime_state.db_call(
        "nearest-shape lookup",
        lambda: nearest.cached(cache, db, filters, key.kernel_version),
    )


def _stale(spec: KernelSpec, key: TuningKey, index: nearest.ShapeIndex | None) -> str:
    """Where the database has `key`'s shape only for another version of the kernel, what is
    known of why, in words (else "")."""
    if index is None or key.signature not in index.stale:
        return ""
    why = (
        f"its declared version changed (version={key.kernel_version!r})"
        if isinstance(spec.versioned, str)
        else "its code, space or constraints changed since"
    )
    return (
        f"{key.kernel} {key.signature} was tuned for a different version of the kernel "
        f"({index.stale[key.signature]}, this one is {key.kernel_version}: {why})"
    )


def _entries(
    spec: KernelSpec, key: TuningKey, db: EntrySource | None
) -> Iterator[tuple[str, StoredEntry]]:
    """The tuned entries of `key`, in the lookup order, each with its source: the innermost
    active overlay that has one, the database, the shipped table; each source is read only if
    the ones before it were not served."""
    overlays = active_overlays()
    entry = next(filter(None, (table.best(key) for table in overlays)), None)
    if entry is not None:
        yield "overlay", entry
    for table in overlays if entry is None else ():
        if (stale := table.stale(key)) is not None:
            runtime_state.warn_once(
                f"stale-overlay:{table.where}:{key}",
                f"pallas-autotune: the overlay {table.where} has {key.kernel} {key.signature} "
                f"only for kernel version {stale.key.kernel_version}, not "
                f"{key.kernel_version}; not served: overlay an entry tuned for this version",
            )
    entry = runtime_state.db_call("lookup", lambda: db.best(key)) if db else None
    if entry is not None:
        yield "db", entry
    entry = _shipped_entry(spec, key)
    if entry is not None:
        yield "shipped", entry


def _shipped_table(spec: KernelSpec, key: TuningKey) -> EntryTable | None:
    """The entries of the kernel's shipped table (`tuned=`) on this device kind, or None: it
    has none, or they cannot be read (warned once)."""
    if spec.tuned is None:
        return None
    try:
        table = shipped_table(spec.tuned)
        entries = table.for_device(key.kernel, key.device_kind)
    except AutotuneError as e:
        if runtime_state.current().settings.strict:
            raise
        runtime_state.warn_once(f"shipped:{spec.tuned}", f"pallas-autotune: {spec.name}: {e}")
        return None
    nameless = table.nameless(key.device_kind)
    if nameless is not None:  # another kernel's, perhaps: said once, this kernel's served
        runtime_state.warn_once(f"nameless:{nameless}", f"pallas-autotune: {nameless}")
    return entries


def _shipped_entry(spec: KernelSpec, key: TuningKey) -> StoredEntry | None:
    """The entry of `key` in the kernel's shipped table, if it has one; a table that has
    the key only for another kernel version warns once."""
    table = _shipped_table(spec, key)
    if table is None:
        return None
    entry = table.best(key)
    if entry is None and (stale := table.stale(key)) is not None:
        runtime_state.warn_once(
            f"stale-shipped:{key}",
            f"pallas-autotune: the table shipped with {key.kernel} ({table.where}) has "
            f"{key.signature} only for a different version of the kernel "
            f"({stale.key.kernel_version}, this one is {key.kernel_version}); not served: "
            "ship a table tuned for this version",
        )
    return entry


def _nearest(
    spec: KernelSpec, index: nearest.ShapeIndex | None, key: TuningKey, sig: Signature, space: Space
) -> Resolution | None:
    """The entry of the nearest tuned shape on this device whose config fits this call,
    from the user's database (`index`, its entries: None where it is not open) and the
    kernel's shipped table: a library's table serves the shapes between those it was tuned
    for too. Both are searched in memory (autotune.runtime.nearest: the database's entries
    read once per process, and again after any write).

    Deterministic: ordered by distance, then the database before the table, then signature
    text, so every host picks the same.
    """
    filters = {k: v for k, v in key.as_dict().items() if k not in ("signature", "kernel_version")}
    version = key.kernel_version
    indexes = []  # (0 for the database or 1 for the shipped table, its index)
    if index is not None:
        indexes.append((0, index))
    table = _shipped_table(spec, key)
    if table is not None:
        shipped = [
            (e.key.signature, e.key.kernel_version, e.config) for e in table.query(**filters)
        ]
        indexes.append((1, nearest.ShapeIndex.of(shipped, version)))
    ranked = heapq.merge(*(_ranked(index, rank, sig) for rank, index in indexes), key=_order)
    for _, rank, signature, config in ranked:
        if space.check_stored(config) is None and broken(space, config, sig) is None:
            where = " (shipped table)" if rank else ""
            return Resolution(
                dict(config), "nearest", key, sig, detail=f"tuned for {signature}{where}"
            )
    return None


def _ranked(index: nearest.ShapeIndex, rank: int, sig: Signature) -> Iterator[tuple]:
    """(distance, rank, signature, config) of `index`'s entries, nearest first."""
    for d, signature, config in index.nearest(sig.args):
        yield d, rank, signature, config


def _order(ranked: tuple) -> tuple:
    return ranked[:3]


def _default_resolution(space: Space, key: TuningKey, sig: Signature, config: dict) -> Resolution:
    """The default configuration of a call, refused (never run) where it breaks a constraint:
    then no candidate of the space fits the call, and the kernel would compute garbage."""
    problem = broken(space, config, sig)
    if problem is None or any(0 in shape for shape in sig.shapes):  # empty: nothing to get wrong
        return Resolution(config, "default", key, sig)
    given = ", ".join(f"{n}=..." for n in space.names)
    detail = (
        f"{key.kernel} {sig.text}: no configuration of its space fits this call, and the default "
        f"{config} {problem}: pass the block sizes explicitly ({given}), or widen its space"
    )
    return Resolution(config, "default", key, sig, detail=detail, refused=True)


def broken(space: Space, config: dict, sig: Signature) -> str | None:
    """What `config` breaks for this call ("breaks ... for f32[...]"), or None."""
    violated = space.violations(config, sig)
    return f"breaks {', '.join(violated)} for {sig.text}" if violated else None


def check_given(
    spec: KernelSpec,
    config: Mapping[str, Any],
    given: frozenset[str],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> None:
    """Raise where the block sizes a call passes itself (`given`, of `config`) break the
    kernel's constraints for it: run outside them a kernel computes garbage (rows never
    written, NaN). Called while jit traces the call: it costs nothing per call."""
    sig = spec.signature(args, kwargs, current_device())
    problem = given_problem(spec, config, given, sig)
    if problem:
        raise AutotuneError(problem)


def given_problem(
    spec: KernelSpec, config: Mapping[str, Any], given: frozenset[str], sig: Signature
) -> str | None:
    """What the parameters `given` of `config` break for the call `sig`, naming the values of
    the kernel's space that keep its constraints there; None where they break nothing (or
    the call is empty: nothing to get wrong)."""
    if not given or any(0 in shape for shape in sig.shapes):
        return None
    space = spec.space(sig.platform)
    problem = broken(space, dict(config), sig)
    if problem is None:
        return None
    hints = []
    for name in sorted(given & set(space.names)):
        values = [v for v in space.param(name).values if space.is_valid({**config, name: v}, sig)]
        fit = ", ".join(map(repr, values)) if values else "none (with the others as given)"
        hints.append(f"{name} {fit}")
    passed = ", ".join(f"{n}={config[n]!r}" for n in sorted(given))
    valid = f": of its space, these fit: {'; '.join(hints)}" if hints else ""
    return (
        f"{spec.name}: {passed} {problem} (outside its constraints a kernel computes "
        f"garbage){valid}; or leave {', '.join(sorted(given))} out for the tuned configuration"
    )
