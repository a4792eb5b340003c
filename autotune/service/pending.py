"""The tasks of recorded misses (`autotune tune --pending`): the kernels and shapes models called
that the database had no entry for."""

from __future__ import annotations

import logging
from typing import Any

from autotune.device import DeviceInfo
from autotune.errors import AutotuneError
from autotune.tuning.settings import DEFAULTS, TuneSettings
from autotune.tuning.task import Task, check_inputs_fit, task_of_miss

log = logging.getLogger(__name__)


def pending_tasks(
    db: Any, device: DeviceInfo, *, kernel: str | None = None, settings: TuneSettings = DEFAULTS
) -> tuple[list[Task], dict[str, int]]:
    """One task per miss recorded on `device`'s kind (most often missed first), with the budget,
    strategy and seed of `settings`, and the number of misses (rows of `autotune db misses`,
    not lookups) per kernel that is not registered here (not tuned).

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
            unknown[m["kernel"]] = unknown.get(m["kernel"], 0) + 1  # rows, as `db misses` lists
            continue
        try:  # a miss is data anyone who can write the database wrote: one bad one is skipped
            task = task_of_miss(m, settings)
            check_inputs_fit(task.shapes, task.dtypes)
        except AutotuneError as e:
            log.warning(
                "skipped the miss of %s %s: %s (drop it with `autotune db misses --delete "
                "--kernel %s --signature '%s'`)",
                m["kernel"],
                m["signature"],
                e,
                m["kernel"],
                m["signature"],
            )
            continue
        tasks[task] = tasks.get(task, 0) + m["count"]  # misses of older kernel versions add up
    return sorted(tasks, key=lambda t: -tasks[t]), unknown
