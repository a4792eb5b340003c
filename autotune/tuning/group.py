"""Tuning a variant group: tune each member that can run the call, then time every member at
its best configuration side by side, by one timer, and store which one won.

Each autotuned member is tuned as on its own (autotune.tuning.kernel: its entry is stored under its
own key); a plain member has nothing to tune. The group is then measured as a kernel whose
candidates are its members, each pinned to its best configuration ({"variant": NAME, ...}),
by the same kind of worker as any tuning task (in this process, or a device worker under
isolation): each is checked against one oracle (the first member's plain-JAX reference, or the
first plain member), timed, and the finalists are re-measured interleaved
(autotune.measure.finalists); ties within the noise go to the first member, unless another is clearly
ahead in both measurements. The group's entry, under
its own key, holds the winning member's name as its config, with one trial per member.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune import registry
from autotune.errors import AutotuneError, KernelError
from autotune.measure.finalists import remeasure
from autotune.runtime.variants import PARAM, Member, VariantGroup
from autotune.tuning.context import TuneContext
from autotune.tuning.kernel import tune_kernel
from autotune.tuning.result import TuneResult
from autotune.tuning.storing import best_entry
from autotune.tuning.task import BoundTask, bind
from autotune.tuning.worker import task_device_worker, task_worker

log = logging.getLogger(__name__)


@dataclass
class GroupTuneResult(TuneResult):
    """A group's tuning: `best_config` is {"variant": the winner}; `finalists` every member
    timed side by side, the winner first."""

    members: dict[str, TuneResult | None] = field(default_factory=dict)  # None: a plain member
    skipped: dict[str, str] = field(default_factory=dict)  # member -> why it did not compete
    device: Any = None  # the DeviceInfo the members were measured on

    @property
    def winner(self) -> str:
        return self.best_config[PARAM]

    @property
    def member_lines(self) -> list[str]:
        """Each member's time side by side (winner first), and why each other did not run."""
        lines = [f"member   {f.config[PARAM]}  {f.time_s * 1e3:.4f} ms" for f in self.finalists]
        return lines + [f"skipped  {name}: {why}" for name, why in self.skipped.items()]


def tune_group(bound: BoundTask, context: TuneContext) -> GroupTuneResult:
    """Tune `bound`'s group (see the module docstring; autotune.tuning.tune comes here for a
    group); the context's settings apply to each member's tuning and to the side-by-side
    measurement. Under isolation one device worker (the context's if given) measures both; on
    several devices (settings.devices) each member is searched on all, and the members
    measured side by side on the first."""
    start = time.perf_counter()
    settings, worker = context.settings, context.worker
    group: VariantGroup = bound.kernel
    task, args, kwargs = bound.task, bound.args, bound.task.static_dict
    owned: Any = None
    if worker is None and settings.isolate and settings.devices == 1:
        # lent to each member's tuning and the side by side, which set it to theirs
        worker = owned = task_device_worker(task, settings)
    with owned or contextlib.nullcontext():  # a worker given stays open
        # which members can run is judged for the device they will run on
        device = worker.device if worker is not None else bound.device
        members, skipped = group.runnable(args, kwargs, device)
        # each member's study is named for its own key: a job names the group's
        members_run = context.replace(settings=settings.replace(study_name=None), worker=worker)
        tuned, configs = _tune_members(bound, members, device, members_run, skipped)
        finalists_start = time.perf_counter()
        with task_worker(group.spec, task, args, settings, worker) as measurer:
            on = bind(bound, measurer.device)
            result = _side_by_side(on, measurer, configs, skipped)
    result.members = tuned
    result.finalists_s = time.perf_counter() - finalists_start
    for name, reason in skipped.items():
        log.info("variant group %s: %s skipped: %s", group.spec.name, name, reason)
    if context.store:  # the database opened by the tuner's entry
        _store(context.db, result)
        result.db_url = context.db.url
        registry.entry_stored()
    result.wall_s = time.perf_counter() - start
    return result


def _tune_members(
    bound: BoundTask,
    members: Sequence[Member],
    device: Any,
    context: TuneContext,
    skipped: dict[str, str],
) -> tuple[dict[str, TuneResult | None], dict[str, dict[str, Any]]]:
    """Each member's tune result (None for a plain member) and its pinned configuration
    ({"variant": NAME, **best}), each tuned as the group's call (`bound`) of that member on
    `device`; a member whose tuning fails goes to `skipped`, with why."""
    tuned: dict[str, TuneResult | None] = {}
    configs: dict[str, dict[str, Any]] = {}
    done = context.member_done or (lambda name, result, why: None)
    for member in members:
        if member.kernel is None:
            tuned[member.name], configs[member.name] = None, {PARAM: member.name}
            done(member.name, None, None)
            continue
        try:
            # the group's inputs, as the member takes them: its own workload named, and checked
            on = bound.member(member.kernel, device).measured(context.settings)
            result = tune_kernel(on, context)
        except AutotuneError as e:
            skipped[member.name] = f"tuning failed: {e}"
            done(member.name, None, skipped[member.name])
            continue
        tuned[member.name] = result
        configs[member.name] = {PARAM: member.name, **result.best_config}
        done(member.name, result, None)
    return tuned, configs


def _side_by_side(
    bound: BoundTask,
    worker: Any,
    configs: Mapping[str, dict[str, Any]],
    skipped: dict[str, str],
) -> GroupTuneResult:
    """The members, each pinned to its configuration, measured on `worker` (set to the group's
    task) as one kernel's candidates and re-measured side by side; KernelError if none ran.
    Each record names the workload that made the inputs (`bound`'s)."""
    group: VariantGroup = bound.kernel
    oracle, oracle_name = _oracle(group, configs, bound.args, bound.task.static_dict)
    worker.set_oracle(oracle)
    trials = []
    for config in configs.values():
        record = worker.measure(config)
        record.device = worker.device_id
        if record.status == "ok":
            trials.append(record)
        else:
            skipped[config[PARAM]] = f"{record.status}: {record.error}"
    if not trials:
        raise KernelError(
            f"no member of variant group {group.spec.name!r} can run this call here: "
            + "; ".join(f"{n}: {r}" for n, r in skipped.items())
        )
    default = trials[0].config  # the first member that ran
    ranked = remeasure(worker, trials, default, n=len(trials))
    # stored under the group's key: the member's name is its config there
    records = [
        dataclasses.replace(
            t,
            config={PARAM: t.config[PARAM]},
            is_default=t.config == default,
            oracle=oracle_name,
            workload=bound.workload,
        )
        for t in trials
    ]
    by_name = {f.config[PARAM]: f for f in ranked}
    return GroupTuneResult(
        kernel=group.spec.name,
        key=bound.key,
        best_config={PARAM: ranked[0].config[PARAM]},
        best_time_s=ranked[0].time_s,
        default_config={PARAM: default[PARAM]},
        default_time_s=by_name[default[PARAM]].time_s,
        trials=records,
        run_id=uuid.uuid4().hex,
        finalists=ranked,
        skipped=skipped,
        device=bound.device,
    )


def _oracle(
    group: VariantGroup,
    configs: Mapping[str, dict[str, Any]],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> tuple[Any, str]:
    """The output every member must match, computed in this process, and the oracle's name
    (autotune.measure.oracle's): the first member's plain-JAX reference, or the first plain member's
    output (XLA); else the first member's output in interpret mode."""
    import jax

    for name in configs:
        member: Member = group.members[name]
        reference = member.kernel.spec.reference if member.kernel else member.fn
        if reference is not None:
            output = jax.jit(functools.partial(reference, **kwargs))(*args)
            return jax.block_until_ready(output), "reference"
    first = group.spec.interpreted(next(iter(configs.values())))
    output = jax.jit(functools.partial(first, **kwargs))(*args)
    return jax.block_until_ready(output), "interpret"


def _store(handle: Any, result: GroupTuneResult) -> None:
    """The members' trials and the group's entry, under the group's key."""
    ids = handle.add_trials(result.key, result.run_id, result.trials)
    for record, db_id in zip(result.trials, ids):
        record.db_id = db_id
    handle.put_best(result.key, best_entry(result, "variants", result.device))
    log.info("stored %s %s: %s", result.kernel, result.key.signature, result.best_config)
