"""Spaces too large to score every configuration at every proposal, or to list at all."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from autotune.errors import SpaceError
from autotune.search.loop import LISTED_UP_TO, _Encoding, make_sampler, run_search
from autotune.search.samplers.base import SCORED
from autotune.search.samplers.gp import GP_EXPLOIT_EVERY, GP_EXPLOIT_FROM, _gp_score
from autotune.search.valid_set import ListedSet
from autotune.signature import ArgSpec, Signature
from autotune.space import Param, Space
from autotune.trial import Evaluation

SIG = Signature((ArgSpec((64,), "float32"),))


def million() -> tuple[Space, list[int]]:
    """Six parameters of ten values each (10^6 configurations), half of them ruled out by a
    constraint that counts its calls."""
    calls = [0]

    def fits(config, sig):
        calls[0] += 1
        return config["a"] + config["b"] <= 9  # 55 of 100 (a, b) pairs

    params = tuple(Param(n, tuple(range(10))) for n in "abcdef")
    return Space(params, (fits,)), calls


def slope(config) -> float:
    """Three parameters decide (fastest at a=2, c=7, e=4), three barely matter (fastest at 0);
    the optimum, 1.0, is admitted by the constraint."""
    decisive = (config["a"] - 2) ** 2 + (config["c"] - 7) ** 2 + (config["e"] - 4) ** 2
    return 1.0 + decisive / 10 + (config["b"] + config["d"] + config["f"]) / 100


def test_a_space_of_a_million_configurations_is_searched_without_listing_it():
    space, calls = million()
    assert space.size == 10**6 > LISTED_UP_TO
    found = run_search(
        space, SIG, lambda c: Evaluation.of(c, slope(c)), n_trials=60, strategy="gp", seed=0
    )
    configs = [ev.config for ev in found]
    assert len(configs) == 60 and len({tuple(c.values()) for c in configs}) == 60
    assert all(c["a"] + c["b"] <= 9 for c in configs)
    # listing would check the constraint once per configuration; the search checked a few
    # per proposal
    assert calls[0] < 10**6 / 5
    # the optimum; 60 random valid configurations find 1.29 on average, 1.06 at best in 100 runs
    assert min(ev.value for ev in found) == 1.0


@pytest.mark.parametrize("strategy", ["tpe", "grid"])
def test_strategies_that_need_the_list_refuse_a_space_too_large_to_list(strategy):
    space, calls = million()
    with pytest.raises(SpaceError, match=f"strategy '{strategy}' needs every valid.*use 'gp'"):
        run_search(space, SIG, lambda c: Evaluation.of(c, 1.0), n_trials=5, strategy=strategy)
    assert calls[0] == 0


def test_a_large_space_whose_constraints_admit_nothing_is_a_clear_error():
    params = tuple(Param(n, tuple(range(10))) for n in "abcdef")
    space = Space(params, (lambda config, sig: False,))
    with pytest.raises(SpaceError, match="no configuration of the space fits .*constraints"):
        run_search(space, SIG, lambda c: Evaluation.of(c, 1.0), n_trials=5, strategy="gp")


def test_the_random_strategy_searches_a_space_too_large_to_list():
    space, calls = million()
    found = run_search(
        space, SIG, lambda c: Evaluation.of(c, slope(c)), n_trials=30, seed=1, strategy="random"
    )
    configs = [ev.config for ev in found]
    assert len({tuple(c.values()) for c in configs}) == 30
    assert all(c["a"] + c["b"] <= 9 for c in configs)  # invalid proposals were replaced
    assert calls[0] < 10**5


def test_sampled_scoring_proposes_the_best_scored_configuration_of_a_smooth_landscape():
    # 9,000 listed configurations, more than SCORED: each proposal scores a sample, the
    # neighbours of the fastest and a hill-climb, and on a smooth landscape still lands on the
    # configuration that scoring all of them would choose
    space = Space(
        (Param("x", tuple(range(30))), Param("y", tuple(range(30))), Param("z", tuple(range(10))))
    )
    valid = list(space.all_configs())
    assert len(valid) > SCORED
    vset = ListedSet(space, valid)
    enc = _Encoding(space)
    sampler = make_sampler("gp", 0, enc, vset)
    study = optuna.create_study(sampler=sampler)

    def time(c):
        return 1.0 + ((c["x"] - 21) / 10) ** 2 + ((c["y"] - 8) / 10) ** 2 + (c["z"] - 6) ** 2 / 25

    exact = []
    for n in range(30):
        trial = study.ask(enc.distributions)
        config = enc.decode(trial.params)
        if n >= 4:  # model-based: compare with the best of all unmeasured configurations
            measured = {tuple(enc.decode(t.params).values()) for t in study.trials[:-1]}
            rows = np.array([r for r in vset.rows if tuple(r) not in measured])
            after = n - GP_EXPLOIT_FROM
            exploit = after >= 0 and after % GP_EXPLOIT_EVERY == 0
            pos = np.array([vset.position(config), *rows])
            late = sampler._gp.x.shape[1] > vset.features(pos[:1]).shape[1]
            fit = sampler._gp  # no other devices: no prior mean, the cold search's best
            best = fit.y_mean + fit.y_std * float(fit.z.min())
            xs = sampler._inputs(pos, late)
            s = _gp_score(fit, None, xs, exploit, np.zeros(len(pos)), best)
            exact.append(s[0] >= s[1:].max() - 1e-9)
        study.tell(trial, time(config))
    assert min(t.value for t in study.trials) == 1.0  # the optimum, in 30 of 9,000
    assert np.mean(exact) >= 0.8, exact


def test_tuning_a_kernel_whose_space_holds_a_million_configurations_never_lists_it(tmp_path):
    import jax
    import jax.numpy as jnp

    import autotune

    space, calls = million()
    names = [p.name for p in space.params]

    def double(x, *, a=0, b=0, c=0, d=0, e=0, f=0):  # the knobs change nothing: cheap to compile
        return x * 2

    kernel = autotune.register(
        double,
        name="million_knobs",
        space={"common": {n: list(range(10)) for n in names}},
        constraints=list(space.constraints),
        defaults=dict.fromkeys(names, 0),
        reference=lambda x: x * 2,
    )
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    result = autotune.tune(kernel, [x], n_trials=4, finalists=0, db=str(tmp_path / "t.db"))
    # every config compiles to one program: measured once, then as many duplicates in a row
    # as the budget end the search (the space holds no more distinct programs)
    assert [t.status for t in result.trials] == ["ok"] + ["duplicate"] * 4
    assert "4 configurations tried compiled to programs measured already" in result.programs_note
    assert all(t.config["a"] + t.config["b"] <= 9 for t in result.trials)
    assert calls[0] < 10**5  # listing the space would check each of its 10^6 configurations
