"""private_density in its ecosystem: cross-validated cutoffs (finite log-densities through the floor), the
scikit-learn estimator checks with their documented skips, and the basis-size guard."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.utils.estimator_checks import check_estimator

from icml24.private_density import (
    DEFAULT_DENSITY_FLOOR,
    MAX_BASIS_SIZE,
    SKLEARN_CHECK_SKIPS,
    SKLEARN_CHECK_SKIPS_BASIS,
    ZCDP,
    PrivateLepskiiDensity,
    PrivateProjectionDensity,
    basis_size,
    check_basis_size,
    cube_index_set,
    empirical_coefficients,
    trig_basis,
)
from icml24.private_density import estimators as est_mod
from icml24.private_density.basis import grid_values


def _beta_product(n: int, seed: int) -> np.ndarray:
    """A smooth non-uniform density on [0,1]^2 that no other test uses: Beta(2, 5) x Beta(3, 3)."""
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.beta(2.0, 5.0, n), rng.beta(3.0, 3.0, n)])


def _gs(x: np.ndarray, privacy) -> GridSearchCV:
    base = PrivateProjectionDensity(cutoff=0, privacy=privacy, random_state=np.random.default_rng(0))
    return GridSearchCV(base, {"cutoff": [0, 1, 2, 4, 8]}, cv=3).fit(x)


# --------------------------------------------------------------------------- cross-validation
def test_gridsearchcv_over_the_cutoff_picks_a_cutoff_on_a_non_uniform_density():
    """Without a floor every cutoff >= 1 scored -inf on held-out points and the search returned cutoff 0
    (the uniform density); with the floor the held-out log-likelihood ranks the cutoffs."""
    x = _beta_product(3000, seed=11)
    gs = _gs(x, ZCDP(1.0))
    scores = gs.cv_results_["mean_test_score"]
    assert np.all(np.isfinite(scores))
    assert gs.best_params_["cutoff"] >= 2  # measured: 4 (per-point held-out log-lik 0.70 vs 0 for the uniform)
    assert scores[1] > scores[0] + 0.3 * len(x) / 3  # cutoff 1 already beats the uniform by far
    # controls: uniform data pick the uniform density; a privacy-dominated budget picks a smaller cutoff
    assert _gs(np.random.default_rng(12).random((3000, 2)), ZCDP(1.0)).best_params_["cutoff"] == 0
    assert 1 <= _gs(x, ZCDP(1e-4)).best_params_["cutoff"] < gs.best_params_["cutoff"]  # measured 1 < 4
    cv = cross_val_score(PrivateProjectionDensity(cutoff=4, privacy=ZCDP(1.0),
                                                  random_state=np.random.default_rng(1)), x, cv=5)
    assert np.all(np.isfinite(cv)) and np.all(cv > 0)


@pytest.mark.parametrize("floor", [DEFAULT_DENSITY_FLOOR, 0.05, 0.3])
def test_floored_projection_is_finite_integrates_to_one_and_is_the_constrained_l2_projection(floor):
    x = _beta_product(400, seed=3)
    est = PrivateProjectionDensity(cutoff=6, privacy=ZCDP(0.05), density_floor=floor,
                                   random_state=np.random.default_rng(4)).fit(x)
    grid = est._grid()
    raw = est.pdf(grid)
    c = est.density_shift()
    g = est.density(grid)
    assert (raw - c < floor).mean() > 0.05  # the floor is active on part of the cube
    np.testing.assert_allclose(g, np.maximum(raw - c, floor), rtol=0, atol=1e-12)
    assert g.mean() == pytest.approx(1.0, abs=1e-9)  # midpoint rule: integral 1
    s = est.score_samples(grid)
    assert np.all(np.isfinite(s)) and s.min() == pytest.approx(math.log(floor))
    corners = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert np.all(np.isfinite(est.score_samples(corners)))
    assert np.isneginf(est.score_samples(np.array([[1.2, 0.5]]))[0])  # the support is the cube
    # the projection onto C = {h >= floor, int h = 1}: closer to f_tilde than other members of C (shifted and
    # renormalised, or the uniform density), and never farther than f_tilde from a density in C
    dist = np.mean((g - raw) ** 2)
    for dc in (-0.05, 0.05):
        h = np.maximum(raw - c - dc, floor)
        h = floor + (h - floor) * (1.0 - floor) / (h - floor).mean()
        assert h.min() >= floor - 1e-12 and h.mean() == pytest.approx(1.0)
        assert dist < np.mean((h - raw) ** 2)
    assert dist < np.mean((1.0 - raw) ** 2)
    for target in (np.ones(len(grid)), 1.0 + 0.5 * np.cos(2 * np.pi * grid[:, 0])):
        assert np.mean((g - target) ** 2) <= np.mean((raw - target) ** 2)


def test_zero_floor_is_the_plain_nonnegative_projection_and_sampling_follows_the_floor():
    x = _beta_product(400, seed=3)
    mk = lambda fl: PrivateProjectionDensity(cutoff=6, privacy=ZCDP(0.05), density_floor=fl,  # noqa: E731
                                             random_state=np.random.default_rng(4)).fit(x)
    plain = mk(0.0)
    grid = plain._grid()
    raw = plain.pdf(grid)
    # the old rule: bisection on mean max(f - c, 0) = 1
    lo, hi = raw.min() - 1.0, raw.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.maximum(raw - mid, 0.0).mean() > 1.0 else (lo, mid)
    assert plain.density_shift() == pytest.approx(0.5 * (lo + hi), abs=1e-10)
    with np.errstate(divide="ignore"):
        assert np.isneginf(plain.score_samples(grid)).any()  # no floor: -inf inside the cube
    fl = mk(0.3)
    # the floor is post-processing: changing it on a fitted estimator recomputes the shift (no refit)
    plain.density_shift()
    plain.set_params(density_floor=0.3)
    assert plain.density_shift() == pytest.approx(fl.density_shift(), abs=1e-12)
    assert plain.density(grid).mean() == pytest.approx(1.0, abs=1e-9)
    draws = fl.sample(5000, random_state=np.random.default_rng(5))
    zero_region = np.isclose(fl.density(draws), 0.3, rtol=0, atol=1e-12)
    expect = np.isclose(fl.density(grid), 0.3, rtol=0, atol=1e-12).mean() * 0.3  # mass of the floored region
    assert zero_region.mean() == pytest.approx(expect, abs=0.015)


@pytest.mark.parametrize("bad", [1.0, -0.1, "0.1", None, math.nan])
def test_bad_density_floor_is_refused_in_fit(bad):
    est = PrivateProjectionDensity(cutoff=1, density_floor=bad)
    with pytest.raises((ValueError, TypeError), match="density_floor"):
        est.fit(np.full((5, 1), 0.5))
    with pytest.raises((ValueError, TypeError), match="density_floor"):
        PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=2, density_floor=bad).fit(np.full((5, 1), 0.5))


def test_score_checks_the_number_of_features():
    est = PrivateProjectionDensity(cutoff=1).fit(np.random.default_rng(0).random((20, 3)))
    with pytest.raises(ValueError, match="X has 1 features, but PrivateProjectionDensity is expecting 3"):
        est.score(np.full((4, 1), 0.5))


@pytest.mark.parametrize("d,N,m", [(1, 7, 16), (2, 3, 8), (2, 3, 7), (3, 2, 6)])
def test_fft_grid_values_match_pointwise_evaluation(d, N, m):
    rng = np.random.default_rng(d + N)
    g = (np.arange(m) + 0.5) / m
    pts = np.stack([t.reshape(-1) for t in np.meshgrid(*([g] * d), indexing="ij")], axis=1)
    k = cube_index_set(cutoff=N, dim=d)
    th = rng.normal(size=len(k))
    np.testing.assert_allclose(grid_values(k, th, m), trig_basis(pts, index_set=k) @ th, rtol=0, atol=1e-11)
    sub = k[np.abs(k).sum(1) <= N][rng.permutation(int((np.abs(k).sum(1) <= N).sum()))]  # not a cube, shuffled
    th2 = rng.normal(size=len(sub))
    np.testing.assert_allclose(grid_values(sub, th2, m), trig_basis(pts, index_set=sub) @ th2, rtol=0, atol=1e-11)
    with pytest.raises(ValueError, match="m > 2"):
        grid_values(k, th, 2 * N)


# --------------------------------------------------------------------------- the basis-size guard
def test_a_basis_too_large_is_refused_before_any_compute(monkeypatch):
    def _no_compute(*a, **k):
        raise AssertionError("computed before the size check")

    monkeypatch.setattr(est_mod, "empirical_coefficients", _no_compute)
    monkeypatch.setattr(est_mod, "cube_index_set", _no_compute)
    x = np.random.default_rng(0).random((40, 10))
    with pytest.raises(ValueError, match=r"\^10 = 9765625 coefficients, more than max_basis_size=1048576"):
        PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0)).fit(x)
    with pytest.raises(ValueError, match=r"\^4 = 1185921 coefficients, more than max_basis_size=1048576"):
        PrivateLepskiiDensity(privacy=ZCDP(1.0)).fit(x[:, :4])  # default max_cutoff = 16 in d = 4
    with pytest.raises(ValueError, match="max_basis_size=1048576"):
        PrivateLepskiiDensity(privacy=ZCDP(1.0)).fit_from_coefficients(np.zeros(33 ** 4), n=40, dim=4)
    big_k = np.array([[0] * 10, [3] + [0] * 9, [-3] + [0] * 9])  # 3 indices, bounding cube K_3: 7^10
    with pytest.raises(ValueError, match=r"\^10 = 282475249"):
        PrivateProjectionDensity(index_set=big_k).fit(x)
    with pytest.raises(ValueError, match=r"\^3 = 125 coefficients, more than max_basis_size=124"):
        PrivateProjectionDensity(cutoff=2, max_basis_size=124).fit(x[:, :3])
    for bad in (0, 1.5, "10"):
        with pytest.raises((ValueError, TypeError), match="max_basis_size"):
            PrivateProjectionDensity(cutoff=1, max_basis_size=bad).fit(x[:, :1])


def test_the_limit_is_overridable_and_the_default_is_documented():
    assert MAX_BASIS_SIZE == 2 ** 20 == PrivateProjectionDensity().max_basis_size
    assert PrivateLepskiiDensity(privacy=ZCDP(1.0)).max_basis_size == MAX_BASIS_SIZE
    assert basis_size(cutoff=2, dim=3) == 125 and check_basis_size(cutoff=2, dim=3, max_basis_size=125) == 125
    x = np.random.default_rng(0).random((50, 3))
    a = PrivateProjectionDensity(cutoff=2, max_basis_size=125).fit(x)
    np.testing.assert_allclose(a.coefficients_, empirical_coefficients(x, cutoff=2))
    lep = lambda size: PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=4, max_basis_size=size,  # noqa: E731
                                             random_state=np.random.default_rng(0))
    assert lep(9 ** 3).fit(x).cutoff_ in (0, 1, 2, 4)
    with pytest.raises(ValueError, match=r"\^3 = 729 coefficients, more than max_basis_size=728"):
        lep(728).fit(x)


def test_high_dimension_with_a_small_cutoff_fits_and_scores():
    """d = 10, N = 1 (3^10 = 59049 coefficients) used to run out of memory in score (the density grid times
    the basis); the FFT grid and the blocked coefficients make it a matter of seconds."""
    x = np.random.default_rng(0).random((40, 10))
    est = PrivateProjectionDensity(cutoff=1, privacy=ZCDP(1.0), random_state=np.random.default_rng(0)).fit(x)
    s = est.score_samples(x)
    assert s.shape == (40,) and np.all(np.isfinite(s))
    np.testing.assert_allclose(np.exp(s), np.maximum(est.pdf(x) - est.density_shift(), DEFAULT_DENSITY_FLOOR))


# --------------------------------------------------------------------------- scikit-learn's estimator checks
def _run_checks(est, expected_failed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = check_estimator(est, on_fail=None, expected_failed_checks=expected_failed)
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in res if r["status"] == "failed"]
    assert failed == []
    return res


@pytest.mark.parametrize("make", [lambda: PrivateProjectionDensity(cutoff=1, privacy=ZCDP(1.0)),
                                  lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=1)])
def test_check_estimator_passes_with_the_documented_skips(make):
    res = _run_checks(make(), SKLEARN_CHECK_SKIPS)
    assert len(res) >= 40
    assert set(SKLEARN_CHECK_SKIPS) == {"check_estimators_nan_inf", "check_fit1d"}


def test_check_estimator_of_the_default_lepskii_lists_the_basis_skips():
    _run_checks(PrivateLepskiiDensity(privacy=ZCDP(1.0)), SKLEARN_CHECK_SKIPS | SKLEARN_CHECK_SKIPS_BASIS)
    assert all("max_basis_size" in why for why in SKLEARN_CHECK_SKIPS_BASIS.values())


def test_input_types_refused_by_type_not_by_value():
    from scipy import sparse

    est = PrivateProjectionDensity(cutoff=1)
    with pytest.raises(TypeError, match="sparse"):
        est.fit(sparse.csr_matrix(np.eye(3)))
    with pytest.raises(ValueError, match="Complex data not supported"):
        est.fit(np.ones((3, 2)) * (1 + 1j))
    with pytest.raises(ValueError, match=r"0 feature\(s\)"):
        est.fit(np.empty((5, 0)))
    with pytest.raises(ValueError, match=r"0 sample\(s\)"):
        est.fit(np.empty((0, 2)))
    # values are private: NaN, inf and out-of-cube records are clipped, never refused
    x = np.random.default_rng(0).random((30, 2))
    x[0, 0], x[1, 1], x[2, 0] = np.nan, np.inf, -7.0
    a = PrivateProjectionDensity(cutoff=2).fit(x)
    np.testing.assert_allclose(a.coefficients_, empirical_coefficients(np.clip(np.nan_to_num(x, nan=0.5, posinf=0.5), 0, 1),
                                                                       cutoff=2))
