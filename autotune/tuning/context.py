"""What one task's tuning runs with, besides the task itself: `TuneContext`, made once by its
caller (autotune.tune, or a job of the tuning service) and handed down as one value to the
tuner of a kernel or of a variant group (and by a group to its members' tuning)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.trial import TrialRecord
from autotune.tuning.settings import TuneSettings

if TYPE_CHECKING:
    from autotune.tuning.worker import DeviceWorker


@dataclass(frozen=True)
class TuneContext:
    """How a task is tuned (`settings`, the task's budget, strategy and seed applied), where it
    is stored, whom it tells of each trial and which device worker it may borrow.

    `db` is a TuningDB, or a URL or path (None: the per-user database): warm starts are read
    from it, and where `store`, every trial and the winner are stored in it (opened once, by
    autotune.tuning.tune.tune_task, where not open already). `progress(record, measured, budget)` hears each trial. A
    `worker` given (a DeviceWorker) measures the task and is left running, so that many tasks
    share one start-up. A variant group's tuning tells `member_done(name, result, why)` of
    each member as it is done: its TuneResult (None for a plain member), or why it failed.

    Where the settings name a studies storage, the task's study (a variant group's members':
    each its own) is deleted before its search where `fresh` (nothing of an earlier run is
    resumed), and once it is tuned where `forget` (unless another worker searches it), so
    that the next run tunes afresh."""

    settings: TuneSettings
    db: Any = None
    store: bool = True
    progress: Callable[[TrialRecord, int, int], None] | None = None
    worker: DeviceWorker | None = None
    member_done: Callable[[str, Any, str | None], None] | None = None
    fresh: bool = False
    forget: bool = False

    def replace(self, **changes: Any) -> TuneContext:
        return dataclasses.replace(self, **changes)
