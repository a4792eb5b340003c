"""`with autotune.overlay(entries):` serves the given entries before any other within the context.

Overlays stack (the innermost is asked first) per thread and async context. A lookup happens
when a call is traced, so the overlay decides what a call traced inside it uses: a function the
caller jitted inside the context keeps its configuration after it. Entering and leaving an
overlay drops the runtime's memo and its kernels' traces, so that eager calls follow it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from autotune.signature import TuningKey
from autotune.tables import EntryTable, entries_of

_ACTIVE: contextvars.ContextVar[tuple[EntryTable, ...]] = contextvars.ContextVar(
    "autotune_overlays", default=()
)


@contextlib.contextmanager
def overlay(source: Any) -> Iterator[EntryTable]:
    """Serve `source`'s entries first within the context, with `source: "overlay"`: a path
    (an exported JSON file or a folder of them), an export document, the result of
    `autotune.tune`, or a list of these."""
    from autotune.runtime import clear_memo

    table = entries_of(source)
    token = _ACTIVE.set((table, *_ACTIVE.get()))
    clear_memo()
    try:
        yield table
    finally:
        _ACTIVE.reset(token)
        clear_memo()


def overlay_entry(key: TuningKey) -> dict[str, Any] | None:
    """The entry of `key` in the innermost active overlay that has one, or None."""
    for table in _ACTIVE.get():
        entry = table.best(key)
        if entry is not None:
            return entry
    return None


def active_overlays() -> tuple[EntryTable, ...]:
    """The overlays in effect here, innermost first."""
    return _ACTIVE.get()
