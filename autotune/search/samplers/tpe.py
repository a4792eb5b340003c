"""The "tpe" model: a Parzen-estimator ratio l(x)/g(x) (as in TPE): how much more the fast
configurations than the slow or failed ones crowd around x. Failures lower the score of their
neighbourhood through a kernel estimate."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from optuna.distributions import BaseDistribution

from autotune.search.samplers.base import CandidateSampler
from autotune.search.valid_set import ListedSet, Position, ValidSet

TPE_GAMMA = 0.15  # share of the measured configurations that model the fast region
TPE_BANDWIDTH = 0.15  # kernel width, in units of a whole ordered range


class TpeSampler(CandidateSampler):
    """The "tpe" model: a Parzen-estimator ratio over every listed valid configuration."""

    def __init__(
        self,
        distributions: Mapping[str, BaseDistribution],
        valid: ValidSet,
        *,
        seed: int | None = None,
        n_startup: int,
    ) -> None:
        if not isinstance(valid, ListedSet):
            raise ValueError("the tpe model scores every valid configuration: list them")
        super().__init__(distributions, valid, seed=seed, n_startup=n_startup)

    def propose(
        self, seen: set[Position], ok: list[Position], times: list[float], failed: list[Position]
    ) -> Position | None:
        rows = self.valid.unseen_rows(seen)
        measured = [self.valid.index[p] for p in ok + failed]
        dist = np.stack([self._distances(i) for i in measured], axis=1)
        s = _tpe_score(dist, np.arange(len(ok)), np.log(np.asarray(times)), rows)
        return tuple(self.valid.rows[rows[int(np.argmax(s))]].tolist())


def _tpe_score(dist: np.ndarray, ok: np.ndarray, y: np.ndarray, unseen: np.ndarray) -> np.ndarray:
    """log l(x) - log g(x): l from the fastest measured, g from the rest and the failures.

    `dist[c, j]`: squared distance of candidate c to measurement j (the `ok` candidates with
    log times `y` first, then the failures)."""
    n_ok = len(ok)
    order = np.argsort(y, kind="stable")
    n_below = max(1, int(np.ceil(TPE_GAMMA * n_ok)))
    below = order[:n_below]
    above = np.concatenate([order[n_below:], np.arange(n_ok, dist.shape[1])])
    d = dist[unseen]
    h2 = 2 * TPE_BANDWIDTH**2
    l_dens = np.exp(-d[:, below] / h2).mean(axis=1)
    g_dens = np.exp(-d[:, above] / h2).mean(axis=1) if len(above) else 0.0
    prior = 1e-3  # a flat floor: far from every measurement the ratio tends to 1
    score = np.log(l_dens + prior) - np.log(g_dens + prior)
    if dist.shape[1] > n_ok:  # failures: a wider kernel estimate of the chance that x runs
        wide = 2 * (2 * TPE_BANDWIDTH) ** 2
        near_ok = np.exp(-d[:, :n_ok] / wide).sum(axis=1)
        near_fail = np.exp(-d[:, n_ok:] / wide).sum(axis=1)
        score += np.log((near_ok + 1.0) / (near_ok + near_fail + 2.0))
    return score
