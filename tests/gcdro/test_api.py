"""GCDRO core and estimator: invariants, closed forms, reference equivalence, input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import clone

from icml24.gcdro import (
    DRORegressor,
    EdgeList,
    GCDRORegressor,
    adaptive_step,
    chemical_potential,
    chi2_constrained_worst_case,
    chi2_worst_case,
    cvar_worst_case,
    dirichlet_energy,
    gcdro_objective,
    gradient_flow,
    graph_laplacian,
    kl_constrained_worst_case,
    kl_worst_case,
    knn_graph,
    laplacian_apply,
    matched,
    upwind_flux,
)


@pytest.fixture(scope="module")
def noisy_instance():
    """2-D points, a smooth high-loss region plus 5 % isolated gross-noise spikes (fixed loss vector)."""
    rng = np.random.default_rng(0)
    n = 120
    x = rng.uniform(-1, 1, size=(n, 2))
    loss = 0.1 + np.exp(-((x - 0.5) ** 2).sum(1) / 0.1)
    noisy = np.zeros(n, bool)
    noisy[rng.choice(n, 6, replace=False)] = True
    loss[noisy] += 10.0
    loss = torch.tensor(loss / loss.mean())
    edges = EdgeList.from_adjacency(knn_graph(x, n_neighbors=8))
    return x, loss, torch.tensor(noisy), edges


def _noisy_mass(q, noisy):
    return float(q[noisy].sum())


# ------------------------------------------------------------------------------------------ C1 mechanism
def test_fixed_knobs_baselines_concentrate_on_noise_strong_alpha_flow_does_not(noisy_instance):
    """At each method's own fixed knob (NOT matched strength: the flow's q is much closer to uniform)."""
    _, loss, noisy, edges = noisy_instance
    frac = float(noisy.float().mean())
    for q in (kl_worst_case(loss, temperature=1.0), chi2_worst_case(loss, lam=1.0),
              cvar_worst_case(loss, alpha=frac)):
        assert _noisy_mass(q, noisy) > 0.5
    q = gradient_flow(loss, edges, alpha=10.0, beta=0.1, n_steps=600)
    assert _noisy_mass(q, noisy) <= 2 * frac
    # ... but uniform weights (no flow at all, n_steps=0) pass that too: the flow must have moved mass and
    # raised the calibrated risk it ascends (both are exactly 0 for n_steps=0)
    n = loss.numel()
    uniform = torch.full_like(loss, 1.0 / n)
    assert 0.5 * float((q - uniform).abs().sum()) > 5e-3
    gain = gcdro_objective(q, loss, edges, alpha=10.0, beta=0.1) - gcdro_objective(uniform, loss, edges,
                                                                                    alpha=10.0, beta=0.1)
    assert float(gain) > 1e-4
    # α = β = 0 (GDRO) with the same flow time is not calibrated: more mass on noise than GCDRO.
    q0 = gradient_flow(loss, edges, alpha=0.0, beta=0.0, n_steps=600)
    assert _noisy_mass(q0, noisy) > 2 * _noisy_mass(q, noisy)


def _matched_arms(loss, edges, level, steps=150):
    return {
        "kl": matched.bisect_knob(lambda lam: kl_worst_case(loss, temperature=lam), level, lo=1e-3, hi=1e5),
        "chi2": matched.bisect_knob(lambda lam: chi2_worst_case(loss, lam=lam), level, lo=1e-3, hi=1e7),
        "cvar": matched.cvar_at_tv(loss, level),
        "gdro": matched.flow_at_tv(loss, edges, level),
        "gcdro": matched.bisect_knob(lambda lam: gradient_flow(loss, edges, alpha=100 * lam, beta=lam, n_steps=steps),
                                     level, lo=1e-5, hi=1e3, iters=30),
        "alpha0": matched.bisect_knob(lambda lam: gradient_flow(loss, edges, alpha=0.0, beta=lam, n_steps=steps),
                                      level, lo=1e-5, hi=1e3, iters=30),
    }


def test_matched_tv_every_arm_hits_the_level_and_geometry_shifts_mass_off_spikes(noisy_instance):
    """C1 at matched strength: each arm's knob is set so that TV(q, uniform) = 0.2. Then the geometric term
    (α = 100 β) moves mass from the isolated noise spikes to the clean high-loss region compared with KL and with
    the same flow without it (α = 0); CVaR at TV 0.2 is uniform on the top 80 % and so puts even less on noise."""
    _, loss, noisy, edges = noisy_instance
    ell, nz = loss.numpy(), noisy.numpy()
    bump = ~nz & (ell >= np.quantile(ell[~nz], 0.9))
    arms = _matched_arms(loss, edges, 0.2)
    for name, m in arms.items():
        assert m.reached and abs(m.tv - 0.2) <= 0.01 * 0.2, (name, m.tv)
        assert abs(float(m.q.sum()) - 1) < 1e-9 and float(m.q.min()) >= 0
    mass = {k: (float(m.q[noisy].sum()), float(m.q.numpy()[bump].sum())) for k, m in arms.items()}
    for other in ("kl", "alpha0"):
        assert mass["gcdro"][0] < mass[other][0] and mass["gcdro"][1] > mass[other][1], mass
    frac = float(nz.mean())
    assert mass["cvar"][0] == pytest.approx(frac / 0.8) and mass["cvar"][0] < mass["gcdro"][0]


def test_matched_helpers_validate_and_report_unreachable_levels(noisy_instance):
    _, loss, _, edges = noisy_instance
    m = matched.flow_at_tv(loss, edges, 0.2, alpha=0.0, beta=0.0, max_steps=1)
    assert not m.reached and m.tv < 0.2
    m = matched.bisect_knob(lambda lam: kl_worst_case(loss, temperature=lam), 0.99, lo=1.0, hi=10.0)
    assert not m.reached
    with pytest.raises(ValueError, match="level"):
        matched.cvar_at_tv(loss, 1.0)
    with pytest.raises(ValueError, match="hi > lo"):
        matched.bisect_knob(lambda lam: loss, 0.1, lo=2.0, hi=1.0)
    with pytest.raises(ValueError, match="max_steps"):
        matched.flow_at_tv(loss, edges, 0.1, max_steps=0)


def test_c3_raising_alpha_lowers_noisy_mass_monotonically(noisy_instance):
    _, loss, noisy, edges = noisy_instance
    # start every flow at the α = 0 equilibrium (Gibbs / KL state) and let the Dirichlet term pull mass off
    gibbs = kl_worst_case(loss, temperature=0.1)
    masses = [_noisy_mass(gradient_flow(loss, edges, alpha=a, beta=0.1, n_steps=500, q0=gibbs), noisy)
              for a in (0.0, 0.1, 1.0, 10.0)]
    assert all(b < a for a, b in zip(masses, masses[1:], strict=False)), masses
    assert masses[0] > 0.5 and masses[-1] < 0.2


# ------------------------------------------------------------------------------------------ C3 exactness
def test_alpha0_kl_softmax_is_stationary(noisy_instance):
    _, loss, _, edges = noisy_instance
    beta = 0.7
    q = kl_worst_case(loss, temperature=beta)
    phi = chemical_potential(q, loss, edges, alpha=0.0, beta=beta)
    flux = upwind_flux(q, phi, edges)
    assert float(flux.abs().max()) < 1e-12
    assert float(phi.max() - phi.min()) < 1e-10  # Φ constant: the Gibbs state is the α = 0 equilibrium


def test_alpha0_flow_converges_to_kl_softmax_on_complete_graph():
    rng = np.random.default_rng(1)
    n, beta = 15, 0.5
    loss = torch.tensor(rng.exponential(size=n))
    edges = EdgeList.from_adjacency(np.ones((n, n)) - np.eye(n))
    q = gradient_flow(loss, edges, alpha=0.0, beta=beta, n_steps=8000, max_step=0.05)
    torch.testing.assert_close(q, kl_worst_case(loss, temperature=beta), atol=1e-8, rtol=0)


def test_flux_sums_to_zero_and_weights_stay_probability():
    rng = np.random.default_rng(2)
    n = 60
    x = rng.normal(size=(n, 3))
    edges = EdgeList.from_adjacency(knn_graph(x, n_neighbors=5))
    for _ in range(5):
        q = torch.tensor(rng.dirichlet(np.ones(n)))
        phi = torch.tensor(rng.normal(size=n) * 10)
        assert abs(float(upwind_flux(q, phi, edges).sum())) < 1e-12
    loss = torch.tensor(rng.exponential(size=n) ** 3 * 100)  # heavy-tailed, large losses
    loss = loss / loss.mean()
    for alpha, beta in ((0.0, 0.0), (0.0, 0.1), (5.0, 0.0), (100.0, 1.0)):
        # raw Euler loop on the kNN graph: no clamp, no renormalisation (gradient_flow adds both as safeguards)
        q = torch.full((n,), 1.0 / n, dtype=torch.float64)
        for _ in range(200):
            phi = chemical_potential(q, loss, edges, alpha=alpha, beta=beta)
            tau = adaptive_step(phi, edges, step_scale=0.5, q=q, alpha=alpha)
            if not torch.isfinite(tau):
                break
            q = q + tau * upwind_flux(q, phi, edges)
            assert torch.isfinite(q).all() and float(q.min()) > 0, (alpha, beta)
            assert abs(float(q.sum()) - 1) < 1e-10, (alpha, beta)


def test_adaptive_step_keeps_positivity_without_renormalisation():
    rng = np.random.default_rng(3)
    n = 40
    edges = EdgeList.from_adjacency(np.ones((n, n)) - np.eye(n))
    q = torch.full((n,), 1.0 / n, dtype=torch.float64)
    loss = torch.tensor(rng.exponential(size=n) * 50)
    for _ in range(100):
        phi = chemical_potential(q, loss, edges, alpha=1.0, beta=0.05)
        tau = adaptive_step(phi, edges, step_scale=0.5, q=q, alpha=1.0)
        q = q + tau * upwind_flux(q, phi, edges)  # raw Euler step, no clamp
        assert float(q.min()) > 0 and abs(float(q.sum()) - 1) < 1e-10


def test_laplacian_and_dirichlet_energy_match_scipy():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(50, 2))
    w = knn_graph(x, n_neighbors=6)
    assert abs(w - w.T).max() == 0 and w.diagonal().sum() == 0
    lap = graph_laplacian(w)
    edges = EdgeList.from_adjacency(w)
    q = rng.dirichlet(np.ones(50))
    qt = torch.tensor(q)
    torch.testing.assert_close(laplacian_apply(qt, edges), torch.tensor(lap @ q))
    torch.testing.assert_close(dirichlet_energy(qt, edges), torch.tensor(q @ (lap @ q)))


def test_knn_graph_is_connected_after_fallback():
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(size=(20, 2)), rng.normal(size=(20, 2)) + 100])  # two far clusters
    assert connected_components(knn_graph(x, n_neighbors=3), directed=False)[0] == 1
    assert connected_components(knn_graph(x, n_neighbors=3, ensure_connected=False), directed=False)[0] == 2


def test_knn_graph_keeps_duplicate_rows_connected_with_weight_one():
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(8)
    base = rng.normal(size=(15, 2))
    x = np.concatenate([base, base])  # row i and row i + 15 are identical
    w = knn_graph(x, n_neighbors=3)
    for i in range(15):
        assert w[i, i + 15] == 1.0 and w[i + 15, i] == 1.0
    assert abs(w - w.T).max() == 0 and w.diagonal().sum() == 0
    # all-identical points: a complete graph of weight-1 edges (used to have no edges at all)
    same = knn_graph(np.ones((6, 2)), n_neighbors=2)
    assert connected_components(same, directed=False)[0] == 1
    assert set(np.unique(same.data)) == {1.0}


# ------------------------------------------------------------------------------------ closed-form baselines
def test_chi2_matches_bisection_reference_and_kkt():
    rng = np.random.default_rng(6)
    loss = torch.tensor(rng.exponential(size=200))
    lam, n = 0.3, 200
    q = chi2_worst_case(loss, lam=lam)
    lo, hi = float(loss.min()) - lam, float(loss.max())
    for _ in range(200):  # Σ (ℓ − η)_+ / (λ n) = 1 by bisection on η
        eta = 0.5 * (lo + hi)
        s = float(torch.clamp(loss - eta, min=0).sum()) / (lam * n)
        lo, hi = (eta, hi) if s > 1 else (lo, eta)
    torch.testing.assert_close(q, torch.clamp(loss - eta, min=0) / (lam * n), atol=1e-10, rtol=0)
    # a large λ (small radius) keeps q positive everywhere: q = 1/n + (ℓ − mean ℓ)/(λ n)
    big = chi2_worst_case(loss, lam=100.0)
    torch.testing.assert_close(big, 1 / n + (loss - loss.mean()) / (100.0 * n))


def test_cvar_and_kl_closed_forms():
    loss = torch.tensor([5.0, 1.0, 3.0, 2.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(cvar_worst_case(loss, alpha=0.4), torch.tensor([0.5, 0, 0, 0, 0.5], dtype=torch.float64))
    q = cvar_worst_case(loss, alpha=0.3)  # cap 2/3: 2/3 on the largest, 1/3 on the next
    torch.testing.assert_close(q, torch.tensor([2 / 3, 0, 0, 0, 1 / 3], dtype=torch.float64))
    torch.testing.assert_close(kl_worst_case(loss, temperature=2.0), torch.softmax(loss / 2.0, 0))


# ----------------------------------------------------------------------------------------------- estimator
@pytest.fixture(scope="module")
def linear_data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(150, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3 + 0.1 * rng.normal(size=150)
    return x, y


def test_erm_estimator_matches_ols(linear_data):
    x, y = linear_data
    m = DRORegressor(method="erm", lr=0.05, max_iter=800, random_state=0).fit(x, y)
    coef = np.linalg.lstsq(np.column_stack([x, np.ones(len(y))]), y, rcond=None)[0]
    np.testing.assert_allclose(m.coef_, coef[:3], atol=1e-3)
    assert m.score(x, y) > 0.99


@pytest.mark.parametrize("est", [GCDRORegressor(n_neighbors=5, max_iter=60), GCDRORegressor(
    n_neighbors=5, max_iter=60, model="mlp", hidden=8, alpha=0.0, beta=0.0), DRORegressor(method="chi2", max_iter=60)])
def test_estimator_api_and_determinism(linear_data, est):
    x, y = linear_data
    a = clone(est).set_params(random_state=3).fit(x, y)
    b = clone(est).set_params(random_state=3).fit(x, y)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    assert a.predict(x).shape == (150,) and np.isfinite(a.score(x, y))
    assert abs(a.weights_.sum() - 1) < 1e-9 and a.weights_.min() >= 0
    assert set(est.get_params()) >= {"model", "lr", "max_iter", "device"}


@pytest.mark.parametrize("kwargs, match", [
    ({"n_neighbors": 0}, "n_neighbors"),
    ({"n_neighbors": 2.5}, "n_neighbors"),  # k >= n is clipped to n − 1 (issue 29), not refused
    ({"alpha": -1.0}, "alpha"),
    ({"beta": -0.1}, "beta"),
    ({"step_scale": 1.5}, "step_scale"),
    ({"model": "tree"}, "model"),
    ({"max_iter": 0}, "max_iter"),
])
def test_gcdro_bad_params_raise(linear_data, kwargs, match):
    x, y = linear_data
    with pytest.raises(ValueError, match=match):
        GCDRORegressor(**kwargs).fit(x, y)


def test_bad_inputs_raise(linear_data):
    x, y = linear_data
    xn = x.copy()
    xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        GCDRORegressor().fit(xn, y)
    yn = y.copy()
    yn[0] = np.nan
    with pytest.raises(ValueError, match="y contains NaN"):
        GCDRORegressor().fit(x, yn)
    with pytest.raises(ValueError, match="same number of samples"):
        GCDRORegressor().fit(x, y[:-1])
    with pytest.raises(ValueError, match="method"):
        DRORegressor(method="wass").fit(x, y)
    with pytest.raises(ValueError, match="level"):
        DRORegressor(method="cvar", level=2.0).fit(x, y)
    with pytest.raises(ValueError, match="n_neighbors"):
        knn_graph(x, n_neighbors=0)
    with pytest.raises(ValueError, match="alpha"):
        gradient_flow(torch.ones(150, dtype=torch.float64), EdgeList.from_adjacency(knn_graph(x)), alpha=-1.0)
    with pytest.raises(ValueError, match="losses"):
        kl_worst_case(torch.tensor([1.0, float("nan")]), temperature=1.0)
    with pytest.raises(TypeError, match="sigma"):
        knn_graph(x, n_neighbors=5, sigma="wide")
    with pytest.raises(ValueError, match="sigma"):
        knn_graph(x, n_neighbors=5, sigma=float("inf"))
    with pytest.raises(TypeError, match="sigma"):
        GCDRORegressor(n_neighbors=5, sigma="wide").fit(x, y)
    with pytest.raises(ValueError, match="temperature"):
        kl_worst_case(torch.ones(3, dtype=torch.float64), temperature=1e-310)
    m = GCDRORegressor(n_neighbors=5, max_iter=5).fit(x, y)
    with pytest.raises(ValueError, match="features"):
        m.predict(x[:, :2])


@pytest.mark.parametrize("est, exc, match", [
    (GCDRORegressor(n_neighbors=5, lr=float("inf")), ValueError, "lr"),
    (DRORegressor(method="kl", lr=float("inf")), ValueError, "lr"),
    (DRORegressor(method="erm", lr=float("nan")), ValueError, "lr"),
    (DRORegressor(method="erm", lr="fast"), TypeError, "lr"),
    (DRORegressor(method="kl", penalty=1e-310), ValueError, "penalty"),
    (DRORegressor(method="kl", penalty=float("inf")), ValueError, "penalty"),
    (DRORegressor(method="chi2", penalty=float("nan")), ValueError, "penalty"),
    (DRORegressor(method="kl_constrained", radius=float("nan")), ValueError, "radius"),
    (DRORegressor(method="chi2_constrained", radius=-1.0), ValueError, "radius"),
    (DRORegressor(method="wasserstein", radius=0.0), ValueError, "radius"),
    (DRORegressor(method="wasserstein"), ValueError, "needs radius"),
    (DRORegressor(method="wasserstein", radius=0.1, model="mlp"), ValueError, "model='linear'"),
    (DRORegressor(method="erm", lr_decay="yes"), TypeError, "lr_decay"),
    (GCDRORegressor(n_neighbors=5, sigma=-1.0), ValueError, "sigma"),
])
def test_non_finite_and_degenerate_hyperparameters_raise(linear_data, est, exc, match):
    x, y = linear_data
    with pytest.raises(exc, match=match):
        est.fit(x, y)


# ------------------------------------------------------------------- constrained and Wasserstein baselines
def test_old_radius_name_of_penalised_methods_raises_a_clear_error(linear_data):
    x, y = linear_data
    for method, new in (("kl", "penalty"), ("chi2", "penalty"), ("cvar", "level")):
        with pytest.raises(ValueError, match=f"takes {new}.*not radius"):
            DRORegressor(method=method, radius=1.0).fit(x, y)


@pytest.mark.parametrize("rho", [0.01, 0.2, 1.5])
def test_constrained_kl_attains_its_radius_and_the_dual_value(rho):
    from scipy.optimize import minimize_scalar
    from scipy.special import logsumexp

    rng = np.random.default_rng(10)
    ell = rng.exponential(size=300)
    q = kl_constrained_worst_case(torch.tensor(ell), radius=rho).numpy()
    assert float((q * np.log(q * 300)).sum()) == pytest.approx(rho, rel=1e-6)
    dual = minimize_scalar(lambda t: np.exp(t) * (logsumexp(ell / np.exp(t)) - np.log(300)) + np.exp(t) * rho,
                           bounds=(-8, 8), method="bounded", options={"xatol": 1e-10})
    assert float(q @ ell) == pytest.approx(dual.fun, rel=1e-6)  # strong duality (Hu & Hong 2013)


@pytest.mark.parametrize("rho", [0.01, 0.5, 5.0])
def test_constrained_chi2_attains_its_radius_and_the_dual_value(rho):
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(11)
    ell = rng.exponential(size=300)
    q = chi2_constrained_worst_case(torch.tensor(ell), radius=rho).numpy()
    assert q.min() >= 0 and q.sum() == pytest.approx(1.0)
    assert float(0.5 * ((300 * q - 1) ** 2).mean()) == pytest.approx(rho, rel=1e-6)
    dual = minimize_scalar(lambda eta: np.sqrt(1 + 2 * rho) * np.sqrt(np.mean(np.maximum(ell - eta, 0) ** 2)) + eta,
                           bounds=(-50, ell.max()), method="bounded", options={"xatol": 1e-12})
    assert float(q @ ell) == pytest.approx(dual.fun, rel=1e-6)  # Duchi & Namkoong (2021)
    # beyond the largest divergence (all mass on the argmax) the argmax is the worst case
    big = chi2_constrained_worst_case(torch.tensor(ell), radius=1e4).numpy()
    assert big[np.argmax(ell)] == pytest.approx(1.0)


def test_wasserstein_worst_case_closed_form_and_fit():
    """sup over feature shifts with mean ‖Δ‖² <= δ of the MSE is (sqrt(MSE) + sqrt(δ)‖θ‖)² (Blanchet et al.
    2019), attained by Δ_i = −sqrt(δ/MSE) r_i θ/‖θ‖; the fitted model minimises sqrt(MSE) + sqrt(δ)‖θ‖."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(12)
    x = rng.normal(size=(200, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.5 * rng.normal(size=200)
    theta, delta = np.array([0.8, -1.5, 0.2]), 0.05
    r = y - x @ theta
    mse = np.mean(r ** 2)
    shift = -np.sqrt(delta / mse) * r[:, None] * theta[None] / np.linalg.norm(theta)
    assert np.mean((shift ** 2).sum(1)) == pytest.approx(delta)
    worst = np.mean((y - (x + shift) @ theta) ** 2)
    assert worst == pytest.approx((np.sqrt(mse) + np.sqrt(delta) * np.linalg.norm(theta)) ** 2)
    for _ in range(20):  # no other shift of the same budget does better
        d = rng.normal(size=x.shape)
        d *= np.sqrt(delta / np.mean((d ** 2).sum(1)))
        assert np.mean((y - (x + d) @ theta) ** 2) <= worst + 1e-12
    est = DRORegressor(method="wasserstein", radius=delta, lr=0.05, max_iter=1500).fit(x, y)
    xs, ys = (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()
    xa = np.column_stack([xs, np.ones(len(xs))])

    def obj(p):
        return np.sqrt(np.mean((xa @ p - ys) ** 2)) + np.sqrt(delta) * np.linalg.norm(p[:3])

    ref = minimize(obj, np.zeros(4), method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12,
                                                                    "maxiter": 20000}).x
    w = est.model_.weight.detach().numpy().ravel()
    np.testing.assert_allclose(w, ref[:3], atol=2e-3)
    assert np.linalg.norm(est.coef_) < np.linalg.norm(np.linalg.lstsq(np.column_stack([x, np.ones(200)]), y,
                                                                      rcond=None)[0][:3])


def test_every_arm_trains_to_a_stationary_point(linear_data):
    x, y = linear_data
    for est in (DRORegressor(method="erm"), DRORegressor(method="kl", penalty=10.0),
                DRORegressor(method="chi2_constrained", radius=0.1), DRORegressor(method="kl_constrained", radius=0.1),
                DRORegressor(method="wasserstein", radius=0.01)):
        est.set_params(lr=0.05, max_iter=800).fit(x, y)
        assert est.final_grad_norm_ < 1e-3, (est.method, est.final_grad_norm_)
