"""Exp-SGDM: the Exp(1) identity, reference equivalences, the shared scalar, state round trips, bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from scipy import stats

from icml24.exp_sgdm import ExpSGDM, NonsmoothObjective, scaling_identity_gap, stationarity_upper_bound
from icml24.exp_sgdm.synthetic import IdentityEstimate

DT = torch.float64


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    f = NonsmoothObjective(dim=20, seed=seed)
    x = torch.randn(20, generator=g, dtype=DT)
    d = torch.randn(20, generator=g, dtype=DT)
    return f, x, d / d.norm()


# ---------------------------------------------------------------- notes §5.1: the identity behind the method
def test_exponential_identity_holds_and_controls_fail():
    f, x, d = _problem()
    g = torch.Generator().manual_seed(1)
    est = scaling_identity_gap(f, x, d, num_samples=100_000, generator=g)
    tol = 4.0 * est.se
    assert abs(est.mean) <= tol, est
    # both sides are individually far from zero: the identity is not trivially 0 = 0
    assert abs(est.lhs) > 10 * tol and abs(est.rhs) > 10 * tol
    one = scaling_identity_gap(f, x, d, num_samples=100_000, generator=g, scaling="one")
    assert abs(one.mean) > 10 * tol, one
    for scaling in ("uniform", "uniform2"):  # U[0,1] (original O2NC's draw), U[0,2] (mean 1 like Exp(1))
        ctl = scaling_identity_gap(f, x, d, num_samples=100_000, generator=g, scaling=scaling)
        assert abs(ctl.z) > 10, (scaling, ctl)


def test_per_coordinate_scaling_breaks_the_identity_jointly():
    """An Exp(1) draw per coordinate is not a move along one ray. At a single (x, Δ) its gap can be small (seed 0:
    z ≈ 2.8), which is why the experiment tests the identity jointly over several points (χ² of the z's)."""
    z2 = exp2 = 0.0
    for seed in range(4):
        f, x, d = _problem(seed)
        g = torch.Generator().manual_seed(seed)
        z2 += scaling_identity_gap(f, x, d, num_samples=50_000, generator=g, scaling="per_coordinate").z ** 2
        exp2 += scaling_identity_gap(f, x, d, num_samples=50_000, generator=g).z ** 2
    assert z2 > 200.0  # χ²_4 survival at 200 is ~1e-42
    assert exp2 < 18.5  # χ²_4 0.999 quantile: the identity itself is not rejected


def test_stationarity_bound_is_at_most_gradient_norm_and_smoothing_helps_at_a_kink():
    f = NonsmoothObjective(dim=1, num_rows=1, alpha=0.0, seed=0)  # F(x) = |a x - b|: kink at b/a
    kink = (f.b / f.A[:, 0]).reshape(1)
    g = torch.Generator().manual_seed(0)
    bound, sigma = stationarity_upper_bound(f, kink + 1e-9, c=1.0, generator=g, sigmas=(0.0, 0.01, 0.1))
    grad_norm = float(f.grad(kink[None] + 1e-9).norm())
    assert grad_norm == pytest.approx(abs(float(f.A)), rel=1e-9)
    assert bound < 0.2 * grad_norm and sigma > 0
    far, far_sigma = stationarity_upper_bound(f, kink + 5.0, c=1.0, generator=g, sigmas=(0.0, 0.01, 0.1))
    assert far == pytest.approx(grad_norm, rel=1e-9) and far_sigma == 0.0


@pytest.mark.parametrize("mean, expected", [(0.3, math.inf), (-0.3, -math.inf), (0.0, 0.0)])
def test_identity_estimate_z_with_zero_se_keeps_the_sign(mean, expected):
    est = IdentityEstimate(mean=mean, se=0.0, lhs=0.0, rhs=0.0, num_samples=2)
    assert est.z == expected and not math.isnan(est.z)
    assert IdentityEstimate(mean=-0.3, se=0.1, lhs=0.0, rhs=0.0, num_samples=2).z == pytest.approx(-3.0)


def test_identity_gap_with_degenerate_scaling_has_signed_z():
    f = NonsmoothObjective(dim=1, num_rows=1, alpha=0.0, seed=0)  # F(x) = |a x - b|, linear away from the kink
    x = (f.b / f.A[:, 0]).reshape(1) + 5.0
    d = torch.ones(1, dtype=f.A.dtype)
    est = scaling_identity_gap(f, x, d, num_samples=8, generator=torch.Generator().manual_seed(0), scaling="one")
    assert est.se == 0.0  # s = 1 on every draw: no spread
    assert est.z == (0.0 if est.mean == 0 else math.copysign(math.inf, est.mean))


@pytest.mark.parametrize("kw, match", [
    ({"c": float("nan")}, "c must be a finite number > 0"),
    ({"c": float("inf")}, "c must be a finite number > 0"),
    ({"c": 0.0}, "c must be a finite number > 0"),
    ({"sigmas": (0.0, float("nan"))}, "sigmas"),
    ({"sigmas": (float("inf"),)}, "sigmas"),
    ({"sigmas": (-0.1,)}, "sigmas"),
])
def test_stationarity_bound_rejects_non_finite_inputs(kw, match):
    f = NonsmoothObjective(dim=3, num_rows=4, seed=0)
    with pytest.raises(ValueError, match=match):
        stationarity_upper_bound(f, torch.zeros(3), generator=torch.Generator().manual_seed(0), **kw)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_stationarity_bound_rejects_non_finite_x(bad):
    f = NonsmoothObjective(dim=3, num_rows=4, seed=0)
    x = torch.zeros(3)
    x[1] = bad
    with pytest.raises(ValueError, match="x must be finite"):
        stationarity_upper_bound(f, x, generator=torch.Generator().manual_seed(0))


def test_closed_form_gradient_matches_autograd():
    f, _, _ = _problem()
    x = torch.randn(64, 20, dtype=DT, generator=torch.Generator().manual_seed(2))
    xx = x.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(f(xx).sum(), xx)
    torch.testing.assert_close(f.grad(x), auto)


# ---------------------------------------------------------------- references (notes §5.2)
def _train(opt_factory, steps=50, seed=0, sched=None):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()
    opt = opt_factory(net)
    sch = sched(opt) if sched else None
    gdata = torch.Generator().manual_seed(123)
    for _ in range(steps):
        xb = torch.randn(32, 5, generator=gdata, dtype=DT)
        yb = torch.randint(0, 3, (32,), generator=gdata)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
        if sch:
            sch.step()
    return net, opt


def test_no_scaling_equals_torch_sgd_with_scheduler():
    beta, lr = 0.9, 0.3
    lam = lambda t: 0.5 * (1 + math.cos(math.pi * t / 50))  # noqa: E731
    sched = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lam)  # noqa: E731
    ours, _ = _train(lambda n: ExpSGDM(n.parameters(), lr=lr, momentum=beta, random_scaling=None), sched=sched)
    ref, _ = _train(lambda n: torch.optim.SGD(n.parameters(), lr=lr * (1 - beta), momentum=beta), sched=sched)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


class _ReferenceExpO2NC:
    """Slow reference of notes §2.1-2.2, written from the equations on one flat vector."""

    def __init__(self, params, *, lr, beta, wd, generator, scaling=True):
        self.params, self.lr, self.beta, self.wd, self.g, self.scaling = list(params), lr, beta, wd, generator, scaling
        self.m = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self):
        deltas = []
        for i, p in enumerate(self.params):
            self.m[i] = self.beta * self.m[i] + (1 - self.beta) * p.grad  # gradient at the current iterate x_{n-1}
            deltas.append(-self.lr * (self.m[i] + self.wd * p))
        s = torch.empty((), dtype=DT).exponential_(1.0, generator=self.g).item() if self.scaling else 1.0
        for p, d in zip(self.params, deltas, strict=True):
            p.copy_(p + s * d)

    def zero_grad(self):
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize("scaling", [True, False])
def test_matches_slow_reference_step_for_step_with_weight_decay(scaling):
    rs = "exponential" if scaling else None
    ours, _ = _train(lambda n: ExpSGDM(n.parameters(), lr=0.2, momentum=0.8, weight_decay=0.01, random_scaling=rs,
                                       generator=torch.Generator().manual_seed(7)))
    ref, _ = _train(lambda n: _ReferenceExpO2NC(n.parameters(), lr=0.2, beta=0.8, wd=0.01,
                                                generator=torch.Generator().manual_seed(7), scaling=scaling))
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_delta_follows_the_ogd_recursion():
    # Δ_{n+1} = β (Δ_n - η' g_n) with η' = lr (1-β)/β (notes §2.2, μ = 0)
    w = torch.nn.Parameter(torch.randn(6, dtype=DT))
    beta, lr = 0.7, 0.1
    opt = ExpSGDM([w], lr=lr, momentum=beta, generator=torch.Generator().manual_seed(0))
    prev = torch.zeros_like(w)
    for k in range(5):
        w.grad = torch.randn(6, dtype=DT, generator=torch.Generator().manual_seed(k))
        g, x0 = w.grad.clone(), w.detach().clone()
        opt.step()
        d = (w.detach() - x0) / opt.last_scale
        torch.testing.assert_close(d, -lr * opt.state[w]["momentum_buffer"])
        torch.testing.assert_close(d, beta * (prev - lr * (1 - beta) / beta * g))
        prev = d


# ---------------------------------------------------------------- the scalar
def _two_group_opt(seed=0, **kw):
    a = torch.nn.Parameter(torch.randn(4, 3, dtype=DT))
    b = torch.nn.Parameter(torch.randn(5, dtype=DT))
    opt = ExpSGDM([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.5, "weight_decay": 0.1}], lr=1.0,
                  momentum=0.9, generator=torch.Generator().manual_seed(seed), **kw)
    return a, b, opt


def _set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=DT)


def test_one_scalar_shared_by_all_groups_and_not_in_the_state():
    a, b, opt = _two_group_opt()
    for k in range(4):
        _set_grads([a, b], k)
        before = [a.detach().clone(), b.detach().clone()]
        opt.step()
        s = opt.last_scale
        assert s is not None and s > 0
        for p, x0, group in zip([a, b], before, opt.param_groups, strict=True):
            delta = -group["lr"] * (opt.state[p]["momentum_buffer"] + group["weight_decay"] * x0)
            torch.testing.assert_close(p.detach() - x0, s * delta)
        assert set(opt.state[a]) == {"momentum_buffer"}  # no Δ buffer is kept
    # the learner's state does not depend on s: another random stream, same gradients, same buffers
    a2, b2, opt2 = _two_group_opt(seed=99)
    a3, b3, opt3 = _two_group_opt(seed=0)
    a2.data.copy_(a3.data), b2.data.copy_(b3.data)
    for k in range(4):
        _set_grads([a2, b2], k), _set_grads([a3, b3], k)
        opt2.step(), opt3.step()
    assert opt2.last_scale != opt3.last_scale
    for p2, p3 in [(a2, a3), (b2, b3)]:
        torch.testing.assert_close(opt2.state[p2]["momentum_buffer"], opt3.state[p3]["momentum_buffer"])
    # without weight decay Δ = -η m is s-free too (with it, Δ_n sees x_{n-1}, i.e. only past scalars)
    torch.testing.assert_close(-0.1 * opt2.state[a2]["momentum_buffer"], -0.1 * opt3.state[a3]["momentum_buffer"])
    assert not torch.allclose(a2, a3)


def test_scalar_is_exp1_and_mean_update_is_the_sgdm_update():
    w = torch.nn.Parameter(torch.randn(8, dtype=DT))
    opt = ExpSGDM([w], lr=0.3, momentum=0.9, generator=torch.Generator().manual_seed(3))
    sgdm = ExpSGDM([w], lr=0.3, momentum=0.9, random_scaling=None)
    g = torch.randn(8, dtype=DT, generator=torch.Generator().manual_seed(5))
    w0, n = w.detach().clone(), 20_000
    w.grad = g
    sgdm.step()
    ref_update = w.detach() - w0
    total, scales = torch.zeros_like(w), []
    for _ in range(n):
        w.data.copy_(w0)
        opt.state[w]["momentum_buffer"].zero_() if w in opt.state else None
        opt.step()
        total += w.detach() - w0
        scales.append(opt.last_scale)
    mean_update = total / n
    assert float((mean_update - ref_update).norm() / ref_update.norm()) < 0.02
    assert stats.kstest(scales, "expon").pvalue > 1e-3
    assert not torch.allclose(w.detach() - w0, ref_update)  # single updates are random


def test_same_seed_same_numbers_and_state_dict_restores_the_stream():
    a, b, opt = _two_group_opt(seed=4, ema_beta=0.9)
    for k in range(3):
        _set_grads([a, b], k)
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    params0 = [a.detach().clone(), b.detach().clone()]
    scales = []
    for k in range(3, 6):
        _set_grads([a, b], k)
        opt.step()
        scales.append(opt.last_scale)
    after = [a.detach().clone(), b.detach().clone()]
    # a fresh optimizer with a *different* generator, restored from the checkpoint, continues identically
    a2 = torch.nn.Parameter(params0[0].clone())
    b2 = torch.nn.Parameter(params0[1].clone())
    opt2 = ExpSGDM([{"params": [a2], "lr": 0.1}, {"params": [b2], "lr": 0.5, "weight_decay": 0.1}], lr=1.0,
                   momentum=0.9, generator=torch.Generator().manual_seed(1234), ema_beta=0.9)
    opt2.load_state_dict(saved)
    assert opt2.num_steps == 3
    scales2 = []
    for k in range(3, 6):
        _set_grads([a2, b2], k)
        opt2.step()
        scales2.append(opt2.last_scale)
    assert scales == scales2
    torch.testing.assert_close([a2.detach(), b2.detach()], after, rtol=0, atol=0)
    for x, y in zip(opt.ema_params(), opt2.ema_params(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [11, 12])
def test_default_generator_follows_torch_manual_seed(seed):
    def scales(sd):
        torch.manual_seed(sd)
        w = torch.nn.Parameter(torch.ones(2))
        opt = ExpSGDM([w], lr=0.1)
        out = []
        for _ in range(3):
            w.grad = torch.ones(2)
            opt.step()
            out.append(opt.last_scale)
        return out
    assert scales(seed) == scales(seed)
    assert scales(seed) != scales(seed + 1)  # the draws do come from the seeded default generator


# ---------------------------------------------------------------- the averaged iterate x̄
def test_ema_is_the_bias_corrected_average_and_swap_restores():
    w = torch.nn.Parameter(torch.zeros(3, dtype=DT))
    beta = 0.8
    opt = ExpSGDM([w], lr=0.5, momentum=0.5, ema_beta=beta, generator=torch.Generator().manual_seed(0))
    iterates = []
    for k in range(6):
        w.grad = torch.randn(3, dtype=DT, generator=torch.Generator().manual_seed(k))
        opt.step()
        iterates.append(w.detach().clone())
    n = len(iterates)
    weights = torch.tensor([beta ** (n - 1 - k) * (1 - beta) for k in range(n)], dtype=DT)
    expected = (weights[:, None] * torch.stack(iterates)).sum(0) / (1 - beta**n)
    (xbar,) = opt.ema_params()
    torch.testing.assert_close(xbar, expected)
    # recursion of notes §2.1: x̄_t = (β-β^t)/(1-β^t) x̄_{t-1} + (1-β)/(1-β^t) x_t
    w_prev = (weights[:-1, None] * torch.stack(iterates[:-1])).sum(0) / beta / (1 - beta ** (n - 1))
    torch.testing.assert_close(xbar, (beta - beta**n) / (1 - beta**n) * w_prev + (1 - beta) / (1 - beta**n) * iterates[-1])
    last = w.detach().clone()
    with opt.swap_ema():
        torch.testing.assert_close(w.detach(), expected)
    torch.testing.assert_close(w.detach(), last, rtol=0, atol=0)
    with pytest.raises(KeyError), opt.swap_ema():
        raise KeyError("boom")
    torch.testing.assert_close(w.detach(), last, rtol=0, atol=0)


def test_loss_decreases_on_a_seeded_problem():
    torch.manual_seed(0)
    f = NonsmoothObjective(dim=10, alpha=0.05, seed=0)
    x = torch.nn.Parameter(torch.full((10,), 2.0, dtype=DT))
    opt = ExpSGDM([x], lr=0.05, momentum=0.9, generator=torch.Generator().manual_seed(0), ema_beta=0.9)
    start = float(f(x.detach()))
    for _ in range(300):
        opt.zero_grad()
        f(x).backward()
        opt.step()
    with opt.swap_ema():
        end = float(f(x.detach()))
    assert end < 0.5 * start


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, exc, match", [
    ({"lr": 0.0}, ValueError, "lr must be a finite number > 0"),
    ({"lr": -1.0}, ValueError, "lr must be a finite number > 0"),
    ({"lr": float("nan")}, ValueError, "lr must be a finite number > 0"),
    ({"lr": "0.1"}, TypeError, "lr must be a finite number > 0, got str"),
    ({"lr": 0.1, "momentum": 1.0}, ValueError, r"momentum must be in \[0, 1\)"),
    ({"lr": 0.1, "momentum": -0.1}, ValueError, r"momentum must be in \[0, 1\)"),
    ({"lr": 0.1, "weight_decay": -1e-4}, ValueError, "weight_decay must be a finite number >= 0"),
    ({"lr": 0.1, "random_scaling": "uniform"}, ValueError, "random_scaling must be"),
    ({"lr": 0.1, "generator": 3}, TypeError, "generator must be a torch.Generator"),
    ({"lr": 0.1, "ema_beta": 1.0}, ValueError, r"ema_beta must be in \[0, 1\)"),
])
def test_bad_arguments_raise_before_compute(kw, exc, match):
    w = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(exc, match=match):
        ExpSGDM([w], **kw)


def test_bad_group_and_missing_ema():
    w, v = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="momentum must be in"):
        ExpSGDM([{"params": [w]}, {"params": [v], "momentum": 1.5}], lr=0.1)
    opt = ExpSGDM([w], lr=0.1)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        opt.add_param_group({"params": [v], "lr": -1})
    assert len(opt.param_groups) == 1
    with pytest.raises(RuntimeError, match="needs ema_beta"):
        opt.ema_params()
    with pytest.raises(RuntimeError, match="needs ema_beta"), opt.swap_ema():
        pass
    f = NonsmoothObjective(dim=3)
    with pytest.raises(ValueError, match="dimension 3"):
        f(torch.ones(4))
    with pytest.raises(ValueError, match="scaling must be"):
        scaling_identity_gap(f, torch.ones(3), torch.ones(3), num_samples=10, generator=torch.Generator(),
                             scaling="normal")
