"""The Optuna search loop: it proposes configurations, an `evaluate` callback measures them.

Search never knows how a configuration is measured (a device, a worker, a recorded landscape),
only its objective value or that it failed. Only distinct, valid configurations cost budget:
a proposal that breaks a constraint, or repeats one already measured, is told to the sampler
without measuring and replaced by the nearest valid unmeasured configuration, so the loop
always progresses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.errors import SpaceError
from autotune.signature import Signature
from autotune.space import Space

log = logging.getLogger(__name__)
STRATEGIES = ("tpe", "random", "grid")
HEARTBEAT_S = 30  # a shared study's running trial whose worker is silent 3x this long is failed
# Heartbeats are how a shared study releases the claims of dead workers; Optuna marks them
# experimental and meant for Study.optimize, which an ask/tell loop cannot use: say it once here.
for _message in ("Argument ``heartbeat_interval``", ".*fail_stale_trials is experimental"):
    warnings.filterwarnings(
        "ignore", message=_message, category=optuna.exceptions.ExperimentalWarning
    )
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


@dataclass(frozen=True)
class Evaluation:
    """What `evaluate` reports: the objective (lower is better) or None for a failure."""

    config: dict[str, Any]
    value: float | None
    status: str = "ok"
    detail: Any = None  # the caller's own record (e.g. the full trial)


def _config_id(config: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, type(v).__name__, v) for k, v in config.items()))


class _Encoding:
    """Maps configs to Optuna parameters: ordered parameters by index into their sorted
    candidates (so the sampler sees neighbours as neighbours), others as categories."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.distributions: dict[str, BaseDistribution] = {}
        for p in space.params:
            if p.ordered:
                self.distributions[p.name] = IntDistribution(0, len(p.values) - 1)
            else:
                self.distributions[p.name] = CategoricalDistribution(list(p.values))

    def decode(self, params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for p in self.space.params:
            v = params[p.name]
            out[p.name] = p.values[v] if p.ordered else v
        return out

    def encode(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            p.name: (p.values.index(config[p.name]) if p.ordered else config[p.name])
            for p in self.space.params
        }

    def coords(self, config: Mapping[str, Any]) -> list[float]:
        """Position in the unit cube, for nearest-neighbour replacement of a proposal."""
        out = []
        for p in self.space.params:
            i = p.values.index(config[p.name])
            out.append(i / (len(p.values) - 1) if len(p.values) > 1 else 0.0)
        return out


def make_sampler(strategy: str, seed: int | None, n_trials: int) -> optuna.samplers.BaseSampler:
    if strategy == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=max(3, min(10, n_trials // 4)), multivariate=True
        )
    if strategy in (
        "random",
        "grid",
    ):  # grid: every valid config is enqueued; the sampler is unused
        return optuna.samplers.RandomSampler(seed=seed)
    raise SpaceError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")


def run_search(
    space: Space,
    sig: Signature,
    evaluate: Callable[[dict[str, Any]], Evaluation],
    *,
    n_trials: int,
    strategy: str = "tpe",
    seed: int | None = None,
    initial: Iterable[Mapping[str, Any]] = (),
    valid: list[dict[str, Any]] | None = None,
    storage: str | None = None,
    study_name: str | None = None,
) -> list[Evaluation]:
    """Measure up to `n_trials` distinct valid configurations; returns them in order.

    When the valid space is no larger than the budget it is searched exhaustively. `initial`
    configurations (warm starts, the default) are measured first.

    With `storage` (an Optuna RDB URL) the study `study_name` is created or resumed there:
    configurations it already measured are not measured again and count against `n_trials`,
    which is then the budget of the whole study, shared by every worker that joins it. The
    result then holds every measured trial of the study (Evaluation.detail as stored), and
    `evaluate`'s `detail` must be JSON-serialisable.
    """
    if n_trials < 1:
        raise SpaceError(f"n_trials must be at least 1, got {n_trials}")
    sampler = make_sampler(strategy, seed, n_trials)
    valid = space.valid_configs(sig) if valid is None else valid
    if not valid:
        raise SpaceError(f"no configuration of the space fits {sig.text} on {sig.platform}")
    budget = min(n_trials, len(valid))
    enc = _Encoding(space)
    valid_ids = {_config_id(c): i for i, c in enumerate(valid)}
    coords = np.array([enc.coords(c) for c in valid])
    unseen = np.ones(len(valid), dtype=bool)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shared = _SharedStudy(storage, study_name, sampler) if storage else None
    study = shared.study if shared else optuna.create_study(direction="minimize", sampler=sampler)
    first = [dict(c) for c in initial if _config_id(c) in valid_ids]
    if strategy == "grid" or len(valid) <= n_trials:
        order = list(valid)
        if strategy != "grid":  # exhaustive anyway; a seeded order finds good ones early on average
            random.Random(seed).shuffle(order)
        first += order
    queued = set()
    for c in first:
        if _config_id(c) not in queued:
            queued.add(_config_id(c))
            # skip_if_exists: workers joining a shared study do not queue the same list again
            study.enqueue_trial(enc.encode(c), skip_if_exists=shared is not None)

    results: list[Evaluation] = []
    measured: dict[tuple, Evaluation] = {}
    claimed: set[tuple] = set()  # configs other live workers are measuring now
    while True:
        if shared:
            measured, claimed = shared.refresh(enc)
            for cid in (*measured, *claimed):
                if cid in valid_ids:
                    unseen[valid_ids[cid]] = False
        if len(measured) + len(claimed) >= budget or not unseen.any():
            break
        trial = study.ask(enc.distributions)
        config = enc.decode(trial.params)
        cid = _config_id(config)
        index = valid_ids.get(cid)
        fresh = index is not None and cid not in measured and cid not in claimed
        if shared and fresh and shared.taken(trial, cid, enc):
            # another worker claimed it at the same moment; neither measures twice (see taken).
            # Queue it again after a random pause, so two workers that both gave it up fall
            # out of step (the one that finds the other measuring it moves on).
            study.tell(trial, state=TrialState.FAIL)
            time.sleep(random.uniform(0.0, 0.5))
            study.enqueue_trial(enc.encode(config))
            continue
        if index is None or cid in measured or cid in claimed:
            # invalid: bad region for the sampler; a repeat: already known, not new evidence
            study.tell(trial, state=TrialState.PRUNED if index is None else TrialState.FAIL)
            study.enqueue_trial(
                enc.encode(_nearest_unseen(valid, coords, unseen, enc.coords(config)))
            )
            continue
        with shared.heartbeat(trial) if shared else contextlib.nullcontext():
            ev = evaluate(config)
        unseen[index] = False
        measured[cid] = ev
        results.append(ev)
        if shared:
            trial.set_user_attr("status", ev.status)
            trial.set_user_attr("detail", ev.detail)
        if ev.value is None:  # failures teach "not here" without a fake timing
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, ev.value)
    if shared:  # every worker's trials, once those still being measured are in
        measured, claimed = shared.refresh(enc)
        while claimed:
            time.sleep(0.5)
            measured, claimed = shared.refresh(enc)
        return list(measured.values())
    return results


def _nearest_unseen(
    valid: list[dict], coords: np.ndarray, unseen: np.ndarray, point: list[float]
) -> dict:
    d = np.abs(coords - np.asarray(point)).sum(axis=1)
    d[~unseen] = np.inf
    return valid[int(np.argmin(d))]  # argmin: the first of equals, so seeded runs repeat


class _SharedStudy:
    """A study in an Optuna RDB storage that several workers (and a resumed run) share.

    Claims: Optuna writes a trial's parameters to the storage when it is asked for, so a
    RUNNING trial is a claim on its configuration that every worker can see. A worker that
    finds another live claim on the configuration it was just given gives it up (see `taken`).
    Claims of dead workers are released: at once for a dead process on this host, and after
    missed heartbeats for other hosts.
    """

    def __init__(self, storage: str, study_name: str | None, sampler: Any) -> None:
        if not study_name:
            raise SpaceError("a study in a storage needs a study_name")
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        for attempt in range(5):
            try:
                self.storage = optuna.storages.RDBStorage(
                    _optuna_url(storage),
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=3 * HEARTBEAT_S,
                )
                break
            except sqlalchemy.exc.SQLAlchemyError:
                # workers starting together race to create Optuna's tables: the loser retries
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        self.study = optuna.create_study(
            storage=self.storage,
            study_name=study_name,
            direction="minimize",
            sampler=sampler,
            load_if_exists=True,
        )

    def refresh(self, enc: _Encoding) -> tuple[dict[tuple, Evaluation], set[tuple]]:
        """The study's measured configs (first measurement of each) and live claims."""
        self._release_dead()
        measured: dict[tuple, Evaluation] = {}
        claimed: set[tuple] = set()
        for t in self.study.get_trials(deepcopy=False):
            if (
                t.state == TrialState.RUNNING
                and "worker" in t.user_attrs  # a claim whose owner can be found dead (see taken)
                and t.params.keys() == enc.distributions.keys()
            ):
                claimed.add(_config_id(enc.decode(t.params)))
            elif t.state in (TrialState.COMPLETE, TrialState.PRUNED) and "status" in t.user_attrs:
                cid = _config_id(enc.decode(t.params))
                measured.setdefault(
                    cid,
                    Evaluation(
                        enc.decode(t.params),
                        t.value if t.state == TrialState.COMPLETE else None,
                        t.user_attrs["status"],
                        t.user_attrs.get("detail"),
                    ),
                )
        return measured, claimed - set(measured)

    def taken(self, trial: optuna.Trial, cid: tuple, enc: _Encoding) -> bool:
        """Whether another worker holds a claim on this trial's config.

        Set-then-check: our parameters are committed (by ask) before we look, so of two workers
        given one config at the same moment, at least the later to commit sees the other. Both
        may see each other and both give it up (a wasted ask, never a duplicate measurement);
        the config stays unmeasured and can be proposed again.
        """
        trial.set_user_attr("worker", self.worker)
        self.storage.record_heartbeat(trial._trial_id)  # from now on a dead owner is detected
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if (
                t.number != trial.number
                and t.params.keys() == enc.distributions.keys()
                and _config_id(enc.decode(t.params)) == cid
            ):
                return True
        return False

    def heartbeat(self, trial: optuna.Trial) -> _Heartbeat:
        return _Heartbeat(self.storage, trial._trial_id)

    def _release_dead(self) -> None:
        optuna.storages.fail_stale_trials(self.study)
        host = socket.gethostname()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker_host, _, pid = str(t.user_attrs.get("worker", "")).partition(":")
            if worker_host == host and pid.isdigit() and not _alive(int(pid)):
                # another worker may have released it first
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)


class _Heartbeat:
    """Records the trial's heartbeat while its configuration is measured."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            self.storage.record_heartbeat(self.trial_id)
            if self.stop.wait(HEARTBEAT_S):
                return

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _optuna_url(url: str) -> str:
    """Optuna's storage takes SQLAlchemy URLs; PostgreSQL through psycopg 3 (the postgres extra)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        from pathlib import Path

        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url
