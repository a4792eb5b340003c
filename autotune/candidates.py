"""Model-based samplers over the valid configurations (autotune.valid_set).

Optuna's own samplers propose points of the whole grid and know nothing of constraints: in the
recorded landscapes most of the grid is invalid, so proposals land on invalid or already
measured points and the loop has to substitute a neighbour. These samplers score valid,
unmeasured configurations with a surrogate model and propose the best one, so each proposal is
a new valid measurement. The first few proposals come before any model: the first at random,
each next one as far as possible from every configuration measured. Then one of two models:

- "tpe": a Parzen-estimator ratio l(x)/g(x) (as in TPE): how much more the fast configurations
  than the slow or failed ones crowd around x.
- "gp": a Gaussian process on log time (its slow half compressed: compress_slow) with a
  length scale per feature and expected improvement (autotune.gp, numpy and scipy; Optuna's
  GPSampler needs torch). Once GP_LATE_FROM timings exist it also sees the `late_features`
  (whether a block size is a power of two); from GP_EXPLOIT_FROM measurements on, every
  GP_EXPLOIT_EVERY-th proposal is the candidate it predicts fastest instead. Where more than
  GP_SCORED candidates are left it scores a random GP_SCORED of them and the neighbours of the
  fastest measured, then climbs from the best of those; so the cost of a proposal does not grow
  with the space, and a space too large to list (a drawn set) is searched the same way.

Failed configurations never enter the timing model; they lower the score of their
neighbourhood through an estimate of the chance of failing there (tpe: a kernel estimate; gp: a
second GP, fitted to ran/failed labels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import log
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from autotune import gp
from autotune.valid_set import ListedSet, Position, ValidSet

TPE_GAMMA = 0.15  # share of the measured configurations that model the fast region
TPE_BANDWIDTH = 0.15  # kernel width, in units of a whole ordered range
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
        candidates farthest from every measured one (among a random GP_SCORED when they are
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
        """GP_SCORED random valid configurations not `seen`, of a set that is not listed: those
        of the last proposal less the ones measured since, and GP_SCORED / 8 or more drawn anew
        in place of the oldest (each drawn one costs constraint checks)."""
        keep = np.array([r for r in self._pool.tolist() if tuple(r) not in seen], dtype=np.int64)
        keep = keep.reshape(len(keep), len(self.valid.sizes))
        k = max(GP_SCORED - len(keep), GP_SCORED // 8)
        new = self.valid.draw(self.rng, k, seen | set(map(tuple, keep.tolist())))
        self._pool = np.vstack([keep, new])[-GP_SCORED:]
        return self._pool


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


class GpSampler(CandidateSampler):
    """The "gp" model: a Gaussian process on log time, and one on ran/failed; its late features
    only from GP_LATE_FROM timings on."""

    def __init__(
        self,
        distributions: Mapping[str, BaseDistribution],
        valid: ValidSet,
        *,
        seed: int | None = None,
        n_startup: int,
    ) -> None:
        super().__init__(distributions, valid, seed=seed, n_startup=n_startup)
        self._gp: gp.Fit | None = None  # the last fits, of times and of failures: the next
        self._runs: gp.Fit | None = None  # ones start from them

    def _inputs(self, pos: np.ndarray, late: bool) -> np.ndarray:
        x = self.valid.features(pos)
        return np.hstack([x, self.valid.late_features(pos)]) if late else x

    def propose(
        self, seen: set[Position], ok: list[Position], times: list[float], failed: list[Position]
    ) -> Position | None:
        late = len(ok) >= GP_LATE_FROM
        x_ok = self._inputs(np.array(ok), late)
        start = _theta(self._gp, x_ok)
        refit = start is None or len(ok) < GP_REFIT_FROM or len(ok) % GP_REFIT_EVERY == 0
        self._gp = gp.fit(x_ok, compress_slow(np.log(times)), start, refit)
        if failed:
            x_all = np.vstack([x_ok, self._inputs(np.array(failed), late)])
            labels = np.r_[np.ones(len(ok)), np.zeros(len(failed))]
            start = _theta(self._runs, x_all)
            self._runs = gp.fit(x_all, labels, start, refit or start is None)
        after = len(ok) + len(failed) - GP_EXPLOIT_FROM  # measurements since the step began
        exploit = after >= 0 and after % GP_EXPLOIT_EVERY == 0
        runs = self._runs if failed else None

        def score(pos: np.ndarray) -> np.ndarray:
            return _gp_score(self._gp, runs, self._inputs(pos, late), exploit)

        listed = isinstance(self.valid, ListedSet)
        if listed and len(self.valid.unseen_rows(seen)) <= GP_SCORED:
            pool = self.valid.draw(self.rng, GP_SCORED, seen)  # all of them: exact
            return tuple(pool[int(np.argmax(score(pool)))].tolist()) if len(pool) else None
        sample = self.valid.draw(self.rng, GP_SCORED, seen) if listed else self._drawn(seen)
        taken = seen | set(map(tuple, sample.tolist()))
        fastest = [ok[i] for i in np.argsort(times, kind="stable")[:GP_NEAR_BEST]]
        near = self.valid.admit(np.vstack([self.valid.neighbours(p) for p in fastest]), taken)
        pool = np.vstack([sample, near])
        if not len(pool):
            return None
        return self._climb(pool, score(pool), score, taken | set(map(tuple, near.tolist())))

    def _climb(
        self,
        pool: np.ndarray,
        scores: np.ndarray,
        score: Callable[[np.ndarray], np.ndarray],
        taken: set[Position],
    ) -> Position:
        """The best-scoring configuration found by hill-climbing from the GP_CLIMB_STARTS best
        of `pool`, one parameter at a time: random candidates rarely include the best one in
        a large space, but usually one a few steps from it."""
        best = int(np.argmax(scores))
        best_pos, best_score = pool[best], scores[best]
        starts = np.argsort(-scores, kind="stable")[:GP_CLIMB_STARTS]
        here, here_score = pool[starts], scores[starts]
        for _ in range(GP_CLIMB_STEPS):
            blocks = []
            for p in here:  # unseen neighbours, scored before their validity is checked: the
                nb = [r for r in map(tuple, self.valid.neighbours(p).tolist()) if r not in taken]
                taken.update(nb)  # constraints are called only for those that would be moves
                blocks.append(np.array(nb, dtype=np.int64).reshape(len(nb), len(p)))
            sizes = [len(b) for b in blocks]
            if not sum(sizes):
                break
            s = score(np.vstack(blocks))
            moved, at = [], 0
            for i, n in enumerate(sizes):
                for j in at + np.argsort(-s[at : at + n], kind="stable"):
                    if s[j] <= here_score[i]:
                        break
                    if self.valid.is_valid(tuple(blocks[i][j - at].tolist())):
                        moved.append((blocks[i][j - at], s[j]))
                        break
                at += n
            if not moved:
                break
            here = np.array([m[0] for m in moved])
            here_score = np.array([m[1] for m in moved])
            top = int(np.argmax(here_score))
            if here_score[top] > best_score:
                best_pos, best_score = here[top], here_score[top]
        return tuple(best_pos.tolist())


def _theta(fit: gp.Fit | None, x: np.ndarray) -> np.ndarray | None:
    """The last fit's hyperparameters, to start the next fit from, if it had the same features."""
    return None if fit is None or fit.x.shape[1] != x.shape[1] else fit.theta


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


# Unmeasured candidates scored per proposal: when more are left, a seeded random GP_SCORED of
# them, the one-parameter neighbours of the GP_NEAR_BEST fastest measured, and a hill-climb from
# the GP_CLIMB_STARTS best scored (see _climb). Scoring every candidate of the 17,956 of
# clblast_gemm_RTX_3090 cost 80 ms a proposal at 200 trials (benchmarks/README.md).
GP_SCORED = 2_000
GP_NEAR_BEST = 3
GP_CLIMB_STARTS = 5
GP_CLIMB_STEPS = 10
# The GP's hyperparameters are fitted anew at every proposal until GP_REFIT_FROM timings exist,
# then at every GP_REFIT_EVERY-th; in between, the last ones are kept and only the new timings
# conditioned on. The fit was half the cost of a proposal at 200 timings (about 20 L-BFGS steps
# of O(n^3) each), and a few timings more move the optimum of 30 or more little.
GP_REFIT_FROM = 30
GP_REFIT_EVERY = 3
# Expected improvement counts only what beats the best time by more than 5%. Without the margin
# the search spent trials on 1% variations around a plateau (parameters that barely matter)
# while configurations several times faster lay elsewhere; with it, budget 50 and 100 gained
# about 0.01 on the recorded landscapes over 16 seeds (benchmarks/README.md).
GP_MIN_GAIN = log(1.05)
# The late features enter the GP once this many timings exist: whether a block size is a power
# of two can matter more than its size (on the recorded AMD landscapes 64 or 128 runs up to 100x
# faster than 48 or 96), but with fewer timings one more length scale to fit made the first
# proposals worse (budget 25: 0.843 with the feature from the start, 0.870 without).
GP_LATE_FROM = 20
# From GP_EXPLOIT_FROM measurements on, every GP_EXPLOIT_EVERY-th proposal is the candidate the
# GP predicts fastest instead of the one with the largest expected improvement. Expected
# improvement (with its margin) keeps spending trials where the model knows little; the
# occasional best guess searches further around the fastest configurations found. On seeds
# 0-7 and 8-15 at budgets 25 / 50 / 100: 0.904 / 0.952 / 0.980 and 0.893 / 0.943 / 0.980,
# against 0.906 / 0.945 / 0.976 and 0.891 / 0.941 / 0.966 without; from 10 measurements on,
# or every second proposal, was worse at 50 or 100 (benchmarks/README.md).
GP_EXPLOIT_FROM = 15
GP_EXPLOIT_EVERY = 3


def compress_slow(y: np.ndarray) -> np.ndarray:
    """Log times `y` as the GP models them: those above the median m become m + log(1 + y - m).

    In the recorded landscapes the slowest configurations run 10 to 100 times longer than the
    fastest (log times 2.3 to 4.6 apart) while what separates the fast ones is a few percent
    (a few hundredths). Fitted to plain log times, the GP spends its variance on the slow tail:
    its length scales follow where things are slow, and near the fastest its mean is flat. The
    fast half is kept as it is, so that expected improvement and its margin (GP_MIN_GAIN) still
    count in log time there; the slow half keeps its order, a time 100x the median stays slower
    than one 10x it, but weighs less. On the 18 recorded landscapes, 16 seeds, budgets 25 / 50 /
    100 / 200: 0.914 / 0.961 / 0.982 / 0.997 against 0.914 / 0.955 / 0.980 / 0.996 without.
    Chosen on seeds 0-7 (+0.011 / +0.008 / +0.008 / +0.004 there); on seeds 8-15, held out,
    only budget 50 gained (-0.010 / +0.004 / -0.003 / -0.001): a gain at 50, within the seed
    noise elsewhere. A threshold at the lower or the upper quartile did worse on seeds 0-7
    (benchmarks/README.md)."""
    m = float(np.median(y))
    return np.where(y > m, m + np.log1p(np.maximum(y - m, 0.0)), y)


def _gp_score(timing: gp.Fit, runs: gp.Fit | None, xs: np.ndarray, exploit: bool) -> np.ndarray:
    """log expected improvement on log time, plus the log chance of not failing; or, to
    `exploit`, minus the predicted log time. `runs` is a fit to 1 (ran) / 0 (failed) labels:
    regression on labels, a cheap stand-in for a GP classifier, whose length scales learn where
    failures start."""
    if exploit:
        score = -gp.posterior(timing, xs)[0]
    else:
        score = gp.log_expected_improvement(timing, xs, GP_MIN_GAIN)
    if runs is not None:
        p_runs = np.clip(gp.posterior(runs, xs)[0], 1e-3, 1.0)
        if not exploit:
            score = score + np.log(p_runs)
        # log EI far from every timing can exceed log EI near the best by hundreds, so no
        # factor would keep the search out of a region that fails: candidates likelier to
        # fail than to run only compete when nothing else is left
        likely = p_runs >= 0.5
        if likely.any():
            score = np.where(likely, score, -np.inf)
    return score
