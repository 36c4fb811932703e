"""Unit tests of dp_public: closed forms vs Monte Carlo, PrivUnitG, semi-DP SGD vs references and Opacus."""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pytest
import torch
from scipy import special

from icml24.dp_public import (
    SemiDPSGD,
    central_mse,
    central_variances,
    clip_and_sum,
    epsilon_for,
    gaussian_noise_std,
    ldp_mse,
    ldp_treat_as_private_mean,
    ldp_weighted_mean,
    make_public_only_sgd,
    noise_multiplier_for,
    optimal_public_weight,
    per_sample_grads,
    poisson_sample,
    private_only_mean,
    privunitg,
    privunitg_mse,
    privunitg_params,
    project_to_unit_ball,
    sanitize_grad_samples,
    sanitize_private_rows,
    throw_away_mean,
    train_semi_dp,
    treat_as_private_mean,
    weighted_mean,
)
from icml24.dp_public.experiment import Config

warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sphere(shape, g):
    z = torch.randn(shape, generator=g, dtype=F64)
    return z / z.norm(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------- Gaussian mechanism
def test_analytic_gaussian_solves_its_equation_and_beats_classic():
    for eps, delta in [(0.3, 1e-5), (1.0, 1e-6), (0.8, 1e-3)]:
        s = gaussian_noise_std(sensitivity=1.0, epsilon=eps, delta=delta)
        a, b = 1 / (2 * s) - eps * s, -1 / (2 * s) - eps * s
        d = special.ndtr(a) - math.exp(eps) * special.ndtr(b)
        assert d <= delta and d == pytest.approx(delta, rel=1e-6)
        classic = gaussian_noise_std(sensitivity=1.0, epsilon=eps, delta=delta, mechanism="classic")
        assert classic == pytest.approx(math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-12)
        assert s < classic
    # linear in the sensitivity
    assert gaussian_noise_std(sensitivity=3.0, epsilon=2.0, delta=1e-5) == pytest.approx(
        3 * gaussian_noise_std(sensitivity=1.0, epsilon=2.0, delta=1e-5), rel=1e-9)


# -------------------------------------------------------------------------------------- central estimators
def _central_mc(trials: int, n_pub: int, n_priv: int, d: int, eps: float, seed: int = 0):
    g = _gen(seed)
    mu = 0.5 * _sphere((d,), g)
    x = mu + 0.5 * _sphere((trials, n_pub + n_priv, d), g)
    x_pub, x_priv = x[:, :n_pub], x[:, n_pub:]
    kw = {"epsilon": eps, "delta": 1e-5, "generator": g}
    est = {
        "throw_away": throw_away_mean(x_pub),
        "treat_as_private": treat_as_private_mean(x_priv, x_pub, **kw),
        "private_only": private_only_mean(x_priv, **kw),
        "weighted": weighted_mean(x_priv, x_pub, v=0.25, **kw)[0],
    }
    return {k: float(((m - mu) ** 2).sum(-1).mean()) for k, m in est.items()}


@pytest.mark.parametrize("n_pub,eps", [(20, 1.0), (60, 0.5)])
def test_central_analytic_mse_matches_monte_carlo(n_pub, eps):
    n_priv, d = 200, 20
    mc = _central_mc(2500, n_pub, n_priv, d, eps)
    for est, val in mc.items():
        an = central_mse(estimator=est, n_pub=n_pub, n_priv=n_priv, dim=d, v=0.25, epsilon=eps, delta=1e-5)
        assert val == pytest.approx(an, rel=0.05), est


def test_weighted_never_worse_and_treat_as_private_is_a_special_weight():
    for n_pub in (2, 5, 20, 100, 500, 1900):
        for eps in (0.1, 0.5, 1.0, 4.0):
            for d in (1, 10, 100):
                kw = {"n_pub": n_pub, "n_priv": 2000 - n_pub, "dim": d, "v": 0.3, "epsilon": eps, "delta": 1e-5}
                w = central_mse(estimator="weighted", **kw)
                ta = central_mse(estimator="throw_away", **kw)
                tp = central_mse(estimator="treat_as_private", **kw)
                assert w <= min(ta, tp) * (1 + 1e-12)
                # treat-as-private == weighted estimator with r = n_pub / n (exact identity)
                assert tp == pytest.approx(central_mse(estimator="weighted", r=n_pub / 2000, **kw), rel=1e-9)


def test_optimal_weight_minimises_the_mse_curve():
    vp, vq = central_variances(n_pub=50, n_priv=950, dim=30, v=0.25, epsilon=1.0, delta=1e-5)
    r_star = optimal_public_weight(var_pub=vp, var_priv=vq)
    rs = np.linspace(0, 1, 2001)
    curve = rs**2 * vp + (1 - rs) ** 2 * vq
    assert abs(rs[curve.argmin()] - r_star) <= 1e-3
    assert 0 < r_star < 1


def test_weighted_mean_endpoints_and_public_variance_estimate():
    g = _gen(1)
    x = 0.5 * _sphere((300, 10), g)
    x_pub, x_priv = x[:40], x[40:]
    m1, r1 = weighted_mean(x_priv, x_pub, epsilon=1.0, delta=1e-5, r=1.0, generator=_gen(0))
    torch.testing.assert_close(m1, x_pub.mean(0))
    assert float(r1) == 1.0
    m0, _ = weighted_mean(x_priv, x_pub, epsilon=1.0, delta=1e-5, r=0.0, generator=_gen(0))
    torch.testing.assert_close(m0, private_only_mean(x_priv, epsilon=1.0, delta=1e-5, generator=_gen(0)))
    # r from the public variance estimate equals r* with v = sum of public coordinate variances
    _, r = weighted_mean(x_priv, x_pub, epsilon=1.0, delta=1e-5, generator=_gen(0))
    v = float(x_pub.var(0, unbiased=True).sum())
    vp, vq = central_variances(n_pub=40, n_priv=260, dim=10, v=v, epsilon=1.0, delta=1e-5)
    assert float(r) == pytest.approx(optimal_public_weight(var_pub=vp, var_priv=vq), rel=1e-9)


def test_same_seed_same_numbers():
    x = 0.5 * _sphere((100, 8), _gen(3))
    a = weighted_mean(x[20:], x[:20], epsilon=1.0, delta=1e-5, generator=_gen(7))[0]
    b = weighted_mean(x[20:], x[:20], epsilon=1.0, delta=1e-5, generator=_gen(7))[0]
    c = weighted_mean(x[20:], x[:20], epsilon=1.0, delta=1e-5, generator=_gen(8))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


# -------------------------------------------------------------------------------------------------- PrivUnitG
@pytest.mark.parametrize("eps", [0.5, 2.0, 6.0])
def test_privunitg_parameters_give_exactly_eps_ldp(eps):
    p = privunitg_params(epsilon=eps)
    assert p.p * (1 - p.q) / (p.q * (1 - p.p)) == pytest.approx(math.exp(eps), rel=1e-10)
    assert special.ndtr(-p.gamma) == pytest.approx(p.q, rel=1e-10)
    # the chosen p minimises the scale over the grid
    assert all(privunitg_params(epsilon=eps, p_grid=(q,)).scale >= p.scale - 1e-12
               for q in np.arange(1, 100) / 100)


def test_privunitg_matches_independent_numbers_from_the_notes():
    p = privunitg_params(epsilon=2.0)
    assert p.p == pytest.approx(0.67)
    assert p.gamma == pytest.approx(0.787, abs=1e-3)
    assert p.scale == pytest.approx(1.271, abs=1e-3)


@pytest.mark.parametrize("norm", [1.0, 0.3])
def test_privunitg_unbiased_and_variance(norm):
    d, draws, eps = 16, 20000, 2.0
    x = norm * torch.nn.functional.normalize(torch.randn(d, generator=_gen(0), dtype=F64), dim=0)
    z = privunitg(x.expand(draws, d).contiguous(), epsilon=eps, generator=_gen(1))
    se = z.std(0) / math.sqrt(draws)
    assert ((z.mean(0) - x).abs() / se).max() < 4.0
    mse = float(((z - x) ** 2).sum(-1).mean())
    assert mse == pytest.approx(privunitg_mse(dim=d, epsilon=eps, input_norm=norm), rel=0.05)
    # the exact formula is close to the d σ_G² approximation of the notes
    assert privunitg_mse(dim=d, epsilon=eps) == pytest.approx(d * privunitg_params(epsilon=eps).scale ** 2,
                                                              rel=0.02)


def test_ldp_analytic_mse_matches_monte_carlo_and_weighted_wins():
    d, n, n_pub, eps, a, trials = 8, 400, 20, 1.0, 0.5, 800
    g = _gen(5)
    mu = torch.zeros(d, dtype=F64)
    mu[0] = a
    u = _sphere((trials, n, d - 1), g)
    x = torch.cat([torch.full((trials, n, 1), a, dtype=F64), math.sqrt(1 - a * a) * u], -1)
    z = privunitg(x, epsilon=eps, generator=g)
    v = 1 - a * a
    mc = {"throw_away": throw_away_mean(x[:, :n_pub]), "treat_as_private": ldp_treat_as_private_mean(z),
          "weighted": ldp_weighted_mean(reports=z[:, n_pub:], x_pub=x[:, :n_pub], epsilon=eps, v=v)[0]}
    for k, m in mc.items():
        val = float(((m - mu) ** 2).sum(-1).mean())
        an = ldp_mse(estimator=k, n_pub=n_pub, n_priv=n - n_pub, dim=d, v=v, epsilon=eps)
        assert val == pytest.approx(an, rel=0.05), k
    for k in (2, 10, 50, 200, 390):
        kw = {"n_pub": k, "n_priv": n - k, "dim": d, "v": v, "epsilon": eps}
        assert ldp_mse(estimator="weighted", **kw) <= min(ldp_mse(estimator="throw_away", **kw),
                                                          ldp_mse(estimator="treat_as_private", **kw))


# ------------------------------------------------------------------------------------- per-sample gradients
def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _ce(o, y):
    return torch.nn.functional.cross_entropy(o, y)


def _slow_grads(model, x, y):
    out = []
    for i in range(len(x)):
        model.zero_grad()
        _ce(model(x[i:i + 1]), y[i:i + 1]).backward()
        out.append([p.grad.detach().clone() for p in model.parameters()])
    return [torch.stack([o[j] for o in out]) for j in range(len(out[0]))]


def test_per_sample_grads_match_loop_reference_and_clip():
    m = _model()
    x, y = torch.randn(7, 5, generator=_gen(0)), torch.randint(0, 3, (7,), generator=_gen(1))
    fast = per_sample_grads(m, _ce, x, y)
    slow = _slow_grads(m, x, y)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b)
    c = 0.05
    ref = [torch.zeros_like(p) for p in m.parameters()]
    for i in range(7):
        nrm = math.sqrt(sum(float((g[i] ** 2).sum()) for g in slow))
        f = min(1.0, c / (nrm + 1e-6))
        for r, g in zip(ref, slow, strict=True):
            r += f * g[i]
    for a, b in zip(clip_and_sum(fast, max_grad_norm=c), ref, strict=True):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------- SemiDPSGD
def _grads(m, seed, b):
    x, y = torch.randn(b, 5, generator=_gen(seed)), torch.randint(0, 3, (b,), generator=_gen(seed + 1))
    return per_sample_grads(m, _ce, x, y)


def test_beta_one_is_exactly_an_opacus_dp_sgd_step():
    from opacus.optimizers import DPOptimizer

    m1, m2 = _model(), _model()
    priv, pub = _grads(m1, 0, 8), _grads(m1, 10, 5)
    opt = SemiDPSGD(m1.parameters(), lr=0.3, beta=1.0, noise_multiplier=1.3, max_grad_norm=0.1,
                    expected_batch_size=8, sample_rate=0.1, generator=_gen(42))
    opt.step(private_grad_samples=priv, public_grad_samples=pub)
    ref = DPOptimizer(torch.optim.SGD(m2.parameters(), lr=0.3), noise_multiplier=1.3, max_grad_norm=0.1,
                      expected_batch_size=8, generator=_gen(42))
    for p, g in zip(m2.parameters(), priv, strict=True):
        p.grad_sample = g.clone()
    ref.step()
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_beta_zero_is_exactly_a_public_step_whatever_the_noise():
    m = _model()
    w0 = [p.detach().clone() for p in m.parameters()]
    priv, pub = _grads(m, 0, 8), _grads(m, 10, 5)
    finals = []
    for noise_seed, priv_seed in ((1, 0), (2, 3)):
        mm = _model()
        opt = SemiDPSGD(mm.parameters(), lr=0.3, beta=0.0, noise_multiplier=5.0, max_grad_norm=0.1,
                        expected_batch_size=8, sample_rate=0.1, generator=_gen(noise_seed))
        opt.step(private_grad_samples=_grads(m, priv_seed, 8), public_grad_samples=pub)
        finals.append([p.detach().clone() for p in mm.parameters()])
    for a, b in zip(*finals, strict=True):
        assert torch.equal(a, b)
    step = [s / 5 for s in clip_and_sum(pub, max_grad_norm=0.1)]
    for a, w, s in zip(finals[0], w0, step, strict=True):
        torch.testing.assert_close(a, w - 0.3 * s)
    del priv


def test_mixed_step_matches_slow_reference():
    m, beta, lr, sigma, c, b = _model(), 0.37, 0.2, 0.8, 0.5, 6
    xp, yp = torch.randn(6, 5, generator=_gen(0)), torch.randint(0, 3, (6,), generator=_gen(1))
    xq, yq = torch.randn(4, 5, generator=_gen(2)), torch.randint(0, 3, (4,), generator=_gen(3))
    slow_p, slow_q = _slow_grads(m, xp, yp), _slow_grads(m, xq, yq)
    w0 = [p.detach().clone() for p in m.parameters()]
    gnoise = _gen(9)
    expected = []
    for j, w in enumerate(w0):
        def clip_sum(gs, j=j, w=w):
            acc = torch.zeros_like(w)
            for i in range(gs[0].shape[0]):
                nrm = math.sqrt(sum(float((g[i] ** 2).sum()) for g in gs))
                acc += min(1.0, c / (nrm + 1e-6)) * gs[j][i]
            return acc
        noise = torch.normal(0.0, sigma * c, size=w.shape, generator=gnoise)
        g_priv = (clip_sum(slow_p) + noise) / b
        g_pub = clip_sum(slow_q) / 4
        expected.append(w - lr * (beta * g_priv + (1 - beta) * g_pub))
    opt = SemiDPSGD(m.parameters(), lr=lr, beta=beta, noise_multiplier=sigma, max_grad_norm=c,
                    expected_batch_size=b, sample_rate=0.5, generator=_gen(9))
    opt.step(private_grad_samples=per_sample_grads(m, _ce, xp, yp),
             public_grad_samples=per_sample_grads(m, _ce, xq, yq))
    for p, e in zip(m.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e)


def test_public_only_sgd_uses_unclipped_mean_gradient():
    m = _model()
    pub = _grads(m, 4, 6)
    w0 = [p.detach().clone() for p in m.parameters()]
    make_public_only_sgd(m.parameters(), lr=0.1).step(public_grad_samples=pub)
    for p, w, g in zip(m.parameters(), w0, pub, strict=True):
        torch.testing.assert_close(p.detach(), w - 0.1 * g.mean(0))


# --------------------------------------------------------------------------------------------- accounting
def test_accountant_epsilon_matches_opacus_privacy_engine():
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    n, b, sigma, steps, delta = 200, 20, 1.1, 15, 1e-5
    x, y = torch.randn(n, 5, generator=_gen(0)), torch.randint(0, 3, (n,), generator=_gen(1))
    m_ref = _model()
    engine = PrivacyEngine(accountant="rdp")
    mod, opt_ref, loader = engine.make_private(module=m_ref, optimizer=torch.optim.SGD(m_ref.parameters(), lr=0.1),
                                               data_loader=DataLoader(TensorDataset(x, y), batch_size=b),
                                               noise_multiplier=sigma, max_grad_norm=1.0)
    done = 0
    while done < steps:
        for xb, yb in loader:
            if done == steps:
                break
            opt_ref.zero_grad()
            _ce(mod(xb), yb).backward()
            opt_ref.step()
            done += 1
    m = _model()
    opt = SemiDPSGD(m.parameters(), lr=0.1, beta=0.5, noise_multiplier=sigma, max_grad_norm=1.0,
                    expected_batch_size=b, sample_rate=b / n, accountant="rdp", generator=_gen(0))
    assert opt.get_epsilon(delta) == 0.0
    for s in range(steps):
        opt.step(private_grad_samples=_grads(m, s, 3), public_grad_samples=_grads(m, 100 + s, 2))
    for s in range(4):  # public-only steps cost nothing
        opt.step(public_grad_samples=_grads(m, 200 + s, 2))
    eps_ref = engine.get_epsilon(delta)
    assert opt.get_epsilon(delta) == pytest.approx(eps_ref, rel=1e-9)
    assert epsilon_for(noise_multiplier=sigma, sample_rate=b / n, steps=steps, delta=delta) == pytest.approx(
        eps_ref, rel=1e-9)


def test_noise_multiplier_for_reaches_the_target():
    sigma = noise_multiplier_for(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.05, steps=100)
    eps = epsilon_for(noise_multiplier=sigma, sample_rate=0.05, steps=100, delta=1e-5)
    assert 0.95 <= eps <= 1.0
    assert epsilon_for(noise_multiplier=sigma * 0.9, sample_rate=0.05, steps=100, delta=1e-5) > 1.0


def test_train_semi_dp_is_seeded_and_reports_epsilon():
    g = _gen(0)
    x, y = torch.randn(120, 5, generator=g), torch.randint(0, 3, (120,), generator=g)
    runs = []
    for _ in range(2):
        m = _model()
        r = train_semi_dp(m, _ce, mode="semi_dp", x_priv=x[20:], y_priv=y[20:], x_pub=x[:20], y_pub=y[:20],
                          epsilon=2.0, delta=1e-5, steps=5, lr=0.1, beta=0.5, batch_size=20,
                          public_batch_size=10, generator=_gen(3))
        runs.append([p.detach().clone() for p in m.parameters()])
        assert 0 < r.epsilon <= 2.0
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_missing_opacus_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "opacus.accountants.registry", None)
    with pytest.raises(ImportError, match=r"icml24\[dp\]"):
        SemiDPSGD(_model().parameters(), lr=0.1, beta=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                  expected_batch_size=4, sample_rate=0.1)


# ----------------------------------------------------------------------------------------------- bad input
def _x(n=10, d=4, seed=0):
    return 0.5 * _sphere((n, d), _gen(seed))


@pytest.mark.parametrize("kw,match", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -1.0}, "epsilon"), ({"epsilon": float("nan")}, "epsilon"),
    ({"epsilon": float("inf")}, "epsilon"), ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"),
    ({"delta": -0.1}, "delta"), ({"r": 1.5}, "r must be in"), ({"v": -1.0}, "v must be"),
])
def test_mean_estimation_bad_input(kw, match):
    args = {"epsilon": 1.0, "delta": 1e-5, **kw}
    with pytest.raises(ValueError, match=match):
        weighted_mean(_x(), _x(seed=1), **args)


def test_mean_estimation_bad_data():
    with pytest.raises(ValueError, match="dimension"):
        weighted_mean(_x(d=4), _x(d=5), epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="dimension"):
        treat_as_private_mean(_x(d=4), _x(d=3), epsilon=1.0, delta=1e-5)
    bad = _x()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):  # public data: a value check is allowed
        weighted_mean(_x(), bad, epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="NaN"):
        throw_away_mean(bad)
    torch.testing.assert_close(project_to_unit_ball(3 * _x()).norm(dim=-1), torch.ones(10, dtype=F64))
    with pytest.raises(ValueError, match="n_pub >= 2"):
        weighted_mean(_x(), _x(n=1), epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="epsilon <= 1"):
        gaussian_noise_std(sensitivity=1.0, epsilon=2.0, delta=1e-5, mechanism="classic")
    with pytest.raises(ValueError, match="sensitivity"):
        gaussian_noise_std(sensitivity=0.0, epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        privunitg(_x(), epsilon=0.0)
    with pytest.raises(TypeError, match="floating"):  # dtype is public: may raise
        weighted_mean(torch.ones(4, 3, dtype=torch.int64), _x(d=3), epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="dimension"):
        ldp_weighted_mean(reports=_x(d=4), x_pub=_x(d=6), epsilon=1.0)
    with pytest.raises(ValueError, match="p in p_grid"):
        privunitg_params(epsilon=1.0, p_grid=(1.5,))


@pytest.mark.parametrize("kw,match", [
    ({"lr": 0.0}, "lr"), ({"beta": -0.1}, "beta"), ({"beta": 1.1}, "beta"), ({"beta": float("nan")}, "beta"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"), ({"max_grad_norm": -1.0}, "max_grad_norm"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"), ({"sample_rate": 0.0}, "sample_rate"),
    ({"sample_rate": 1.5}, "sample_rate"), ({"expected_batch_size": 0}, "expected_batch_size"),
    ({"accountant": "moments"}, "accountant"),
])
def test_semidpsgd_bad_hyperparameters(kw, match):
    args = {"lr": 0.1, "beta": 0.5, "noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 4,
            "sample_rate": 0.1, **kw}
    with pytest.raises(ValueError, match=match):
        SemiDPSGD(_model().parameters(), **args)


def test_semidpsgd_bad_gradients_leave_parameters_untouched():
    m = _model()
    w0 = [p.detach().clone() for p in m.parameters()]
    opt = SemiDPSGD(m.parameters(), lr=0.1, beta=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                    expected_batch_size=4, sample_rate=0.1)
    good = _grads(m, 0, 4)
    nan = [g.clone() for g in good]
    nan[0][1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        opt.step(private_grad_samples=good, public_grad_samples=nan)
    with pytest.raises(ValueError, match="shape"):
        opt.step(private_grad_samples=[g[:, None] for g in good])
    with pytest.raises(ValueError, match="tensors"):
        opt.step(private_grad_samples=good[:2])
    with pytest.raises(ValueError, match="pass"):
        opt.step()
    for p, w in zip(m.parameters(), w0, strict=True):
        assert torch.equal(p.detach(), w)
    assert opt.private_steps == 0


def test_train_semi_dp_bad_input():
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    base = {"x_priv": x[10:], "y_priv": y[10:], "x_pub": x[:10], "y_pub": y[:10], "epsilon": 1.0,
            "delta": 1e-5, "steps": 2, "lr": 0.1, "mode": "semi_dp"}
    for kw, match in [({"epsilon": 0.0}, "epsilon"), ({"delta": 2.0}, "delta"), ({"beta": 2.0}, "beta"),
                      ({"max_grad_norm": 0.0}, "max_grad_norm"), ({"x_pub": torch.randn(10, 6)}, "feature shape"),
                      ({"mode": "dp"}, "mode"), ({"steps": 0}, "steps")]:
        with pytest.raises(ValueError, match=match):
            train_semi_dp(_model(), _ce, **{**base, **kw})
    xn = x.clone()
    xn[2, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):  # public data: a value check is allowed
        train_semi_dp(_model(), _ce, **{**base, "x_pub": xn[:10]})


def _hostile(x):
    h = x.clone()
    h[0, 0] = float("nan")
    h[1, 1] = float("inf")
    h[2, 0] = -float("inf")
    h[3] = 1e30
    h[4] *= 50.0
    return h


def test_sanitize_private_rows_rule():
    x = 0.5 * _x(n=10, d=4)
    torch.testing.assert_close(sanitize_private_rows(x), x)  # identity inside the ball
    h = _hostile(x)
    s = sanitize_private_rows(h)
    assert torch.isfinite(s).all() and (s.norm(dim=-1) <= 1 + 1e-12).all()
    ref = torch.where(torch.isfinite(h), h, 0.0)
    ref = ref / ref.norm(dim=-1, keepdim=True).clamp(min=1.0)
    torch.testing.assert_close(s, ref)
    torch.testing.assert_close(s[4], x[4] / x[4].norm())
    assert s[0, 0] == 0 and s[1, 1] == 0 and s[2, 0] == 0
    s32 = sanitize_private_rows(torch.full((2, 3), 1e30, dtype=torch.float32))  # the norm overflows
    assert torch.equal(s32, torch.zeros(2, 3))


def test_private_values_never_raise_and_rule_is_applied():
    """Hostile private rows (NaN, ±inf, huge, outside the ball) are mapped by the documented rule; the output
    equals the estimator on the sanitized rows with the same noise draw."""
    x_priv, x_pub = _hostile(_x(n=12, d=4)), _x(n=8, d=4, seed=3)
    clean = sanitize_private_rows(x_priv)
    kw = {"epsilon": 1.0, "delta": 1e-5}
    for fn in (lambda xp: weighted_mean(xp, x_pub, **kw, generator=_gen(7))[0],
               lambda xp: treat_as_private_mean(xp, x_pub, **kw, generator=_gen(7)),
               lambda xp: private_only_mean(xp, **kw, generator=_gen(7)),
               lambda xp: privunitg(xp, epsilon=1.0, generator=_gen(7))):
        out = fn(x_priv)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, fn(clean))
    # the weight r never looks at private values
    r_h = weighted_mean(x_priv, x_pub, **kw, generator=_gen(1))[1]
    r_c = weighted_mean(clean, x_pub, **kw, generator=_gen(1))[1]
    torch.testing.assert_close(r_h, r_c)


def test_private_gradients_with_nan_are_zeroed_not_raised():
    m = _model()
    good = _grads(m, 0, 4)
    bad = [g.clone() for g in good]
    bad[0][1, 0, 0] = float("nan")
    bad[-1][2] = float("inf")
    s = sanitize_grad_samples(bad)
    for g_s, g in zip(s, good, strict=True):
        assert torch.equal(g_s[[0, 3]], g[[0, 3]])
        assert torch.equal(g_s[[1, 2]], torch.zeros_like(g[[1, 2]]))
    outs = []
    for gs in (bad, s):
        mm = _model()
        mm.load_state_dict(m.state_dict())
        opt = SemiDPSGD(mm.parameters(), lr=0.1, beta=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                        expected_batch_size=4, sample_rate=0.1, generator=_gen(5))
        opt.step(private_grad_samples=gs, public_grad_samples=good)
        outs.append([p.detach().clone() for p in mm.parameters()])
        assert opt.private_steps == 1
    for a, b in zip(*outs, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


def test_train_semi_dp_hostile_private_data_equals_zeroed_data():
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    xh = x.clone()
    xh[12, 0], xh[15, 3], xh[20, 1] = float("nan"), float("inf"), -float("inf")
    xz = torch.nan_to_num(xh, nan=0.0, posinf=0.0, neginf=0.0)
    outs = []
    for xp in (xh, xz):
        torch.manual_seed(0)
        m = _model()
        res = train_semi_dp(m, _ce, mode="semi_dp", x_priv=xp[10:], y_priv=y[10:], x_pub=x[:10], y_pub=y[:10],
                            epsilon=1.0, delta=1e-5, steps=3, lr=0.1, batch_size=5, generator=_gen(2))
        outs.append([p.detach().clone() for p in m.parameters()])
        assert res.epsilon is not None and res.epsilon <= 1.0 + 1e-9
    for a, b in zip(*outs, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kw", [{"delta": 0.0}, {"clip_norm": 0.0}, {"me_epsilons": (0.0,)},
                                {"lin_betas": (1.5,)}, {"me_n_pub": (1,)}, {"mechanism": "laplace"},
                                {"mechanism": "classic"}])
def test_config_validation(kw):
    with pytest.raises(ValueError):
        Config(**kw)


# ------------------------------------------------------------------------------------ review regressions
def _tagged_data(n_pub=6, n_priv=40, d=3):
    """Public rows carry +1 in coordinate 0, private rows −1: with loss = output the per-sample gradient of a
    bias-free linear model is the input row itself, so each gradient row reveals where it came from."""
    g = _gen(11)
    x_pub = torch.cat([torch.ones(n_pub, 1), torch.rand(n_pub, d - 1, generator=g)], dim=1)
    x_priv = torch.cat([-torch.ones(n_priv, 1), torch.rand(n_priv, d - 1, generator=g)], dim=1)
    return x_pub, torch.zeros(n_pub), x_priv, torch.zeros(n_priv)


@pytest.mark.parametrize("bad", [-5, 0, -1, True, 2.5, "3"])
def test_train_semi_dp_rejects_bad_public_batch_size(bad):
    x_pub, y_pub, x_priv, y_priv = _tagged_data()
    with pytest.raises(ValueError, match="public_batch_size"):
        train_semi_dp(torch.nn.Linear(3, 1, bias=False), lambda o, y: o.sum(), mode="semi_dp", x_priv=x_priv,
                      y_priv=y_priv, x_pub=x_pub, y_pub=y_pub, epsilon=1.0, delta=1e-5, steps=2, lr=0.1,
                      batch_size=10, public_batch_size=bad)


@pytest.mark.parametrize("mode", ["semi_dp", "public_only"])
@pytest.mark.parametrize("pbs", [None, 1, 4, 6, 50])
def test_train_semi_dp_public_rows_come_only_from_public_data(monkeypatch, mode, pbs):
    x_pub, y_pub, x_priv, y_priv = _tagged_data()
    seen = {"pub": [], "priv": []}
    original = SemiDPSGD.step

    def spy(self, *, private_grad_samples=None, public_grad_samples=None):
        if public_grad_samples is not None:
            seen["pub"].append(public_grad_samples[0].reshape(-1, 3).clone())
        if private_grad_samples is not None:
            seen["priv"].append(private_grad_samples[0].reshape(-1, 3).clone())
        return original(self, private_grad_samples=private_grad_samples, public_grad_samples=public_grad_samples)

    monkeypatch.setattr(SemiDPSGD, "step", spy)
    model = torch.nn.Linear(3, 1, bias=False)
    train_semi_dp(model, lambda o, y: o.sum(), mode=mode, x_priv=x_priv, y_priv=y_priv, x_pub=x_pub,
                  y_pub=y_pub, epsilon=1.0, delta=1e-5, steps=6, lr=0.1, batch_size=10, public_batch_size=pbs,
                  generator=_gen(2))
    expected = 6 if pbs is None else min(pbs, 6)
    assert len(seen["pub"]) == 6
    for rows in seen["pub"]:
        assert rows.shape[0] == expected
        assert torch.all(rows[:, 0] == 1.0)  # every public row is a public sample
    if mode == "semi_dp":
        assert len(seen["priv"]) == 6 and sum(r.shape[0] for r in seen["priv"]) > 0
        for rows in seen["priv"]:
            assert torch.all(rows[:, 0] == -1.0)  # and no public sample lands in the noised private part
    else:
        assert not seen["priv"]


@pytest.mark.parametrize("tol", [0.0, -0.01, 1.0, 2.0, float("nan")])
def test_noise_multiplier_for_rejects_bad_tolerance(tol):
    with pytest.raises(ValueError, match="epsilon_tolerance"):
        noise_multiplier_for(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.1, steps=10,
                             epsilon_tolerance=tol)


@pytest.mark.parametrize("kw,match", [
    ({"weight_decay": float("nan")}, "weight_decay"), ({"weight_decay": float("inf")}, "weight_decay"),
    ({"weight_decay": "0.1"}, "weight_decay"), ({"momentum": "0.9"}, "momentum"),
    ({"momentum": float("nan")}, "momentum"), ({"momentum": None}, "momentum"),
])
def test_semidpsgd_rejects_non_finite_or_non_numeric_momentum_and_weight_decay(kw, match):
    args = {"lr": 0.1, "beta": 0.5, "noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 4,
            "sample_rate": 0.1, **kw}
    with pytest.raises(ValueError, match=match):
        SemiDPSGD(_model().parameters(), **args)


@pytest.mark.parametrize("rate", [0.0, -0.5, 1.5, float("nan")])
def test_poisson_sample_rejects_bad_rate(rate):
    with pytest.raises(ValueError, match="sample_rate"):
        poisson_sample(10, sample_rate=rate)


def test_poisson_sample_keeps_valid_rates():
    assert torch.equal(poisson_sample(7, sample_rate=1.0), torch.arange(7))
    idx = poisson_sample(20000, sample_rate=0.25, generator=_gen(0))
    assert abs(len(idx) / 20000 - 0.25) < 0.02


def test_private_rows_are_projected_so_the_sensitivity_holds():
    # rows slightly outside the ball pass the 1e-6-tolerant check; the estimators must use the projected rows
    x = _sphere((30, 4), _gen(3)) * (1.0 + 5e-7)
    pub = _x(n=8, seed=4)
    xp = project_to_unit_ball(x)
    assert not torch.equal(x, xp) and float(xp.norm(dim=-1).max()) <= 1.0
    kw = {"epsilon": 1.0, "delta": 1e-5}
    torch.testing.assert_close(private_only_mean(x, **kw, generator=_gen(5)),
                               private_only_mean(xp, **kw, generator=_gen(5)), rtol=0, atol=0)
    torch.testing.assert_close(treat_as_private_mean(x, pub, **kw, generator=_gen(5)),
                               treat_as_private_mean(xp, pub, **kw, generator=_gen(5)), rtol=0, atol=0)
    a, ra = weighted_mean(x, pub, **kw, generator=_gen(5))
    b, rb = weighted_mean(xp, pub, **kw, generator=_gen(5))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(ra, rb, rtol=0, atol=0)
    # the noise-free part is the projected mean, not the raw one
    sigma = gaussian_noise_std(sensitivity=2.0 / 30, **kw)
    noise = torch.randn(4, generator=_gen(5), dtype=F64)
    torch.testing.assert_close(private_only_mean(x, **kw, generator=_gen(5)), xp.mean(0) + sigma * noise)


@pytest.mark.parametrize("eps", [710.0, 740.0])
def test_privunitg_params_do_not_overflow_for_huge_epsilon(eps):
    p = privunitg_params(epsilon=eps)
    assert 0.0 < p.q < 1e-300 and math.isfinite(p.gamma) and math.isfinite(p.scale) and p.scale > 0
    # the same formula is continuous with moderate ε
    assert privunitg_params(epsilon=700.0).scale == pytest.approx(0.02715426, rel=1e-5)


def test_privunitg_params_beyond_float_range_is_a_clear_error():
    with pytest.raises(ValueError, match="epsilon=1000"):
        privunitg_params(epsilon=1000.0)


def test_lin_betas_must_mix_public_and_private():
    for grid in [(0.5, 1.0), (0.0,), (1.0,)]:
        with pytest.raises(ValueError, match="lin_betas"):
            Config(lin_betas=grid)
    assert all(0.0 < b < 1.0 for b in Config().lin_betas + Config.quick().lin_betas)


def test_e3_beta_grid_holds_the_dp_gd_equivalent_and_values_above_0_9():
    from icml24.dp_public.experiment import linear_betas

    cfg = Config()
    for k in cfg.lin_n_pubs:  # n = lin_n is fixed, n_priv = n − n_pub
        betas = linear_betas(cfg, k)
        assert betas[0] == pytest.approx((cfg.lin_n - k) / cfg.lin_n)
        assert any(0.9 < b < 1.0 for b in betas[1:])


def test_tuning_grids_give_every_arm_the_same_budget():
    from icml24.dp_public.experiment import tuning_grids

    grid, one = tuning_grids((0.5, 0.9, 0.99), (0.1, 1.0))
    assert len(grid) == len(one) == 6 and set(grid) == {(b, lr) for b in (0.5, 0.9, 0.99) for lr in (0.1, 1.0)}
    assert one[0] == pytest.approx(0.1) and one[-1] == pytest.approx(1.0)
    assert np.allclose(np.diff(np.log(one)), np.log(10) / 5)


def test_semi_dp_at_beta_eq_is_dp_gd_on_all_data_for_a_full_batch_step():
    """With full batches, β = n_priv / n mixes (Σ_priv clip + noise) / n_priv and the public mean exactly into
    (Σ_all clip + noise) / n: one semi-DP step equals one DP-GD step on all data with the same noise."""
    torch.manual_seed(0)
    x, y = torch.randn(50, 5), torch.randint(0, 3, (50,))
    n_pub, n = 10, 50
    outs = []
    for beta, priv, pub in (((n - n_pub) / n, (x[n_pub:], y[n_pub:]), (x[:n_pub], y[:n_pub])),
                            (1.0, (x, y), None)):
        m = _model()
        opt = SemiDPSGD(m.parameters(), lr=0.5, beta=beta, noise_multiplier=1.3, max_grad_norm=0.5,
                        expected_batch_size=len(priv[0]), sample_rate=1.0, generator=_gen(3))
        gpub = per_sample_grads(m, _ce, *pub) if pub else None
        opt.step(private_grad_samples=per_sample_grads(m, _ce, *priv), public_grad_samples=gpub)
        outs.append([p.detach().clone() for p in m.parameters()])
    # same noise draw, scaled by β / n_priv = 1 / n in the first run and 1 / n in the second
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_gdp_accountant_is_refused_everywhere():
    """GDP accounting can under-estimate ε (Opacus warns so); the (ε, δ) promise needs rdp or prv."""
    with pytest.raises(ValueError, match="gdp.*under-estimate"):
        SemiDPSGD(_model().parameters(), lr=0.1, beta=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                  expected_batch_size=4, sample_rate=0.1, accountant="gdp")
    with pytest.raises(ValueError, match="gdp"):
        noise_multiplier_for(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.1, steps=10, accountant="gdp")
    with pytest.raises(ValueError, match="gdp"):
        epsilon_for(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1e-5, accountant="gdp")
    x, y = torch.randn(30, 5), torch.randint(0, 3, (30,))
    with pytest.raises(ValueError, match="gdp"):
        train_semi_dp(_model(), _ce, mode="semi_dp", x_priv=x[10:], y_priv=y[10:], x_pub=x[:10], y_pub=y[:10],
                      epsilon=1.0, delta=1e-5, steps=2, lr=0.1, accountant="gdp")
    for acc in ("rdp", "prv", None):
        SemiDPSGD(_model().parameters(), lr=0.1, beta=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                  expected_batch_size=4, sample_rate=0.1, accountant=acc)
