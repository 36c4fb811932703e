"""``common.tuning.tune_grid``: self-extending grids, natural bounds, the one-SE rule, and model selection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge

from icml24.common.tuning import repick, select_models, tune_grid, tuning_check

GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)


def _curve(f, noise: float = 0.01, n: int = 5):
    """An evaluator returning ``n`` replicate scores of ``f(value)`` plus per-replicate noise shared by every value
    (replicates are seeds: paired across the grid); logs its calls."""
    calls: list[list[float]] = []

    def evaluate(values):
        calls.append(list(values))
        return [[f(v) + noise * e for e in np.random.default_rng(7).standard_normal(n)] for v in values]
    return evaluate, calls


def test_a_flat_curve_never_extends_and_picks_the_centre():
    evaluate, calls = _curve(lambda v: 1.0)
    t = tune_grid(evaluate, GRID)
    assert calls == [list(GRID)] and t.extensions == [] and t.value == pytest.approx(0.1) and t.ok


def test_a_monotone_curve_extends_twice_by_the_grid_ratio_and_stops():
    evaluate, calls = _curve(lambda v: math.log10(v))  # higher is always better: the optimum is beyond the grid
    t = tune_grid(evaluate, GRID, max_extra=2)
    assert t.extensions == pytest.approx([100.0, 1000.0]) and calls[1:] == [[pytest.approx(100.0)],
                                                                           [pytest.approx(1000.0)]]
    assert t.value == pytest.approx(1000.0) and t.edge == "high" and not t.ok
    c = tuning_check(name="lr inside its grid", tuned=t, arm="sgd")
    assert c.kind == "sanity" and not c.passed and "non-natural edge" in c.detail
    # a loss (minimise) that keeps falling toward small values extends downward
    t = tune_grid(_curve(lambda v: math.log10(v))[0], GRID, maximize=False, max_extra=1)
    assert t.extensions == pytest.approx([1e-4]) and t.edge == "low"


def test_an_extension_that_finds_an_interior_optimum():
    evaluate, _ = _curve(lambda v: -(math.log10(v) - 1.6) ** 2)  # optimum at 10**1.6, past the top
    t = tune_grid(evaluate, GRID, max_extra=3)
    assert t.extensions == pytest.approx([100.0, 1000.0]) and t.value == pytest.approx(100.0)
    assert t.edge is None and t.ok and tuning_check(name="c", tuned=t).passed
    # a linear grid extends by its step
    evaluate, _ = _curve(lambda v: -(v - 5.5) ** 2, noise=0.0)
    t = tune_grid(evaluate, (1, 2, 3, 4), log=False, max_extra=3, integer=True)
    assert t.extensions == [5.0, 6.0] and t.value == 5.0 and t.ok  # tie 5 vs 6: the one nearer the centre


def test_an_edge_within_one_standard_error_of_its_neighbour_does_not_extend():
    evaluate, calls = _curve(lambda v: 0.001 * math.log10(v), noise=0.05)
    t = tune_grid(evaluate, GRID)
    assert len(calls) == 1 and t.extensions == [] and t.edge is None
    # the same curve measured without noise is evidence: it extends
    assert tune_grid(_curve(lambda v: 0.001 * math.log10(v), noise=0.0)[0], GRID).extensions


def test_a_natural_bound_is_a_legitimate_pick_and_the_arm_equals_the_named_arm():
    # ridge strength: its low limit is ordinary least squares; here the data prefer no regularisation at all
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 5))
    y = x @ rng.standard_normal(5) + 0.01 * rng.standard_normal(200)
    xv = rng.standard_normal((100, 5))
    yv = xv @ np.linalg.lstsq(x, y, rcond=None)[0]

    def evaluate(alphas):
        return [[-float(np.mean((Ridge(alpha=a, fit_intercept=False).fit(x, y).predict(xv) - yv) ** 2))] * 3 for a in alphas]

    grid = (1e-8, 1e-2, 1.0, 100.0)
    t = tune_grid(evaluate, grid, natural_bound="low", reduces_to="OLS")
    assert t.value == 1e-8 and t.extensions == [] and t.at_natural_bound and t.ok
    np.testing.assert_allclose(Ridge(alpha=t.value, fit_intercept=False).fit(x, y).coef_,
                               LinearRegression(fit_intercept=False).fit(x, y).coef_,
                               rtol=1e-6, atol=1e-8)
    c = tuning_check(name="ridge strength inside its grid", tuned=t, arm="ridge")
    assert c.passed and "reduces to OLS" in c.detail
    with pytest.raises(ValueError, match="reduces_to"):
        tune_grid(evaluate, grid, natural_bound="low")


def test_hard_limits_integer_grids_diverged_settings_and_bad_input():
    evaluate, _ = _curve(lambda v: -v, noise=0.0)  # fewer in-context examples always better, but k >= 1
    t = tune_grid(evaluate, (1, 2, 3, 4), log=False, integer=True, limits=(1, None))
    assert t.extensions == [] and t.value == 1.0 and t.at_limit and t.ok  # nothing below k = 1 exists
    assert "hard domain limit" in tuning_check(name="k", tuned=t).detail
    t = tune_grid(evaluate, (2, 3, 4), log=False, integer=True, limits=(1, None), max_extra=0)
    assert t.value == 2.0 and not t.at_limit and not t.ok  # k = 1 was never tried
    prob, _ = _curve(lambda v: v, noise=0.0)
    t = tune_grid(prob, (0.25, 0.5, 0.75), log=False, limits=(0.0, 1.0), max_extra=3)
    assert t.extensions == [1.0] and t.value == 1.0 and t.ok
    diverged = lambda vs: [[float("nan")] * 3 if v > 0.5 else [v] * 3 for v in vs]  # noqa: E731
    t = tune_grid(diverged, (0.1, 0.3, 1.0, 3.0), max_extra=0)
    assert t.value == 0.3
    for kwargs, match in [({"grid": (1.0,)}, "2 distinct"), ({"grid": (0.0, 1.0)}, "log grid"),
                          ({"grid": GRID, "max_extra": -1}, "max_extra"),
                          ({"grid": GRID, "natural_bound": "left", "reduces_to": "x"}, "natural_bound")]:
        with pytest.raises(ValueError, match=match):
            tune_grid(evaluate, **kwargs)


def test_model_selection_rules_pick_on_the_same_grid_and_the_oracle_is_never_the_rule():
    # in-distribution validation prefers the mildest strength; the shifted domain prefers a strong one
    def evaluate(etas):
        return [{"training-domain validation": [1.0 - 0.01 * e] * 4,
                 "leave-one-domain-out": [-(math.log10(e) - 1) ** 2] * 4,
                 "test-domain oracle": [-(math.log10(e) - 1.3) ** 2] * 4,
                 "test": [float(e)] * 4} for e in etas]

    sel = select_models(evaluate, (0.1, 1.0, 10.0, 100.0), rule="training-domain validation",
                        report=["leave-one-domain-out", "test-domain oracle"], natural_bound="low",
                        reduces_to="ERM")
    assert list(sel) == ["training-domain validation", "leave-one-domain-out", "test-domain oracle"]
    assert sel["training-domain validation"].value == 0.1 and sel["training-domain validation"].at_natural_bound
    assert sel["leave-one-domain-out"].value == 10.0 and sel["test-domain oracle"].value == 10.0
    assert sel["leave-one-domain-out"].at("test") == [10.0] * 4
    assert repick(sel["leave-one-domain-out"], score="test").value == 100.0
    with pytest.raises(ValueError, match="upper bound"):
        select_models(evaluate, (0.1, 1.0), rule="test-domain oracle")
    with pytest.raises(ValueError, match="unknown"):
        select_models(evaluate, (0.1, 1.0), report=["oracle"])


def test_tuning_check_over_cells_counts_natural_bounds_as_inside():
    ev_in, _ = _curve(lambda v: -(math.log10(v) + 1) ** 2, noise=0.0)
    ev_edge, _ = _curve(lambda v: v, noise=0.0)
    cells = [tune_grid(ev_in, GRID), tune_grid(ev_edge, GRID, max_extra=0),
             tune_grid(ev_edge, GRID, natural_bound="high", reduces_to="ERM")]
    c = tuning_check(name="c", tuned=cells, threshold=0.5, guards=["claim a"])
    assert c.measured == pytest.approx(2 / 3) and c.passed and c.guards == ["claim a"] and c.n == 3
    assert not tuning_check(name="c", tuned=cells, threshold=1.0).passed
