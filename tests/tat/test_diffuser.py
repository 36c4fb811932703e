"""The small Diffuser: schedule, strided sampler, inpainting, training, the U-Net, the planner's input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from icml24.tat.diffuser import (
    GaussianDiffusion,
    LimitsNormalizer,
    MLPDenoiser,
    TemporalUnet,
    cosine_beta_schedule,
    train_diffuser,
)
from icml24.tat.maze import Maze, PointMaze2D
from icml24.tat.planner import DiffuserPlanner, execute_plan, execute_plans


class _Oracle(nn.Module):
    """Predicts a fixed clean trajectory x_0 whatever the input."""

    def __init__(self, x0: torch.Tensor) -> None:
        super().__init__()
        self.x0 = x0
        self.p = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.x0.expand(x.shape[0], -1, -1).clone()


def test_cosine_schedule():
    b = cosine_beta_schedule(20)
    ab = torch.cumprod(1 - b, 0)
    assert b.shape == (20,) and (b > 0).all() and (b <= 0.999).all()
    assert (ab[1:] < ab[:-1]).all() and ab[0] > 0.97 and ab[-1] < 0.01


def test_strided_timesteps():
    d = GaussianDiffusion(_Oracle(torch.zeros(1, 8, 2)), horizon=8, transition_dim=2, n_timesteps=20)
    assert d.timesteps() == list(range(19, -1, -1)) and d.timesteps(50) == d.timesteps()
    ts = d.timesteps(7)
    assert len(ts) == 7 and ts[0] == 19 and ts[-1] == 0 and all(a > b for a, b in zip(ts[:-1], ts[1:], strict=False))


@pytest.mark.parametrize("n_steps", [None, 7, 1])
def test_oracle_denoiser_is_recovered_exactly_and_conditions_are_inpainted(n_steps):
    H, D = 8, 2
    x0 = torch.linspace(-0.9, 0.9, H * D).reshape(1, H, D)
    d = GaussianDiffusion(_Oracle(x0), horizon=H, transition_dim=D, n_timesteps=20)
    cond = {0: x0[0, 0], H - 1: x0[0, -1]}
    x = d.sample(cond, batch_size=4, n_steps=n_steps, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(x, x0.expand(4, -1, -1))
    other = {0: torch.tensor([0.5, -0.5])}
    x = d.sample(other, batch_size=3, n_steps=n_steps)
    torch.testing.assert_close(x[:, 0], other[0].expand(3, -1))


def test_posterior_mean_at_consecutive_steps_matches_ddpm():
    """One reverse step t → t−1 with noise switched off equals the DDPM posterior mean
    μ̃ = √ᾱ_{t−1} β_t/(1−ᾱ_t) x̂_0 + √α_t (1−ᾱ_{t−1})/(1−ᾱ_t) x_t."""
    H, D, T = 4, 1, 10
    x0 = torch.full((1, H, D), 0.3)
    d = GaussianDiffusion(_Oracle(x0), horizon=H, transition_dim=D, n_timesteps=T)
    b = cosine_beta_schedule(T)
    ab = torch.cumprod(1 - b, 0)
    g = torch.Generator().manual_seed(1)
    xT = torch.randn((1, H, D), generator=torch.Generator().manual_seed(1))
    # two-step sampler: steps (T-1) -> 0 strided; compare against the closed form with the respaced β
    x = d.sample({}, batch_size=1, n_steps=2, generator=g)
    torch.testing.assert_close(x, x0)  # final step returns x̂_0
    t, tp = T - 1, T - 2
    beta = 1 - ab[t] / ab[tp]
    assert beta == pytest.approx(float(b[t]), rel=1e-5)  # consecutive respaced β = schedule β
    del xT


def test_mlp_training_lowers_the_loss_and_same_seed_same_model():
    H, D = 8, 2
    data = torch.stack([torch.linspace(-1, 1, H)] * D, dim=1)[None].repeat(256, 1, 1)
    data = data * torch.rand(256, 1, 1)

    def windows(b, g):
        return data[torch.randint(0, 256, (b,), generator=g)]

    def make():
        torch.manual_seed(0)
        return GaussianDiffusion(MLPDenoiser(horizon=H, transition_dim=D, hidden=64), horizon=H, transition_dim=D,
                                 n_timesteps=10)
    ema, curve = train_diffuser(make(), windows, steps=200, batch_size=32, generator=torch.Generator().manual_seed(0))
    assert np.mean(curve[-30:]) < 0.5 * np.mean(curve[:30])
    ema2, _ = train_diffuser(make(), windows, steps=20, batch_size=32, generator=torch.Generator().manual_seed(0))
    ema3, _ = train_diffuser(make(), windows, steps=20, batch_size=32, generator=torch.Generator().manual_seed(0))
    for a, b in zip(ema3.parameters(), ema2.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_temporal_unet_forward_and_a_few_training_steps():
    H, D = 16, 4
    net = TemporalUnet(horizon=H, transition_dim=D, dim=8, dim_mults=(1, 2, 4))
    out = net(torch.randn(3, H, D), torch.tensor([0, 5, 9]))
    assert out.shape == (3, H, D)
    d = GaussianDiffusion(net, horizon=H, transition_dim=D, n_timesteps=10)
    data = torch.linspace(-1, 1, H)[None, :, None].repeat(64, 1, D) * torch.rand(64, 1, 1)
    _, curve = train_diffuser(d, lambda b, g: data[torch.randint(0, 64, (b,), generator=g)], steps=40,
                              batch_size=8, generator=torch.Generator().manual_seed(0))
    assert np.mean(curve[-10:]) < np.mean(curve[:10])
    with pytest.raises(ValueError, match="divisible"):
        TemporalUnet(horizon=18, transition_dim=D, dim=8, dim_mults=(1, 2, 4))


def test_normalizer_round_trip():
    x = np.random.default_rng(0).normal(size=(100, 4)) * [1, 2, 3, 4]
    n = LimitsNormalizer(x)
    z = n.normalize(x)
    assert z.min() == pytest.approx(-1) and z.max() == pytest.approx(1)
    np.testing.assert_allclose(n.unnormalize(z), x)


def test_bad_inputs_raise_before_compute():
    with pytest.raises(ValueError, match="horizon must be an int >= 2"):
        MLPDenoiser(horizon=1, transition_dim=4)
    with pytest.raises(ValueError, match="horizon must be an int >= 2"):
        GaussianDiffusion(_Oracle(torch.zeros(1, 1, 4)), horizon=1, transition_dim=4)
    d = GaussianDiffusion(_Oracle(torch.zeros(1, 8, 4)), horizon=8, transition_dim=4)
    with pytest.raises(ValueError, match="dimension 3, expected 4"):
        d.sample({0: torch.zeros(3)}, batch_size=2)
    planner = DiffuserPlanner(diffusion=d, normalizer=LimitsNormalizer(np.array([[0, 0, -1, -1], [4, 4, 1, 1]])),
                              maze=Maze("umaze"))
    with pytest.raises(ValueError, match=r"start \(2, 2\) is inside the wall cell \(2, 2\)"):
        planner.sample(start=(2.0, 2.0), goal=(1.0, 1.0), n_samples=4)
    with pytest.raises(ValueError, match="goal .* outside the umaze map"):
        planner.sample(start=(1.0, 1.0), goal=(1.0, 7.0), n_samples=4)
    xn, xu = planner.sample(start=(1.0, 1.0), goal=(3.0, 1.0), n_samples=4)
    assert xn.shape == xu.shape == (4, 8, 4)


def test_execute_plan_follows_a_feasible_plan_to_the_goal():
    env = PointMaze2D("umaze", max_episode_steps=80)
    pts = [(1, 1), (1, 3), (3, 3), (3, 1)]
    xy = np.concatenate([np.linspace(pts[k], pts[k + 1], 10, endpoint=False) for k in range(3)] + [[pts[-1]]])
    plan = np.concatenate([xy, np.zeros_like(xy)], 1)
    r = execute_plan(env, plan, start=np.array([1.0, 1.0]), goal=np.array([3.0, 1.0]), steps=60)
    assert r.success and not r.infeasible and r.final_dist < 0.2
    bad = np.array([[1.0, 1.0, 0, 0], [2.0, 1.0, 0, 0], [3.0, 1.0, 0, 0]])
    r = execute_plan(env, bad, start=np.array([1.0, 1.0]), goal=np.array([3.0, 1.0]), steps=60)
    assert r.infeasible and not r.success


def test_a_plan_through_a_wall_ends_the_episode_at_the_contact_when_asked():
    bad = np.array([[1.0, 1.0, 0, 0], [2.0, 1.0, 0, 0], [3.0, 1.0, 0, 0]])
    start, goal = np.array([1.0, 1.0]), np.array([3.0, 1.0])
    slide = execute_plan(PointMaze2D("umaze"), bad, start=start, goal=goal, steps=60)
    stop = execute_plan(PointMaze2D("umaze", terminate_on_contact=True), bad, start=start, goal=goal, steps=60)
    assert slide.contact and stop.contact and len(stop.path) < 10 < len(slide.path) == 61


def test_batched_execution_equals_one_plan_at_a_time():
    rng = np.random.default_rng(0)
    start, goal = np.array([1.05, 0.95]), np.array([6.0, 6.0])
    plans = np.cumsum(rng.normal(0, 0.2, (40, 30, 4)), 1) + np.r_[start, 0, 0]
    plans[:5] = np.linspace([1, 1, 0, 0], [1, 1.4, 0, 0], 30)  # a few that stay clear of the walls
    for terminate in (False, True):
        env = PointMaze2D("medium", terminate_on_contact=terminate)
        b = execute_plans(env, plans, start=start, goal=goal, steps=75)
        rs = [execute_plan(env, p, start=start, goal=goal, steps=75) for p in plans]
        assert 0 < b["contact"].sum() < len(plans)
        for k, r in enumerate(rs):
            assert (b["ret"][k], b["contact"][k], b["infeasible"][k]) == (r.ret, r.contact, r.infeasible)
            assert b["final_dist"][k] == r.final_dist
    with pytest.raises(ValueError, match=r"plans must be \[K, H, 4\]"):
        execute_plans(env, plans[0], start=start, goal=goal, steps=5)
    with pytest.raises(ValueError, match="non-finite"):
        execute_plans(env, np.full((2, 3, 4), np.nan), start=start, goal=goal, steps=5)
