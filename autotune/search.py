"""The Optuna search loop: it proposes configurations, an `evaluate` callback measures them.

Search never knows how a configuration is measured (a device, a worker, a recorded landscape),
only its objective value or that it failed. Only distinct, valid configurations cost budget:
a proposal that breaks a constraint, or repeats one already measured, is told to the sampler
without measuring and replaced by the nearest valid unmeasured configuration, so the loop
always progresses.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.errors import SpaceError
from autotune.signature import Signature
from autotune.space import Space

log = logging.getLogger(__name__)
STRATEGIES = ("tpe", "random", "grid")


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
) -> list[Evaluation]:
    """Measure up to `n_trials` distinct valid configurations; returns them in order.

    When the valid space is no larger than the budget it is searched exhaustively. `initial`
    configurations (warm starts, the default) are measured first.
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
    study = optuna.create_study(direction="minimize", sampler=sampler)
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
            study.enqueue_trial(enc.encode(c))

    results: list[Evaluation] = []
    measured: dict[tuple, Evaluation] = {}
    while len(results) < budget:
        trial = study.ask(enc.distributions)
        config = enc.decode(trial.params)
        cid = _config_id(config)
        index = valid_ids.get(cid)
        if index is None or cid in measured:
            # invalid: bad region for the sampler; a repeat: already known, not new evidence
            study.tell(trial, state=TrialState.PRUNED if index is None else TrialState.FAIL)
            study.enqueue_trial(
                enc.encode(_nearest_unseen(valid, coords, unseen, enc.coords(config)))
            )
            continue
        ev = evaluate(config)
        unseen[index] = False
        measured[cid] = ev
        results.append(ev)
        if ev.value is None:  # failures teach "not here" without a fake timing
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, ev.value)
    return results


def _nearest_unseen(
    valid: list[dict], coords: np.ndarray, unseen: np.ndarray, point: list[float]
) -> dict:
    d = np.abs(coords - np.asarray(point)).sum(axis=1)
    d[~unseen] = np.inf
    return valid[int(np.argmin(d))]  # argmin: the first of equals, so seeded runs repeat
