"""The "gp" model (the default): a Gaussian process on log time (its slow half compressed:
compress_slow) with a length scale per feature and expected improvement (autotune.search.gp,
numpy and scipy; Optuna's GPSampler needs torch). Once GP_LATE_FROM timings exist it also sees
the `late_features` (whether a block size is a power of two); from GP_EXPLOIT_FROM measurements
on, every GP_EXPLOIT_EVERY-th proposal is the candidate it predicts fastest instead. Where more
than SCORED candidates are left it scores a random SCORED of them and the neighbours of the
fastest measured, then climbs from the best of those; so the cost of a proposal does not grow
with the space, and a space too large to list (a drawn set) is searched the same way. Failures
lower the score of their neighbourhood through a second GP, fitted to ran/failed labels."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import log

import numpy as np
from optuna.distributions import BaseDistribution

from autotune.search import gp, transfer
from autotune.search.samplers.base import SCORED, CandidateSampler
from autotune.search.transfer import Prior
from autotune.search.valid_set import ListedSet, Position, ValidSet

# Unmeasured candidates scored per proposal: when more than SCORED are left, a seeded random
# SCORED of them, the one-parameter neighbours of the GP_NEAR_BEST fastest measured, and a
# hill-climb from the GP_CLIMB_STARTS best scored (see _climb).
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
# With other devices' results (autotune.search.transfer), the unmeasured configurations their
# prior mean ranks fastest are scored too, this many: a random sample of a large space holds
# few of them.
GP_PRIOR_BEST = 200
# With other devices' results, every GP_COLD_EVERY-th proposal is the cold model's (fitted to
# the same timings without the others' prior mean): insurance against a device whose optimum
# lies where the others are slow. Without it convolution_milo_A100 (an isolated optimum the
# others do not share; 0.908 at 100 trials cold) stayed at 0.679 of it on all of seeds 0-7;
# turning the prior off after 8 trials without improvement kept it there too (the data by then
# all lie where the others are fast), while a cold proposal every third measurement from the
# start reached 0.880 (every second 0.780; 4 spread start-up points after the leads 0.731, with
# every third cold 0.841). On the six convolution_milo landscapes, seeds 0-7, at 10 / 25 / 50 /
# 100 trials: every third 0.910 / 0.926 / 0.938 / 0.980, never 0.910 / 0.930 / 0.942 / 0.947,
# cold 0.713 / 0.866 / 0.935 / 0.976 (benchmarks/README.md).
GP_COLD_EVERY = 3


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
        prior: Prior | None = None,
    ) -> None:
        super().__init__(distributions, valid, seed=seed, n_startup=n_startup)
        self.prior = prior  # other devices' results (autotune.search.transfer), or None
        self._gp: gp.Fit | None = None  # the last fits, of times and of failures: the next
        self._runs: gp.Fit | None = None  # ones start from them
        self._fits: dict[bool, gp.Fit] = {}  # the last fit with a prior mean, and without

    def _inputs(self, pos: np.ndarray, late: bool) -> np.ndarray:
        x = self.valid.features(pos)
        return np.hstack([x, self.valid.late_features(pos)]) if late else x

    def propose(
        self, seen: set[Position], ok: list[Position], times: list[float], failed: list[Position]
    ) -> Position | None:
        late = len(ok) >= GP_LATE_FROM
        x_ok = self._inputs(np.array(ok), late)
        y = compress_slow(np.log(times))
        # with other devices' results, every GP_COLD_EVERY-th proposal is the cold model's
        cold_turn = (len(ok) + len(failed)) % GP_COLD_EVERY == 0
        mean = self._prior_mean(np.array(ok), y, cold_turn)
        with_prior = self._mean_weights is not None
        start = _theta(self._fits.get(with_prior), x_ok)
        refit = start is None or len(ok) < GP_REFIT_FROM or len(ok) % GP_REFIT_EVERY == 0
        self._gp = gp.fit(x_ok, y - mean(np.array(ok)), start, refit)
        self._fits[with_prior] = self._gp
        # the fastest log time, as the fit holds it where no prior mean is subtracted (the
        # cold search, to the last bit)
        best = (
            float(y.min())
            if self._mean_weights is not None
            else self._gp.y_mean + self._gp.y_std * float(self._gp.z.min())
        )
        if failed:
            x_all = np.vstack([x_ok, self._inputs(np.array(failed), late)])
            labels = np.r_[np.ones(len(ok)), np.zeros(len(failed))]
            start = _theta(self._runs, x_all)
            self._runs = gp.fit(x_all, labels, start, refit or start is None)
        after = len(ok) + len(failed) - GP_EXPLOIT_FROM  # measurements since the step began
        exploit = after >= 0 and after % GP_EXPLOIT_EVERY == 0
        runs = self._runs if failed else None

        def score(pos: np.ndarray) -> np.ndarray:
            return _gp_score(self._gp, runs, self._inputs(pos, late), exploit, mean(pos), best)

        listed = isinstance(self.valid, ListedSet)
        if listed and len(self.valid.unseen_rows(seen)) <= SCORED:
            pool = self.valid.draw(self.rng, SCORED, seen)  # all of them: exact
            return tuple(pool[int(np.argmax(score(pool)))].tolist()) if len(pool) else None
        sample = self.valid.draw(self.rng, SCORED, seen) if listed else self._drawn(seen)
        taken = seen | set(map(tuple, sample.tolist()))
        fastest = [ok[i] for i in np.argsort(times, kind="stable")[:GP_NEAR_BEST]]
        near = self.valid.admit(np.vstack([self.valid.neighbours(p) for p in fastest]), taken)
        pool = np.vstack([sample, near, self._prior_best(taken)])
        if not len(pool):
            return None
        return self._climb(pool, score(pool), score, taken | set(map(tuple, near.tolist())))

    def _prior_mean(
        self, ok: np.ndarray, y: np.ndarray, cold_turn: bool
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The GP's prior mean at positions: 0 without other devices' results or on a
        `cold_turn`, else their agreement-weighted relative log times times a slope fitted to
        `y` (see autotune.search.transfer)."""
        self._mean_weights, self._slope = None, 0.0
        if self.prior is None or cold_turn:
            return lambda pos: np.zeros(len(pos))
        w = self.prior.weights(ok, y)
        if w.sum() <= 0:  # no device agrees with this one: the cold model
            return lambda pos: np.zeros(len(pos))
        w = w / w.sum()
        slope = transfer.slope(self.prior.matrix(ok) @ w, y)
        self._mean_weights, self._slope = w, slope
        return lambda pos: slope * (self.prior.matrix(pos) @ w)

    def _prior_best(self, taken: set[Position]) -> np.ndarray:
        """The unmeasured positions the prior mean ranks fastest, GP_PRIOR_BEST of them, to be
        scored beside the random sample (none without a prior, or once it has no weight)."""
        empty = np.zeros((0, len(self.valid.sizes)), dtype=np.int64)
        if self.prior is None or self._mean_weights is None or not self._slope:
            return empty
        order = np.argsort(self.prior.known_values @ self._mean_weights, kind="stable")
        out = []
        for i in order:
            pos = tuple(self.prior.known[i].tolist())
            if pos not in taken:
                out.append(self.prior.known[i])
                if len(out) == GP_PRIOR_BEST:
                    break
        return np.array(out, dtype=np.int64).reshape(len(out), len(self.valid.sizes))

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


def _gp_score(
    timing: gp.Fit,
    runs: gp.Fit | None,
    xs: np.ndarray,
    exploit: bool,
    mean: np.ndarray,
    best: float,
) -> np.ndarray:
    """log expected improvement on log time below `best`, plus the log chance of not failing;
    or, to `exploit`, minus the predicted log time. `timing` is fitted to the log times less a
    prior `mean` (0 without other devices' results), added back here. `runs` is a fit to 1
    (ran) / 0 (failed) labels: regression on labels, a cheap stand-in for a GP classifier,
    whose length scales learn where failures start."""
    mu, sd = gp.posterior(timing, xs)
    mu = mu + mean
    score = -mu if exploit else gp.log_ei(mu, sd, best - GP_MIN_GAIN)
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
