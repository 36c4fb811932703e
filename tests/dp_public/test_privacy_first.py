"""Issue 29, "Privacy first": full-batch normalisation and sensitivity, reproducible / replayed noise, Opacus
double wrapping, division by the expected (public) batch size, and the RDP floor's error message.

Each test here failed on the code before the fix (checked with ``tools/mutate.py`` mutants that restore the old
lines; see the dp_public README)."""

from __future__ import annotations

import warnings

import pytest
import torch

from icml24.dp_public import (
    OpacusWrappingError,
    ReproducibleNoiseWarning,
    SemiDPSGD,
    epsilon_for,
    noise_multiplier_for,
    per_sample_grads,
    train_semi_dp,
)

warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
warnings.filterwarnings("ignore", message=".*Full backward hook.*")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lin_loss(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # loss = output: the per-sample gradient of a bias-free linear model is the input row itself
    return o.sum()


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibleNoiseWarning)
        return fn(*a, **kw)


# ------------------------------------------------------------------------------------- 1. full-batch path
def _full_batch_data(n_priv=30, n_pub=5, d=4):
    g = _gen(3)
    x_priv = 0.2 * torch.randn(n_priv, d, generator=g)  # norms < C = 1: no clipping, exact sums
    x_pub = 0.2 * torch.randn(n_pub, d, generator=g)
    return x_priv, torch.zeros(n_priv), x_pub, torch.zeros(n_pub)


def _train_full(x_priv, y_priv, x_pub, y_pub, **kw):
    model = torch.nn.Linear(x_priv.shape[1], 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    res = _quiet(train_semi_dp, model, _lin_loss, mode="semi_dp", x_priv=x_priv, y_priv=y_priv, x_pub=x_pub,
                 y_pub=y_pub, epsilon=1.0, delta=1e-5, steps=1, lr=1.0, beta=0.5, batch_size=None,
                 generator=_gen(7), **kw)
    return model.weight.detach()[0].clone(), res


def test_full_batch_under_add_remove_refuses_without_a_declared_batch_size():
    data = _full_batch_data()
    with pytest.raises(ValueError, match="expected_batch_size.*private"):
        _train_full(*data)  # before the fix: b = n = len(x_priv), silently


def test_full_batch_under_add_remove_divides_by_the_declared_constant_not_by_n():
    """Adding a record whose gradient is 0 must not change the output distribution under add/remove; dividing the
    noisy sum by n (n -> n + 1) rescales the whole update, which releases n."""
    x_priv, y_priv, x_pub, y_pub = _full_batch_data()
    w_d, res = _train_full(x_priv, y_priv, x_pub, y_pub, expected_batch_size=40)
    w_d1, _ = _train_full(torch.cat([x_priv, torch.zeros(1, 4)]), torch.zeros(31), x_pub, y_pub,
                          expected_batch_size=40)
    torch.testing.assert_close(w_d, w_d1, rtol=0, atol=0)  # same noise (q = 1 draws no sampling randomness)
    # and the update is the closed form with b = 40: w = −β (Σ x_i + N(0, σ²C²)) / 40 − (1 − β) mean(x_pub)
    noise = torch.normal(0.0, res.noise_multiplier * 1.0, size=(1, 4), generator=_gen(7))[0]
    expected = -0.5 * (x_priv.sum(0) + noise) / 40 - 0.5 * x_pub.mean(0)
    torch.testing.assert_close(w_d, expected)
    assert res.noise_multiplier == pytest.approx(
        noise_multiplier_for(target_epsilon=1.0, target_delta=1e-5, sample_rate=1.0, steps=1))


def test_full_batch_under_replace_one_has_sensitivity_two_c_and_divides_by_n():
    x_priv, y_priv, x_pub, y_pub = _full_batch_data()
    w, res = _train_full(x_priv, y_priv, x_pub, y_pub, neighbouring="replace_one")
    sigma = res.noise_multiplier
    assert sigma == pytest.approx(noise_multiplier_for(target_epsilon=1.0, target_delta=1e-5, sample_rate=1.0,
                                                       steps=1))
    noise = torch.normal(0.0, sigma * 2.0, size=(1, 4), generator=_gen(7))[0]  # std 2σC, C = 1
    expected = -0.5 * (x_priv.sum(0) + noise) / 30 - 0.5 * x_pub.mean(0)
    torch.testing.assert_close(w, expected)


def test_replace_one_noise_std_is_two_sigma_c():
    d, sigma, c = 40_000, 0.7, 0.5
    w = torch.nn.Parameter(torch.zeros(d))
    opt = _quiet(SemiDPSGD, [w], lr=1.0, beta=1.0, noise_multiplier=sigma, max_grad_norm=c, expected_batch_size=1,
                 sample_rate=1.0, neighbouring="replace_one", generator=_gen(0))
    opt.step(private_grad_samples=[torch.zeros(3, d)])
    assert float(w.detach().std()) == pytest.approx(2 * sigma * c, rel=0.02)
    assert opt.sensitivity == 2 * c


def test_replace_one_is_refused_with_poisson_subsampling():
    w = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="sample_rate=1"):
        SemiDPSGD([w], lr=1.0, beta=1.0, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4,
                  sample_rate=0.5, neighbouring="replace_one")
    x_priv, y_priv, x_pub, y_pub = _full_batch_data()
    with pytest.raises(ValueError, match="full batches only"):
        _quiet(train_semi_dp, torch.nn.Linear(4, 1, bias=False), _lin_loss, mode="semi_dp", x_priv=x_priv,
               y_priv=y_priv, x_pub=x_pub, y_pub=y_pub, epsilon=1.0, delta=1e-5, steps=1, lr=1.0, batch_size=5,
               neighbouring="replace_one")
    with pytest.raises(ValueError, match="neighbouring"):
        SemiDPSGD([w], lr=1.0, beta=1.0, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4,
                  sample_rate=1.0, neighbouring="swap")
    with pytest.raises(ValueError, match="must equal batch_size"):
        _quiet(train_semi_dp, torch.nn.Linear(4, 1, bias=False), _lin_loss, mode="semi_dp", x_priv=x_priv,
               y_priv=y_priv, x_pub=x_pub, y_pub=y_pub, epsilon=1.0, delta=1e-5, steps=1, lr=1.0, batch_size=5,
               expected_batch_size=6)


# ------------------------------------------------------------------------------------ 2. noise that repeats
def test_a_seeded_noise_generator_warns_once_and_no_generator_does_not():
    w = torch.nn.Parameter(torch.zeros(3))
    kw = {"lr": 1.0, "beta": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 4, "sample_rate": 0.5}
    with pytest.warns(ReproducibleNoiseWarning, match="generator"):
        SemiDPSGD([w], noise_multiplier=1.0, generator=_gen(0), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReproducibleNoiseWarning)
        SemiDPSGD([w], noise_multiplier=1.0, generator=None, **kw)
        SemiDPSGD([w], noise_multiplier=0.0, generator=_gen(0), **kw)  # no noise, nothing to reproduce
    x_priv, y_priv, x_pub, y_pub = _full_batch_data()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        train_semi_dp(torch.nn.Linear(4, 1, bias=False), _lin_loss, mode="semi_dp", x_priv=x_priv, y_priv=y_priv,
                      x_pub=x_pub, y_pub=y_pub, epsilon=1.0, delta=1e-5, steps=1, lr=1.0, batch_size=10,
                      generator=_gen(1))
    hits = [r for r in rec if issubclass(r.category, ReproducibleNoiseWarning)]
    assert len(hits) == 1 and hits[0].filename == __file__  # points at the caller's line


_KW = {"lr": 1.0, "beta": 1.0, "noise_multiplier": 1.3, "max_grad_norm": 1.0, "expected_batch_size": 1,
       "sample_rate": 0.1}


def _noise_run(opt: SemiDPSGD, w: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Zero private gradients: each step's update is −lr·noise, so the noise stream is read off the weights."""
    out = []
    for _ in range(steps):
        before = w.detach().clone()
        opt.step(private_grad_samples=[torch.zeros(2, *w.shape)])
        out.append(before - w.detach())
    return out


def _fresh(seed=1):
    w = torch.nn.Parameter(torch.zeros(6))
    return w, _quiet(SemiDPSGD, [w], **_KW, generator=_gen(seed))


def test_a_resumed_run_continues_the_noise_stream_instead_of_replaying_it():
    k, m = 5, 4
    w_ref, ref = _fresh()
    noise_ref = _noise_run(ref, w_ref, k + m)

    w_a, a = _fresh()
    noise_a = _noise_run(a, w_a, k)
    state, weights = a.state_dict(), w_a.detach().clone()

    # the resumed process re-creates its optimizer and generator from the same seed, then loads the checkpoint
    w_b, b = _fresh()
    with torch.no_grad():
        w_b.copy_(weights)
    b.load_state_dict(state)
    noise_b = _noise_run(b, w_b, m)
    for x, y in zip(noise_b, noise_ref[k:], strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)  # = the uninterrupted run's noise
    for x, y in zip(noise_b, noise_a[:m], strict=True):
        assert not torch.allclose(x, y)  # not a replay of the pre-checkpoint noise
    assert b.get_epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5))
    torch.testing.assert_close(w_b, w_ref, rtol=0, atol=0)


def test_a_checkpoint_without_generator_state_is_refused_by_a_seeded_optimizer():
    w, a = _fresh()
    _noise_run(a, w, 2)
    state = a.state_dict()
    old = {**state, "privacy": {k: v for k, v in state["privacy"].items() if k != "generator"}}
    with pytest.raises(ValueError, match="replay"):
        _fresh()[1].load_state_dict(old)
    w2 = torch.nn.Parameter(torch.zeros(6))
    SemiDPSGD([w2], **_KW, generator=None).load_state_dict(old)  # global RNG: nothing to replay from a seed


# ----------------------------------------------------------------------------- 3. Opacus double wrapping
def test_privacy_engine_wrapping_a_semi_dp_optimizer_is_refused():
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(40, 5, generator=_gen(0)), torch.randint(0, 3, (40,), generator=_gen(1))
    opt = SemiDPSGD(model.parameters(), lr=0.1, beta=0.5, noise_multiplier=1.0, max_grad_norm=1.0,
                    expected_batch_size=10, sample_rate=0.25)
    engine = PrivacyEngine(accountant="rdp")
    gsm, dp_opt, loader = engine.make_private(module=model, optimizer=opt,
                                              data_loader=DataLoader(TensorDataset(x, y), batch_size=10),
                                              noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False)
    w0 = [p.detach().clone() for p in model.parameters()]
    xb, yb = next(iter(loader))
    dp_opt.zero_grad()
    torch.nn.functional.cross_entropy(gsm(xb), yb).backward()
    with pytest.raises(OpacusWrappingError, match="GradSampleModule.*capture_public"):
        dp_opt.step()
    assert opt.private_steps == 0 and len(opt.accountant) == 0  # SemiDPSGD charged nothing
    assert all(torch.equal(a, p) for a, p in zip(w0, model.parameters(), strict=True))
    assert issubclass(OpacusWrappingError, ValueError)


# ---------------------------------------------------------------------- 4. divide by the expected batch size
@pytest.mark.parametrize("realised", [0, 3, 13])
def test_private_sum_is_divided_by_the_expected_batch_size_not_the_realised_one(realised):
    """Poisson batches vary in size; dividing by the realised size (Opacus #420) releases it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    b, lr, beta, sigma, c = 8, 0.3, 0.6, 0.9, 1.0
    xp, yp = torch.randn(realised, 5, generator=_gen(2)), torch.randint(0, 2, (realised,), generator=_gen(3))
    xq, yq = torch.randn(4, 5, generator=_gen(4)), torch.randint(0, 2, (4,), generator=_gen(5))
    ce = torch.nn.functional.cross_entropy
    priv, pub = per_sample_grads(model, ce, xp, yp), per_sample_grads(model, ce, xq, yq)
    w0 = [p.detach().clone() for p in model.parameters()]
    gnoise = _gen(11)
    from icml24.dp_public import clip_and_sum
    s_priv, s_pub = clip_and_sum(priv, max_grad_norm=c), clip_and_sum(pub, max_grad_norm=c)
    expected = []
    for w, sp, sq in zip(w0, s_priv, s_pub, strict=True):
        noise = torch.normal(0.0, sigma * c, size=w.shape, generator=gnoise)
        expected.append(w - lr * (beta * (sp + noise) / b + (1 - beta) * sq / 4))
    opt = _quiet(SemiDPSGD, model.parameters(), lr=lr, beta=beta, noise_multiplier=sigma, max_grad_norm=c,
                 expected_batch_size=b, sample_rate=0.2, generator=_gen(11))
    opt.step(private_grad_samples=priv, public_grad_samples=pub)
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e)


def test_an_epsilon_below_the_rdp_floor_names_the_prv_accountant():
    kw = {"target_epsilon": 0.05, "target_delta": 1e-5, "sample_rate": 1.0, "steps": 1}
    with pytest.raises(ValueError, match='accountant="prv"'):
        noise_multiplier_for(**kw)
    sigma = noise_multiplier_for(**kw, accountant="prv")  # and the PRV accountant does reach it
    assert epsilon_for(noise_multiplier=sigma, sample_rate=1.0, steps=1, delta=1e-5, accountant="prv") <= 0.05
