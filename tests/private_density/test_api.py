"""Unit tests of the private projection density estimator: basis exactness, calibration (C1), privacy mechanics
(C4), budget accounting of the private Lepskii selection, and input validation."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from icml24.private_density import (
    CALIBRATED_KAPPA_PRIV,
    ZCDP,
    ApproxDP,
    PrivateLepskiiDensity,
    PrivateProjectionDensity,
    PureDP,
    TrigDensity,
    clip_to_cube,
    cube_index_set,
    dyadic_cutoffs,
    empirical_coefficients,
    expected_mise,
    l1_sensitivity,
    l2_sensitivity,
    noise_variance,
    trig_basis,
)
from icml24.private_density.experiment import Config

_X1 = np.full((4, 1), 0.5)


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with threadpool_limits(limits=1):
        yield


def _phi_slow(j: int, t: float) -> float:
    if j == 0:
        return 1.0
    if j > 0:
        return math.sqrt(2.0) * math.cos(2.0 * math.pi * j * t)
    return math.sqrt(2.0) * math.sin(2.0 * math.pi * (-j) * t)


def _basis_slow(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    out = np.empty((x.shape[0], k.shape[0]))
    for i in range(x.shape[0]):
        for m in range(k.shape[0]):
            out[i, m] = math.prod(_phi_slow(int(k[m, c]), float(x[i, c])) for c in range(x.shape[1]))
    return out


# --------------------------------------------------------------------------- basis
@pytest.mark.parametrize("d,N", [(1, 7), (2, 4), (3, 2)])
def test_basis_matches_slow_loop(d, N):
    rng = np.random.default_rng(d)
    x = rng.random((13, d))
    k = cube_index_set(cutoff=N, dim=d)
    assert k.shape == ((2 * N + 1) ** d, d)
    np.testing.assert_allclose(trig_basis(x, cutoff=N), _basis_slow(x, k), rtol=0, atol=1e-12)
    # arbitrary (hyperbolic-cross-like) index set, shuffled
    sub = k[np.abs(k).sum(1) <= N][rng.permutation(int((np.abs(k).sum(1) <= N).sum()))]
    np.testing.assert_allclose(trig_basis(x, index_set=sub), _basis_slow(x, sub), rtol=0, atol=1e-12)


def test_cube_ordering_is_lexicographic():
    k = cube_index_set(cutoff=2, dim=2)
    assert [tuple(r) for r in k.tolist()] == list(itertools.product(range(-2, 3), repeat=2))


@pytest.mark.parametrize("d,N", [(1, 30), (2, 5), (3, 3)])
def test_sum_of_squares_equals_size(d, N):
    x = np.random.default_rng(0).random((500, d))
    s = (trig_basis(x, cutoff=N) ** 2).sum(1)
    np.testing.assert_allclose(s, (2 * N + 1) ** d, rtol=0, atol=1e-10)


def test_sum_of_squares_identity_needs_sign_symmetry():
    x = np.random.default_rng(1).random((200, 2))
    k = cube_index_set(cutoff=3, dim=2)
    sym = k[np.abs(k).sum(1) <= 3]  # closed under sign flips: identity holds
    np.testing.assert_allclose((trig_basis(x, index_set=sym) ** 2).sum(1), sym.shape[0], atol=1e-10)
    half = k[k[:, 0] >= 0]  # drops the sines of the first coordinate: identity fails, sensitivity bound changes
    s = (trig_basis(x, index_set=half) ** 2).sum(1)
    assert s.max() - s.min() > 1.0
    assert l2_sensitivity(half, n=1) == pytest.approx(2 * math.sqrt(np.sum(2.0 ** (half[(half != 0).any(1)] != 0)
                                                                            .sum(1))))


@pytest.mark.parametrize("d,N", [(1, 9), (2, 4), (3, 2)])
def test_empirical_coefficients_fast_path_equals_basis_mean(d, N):
    x = np.random.default_rng(2).random((1001, d))
    ref = trig_basis(x, cutoff=N).mean(0)
    np.testing.assert_allclose(empirical_coefficients(x, cutoff=N, chunk_size=97), ref, rtol=0, atol=1e-13)
    k = cube_index_set(cutoff=N, dim=d)[::3]
    np.testing.assert_allclose(empirical_coefficients(x, index_set=k, chunk_size=50), ref[::3], atol=1e-13)


# --------------------------------------------------------------------------- densities, closed form
def test_density_coefficients_quadrature_and_floor():
    f = TrigDensity.sobolev(beta=1.5, dim=2, degree=6, seed=3, scaling="grid")
    p = 6 + 1 + 7  # exact rectangle rule for f * phi_k with |k| <= 7
    g = (np.arange(p) + 0.5) / p
    pts = np.stack([m.reshape(-1) for m in np.meshgrid(g, g, indexing="ij")], axis=1)
    k = cube_index_set(cutoff=7, dim=2)
    theta_q = (f.pdf(pts)[:, None] * trig_basis(pts, index_set=k)).mean(0)
    np.testing.assert_allclose(theta_q, f.coefficients_on(k), atol=1e-13)
    fine = np.random.default_rng(0).random((20000, 2))
    assert f.pdf(fine).min() >= 0.15  # grid scaling: min f = 0.2 on the grid, slightly less between nodes
    assert f.pdf(fine).max() <= f.envelope
    fb = TrigDensity.sobolev(beta=0.5, dim=1, degree=40, seed=0)
    assert fb.deviation_bound == pytest.approx(0.8)


def test_sampling_matches_coefficients():
    f = TrigDensity.sobolev(beta=1.0, dim=1, degree=20, seed=0, scaling="grid")
    x = f.sample(200_000, rng=np.random.default_rng(0))
    assert x.shape == (200_000, 1) and x.min() >= 0 and x.max() <= 1
    err = empirical_coefficients(x, cutoff=5) - f.coefficients_on(cube_index_set(cutoff=5, dim=1))
    assert np.abs(err).max() < 5 * math.sqrt(2.0 / 200_000)


def test_second_moments_exact():
    f = TrigDensity.sobolev(beta=1.0, dim=2, degree=5, seed=1, scaling="grid")
    m = f.second_moments(cutoff=3)
    p = 41  # a finer rule gives the same numbers if the coarse one is exact
    g = (np.arange(p) + 0.5) / p
    pts = np.stack([a.reshape(-1) for a in np.meshgrid(g, g, indexing="ij")], axis=1)
    ref = (f.pdf(pts)[:, None] * trig_basis(pts, cutoff=3) ** 2).mean(0)
    np.testing.assert_allclose(m, ref, atol=1e-13)
    assert m.sum() == pytest.approx((2 * 3 + 1) ** 2)  # sum_k phi_k^2 = |K| pointwise


@pytest.mark.parametrize("d,N,n,privacy", [(1, 6, 2000, ZCDP(0.005)), (1, 4, 3000, PureDP(0.3)),
                                           (2, 3, 2000, ZCDP(0.05)), (1, 8, 1500, None)])
def test_empirical_mise_matches_closed_form(d, N, n, privacy):
    """C1: mean ISE over R=200 independent data sets and noise draws within 10% of the closed form."""
    f = TrigDensity.sobolev(beta=1.5, dim=d, degree=12, seed=5, scaling="grid")
    rng = np.random.default_rng(11)
    ise = [PrivateProjectionDensity(cutoff=N, privacy=privacy, random_state=rng).fit(f.sample(n, rng=rng)).ise(f)
           for _ in range(200)]
    cf = expected_mise(f, cutoff=N, n=n, privacy=privacy)
    assert np.mean(ise) == pytest.approx(cf["mise"], rel=0.10)
    if privacy is not None:
        assert cf["priv"] > 0.2 * cf["mise"]  # the noise term matters in these cells


def test_ise_equals_integrated_squared_error():
    f = TrigDensity.sobolev(beta=1.0, dim=2, degree=4, seed=2, scaling="grid")
    est = PrivateProjectionDensity(cutoff=3, privacy=ZCDP(1.0), random_state=0).fit(
        f.sample(500, rng=np.random.default_rng(0)))
    p = 4 + 3 + 1
    p = 2 * p  # (f_tilde - f)^2 has degree <= 2 max(M, N)
    g = (np.arange(p) + 0.5) / p
    pts = np.stack([a.reshape(-1) for a in np.meshgrid(g, g, indexing="ij")], axis=1)
    quad = np.mean((est.pdf(pts) - f.pdf(pts)) ** 2)
    assert est.ise(f) == pytest.approx(quad, rel=1e-10)
    assert est.ise(f.coefficient_dict()) == pytest.approx(quad, rel=1e-10)
    assert est.ise((f.index_set, f.coefficients)) == pytest.approx(quad, rel=1e-10)
    assert est.pdf(pts, clip=True).min() >= 0


# --------------------------------------------------------------------------- privacy mechanics (C4)
def test_noise_scale_matches_formula():
    n, N, rho = 1000, 5, 0.3
    x = np.random.default_rng(0).random((n, 1))
    est = PrivateProjectionDensity(cutoff=N, privacy=ZCDP(rho), random_state=0).fit(x)
    size = 2 * N + 1
    assert est.noise_variance_ == pytest.approx(2 * (size - 1) / (n * n * rho), rel=1e-12)
    assert est.sensitivity_l2_ == pytest.approx(2 * math.sqrt(size - 1) / n, rel=1e-12)
    theta_hat = empirical_coefficients(x, cutoff=N)
    z = np.stack([PrivateProjectionDensity(cutoff=N, privacy=ZCDP(rho), random_state=s).fit(x).coefficients_
                  - theta_hat for s in range(400)])
    mid = size // 2
    assert np.all(z[:, mid] == 0)  # theta_0 = 1 is public
    emp = np.var(np.delete(z, mid, axis=1))
    assert emp == pytest.approx(est.noise_variance_, rel=0.08)
    # pure DP: Laplace scale b = Delta_1 / epsilon, Delta_1 = 2 * sqrt2 * (|K|-1) / n in d = 1
    lap = PrivateProjectionDensity(cutoff=N, privacy=PureDP(1.5), random_state=0).fit(x)
    assert lap.sensitivity_l1_ == pytest.approx(2 * math.sqrt(2) * (size - 1) / n)
    assert lap.noise_scale_ == pytest.approx(lap.sensitivity_l1_ / 1.5)
    zl = np.stack([PrivateProjectionDensity(cutoff=N, privacy=PureDP(1.5), random_state=s).fit(x).coefficients_
                   - theta_hat for s in range(400)])
    assert np.mean(np.abs(np.delete(zl, mid, axis=1))) == pytest.approx(lap.noise_scale_, rel=0.08)
    # approximate DP, classical Gaussian mechanism
    a = noise_variance(cube_index_set(cutoff=N, dim=1), n=n, privacy=ApproxDP(0.5, 1e-5))
    assert a == pytest.approx((2 * math.sqrt(size - 1) / n) ** 2 * 2 * math.log(1.25e5) / 0.25)


@pytest.mark.parametrize("d,N", [(1, 8), (2, 3)])
def test_neighbouring_coefficient_difference_within_sensitivity(d, N):
    """C4 audit: 10^4 random replace-one neighbours (plus adversarial corners) never exceed Delta_2 / Delta_1."""
    rng = np.random.default_rng(7)
    n = 50
    k = cube_index_set(cutoff=N, dim=d)
    nz = (k != 0).any(1)
    d2, d1 = l2_sensitivity(k, n=n), l1_sensitivity(k, n=n)
    a, b = rng.random((10_000, d)), rng.random((10_000, d))
    a[:4], b[:4] = 0.0, np.array([[0.5] * d, [1.0] * d, [0.25] * d, [1 / (2 * N + 1)] * d])
    diff = (trig_basis(a, cutoff=N) - trig_basis(b, cutoff=N))[:, nz] / n
    l2, l1 = np.linalg.norm(diff, axis=1), np.abs(diff).sum(1)
    assert l2.max() <= d2 * (1 + 1e-12) and l1.max() <= d1 * (1 + 1e-12)
    assert l2.max() >= 0.6 * d2  # the bound is not vacuous
    # through the estimator on actual data sets differing in one record
    base = rng.random((n, d))
    for i in range(20):
        other = base.copy()
        other[i] = rng.random(d)
        t0 = empirical_coefficients(base, cutoff=N)
        t1 = empirical_coefficients(other, cutoff=N)
        assert np.linalg.norm((t0 - t1)[nz]) <= d2 * (1 + 1e-12)


@pytest.mark.parametrize("privacy", [ZCDP(0.37), PureDP(1.3), ApproxDP(0.9, 1e-6)])
@pytest.mark.parametrize("scheme", ["shell", "independent"])
def test_lepskii_spends_exactly_the_budget(privacy, scheme):
    x = np.random.default_rng(0).random((400, 2))
    lep = PrivateLepskiiDensity(privacy=privacy, max_cutoff=6, scheme=scheme, random_state=0).fit(x)
    assert lep.cutoffs_ == dyadic_cutoffs(6) == (0, 1, 2, 4, 6)
    assert len(lep.budget_spent_) == 4
    spent = lep.privacy_spent_
    assert type(spent) is type(privacy)
    assert spent.budget == pytest.approx(privacy.budget, rel=1e-12)
    if isinstance(privacy, ApproxDP):
        assert spent.delta == pytest.approx(privacy.delta, rel=1e-12)
    w = PrivateLepskiiDensity(privacy=privacy, cutoffs=(0, 2, 5), budget_weights=(1.0, 3.0), scheme=scheme,
                              random_state=0).fit(x)
    assert [p.budget / privacy.budget for p in w.budget_spent_] == pytest.approx([0.25, 0.75])
    assert w.privacy_spent_.budget == pytest.approx(privacy.budget, rel=1e-12)


def test_lepskii_shell_family_is_nested_and_noise_energy_exact():
    x = np.random.default_rng(1).random((300, 1))
    n = 300
    lep = PrivateLepskiiDensity(privacy=ZCDP(0.2), cutoffs=(0, 1, 3, 7), random_state=0).fit(x)
    big = lep.candidate_coefficients_[7]
    k7 = cube_index_set(cutoff=7, dim=1)
    for c in (0, 1, 3):
        np.testing.assert_array_equal(lep.candidate_coefficients_[c], big[np.abs(k7[:, 0]) <= c])
    # shell j has 2 (N_j - N_{j-1}) coefficients, budget rho/3, Delta_2 = 2 sqrt(|S_j|)/n
    e = sum(s * (4 * s / n**2) / (2 * 0.2 / 3) for s in (2, 4, 8))
    assert lep.candidate_noise_energy_[7] == pytest.approx(e)
    assert lep.select_cutoff(kappa_stat=1e9, kappa_priv=1e9) == 0
    assert lep.select_cutoff(kappa_stat=0, kappa_priv=0) in lep.cutoffs_


def test_lepskii_adapts_to_privacy_level():
    f = TrigDensity.sobolev(beta=1.0, dim=1, degree=30, seed=0, scaling="grid")
    x = f.sample(20_000, rng=np.random.default_rng(0))
    cut = {rho: np.median([PrivateLepskiiDensity(privacy=ZCDP(rho), max_cutoff=32, kappa_priv=2.0,
                                                 random_state=s).fit(x).cutoff_ for s in range(5)])
           for rho in (1e-6, 10.0)}
    assert cut[1e-6] < cut[10.0]


def test_fit_equals_fit_from_coefficients_and_seeded_reproducibility():
    x = np.random.default_rng(2).random((256, 2))
    a = PrivateLepskiiDensity(privacy=ZCDP(0.5), max_cutoff=4, random_state=3).fit(x)
    b = PrivateLepskiiDensity(privacy=ZCDP(0.5), max_cutoff=4, random_state=3).fit_from_coefficients(
        empirical_coefficients(x, cutoff=4), n=256, dim=2)
    np.testing.assert_array_equal(a.coefficients_, b.coefficients_)
    assert a.cutoff_ == b.cutoff_
    p1 = PrivateProjectionDensity(cutoff=3, privacy=PureDP(1.0), random_state=5).fit(x).coefficients_
    p2 = PrivateProjectionDensity(cutoff=3, privacy=PureDP(1.0), random_state=5).fit(x).coefficients_
    p3 = PrivateProjectionDensity(cutoff=3, privacy=PureDP(1.0), random_state=6).fit(x).coefficients_
    np.testing.assert_array_equal(p1, p2)
    assert not np.array_equal(p1, p3)


def test_zcdp_conversion():
    eps, delta = ZCDP(0.1).to_approx_dp(delta=1e-5)
    assert eps == pytest.approx(0.1 + 2 * math.sqrt(0.1 * math.log(1e5))) and delta == 1e-5


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make,match", [
    (lambda: ZCDP(0.0), "rho"), (lambda: ZCDP(-1.0), "rho"), (lambda: ZCDP(float("nan")), "rho"),
    (lambda: ZCDP(float("inf")), "rho"), (lambda: PureDP(0.0), "epsilon"), (lambda: PureDP(float("nan")), "epsilon"),
    (lambda: ApproxDP(0.5, 0.0), "delta"), (lambda: ApproxDP(0.5, 1.0), "delta"), (lambda: ApproxDP(1.0, 1e-5), "epsilon"),
    (lambda: ApproxDP(-0.1, 1e-5), "epsilon"), (lambda: ZCDP(0.1).to_approx_dp(delta=2.0), "delta"),
    (lambda: PrivateProjectionDensity(cutoff=-1, privacy=ZCDP(1.0)).fit(_X1), "cutoff"),
    (lambda: PrivateProjectionDensity(privacy=ZCDP(1.0)).fit(_X1), "cutoff or index_set"),
    (lambda: PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0), device="cuda").fit(_X1), "device"),
    (lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), cutoffs=(0, 2, 2)).fit(_X1), "cutoffs"),
    (lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), cutoffs=(0, -1, 2)).fit(_X1), "cutoffs"),
    (lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=0).fit(_X1), "max_cutoff"),
    (lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), kappa_priv=-1.0).fit(_X1), "kappa_priv"),
    (lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), scheme="bogus").fit(_X1), "scheme"),
    (lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), cutoffs=(0, 1, 2), budget_weights=(1.0, -1.0)).fit(_X1), "budget_weights"),
    (lambda: TrigDensity.sobolev(beta=0.0, dim=1, degree=4, seed=0), "beta"),
    (lambda: TrigDensity(index_set=np.zeros((1, 1), int), coefficients=[0.5]), "theta_0"),
    (lambda: expected_mise(TrigDensity.sobolev(beta=1.0, dim=1, degree=3, seed=0), cutoff=-2, n=10,
                           privacy=None), "cutoff"),
    (lambda: expected_mise(TrigDensity.sobolev(beta=1.0, dim=1, degree=3, seed=0), cutoff=2, n=0,
                           privacy=None), "n must"),
])
def test_bad_arguments_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("x,match", [(np.zeros((0, 1)), r"0 sample\(s\)"), (np.zeros((2, 2, 2)), "non-empty"),
                                     (np.zeros((3, 0)), r"0 feature\(s\)")])
def test_bad_data_raises_before_compute(x, match):
    for est in (PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0)), PrivateLepskiiDensity(privacy=ZCDP(1.0))):
        with pytest.raises(ValueError, match=match):
            est.fit(x)
    with pytest.raises(ValueError, match=match):
        empirical_coefficients(x, cutoff=2)


def test_clip_to_cube_rule():
    x = np.array([[0.2, 0.7], [1.2, -0.3], [np.nan, 0.4], [np.inf, -np.inf], [1e300, -1e300]])
    out = clip_to_cube(x)
    np.testing.assert_array_equal(out, [[0.2, 0.7], [1.0, 0.0], [0.5, 0.4], [0.5, 0.5], [1.0, 0.0]])
    inside = np.random.default_rng(0).random((20, 3))
    np.testing.assert_array_equal(clip_to_cube(inside), inside)  # identity on the cube


@pytest.mark.parametrize("make", [
    lambda: PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0), random_state=3),
    lambda: PrivateProjectionDensity(cutoff=2, privacy=PureDP(1.0), random_state=3),
    lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), cutoffs=(0, 1, 2, 4), random_state=3),
])
def test_hostile_private_values_never_raise_and_equal_the_clipped_fit(make):
    """Out-of-cube, NaN and inf records are mapped by clip_to_cube; the fit equals the fit on the clipped data
    with the same noise draw."""
    x = np.random.default_rng(1).random((50, 2))
    x[0] = [1.5, -2.0]
    x[1, 0], x[2, 1], x[3, 0] = np.nan, np.inf, -np.inf
    x[4, 1] = 1e300
    a, b = make().fit(x), make().fit(clip_to_cube(x))
    assert np.all(np.isfinite(a.coefficients_))
    np.testing.assert_array_equal(a.coefficients_, b.coefficients_)
    np.testing.assert_array_equal(empirical_coefficients(x, cutoff=2),
                                  empirical_coefficients(clip_to_cube(x), cutoff=2))


def test_type_errors_and_unfitted():
    with pytest.raises(TypeError, match="privacy"):
        PrivateProjectionDensity(cutoff=2, privacy=0.5).fit(_X1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="privacy"):
        PrivateLepskiiDensity(privacy=None).fit(_X1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cutoff"):
        PrivateProjectionDensity(cutoff=2.5, privacy=None).fit(_X1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rho"):
        ZCDP("0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="random_state"):
        PrivateProjectionDensity(cutoff=1, privacy=None, random_state=-3).fit(_X1)
    est = PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0))
    with pytest.raises(RuntimeError, match="fit"):
        est.pdf(np.array([[0.5]]))
    est.fit(np.random.default_rng(0).random((10, 2)))
    with pytest.raises(ValueError, match="d=1 columns"):
        est.pdf(np.array([[0.5]]))
    with pytest.raises(ValueError, match=r"\[0,1\]"):
        est.pdf(np.array([[0.5, 2.0]]))
    with pytest.raises(TypeError, match="true_coefs"):
        est.ise([1.0, 2.0])
    with pytest.raises(ValueError, match="index_set has d=3"):
        PrivateProjectionDensity(index_set=np.zeros((1, 3), int), privacy=None).fit(np.full((4, 2), 0.5))


@pytest.mark.parametrize("kw,match", [({"rho": 0.0}, "rho"), ({"seeds": ()}, "seeds"), ({"dims": (4,)}, "dims"),
                                      ({"n_grid": (100, 10)}, "n_grid"), ({"betas": (-1.0,)}, "betas"),
                                      ({"noise_draws": 0}, "noise_draws"), ({"kappa_priv": -1.0}, "kappa")])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_neighbouring_difference_within_sensitivity_for_a_non_symmetric_index_set():
    """C4 audit for an index set that is not closed under sign flips (the sines of the first coordinate
    dropped): random replace-one pairs never exceed Delta_2(half, n) / Delta_1(half, n)."""
    rng = np.random.default_rng(17)
    n, N = 50, 3
    k = cube_index_set(cutoff=N, dim=2)
    half = k[k[:, 0] >= 0]
    nz = (half != 0).any(1)
    d2, d1 = l2_sensitivity(half, n=n), l1_sensitivity(half, n=n)
    a, b = rng.random((20_000, 2)), rng.random((20_000, 2))
    diff = (trig_basis(a, index_set=half) - trig_basis(b, index_set=half))[:, nz] / n
    l2, l1 = np.linalg.norm(diff, axis=1), np.abs(diff).sum(1)
    assert l2.max() <= d2 * (1 + 1e-12) and l1.max() <= d1 * (1 + 1e-12)
    assert l2.max() >= 0.5 * d2  # the bound is not vacuous
    # the symmetric-set formula 2 sqrt(|K \ {0}|) / n would be too small here: random pairs exceed it
    assert l2.max() > 2 * math.sqrt(int(nz.sum())) / n
    base = rng.random((n, 2))
    t0 = empirical_coefficients(base, index_set=half)
    for i in range(30):
        other = base.copy()
        other[i] = rng.random(2)
        t1 = empirical_coefficients(other, index_set=half)
        assert np.linalg.norm((t0 - t1)[nz]) <= d2 * (1 + 1e-12)


@pytest.mark.parametrize("privacy", [ZCDP(1e-320), PureDP(1e-320), ApproxDP(1e-320, 1e-5)])
def test_noise_variance_that_is_not_finite_raises(privacy):
    k = cube_index_set(cutoff=3, dim=1)
    with pytest.raises(ValueError, match="not finite"):
        noise_variance(k, n=100, privacy=privacy)
    x = np.random.default_rng(0).random((100, 1))
    with pytest.raises(ValueError, match="not finite"):
        PrivateProjectionDensity(cutoff=3, privacy=privacy, random_state=0).fit(x)
    with pytest.raises(ValueError, match="not finite"):
        PrivateLepskiiDensity(privacy=privacy, max_cutoff=4, random_state=0).fit(x)


@pytest.mark.parametrize("kw,match", [({"kappa_stat": "a"}, "kappa_stat"), ({"kappa_priv": "1.0"}, "kappa_priv"),
                                      ({"kappa_stat": None}, "kappa_stat"), ({"kappa_priv": True}, "kappa_priv"),
                                      ({"budget_weights": "abcd"}, "budget_weights"),
                                      ({"budget_weights": ["a", 1, 1, 1]}, "budget_weights"),
                                      ({"budget_weights": [None, 1, 1, 1]}, "budget_weights")])
def test_non_numeric_lepskii_constants_name_the_parameter(kw, match):
    with pytest.raises(TypeError, match=match):
        PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=6, **kw).fit(_X1)


def test_select_cutoff_non_numeric_constants_name_the_parameter():
    lep = PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=4, random_state=0).fit(
        np.random.default_rng(0).random((200, 1)))
    with pytest.raises(TypeError, match="kappa_stat"):
        lep.select_cutoff(kappa_stat="x")
    with pytest.raises(TypeError, match="kappa_priv"):
        lep.select_cutoff(kappa_priv="1")
    assert lep.select_cutoff(kappa_stat=1.0, kappa_priv=np.float64(1.0)) in lep.cutoffs_


# --------------------------------------------------------------------------- scikit-learn API
def test_default_kappa_priv_is_the_calibrated_value_the_experiment_uses():
    assert PrivateLepskiiDensity(privacy=ZCDP(1.0)).kappa_priv == CALIBRATED_KAPPA_PRIV == Config().kappa_priv == 2.0


@pytest.mark.parametrize("make", [
    lambda: PrivateProjectionDensity(cutoff=3, privacy=ZCDP(0.5)),
    lambda: PrivateLepskiiDensity(privacy=ZCDP(0.5), cutoffs=(0, 1, 2, 4), budget_weights=(1.0, 2.0, 1.0)),
])
def test_sklearn_get_params_clone_and_validation_in_fit(make):
    from sklearn.base import clone

    est = make()
    params = est.get_params()
    assert params["privacy"] == ZCDP(0.5) and "random_state" in params
    c = clone(est)
    assert c.get_params() == params and not hasattr(c, "coefficients_")
    x = np.random.default_rng(0).random((300, 2))
    a = clone(est).set_params(random_state=np.random.default_rng(4)).fit(x)
    b = clone(est).set_params(random_state=np.random.default_rng(4)).fit(x)
    np.testing.assert_array_equal(a.coefficients_, b.coefficients_)
    assert a.n_features_in_ == 2
    bad = clone(est).set_params(privacy="none")  # accepted at construction, refused by fit before compute
    with pytest.raises(TypeError, match="privacy"):
        bad.fit(x)


def test_fixed_int_seed_warns_that_noise_is_reproducible():
    from icml24.private_density import ReproducibleNoiseWarning

    x = np.random.default_rng(0).random((100, 1))
    with pytest.warns(ReproducibleNoiseWarning, match="reproducible"):
        a = PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0), random_state=5).fit(x)
    with pytest.warns(ReproducibleNoiseWarning):
        PrivateLepskiiDensity(privacy=ZCDP(1.0), max_cutoff=2, random_state=5).fit(x)
    with pytest.warns(ReproducibleNoiseWarning):
        b = PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0), random_state=5).fit(x)
    np.testing.assert_array_equal(a.coefficients_, b.coefficients_)  # the point of the warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0), random_state=None).fit(x)
        PrivateProjectionDensity(cutoff=2, privacy=ZCDP(1.0), random_state=np.random.default_rng(1)).fit(x)
        PrivateProjectionDensity(cutoff=2, privacy=None, random_state=5).fit(x)  # no noise: nothing to warn


def test_renormalised_nonnegative_projection_score_samples_and_sample():
    f = TrigDensity.sobolev(beta=1.0, dim=2, degree=4, seed=0)
    x = f.sample(2000, rng=np.random.default_rng(0))
    est = PrivateProjectionDensity(cutoff=4, privacy=ZCDP(2e-3), random_state=np.random.default_rng(2)).fit(x)
    raw = est.pdf(est._grid())
    assert raw.min() < 0  # strong noise: the raw projection goes negative, so the projection matters
    g = est.density(est._grid())
    assert g.min() >= 0 and g.mean() == pytest.approx(1.0, abs=1e-9)  # midpoint rule: integral 1
    truth = f.pdf(est._grid())
    assert np.mean((g - truth) ** 2) <= np.mean((raw - truth) ** 2)  # L2 projection onto densities
    pts = np.array([[0.3, 0.6], [0.9, 0.1], [1.5, 0.5], [-0.1, 0.2]])
    s = est.score_samples(pts)
    np.testing.assert_allclose(np.exp(s[:2]), est.density(pts[:2]))
    assert np.all(np.isneginf(s[2:]))  # outside the cube: density 0, no exception
    assert est.score(pts[:2]) == pytest.approx(s[:2].sum())
    draws = est.sample(4000, random_state=np.random.default_rng(3))
    assert draws.shape == (4000, 2) and draws.min() >= 0 and draws.max() <= 1
    # the draws follow f_plus: cell frequencies on a 4x4 grid match its integrals
    cells = np.floor(draws * 4).astype(int)
    freq = np.bincount(cells[:, 0] * 4 + cells[:, 1], minlength=16) / 4000
    gg = est.density(est._grid())
    m = int(round(len(gg) ** 0.5))
    expect = gg.reshape(m, m).reshape(4, m // 4, 4, m // 4).mean(axis=(1, 3)).reshape(-1) / 16
    assert np.abs(freq - expect).max() < 0.02  # uniform draws would be off by 0.05
    np.testing.assert_array_equal(draws, est.sample(4000, random_state=np.random.default_rng(3)))
    with pytest.raises(ValueError, match="n_samples"):
        est.sample(0)


def test_fit_from_coefficients_never_raises_on_values():
    x = np.random.default_rng(0).random((200, 1))
    th = empirical_coefficients(x, cutoff=4)
    bad = th.copy()
    bad[1], bad[2], bad[3] = np.nan, np.inf, 50.0
    fixed = th.copy()
    fixed[1], fixed[2], fixed[3] = 0.0, 0.0, 2 ** 0.5  # non-finite -> 0; 50 -> the bound sqrt2
    mk = lambda: PrivateLepskiiDensity(privacy=ZCDP(1.0), cutoffs=(0, 1, 2, 4),  # noqa: E731
                                       random_state=np.random.default_rng(3))
    a = mk().fit_from_coefficients(bad, n=200, dim=1)
    b = mk().fit_from_coefficients(fixed, n=200, dim=1)
    np.testing.assert_array_equal(a.coefficients_, b.coefficients_)
    c = mk().fit_from_coefficients(th, n=200, dim=1)
    np.testing.assert_array_equal(c.coefficients_, mk().fit(x).coefficients_)  # identity on real coefficients
    with pytest.raises(ValueError, match="entries"):
        mk().fit_from_coefficients(th[:-1], n=200, dim=1)


def test_rho_for_cost_sets_the_closed_form_privacy_cost():
    from icml24.private_density.experiment import rho_for_cost

    dens = TrigDensity.sobolev(beta=1.5, dim=1, degree=16, seed=3, scaling="grid")
    pieces = {N: expected_mise(dens, cutoff=N, n=1, privacy=ZCDP(1.0)) for N in range(9)}
    with pytest.raises(ValueError, match="not reachable"):  # cost <= 1, or above the noise-free cutoff 0's
        rho_for_cost(pieces, n=1_000, cost=1.0)
    with pytest.raises(ValueError, match="not reachable"):
        rho_for_cost(pieces, n=1_000, cost=1e6)
    prev = math.inf
    for n in (1_000, 10_000, 100_000):
        rho = rho_for_cost(pieces, n=n, cost=10.0)
        priv = min(expected_mise(dens, cutoff=N, n=n, privacy=ZCDP(rho))["mise"] for N in range(9))
        nonpriv = min(expected_mise(dens, cutoff=N, n=n, privacy=None)["mise"] for N in range(9))
        assert priv / nonpriv == pytest.approx(10.0, rel=1e-6)
        assert rho < prev  # a constant cost needs a shrinking budget as n grows
        prev = rho


@pytest.mark.parametrize("kw", [{"cost_target": 1.0}, {"cost_band": 0.5}, {"closed_form_tol": 0.0}])
def test_config_rejects_bad_regime_parameters(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        Config(**kw)
