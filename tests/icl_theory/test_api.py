"""icl_theory: closed forms vs dense references, the decomposition and its rates (notes §5.2 items 1-6), the
transformer's causality, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from icml24.icl_theory import (
    HierarchicalLinearModel,
    ICLTransformer,
    SubspaceLinearModel,
    asymptotic_intra_error,
    asymptotic_meta_error,
    bayes_nll,
    dense_information,
    estimate_errors,
    estimate_subspace_errors,
    intra_task_error,
    meta_learning_error,
    no_meta_nll,
    oracle_psi_nll,
    per_position_nll,
    sphere_grid,
    subspace_log_likelihood,
    train_icl,
)



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only wait on the shared cores
    yield
    torch.set_num_threads(n)


W8 = HierarchicalLinearModel(d=8, sigma_psi=1.0, sigma_theta=0.5, sigma=1.0)  # notes §3


def _cov_y(model: HierarchicalLinearModel, Z: np.ndarray, *, psi_known: bool = False, meta: bool = True) -> np.ndarray:
    """Cov(Y | Z) of one data set Z (M, T, d): σ_ψ² XXᵀ (if ψ unknown) + σ_θ² blockdiag(Z_m Z_mᵀ) + σ² I."""
    M, T, d = Z.shape
    X = Z.reshape(M * T, d)
    C = model.sigma ** 2 * np.eye(M * T)
    for m in range(M):
        sl = slice(m * T, (m + 1) * T)
        C[sl, sl] += model.sigma_theta ** 2 * Z[m] @ Z[m].T
        if not meta and not psi_known:  # every sequence has its own independent N(0, σ_ψ²) copy of ψ
            C[sl, sl] += model.sigma_psi ** 2 * Z[m] @ Z[m].T
    if meta and not psi_known:
        C += model.sigma_psi ** 2 * X @ X.T
    return C


# ---------------------------------------------------------------- closed forms against dense references
def test_fast_closed_forms_equal_the_dense_covariance_reference():
    rng = np.random.default_rng(0)
    for M, T, d in ((1, 5, 3), (4, 6, 3), (3, 2, 5)):  # T < d too: rank-deficient Gram matrices
        w = HierarchicalLinearModel(d=d, sigma_psi=0.7, sigma_theta=1.3, sigma=0.4)
        Z = rng.standard_normal((M, T, d))
        ref = dense_information(w, Z)
        assert meta_learning_error(w, Z) == pytest.approx(ref["meta"], rel=1e-10)
        assert intra_task_error(w, Z) == pytest.approx(ref["intra"], rel=1e-10)
        assert ref["total"] == pytest.approx(ref["meta"] + ref["intra"], rel=1e-12)


def test_sequential_predictors_equal_the_joint_gaussian_densities():
    """Chain rule: Σ_t −ln P̂(y_t | past) of each predictor = −ln of the matching joint density of Y given Z."""
    w = HierarchicalLinearModel(d=3, sigma_psi=1.2, sigma_theta=0.6, sigma=0.5)
    data = w.sample(M=4, T=5, rng=np.random.default_rng(1), reps=3)
    for nll_fn, kw in ((bayes_nll, {}), (oracle_psi_nll, {"psi_known": True}), (no_meta_nll, {"meta": False})):
        got = nll_fn(w, data).sum((1, 2))
        for r in range(3):
            Z, y = data.Z[r], data.Y[r].reshape(-1)
            mean = np.zeros_like(y)
            if kw.get("psi_known"):
                mean = Z.reshape(-1, 3) @ data.psi[r]
            ref = -stats.multivariate_normal(mean, _cov_y(w, Z, **kw)).logpdf(y)
            assert got[r] == pytest.approx(ref, rel=1e-9), nll_fn.__name__


def test_subspace_likelihood_equals_the_dense_gaussian():
    w = SubspaceLinearModel(d=3, sigma_w=0.8, sigma=0.3)
    rng = np.random.default_rng(2)
    B, _, Z, Y = w.sample(M=3, T=4, reps=1, rng=rng)
    b = sphere_grid(d=3, n=7)
    A = np.einsum("mti,mtj->mij", Z[0], Z[0])
    got = subspace_log_likelihood(w, b, A, np.einsum("mti,mt->mi", Z[0], Y[0]), (Y[0] ** 2).sum(1), 4)
    for g in range(7):
        ref = sum(stats.multivariate_normal(np.zeros(4), w.sigma ** 2 * np.eye(4) + w.sigma_w ** 2
                                            * np.outer(Z[0, m] @ b[g], Z[0, m] @ b[g])).logpdf(Y[0, m])
                  for m in range(3))
        assert got[g] == pytest.approx(ref, rel=1e-10)
    assert np.allclose(np.linalg.norm(sphere_grid(d=5, n=9, rng=rng), axis=1), 1.0)


# ---------------------------------------------------------------- notes §5.2
@pytest.mark.parametrize("M, T", [(4, 32), (16, 8)])
def test_decomposition_identity_within_4_standard_errors(M, T):  # item 1
    e = estimate_errors(W8, M=M, T=T, reps=200, rng=np.random.default_rng(M))
    assert abs(e.mean("decomp_gap")) <= 4 * e.se("decomp_gap")
    # the identity is not 0 = 0: both terms are large against the tolerance
    assert e.mean("meta") > 20 * e.se("decomp_gap") and e.mean("intra") > 20 * e.se("decomp_gap")


def _intra_mean(model, *, M, T, n, seed):
    return float(intra_task_error(model, np.random.default_rng(seed).standard_normal((n, M, T, model.d))).mean())


def test_intra_task_bound_and_tightness():  # item 2
    for T in (8, 32, 128):
        ratio = _intra_mean(W8, M=1, T=T, n=500, seed=T) / asymptotic_intra_error(W8, T=T)
        assert ratio <= 1.0
        if T >= 32:
            assert ratio >= 0.9


def test_intra_task_error_is_independent_of_M():  # item 3
    vals = [_intra_mean(W8, M=M, T=32, n=500, seed=M) for M in (1, 16, 64)]
    assert (max(vals) - min(vals)) / np.mean(vals) < 0.03


def test_meta_learning_error_decreases_and_matches_the_rate():  # item 4
    rng = np.random.default_rng(4)
    grid = {(M, T): float(meta_learning_error(W8, rng.standard_normal((32, M, T, 8))).mean())
            for M in (1, 4, 16, 64) for T in (8, 32, 128)}
    for T in (8, 32, 128):
        ms = [grid[M, T] for M in (1, 4, 16, 64)]
        assert all(b < a for a, b in zip(ms[:-1], ms[1:], strict=True))
    for M in (1, 4, 16, 64):
        ts = [grid[M, T] for T in (8, 32, 128)]
        assert all(b < a for a, b in zip(ts[:-1], ts[1:], strict=True))
        assert 0.9 <= grid[M, 128] / asymptotic_meta_error(W8, M=M, T=128) <= 1.05


def test_ordering_oracle_bayes_no_meta_and_bayes_minus_oracle_is_meta():  # item 5
    e = estimate_errors(HierarchicalLinearModel(d=4, sigma_psi=1.0, sigma_theta=0.5, sigma=1.0), M=4, T=16,
                        reps=200, rng=np.random.default_rng(5))
    meta_mc = e.values["meta_mc"]
    nm_gap = e.values["excess_no_meta"] - e.values["excess_bayes"]
    assert meta_mc.mean() > 4 * e.se("meta_mc") and nm_gap.mean() > 4 * nm_gap.std(ddof=1) / math.sqrt(nm_gap.size)
    assert abs(e.mean("meta_mc") - e.mean("meta")) <= 4 * e.se("meta_mc")
    assert abs(e.mean("excess_oracle") - e.mean("intra")) <= 4 * e.se("excess_oracle")


def test_bayes_equals_no_meta_with_one_sequence():
    w = HierarchicalLinearModel(d=3)
    data = w.sample(M=1, T=6, rng=np.random.default_rng(6), reps=4)
    np.testing.assert_allclose(bayes_nll(w, data), no_meta_nll(w, data), rtol=1e-12)


def test_subspace_rates_and_quadrature():  # item 6 (d = 2, where r(d − r)/2 = 1/2)
    w = SubspaceLinearModel(d=2, sigma_w=1.0, sigma=0.5)
    g = sphere_grid(d=2, n=2000)
    xs, ys = [], []
    for M, T in ((4, 16), (16, 16), (64, 16), (64, 64)):
        e = estimate_subspace_errors(w, M=M, T=T, reps=40, grid=g, rng=np.random.default_rng(M * T))
        assert abs(e.intra.mean() * T / (0.5 * math.log1p(T / 0.25)) - 1) < 0.05
        xs.append(math.log(M * T))
        ys.append(e.meta.mean() * M * T)
    assert all(b > a for a, b in zip(ys[:-1], ys[1:], strict=True))
    assert 0.3 <= np.polyfit(xs, ys, 1)[0] <= 0.7
    fine = [float(estimate_subspace_errors(w, M=16, T=16, reps=3, grid=sphere_grid(d=2, n=n),
                                           rng=np.random.default_rng(9)).meta.mean()) for n in (2000, 20000)]
    assert abs(fine[0] - fine[1]) < 1e-3
    coarse = float(estimate_subspace_errors(w, M=16, T=16, reps=3, grid=sphere_grid(d=2, n=8),
                                            rng=np.random.default_rng(9)).meta.mean())
    assert abs(coarse - fine[1]) > 1e-3  # the convergence check can fail: 8 directions are too few


# ---------------------------------------------------------------- transformer
def test_transformer_is_causal_and_the_control_sees_only_z_t():
    torch.manual_seed(0)
    z, y = torch.randn(2, 6, 3), torch.randn(2, 6)
    for ctx in (True, False):
        net = ICLTransformer(d=3, T=6, width=16, heads=2, context=ctx).eval()
        mu, lv = net(z, y)
        y2 = y.clone()
        y2[:, 3:] += 5.0  # y_4.. changed: predictions at t <= 4 (index <= 3) must not move
        mu2, _ = net(z, y2)
        torch.testing.assert_close(mu[:, :4], mu2[:, :4])
        assert not torch.allclose(mu[:, 4:], mu2[:, 4:]) if ctx else torch.allclose(mu, mu2)
        z2 = z.clone()
        z2[:, 0] += 3.0  # z_1 changed
        mu3, _ = net(z2, y)
        assert not torch.allclose(mu[:, 0], mu3[:, 0])
        assert (not torch.allclose(mu[:, 1:], mu3[:, 1:])) if ctx else torch.allclose(mu[:, 1:], mu3[:, 1:])


def test_training_is_seeded_and_lowers_the_validation_loss():
    w = HierarchicalLinearModel(d=2, sigma_psi=1.0, sigma_theta=0.5, sigma=0.5)
    rng = np.random.default_rng(0)
    tr, va = w.sample(M=64, T=8, rng=rng), w.sample(M=32, T=8, rng=rng)
    runs = [train_icl(Z=tr.Z[0], Y=tr.Y[0], Z_val=va.Z[0], Y_val=va.Y[0], context=True, steps=40, width=16,
                      heads=2, eval_every=20, seed=3) for _ in range(2)]
    a, b = (per_position_nll(r.model, Z=va.Z[0], Y=va.Y[0]) for r in runs)
    np.testing.assert_array_equal(a, b)
    assert runs[0].val_curve[0][0] == 0 and min(v for _, v in runs[0].val_curve) < runs[0].val_curve[0][1]


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, err, match", [
    ({"d": 0}, ValueError, "d must be"), ({"d": 2.0}, TypeError, "d must be"),
    ({"d": 2, "sigma": 0.0}, ValueError, "sigma must be"), ({"d": 2, "sigma_psi": -1.0}, ValueError, "sigma_psi"),
    ({"d": 2, "sigma_theta": float("nan")}, ValueError, "sigma_theta"),
])
def test_bad_model_parameters(kw, err, match):
    with pytest.raises(err, match=f"icl_theory: {match}"):
        HierarchicalLinearModel(**kw)


@pytest.mark.parametrize("kw, match", [({"d": 1}, "d must be"), ({"d": 3, "sigma_w": 0.0}, "sigma_w"),
                                       ({"d": 3, "sigma": -0.5}, "sigma must be")])
def test_bad_subspace_parameters(kw, match):
    with pytest.raises(ValueError, match=f"icl_theory: {match}"):
        SubspaceLinearModel(**kw)


@pytest.mark.parametrize("M, T", [(0, 4), (3, 0), (-1, 4)])
def test_bad_sizes(M, T):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="icl_theory: [MT] must be"):
        W8.sample(M=M, T=T, rng=rng)
    with pytest.raises(ValueError, match="icl_theory: [MT] must be"):
        estimate_errors(W8, M=M, T=T, reps=2, rng=rng)
    with pytest.raises(ValueError, match="icl_theory: [MT] must be"):
        asymptotic_meta_error(W8, M=M, T=T)
    with pytest.raises(ValueError, match="icl_theory: [MT] must be"):
        estimate_subspace_errors(SubspaceLinearModel(d=2), M=M, T=T, reps=2, grid=sphere_grid(d=2, n=4), rng=rng)


def test_bad_shapes_and_transformer_arguments():
    with pytest.raises(ValueError, match="Z must have shape"):
        meta_learning_error(W8, np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="grid must have shape"):
        estimate_subspace_errors(SubspaceLinearModel(d=3), M=2, T=2, reps=2, grid=sphere_grid(d=2, n=4),
                                 rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs rng"):
        sphere_grid(d=4, n=10)
    with pytest.raises(ValueError, match="divisible"):
        ICLTransformer(d=2, T=4, width=10, heads=4)
    with pytest.raises(ValueError, match="exceeds"):
        ICLTransformer(d=2, T=4, width=8, heads=2)(torch.zeros(1, 5, 2), torch.zeros(1, 5))
