"""`with autotune.overlay(entries):` serves the given entries before any other within the context.

Overlays stack (the innermost is asked first). Which are active is kept per thread and async
context, but what they decide is not: a lookup happens when a call is traced, and a kernel's
traced calls serve the whole process. So the overlay decides what a call traced inside it uses,
in every thread until it ends, and a function the caller jitted inside the context keeps its
configuration after it. Entering and leaving an overlay drops the runtime's memo and its
kernels' traces (autotune.runtime.state), so that eager calls follow it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.db.tables import EntryTable, entries_of
from autotune.errors import AutotuneError
from autotune.runtime.state import current, drop_lookups, warn_once

_ACTIVE: contextvars.ContextVar[tuple[EntryTable, ...]] = contextvars.ContextVar(
    "autotune_overlays", default=()
)


@contextlib.contextmanager
def overlay(source: Any) -> Iterator[EntryTable]:
    """Serve `source`'s entries first within the context, with `source: "overlay"`: a path
    (an exported JSON file or a folder of them), an export document, the result of
    `autotune.tune`, or a list of these. A file that is there but cannot be read is data gone
    bad, as a database can be: warned once, and the calls go on without it."""
    try:
        table = entries_of(source)
    except AutotuneError as e:
        if (
            not (isinstance(source, (str, Path)) and Path(source).exists())
            or current().settings.strict
        ):
            raise
        warn_once(f"overlay:{source}", f"pallas-autotune: overlay not served: {e}")
        table = EntryTable([], str(source))
    token = _ACTIVE.set((table, *_ACTIVE.get()))
    drop_lookups()
    try:
        yield table
    finally:
        _ACTIVE.reset(token)
        drop_lookups()


def active_overlays() -> tuple[EntryTable, ...]:
    """The overlays in effect here, innermost first."""
    return _ACTIVE.get()


@contextlib.contextmanager
def restored(tables: tuple[EntryTable, ...]) -> Iterator[None]:
    """Within: `tables` are the overlays in effect, as where a call was traced whose lookup runs
    later elsewhere (XLA's partitioner traces each device's part while it compiles, on a thread
    of its own in JAX 0.10); nothing is dropped, as nothing changed for that call."""
    token = _ACTIVE.set(tables)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
