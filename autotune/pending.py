"""The tasks of recorded misses (`autotune tune --pending`): the kernels and shapes models called
that the database had no entry for."""

from __future__ import annotations

from typing import Any

from autotune.device import DeviceInfo
from autotune.task import Task, task_of_miss
from autotune.tune_settings import DEFAULTS


def pending_tasks(
    db: Any, device: DeviceInfo, *, kernel: str | None = None, trials: int = DEFAULTS.n_trials
) -> tuple[list[Task], dict[str, int]]:
    """One task per miss recorded on `device`'s kind (most often missed first), and the number
    of misses per kernel that is not registered here (not tuned).

    A miss names its kernel by registered name only: whoever can write the database must not
    choose what this process imports, so the operator imports the user's kernels (`--import`).
    """
    from autotune.registry import registered

    misses = db.misses(
        kernel=kernel,
        platform=device.platform,
        device_kind=device.device_kind,
        backend=device.backend,
    )
    known = registered()
    tasks: dict[Task, int] = {}
    unknown: dict[str, int] = {}
    for m in misses:
        if m["kernel"] not in known:
            unknown[m["kernel"]] = unknown.get(m["kernel"], 0) + m["count"]
            continue
        task = task_of_miss(m, trials)
        tasks[task] = tasks.get(task, 0) + m["count"]  # misses of older kernel versions add up
    return sorted(tasks, key=lambda t: -tasks[t]), unknown
