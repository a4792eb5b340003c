"""The tuning service (`autotune tune --pending --watch`): model code anywhere records the keys
it misses; a watcher tunes each as it arrives and the next trace is served its entry.

Each key is tuned only while its watcher holds the key's claim (autotune.service.claims), so watchers
beside each other, on one SQLite file or across hosts on one PostgreSQL database, never tune
one key twice. On several devices (settings.devices) a watcher claims as many keys at once
and tunes them side by side (autotune.service.jobs). Idle, a watcher asks the database for misses (one
query) at growing intervals, up to `max_wait_s`; a miss found resets them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from autotune.device import DeviceInfo
from autotune.errors import AutotuneError, DatabaseError
from autotune.service.claims import claim
from autotune.service.jobs import run_tasks
from autotune.service.pending import pending_tasks
from autotune.service.progress import JobProgress, Outcome
from autotune.tuning.settings import DEFAULTS, TuneSettings
from autotune.tuning.task import BoundTask, Task, bind
from autotune.tuning.worker import device_count

log = logging.getLogger(__name__)

FIRST_WAIT_S = 0.5  # idle: the first wait before asking again, doubled up to max_wait_s
MAX_WAIT_S = 30.0


def watch(
    db: Any,
    device: DeviceInfo,
    *,
    settings: TuneSettings = DEFAULTS,
    kernel: str | None = None,
    max_wait_s: float = MAX_WAIT_S,
    show: Callable[[JobProgress, Outcome | None], None] | None = None,
    unknown: Callable[[str, int], None] | None = None,
) -> None:
    """Tune the misses recorded on `device`'s kind (of `kernel` only, where given) in `db` (a
    TuningDB) as they arrive, until interrupted (KeyboardInterrupt, or SystemExit on SIGTERM:
    a tune in flight resumes from its study next time). `show` hears each trial and outcome,
    as a job's display does.

    A key another watcher holds is left to it. A task that failed, or was found tuned already,
    is not tried again by this watcher (its miss stays listed: `autotune db misses`).
    `unknown(kernel, misses)` hears once of each kernel that is not registered here."""
    done: set[Task] = set()  # failed, or tuned already: not tried again
    told: set[str] = set()
    wait = FIRST_WAIT_S
    down = False  # the database could not be reached on the last look
    while True:
        try:
            worked = _tune_pending(db, device, settings, kernel, show, unknown, done, told)
        except DatabaseError as e:  # a service outlives an outage: it looks again later
            if not down:
                log.warning("watching: %s; looking again every %.0f s at most", e, max_wait_s)
            down, worked = True, False
        else:
            if down:
                log.warning("watching: the database answers again")
            down = False
        if worked:
            wait = FIRST_WAIT_S
            continue
        time.sleep(wait)
        wait = min(wait * 2, max_wait_s)


def _tune_pending(
    db: Any,
    device: DeviceInfo,
    settings: TuneSettings,
    kernel: str | None,
    show: Callable[[JobProgress, Outcome | None], None] | None,
    unknown: Callable[[str, int], None] | None,
    done: set[Task],
    told: set[str],
) -> bool:
    """One look at the misses: those not tried yet and claimed by no other watcher, as many as
    the devices at most, tuned side by side (one device each) or, fewer, in turn on every
    device; whether any was."""
    tasks, strangers = pending_tasks(db, device, kernel=kernel, settings=settings)
    for name, n in strangers.items():
        if name not in told and unknown is not None:
            unknown(name, n)
        told.add(name)
    batch = device_count(settings)  # misses tuned at once: one per device (autotune.service.jobs)
    worked = False
    with contextlib.ExitStack() as claims:
        claimed: list[BoundTask] = []  # bound once: the job tunes each as bound here
        for task in tasks:
            if task in done:
                continue
            try:
                bound = bind(task, device)
            except AutotuneError as e:
                log.warning("skipped the miss of %s: %s", task.label, e)
                done.add(task)
                continue
            if claims.enter_context(claim(db, bound.key)):  # else another watcher is tuning it
                claimed.append(bound)
            if len(claimed) == batch:
                break
        for outcome in run_tasks(claimed, device, db=db, settings=settings, show=show):
            if outcome.status == "tuned":
                worked = True
            else:
                done.add(outcome.task)
    return worked
