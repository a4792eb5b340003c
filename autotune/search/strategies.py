"""The search strategies a tuning run can use: one table of name -> sampler constructor, and the
default. Importing it imports no Optuna, so that the CLI and job files check a strategy name
here; a constructor imports its sampler when a search calls it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Random proposals before a model takes over. Fixed (not a share of the budget) so that a run
# with budget n is the first n trials of a run with a larger budget, as the benchmark assumes.
# 4 rather than 8: on the recorded landscapes both models gain at every budget (see
# benchmarks/README.md); fewer than 4 leaves the GP too little to fit its length scales.
STARTUP_TRIALS = 4


def _tpe(distributions: Mapping[str, Any], valid: Any, seed: int | None, prior: Any = None) -> Any:
    from autotune.search.samplers.tpe import TpeSampler

    return TpeSampler(distributions, valid, seed=seed, n_startup=STARTUP_TRIALS)


def _gp(distributions: Mapping[str, Any], valid: Any, seed: int | None, prior: Any = None) -> Any:
    from autotune.search.samplers.gp import GpSampler

    return GpSampler(distributions, valid, seed=seed, n_startup=STARTUP_TRIALS, prior=prior)


def _cmaes(
    distributions: Mapping[str, Any], valid: Any, seed: int | None, prior: Any = None
) -> Any:
    import optuna

    from autotune.errors import SpaceError

    try:
        import cmaes  # noqa: F401
    except ImportError:
        raise SpaceError(
            "strategy 'cmaes' needs the cmaes package: pip install 'pallas-autotune[cmaes]', "
            "or use strategy 'tpe'"
        ) from None
    # CMA-ES models the ordered (integer) parameters; categories fall back to random
    return optuna.samplers.CmaEsSampler(
        seed=seed,
        n_startup_trials=STARTUP_TRIALS,
        independent_sampler=optuna.samplers.RandomSampler(seed=seed),
    )


def _random(
    distributions: Mapping[str, Any], valid: Any, seed: int | None, prior: Any = None
) -> Any:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


# name -> the constructor of its Optuna sampler, from the encoded parameters' distributions,
# the valid configurations (autotune.search.valid_set), the seed and other devices' results
# (autotune.search.transfer.Prior, or None; only "gp" models them, the others ignore them). "grid" has every valid
# configuration queued (autotune.search.run_search): its sampler is never asked.
SAMPLERS: dict[str, Callable[..., Any]] = {
    "tpe": _tpe,
    "gp": _gp,
    "cmaes": _cmaes,
    "random": _random,
    "grid": _random,
}
STRATEGIES = tuple(SAMPLERS)

# "gp" finds a better configuration than "tpe" at every budget on the recorded GPU landscapes
# (benchmarks/README.md), and its proposal (tens of ms) is cheap against a compile and a timing
DEFAULT_STRATEGY = "gp"
