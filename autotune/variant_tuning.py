"""Tuning a variant group: tune each member that can run the call, then time every member at
its best configuration side by side, by one timer, and store which one won.

Each autotuned member is tuned as on its own (`autotune.tune`: its entry is stored under its
own key); a plain member has nothing to tune. The winners are then compiled in this process,
checked against one another (a member whose output differs is dropped, with the reason) and
timed interleaved as the finalists of one kernel are (autotune.finalists): ties within the
noise go to the member listed first. The group's entry, under its own key, holds the winning
member's name as its config, with one trial per member timed.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune import registry
from autotune.device import current_device
from autotune.errors import AutotuneError, KernelError
from autotune.finalists import MAX_REPS, ROUND_S, ROUNDS, Finalist, rank
from autotune.measure import compile_ahead, interleaved, summarise, time_compiled
from autotune.trial import TrialRecord
from autotune.tune_settings import TuneSettings
from autotune.tuner import TuneResult, _open_db, random_inputs, tune
from autotune.variants import PARAM, Member, VariantGroup
from autotune.verify import compare

log = logging.getLogger(__name__)


@dataclass
class GroupTuneResult(TuneResult):
    """A group's tuning: `best_config` is {"variant": the winner}; `finalists` every member
    timed side by side, the winner first."""

    members: dict[str, TuneResult | None] = field(default_factory=dict)  # None: a plain member
    skipped: dict[str, str] = field(default_factory=dict)  # member -> why it did not compete

    @property
    def winner(self) -> str:
        return self.best_config[PARAM]

    @property
    def member_lines(self) -> list[str]:
        """Each member's time side by side (winner first), and why each other did not run."""
        lines = [f"member   {f.config[PARAM]}  {f.time_s * 1e3:.4f} ms" for f in self.finalists]
        return lines + [f"skipped  {name}: {why}" for name, why in self.skipped.items()]


def tune_group(
    group: VariantGroup,
    args: Sequence[Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    settings: TuneSettings | None = None,
    db: Any = None,
    store: bool = True,
    progress: Callable[[TrialRecord, int, int], None] | None = None,
    worker: Any = None,
) -> GroupTuneResult:
    """Tune `group` for these arguments (see the module docstring); `settings` apply to each
    member's tuning, and `worker` (a DeviceWorker) measures them if given."""
    settings = settings or TuneSettings()
    start = time.perf_counter()
    kwargs = dict(kwargs or {})
    args = random_inputs(args, 0 if settings.seed is None else settings.seed)
    handle = _open_db(db) if store else None
    try:
        device = current_device()
        sig = group.spec.signature(args, kwargs, device)
        key = group.spec.key(sig, device)
        members, skipped = group.runnable(args, kwargs)
        tuned: dict[str, TuneResult | None] = {}
        configs: dict[str, dict[str, Any]] = {}
        # each member's study is named for its own key: a job names the group's
        member_settings = settings.replace(study_name=None)
        for member in members:
            if member.kernel is None:
                tuned[member.name], configs[member.name] = None, {}
                continue
            try:
                result = tune(
                    member.kernel,
                    args,
                    kwargs=kwargs,
                    settings=member_settings,
                    db=handle,
                    store=store,
                    progress=progress,
                    worker=worker,
                )
            except AutotuneError as e:
                skipped[member.name] = f"tuning failed: {e}"
                continue
            tuned[member.name], configs[member.name] = result, result.best_config
        for name, reason in skipped.items():
            log.info("variant group %s: %s skipped: %s", group.spec.name, name, reason)
        finalists_start = time.perf_counter()
        ranked, records = _side_by_side(group, configs, tuned, args, kwargs, settings, skipped)
        if not ranked:
            raise KernelError(
                f"no member of variant group {group.spec.name!r} can run {sig.text} here: "
                + "; ".join(f"{n}: {r}" for n, r in skipped.items())
            )
        default = next(f for f in ranked if f.distance == min(g.distance for g in ranked))
        result = GroupTuneResult(
            kernel=group.spec.name,
            key=key,
            best_config=ranked[0].config,
            best_time_s=ranked[0].time_s,
            default_config=default.config,
            default_time_s=default.time_s,
            trials=records,
            run_id=uuid.uuid4().hex,
            finalists=ranked,
            finalists_s=time.perf_counter() - finalists_start,
            members=tuned,
            skipped=skipped,
        )
        if handle is not None:
            _store(handle, result, device)
            result.db_url = handle.url
            registry.entry_stored()
    finally:
        if handle is not None and handle is not db:
            handle.close()
    result.wall_s = time.perf_counter() - start
    return result


def _side_by_side(
    group: VariantGroup,
    configs: Mapping[str, dict[str, Any]],
    tuned: Mapping[str, TuneResult | None],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    settings: TuneSettings,
    skipped: dict[str, str],
) -> tuple[list[Finalist], list[TrialRecord]]:
    """Each member at its configuration compiled, checked against the first autotuned member
    (else the first) and timed interleaved: the finalists, winner first, and one trial each."""
    order = list(group.members)
    compiled: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for name, config in configs.items():
        member: Member = group.members[name]
        fn = (
            member.kernel.spec.bound_function(config, interpret=True)
            if member.kernel
            else member.fn
        )
        try:
            compiled[name], _ = compile_ahead(functools.partial(fn, **kwargs), args)
            outputs[name] = compiled[name](*args)
        except Exception as e:  # a member that fails here does not compete
            skipped[name] = f"{type(e).__name__}: {e}".splitlines()[0]
            compiled.pop(name, None)
    checked = [n for n in compiled if tuned.get(n) is not None] or list(compiled)
    if checked:
        reference = checked[0]
        for name in list(compiled):
            verdict = compare(outputs[name], outputs[reference], kwargs.get("precision"))
            if not verdict.ok:
                skipped[name] = f"its output differs from {reference}'s: {verdict.message}"
                del compiled[name]
    names = list(compiled)
    if not names:
        return [], []
    first = {}
    for name in names:
        result = tuned.get(name)
        first[name] = (
            result.best_time_s
            if result is not None
            else time_compiled(compiled[name], args, settings.policy).median_s
        )
    timings: list[Any] = [None] * len(names)
    timer = "wall"
    if len(names) > 1:
        reps = max(1, min(MAX_REPS, int(ROUND_S / max(min(first.values()), 1e-9))))
        samples, timer = interleaved(
            [compiled[n] for n in names], [list(args)], ROUNDS, reps, settings.policy
        )
        timings = [summarise(s, timer) for s in samples]
    finalists = [
        Finalist(config={PARAM: n}, first_s=first[n], timing=t, distance=float(order.index(n)))
        for n, t in zip(names, timings)
    ]
    records = [
        TrialRecord(
            config={PARAM: n},
            status="ok",
            **(t.as_trial_fields() if t else {"time_s": first[n], "timer": timer}),
            is_default=n == names[0],
        )
        for n, t in zip(names, timings)
    ]
    return rank(finalists), records


def _store(handle: Any, result: GroupTuneResult, device: Any) -> None:
    """The members' trials and the group's entry, under the group's key."""
    ids = handle.add_trials(result.key, result.run_id, result.trials)
    for record, db_id in zip(result.trials, ids):
        record.db_id = db_id
    best = next(t for t in result.trials if t.config == result.best_config)
    handle.put_best(
        result.key,
        {
            "config": result.best_config,
            "time_s": result.best_time_s,
            "default_time_s": result.default_time_s,
            "speedup": result.speedup,
            "n_trials": len(result.trials),
            "n_rejected": 0,
            "trial_id": best.db_id,
            "run_id": result.run_id,
            "strategy": "variants",
            "timer": best.timer or "wall",
            "jax_version": device.jax_version,
            "jaxlib_version": device.jaxlib_version,
            "runtime_version": device.runtime_summary,
        },
    )
    log.info("stored %s %s: %s", result.kernel, result.key.signature, result.best_config)
