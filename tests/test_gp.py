"""The "gp" strategy's Gaussian process (autotune.search.gp) on synthetic data."""

import numpy as np
from scipy.optimize import approx_fprime
from scipy.stats import spearmanr

from autotune.search import gp


def test_the_posterior_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, z = rng.random((25, 3)), rng.standard_normal(25)
    diff2 = (x.T[:, :, None] - x.T[:, None, :]) ** 2
    theta = np.array([-0.5, 0.2, -1.0, 0.3, np.log(0.05)])
    _, grad = gp._neg_log_posterior(theta, z, diff2)
    numeric = approx_fprime(theta, lambda t: gp._neg_log_posterior(t, z, diff2)[0], 1e-6)
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-4)


def test_a_feature_that_does_not_matter_gets_a_long_length_scale():
    rng = np.random.default_rng(1)
    x = rng.random((40, 2))
    fit = gp.fit(x, np.sin(4 * x[:, 0]) + 0.01 * rng.standard_normal(40))
    relevant, irrelevant = fit.scales
    assert irrelevant > 5 * relevant


def test_expected_improvement_prefers_the_unmeasured_side_of_the_best():
    x = np.linspace(0, 0.6, 7)[:, None]  # time falls towards x = 1, measured up to 0.6
    fit = gp.fit(x, -2.0 * x[:, 0])
    log_ei = gp.log_expected_improvement(fit, np.array([[0.1], [0.3], [0.8]]))
    assert log_ei[2] > log_ei[1] > log_ei[0]


def test_log_expected_improvement_keeps_ranking_where_ei_underflows():
    x = np.linspace(0, 1, 9)[:, None]
    fit = gp.fit(x, (x[:, 0] - 0.5) ** 2)  # well measured: EI is below 1e-300 far from 0.5
    log_ei = gp.log_expected_improvement(fit, np.array([[0.47], [0.2], [0.05], [0.01]]))
    assert np.all(np.isfinite(log_ei)) and log_ei[3] < -700
    assert log_ei[0] > log_ei[1] > log_ei[2]


def test_a_margin_costs_a_small_sure_gain_more_than_an_uncertain_one():
    # a plateau of near-equal times at 0.4-0.5, slower towards 0; nothing measured beyond 0.5
    x = np.array([0.0, 0.1, 0.2, 0.40, 0.42, 0.44, 0.46, 0.48, 0.5])[:, None]
    fit = gp.fit(x, np.log([8.0, 6.0, 4.0, 1.0, 1.002, 0.999, 1.001, 1.0, 1.002]))
    near, far = np.array([[0.45]]), np.array([[1.0]])
    drop = [
        gp.log_expected_improvement(fit, c)[0]
        - gp.log_expected_improvement(fit, c, np.log(1.05))[0]
        for c in (near, far)
    ]
    assert drop[0] > 100 and 0 < drop[1] < 1


def test_a_dozen_timings_in_seven_dimensions_rank_the_unmeasured_points():
    # three parameters matter (a bowl, or a product plus a term), four do not; with a fixed
    # length-scale prior of half the range the fits ranked 2,000 unmeasured points at a rank
    # correlation of 0.85 and 0.87 on average (0.66 at worst); with one growing as sqrt(d), 0.95
    # and 0.98
    def bowl(x):
        return ((x[:, :3] - 0.3) ** 2) @ np.array([3.0, 2.0, 1.0])

    def product(x):
        return 3.0 * x[:, 0] * x[:, 1] + x[:, 2]

    for truth in (bowl, product):
        rhos = []
        for seed in range(4):
            rng = np.random.default_rng(seed)
            x, xs = rng.random((12, 7)), rng.random((2000, 7))
            mean = gp.posterior(gp.fit(x, truth(x)), xs)[0]
            rhos.append(spearmanr(mean, truth(xs)).statistic)
        assert np.mean(rhos) > 0.93, (truth.__name__, rhos)
