"""The base of the model-based samplers over the valid configurations
(autotune.search.valid_set), one model per module beside it: tpe.py, gp.py.

Optuna's own samplers propose points of the whole grid and know nothing of constraints: in the
recorded landscapes most of the grid is invalid, so proposals land on invalid or already
measured points and the loop has to substitute a neighbour. These samplers score valid,
unmeasured configurations with a surrogate model and propose the best one, so each proposal is
a new valid measurement. The first few proposals come before any model: the first at random,
each next one as far as possible from every configuration measured (CandidateSampler); then
the model's (`propose`). Failed configurations never enter the timing model; each model lowers
the score of their neighbourhood.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from autotune.search.valid_set import ListedSet, Position, ValidSet

# Unmeasured candidates a proposal looks at when the valid set is not listed (a drawn set), and
# how many the GP scores when more are left (see GpSampler.propose). Scoring every candidate of
# the 17,956 of clblast_gemm_RTX_3090 cost 80 ms a proposal at 200 trials (benchmarks/README.md).
SCORED = 2_000
_SEEN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


class CandidateSampler(BaseSampler):
    """Proposes the unmeasured valid configuration with the best score of a model (`propose`,
    one subclass per model); for the first `n_startup` timings, one far from those measured.
    `valid` holds the configurations, their positions and model inputs."""

    def __init__(
        self,
        distributions: Mapping[str, BaseDistribution],
        valid: ValidSet,
        *,
        seed: int | None = None,
        n_startup: int,
    ) -> None:
        self.distributions = dict(distributions)
        self.valid = valid
        self.n_startup = n_startup
        self.rng = np.random.default_rng(seed)
        self.fallback = RandomSampler(seed=seed)
        if isinstance(valid, ListedSet):
            self.features = valid.features(valid.rows)  # of every listed one, for distances
        self._pool = np.zeros((0, len(valid.sizes)), dtype=np.int64)  # see _drawn
        self._dist_cols: dict[int, np.ndarray] = {}  # squared distances of all to row i

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()
        self.fallback.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if search_space.keys() != self.distributions.keys():
            return {}
        seen: set[Position] = set()
        ok, times, failed = [], [], []
        for t in study.get_trials(deepcopy=False, states=_SEEN):
            if t.number == trial.number:
                continue
            pos = self.valid.from_params(t.params)
            if pos is None or not self.valid.is_valid(pos):  # an invalid proposal: not a candidate
                continue
            seen.add(pos)  # running trials too: parallel workers should not repeat them
            if t.state == TrialState.COMPLETE and t.value is not None and t.value > 0:
                ok.append(pos)
                times.append(t.value)
            elif t.state == TrialState.PRUNED:
                failed.append(pos)
        if self.valid.count is not None and len(seen) >= self.valid.count:
            return {}
        if len(ok) < self.n_startup:
            pos = self._spread(seen, ok + failed)
        else:
            pos = self.propose(seen, ok, times, failed)
        return {} if pos is None else self.valid.to_params(pos)

    def propose(
        self, seen: set[Position], ok: list[Position], times: list[float], failed: list[Position]
    ) -> Position | None:
        """The model's best unseen candidate, from the timings `times` of `ok` and the
        `failed` ones (None: nothing left)."""
        raise NotImplementedError

    def _spread(self, seen: set[Position], measured: list[Position]) -> Position | None:
        """A start-up candidate: at random while nothing is measured, then one of the unseen
        candidates farthest from every measured one (among a random SCORED when they are
        not listed). A model fitted to a handful of points learns the most from points spread
        over the space (seeds 0-15 at budget 25: 0.899 against 0.867 with random start-up
        points, benchmarks/README.md)."""
        if isinstance(self.valid, ListedSet):
            unseen = self.valid.unseen_rows(seen)
            if not measured:
                i = int(self.rng.choice(unseen))
            else:
                rows = [self.valid.index[p] for p in measured]
                gap = np.min([self._distances(j)[unseen] for j in rows], axis=0)
                i = int(self.rng.choice(unseen[gap == gap.max()]))
            return tuple(self.valid.rows[i].tolist())
        pool = self._drawn(seen)
        if not len(pool):
            return None
        if not measured:
            return tuple(pool[0].tolist())
        x, at = self.valid.features(pool), self.valid.features(np.array(measured))
        gap = np.min([((x - a) ** 2).sum(axis=1) for a in at], axis=0)
        return tuple(pool[int(self.rng.choice(np.flatnonzero(gap == gap.max())))].tolist())

    def _distances(self, i: int) -> np.ndarray:
        col = self._dist_cols.get(i)
        if col is None:
            col = ((self.features - self.features[i]) ** 2).sum(axis=1)
            self._dist_cols[i] = col
        return col

    def _drawn(self, seen: set[Position]) -> np.ndarray:
        """SCORED random valid configurations not `seen`, of a set that is not listed: those
        of the last proposal less the ones measured since, and SCORED / 8 or more drawn anew
        in place of the oldest (each drawn one costs constraint checks)."""
        keep = np.array([r for r in self._pool.tolist() if tuple(r) not in seen], dtype=np.int64)
        keep = keep.reshape(len(keep), len(self.valid.sizes))
        k = max(SCORED - len(keep), SCORED // 8)
        new = self.valid.draw(self.rng, k, seen | set(map(tuple, keep.tolist())))
        self._pool = np.vstack([keep, new])[-SCORED:]
        return self._pool
