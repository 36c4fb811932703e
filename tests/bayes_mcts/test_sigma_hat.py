"""Heteroscedastic network error, the estimated σ̂(s) (validation residuals per feature bin), SPL (issue 30)."""

from __future__ import annotations

import numpy as np
import pytest

from icml24.bayes_mcts import experiment as ex
from icml24.bayes_mcts.envs import GridMaze, make_minigrid
from icml24.bayes_mcts.value_models import (
    BinnedResidualStd,
    EstimatedStdModel,
    SimulatedValueModel,
    validation_residuals,
)


def test_fog_is_observable_and_leaves_the_layout_unchanged():
    plain, fogged = GridMaze(size=6, seed=7), GridMaze(size=6, seed=7, fog=0.3)
    assert np.array_equal(plain.wall, fogged.wall) and not plain.fog_mask.any()
    assert not (fogged.fog_mask & fogged.wall).any()  # only free cells are fogged
    frac = np.mean([GridMaze(size=6, seed=s, fog=0.3).fog_mask[~GridMaze(size=6, seed=s).wall].mean()
                    for s in range(20)])
    assert frac == pytest.approx(0.3, abs=0.05)
    s = fogged.states()[5]
    assert fogged.features(s)[0] == int(fogged.fog_mask[s]) and 1 <= fogged.features(s)[1] <= 4
    assert fogged.goal not in fogged.states() and len(fogged.states()) == int((~fogged.wall).sum()) - 1
    with pytest.raises(ValueError, match="fog"):
        GridMaze(size=4, seed=0, fog=1.5)


def test_minigrid_fog_features():
    env = make_minigrid("MiniGrid-SimpleCrossingS11N5-v0", seed=3, fog=0.5)
    fog, n_open = env.features(env.start)
    assert fog == int(env.fogged(env.start)) and 0 <= n_open <= 4
    assert 0 < env.fog_mask.mean() < 1 and all(len(p) == 3 for p in env.states())


def test_heteroscedastic_network_error_follows_err_std_fn():
    env = GridMaze(size=8, seed=1, fog=0.3)
    net = SimulatedValueModel(q_star=env.q_star, sigma_err=0.0, std_mode="sigma", seed=1,
                              err_std_fn=lambda s: 3.0 if env.fogged(s) else 0.25)
    res = {0: [], 1: []}
    for s in env.states():
        mu, sd = net(s)
        res[int(env.fogged(s))] += list(mu - env.q_star(s))
        assert np.all(sd == (3.0 if env.fogged(s) else 0.25))  # the "sigma" mode: the simulator's own σ_err(s)
    assert np.std(res[1]) == pytest.approx(3.0, rel=0.2) and np.std(res[0]) == pytest.approx(0.25, rel=0.2)
    with pytest.raises(ValueError, match="err_std_fn"):
        SimulatedValueModel(q_star=env.q_star, sigma_err=0.0, err_std_fn=lambda s: -1.0)(env.start)


def test_binned_residual_std_is_the_rms_per_bin_with_a_pooled_fallback():
    rng = np.random.default_rng(0)
    samples = [("a", rng.normal(0, 2.0, 4)) for _ in range(500)] + [("b", rng.normal(0, 0.5, 4)) for _ in range(500)]
    samples += [("rare", np.array([100.0]))]
    est = BinnedResidualStd(samples, min_count=20)
    assert est("a") == pytest.approx(2.0, rel=0.05) and est("b") == pytest.approx(0.5, rel=0.05)
    allr = np.concatenate([r for _, r in samples])
    assert est.pooled == pytest.approx(np.sqrt(np.mean(allr ** 2)))
    assert est("rare") == est.pooled and est("never seen") == est.pooled  # too few residuals / unseen: pooled
    assert est.counts == {"a": 2000, "b": 2000, "rare": 1}
    # the RMS about zero, not the sd about the bin mean: a biased bin keeps its bias in σ̂
    biased = BinnedResidualStd([("x", np.full(30, 1.5))], min_count=1)
    assert biased("x") == pytest.approx(1.5)
    pooled = BinnedResidualStd(samples, pooled=True)
    assert pooled("a") == pooled("b") == pytest.approx(est.pooled)
    with pytest.raises(ValueError, match="no residuals"):
        BinnedResidualStd([])
    with pytest.raises(ValueError, match="non-finite"):
        BinnedResidualStd([("a", np.array([np.nan]))])


def test_sigma_hat_is_estimated_from_residuals_not_read_from_the_simulator(monkeypatch):
    cfg = ex.Config()
    val = [2000 + j for j in range(4)]
    est = ex.fit_sigma_hat("gridmaze", cfg, val)["hat"]
    fog_bins = [x for k, x in est.table.items() if k[0] == 1]
    clear_bins = [x for k, x in est.table.items() if k[0] == 0]
    assert fog_bins and clear_bins
    assert all(abs(x - cfg.sigma_hi) < 0.6 for x in fog_bins) and all(abs(x - cfg.sigma_lo) < 0.1 for x in clear_bins)
    # a network whose true error differs from the Config's sigma_hi / sigma_lo: σ̂ follows the residuals
    real = ex.network

    def other(env, cfg_, **kw):
        return real(env, cfg_.replace(sigma_hi=1.0, sigma_lo=0.5), **kw)

    monkeypatch.setattr(ex, "network", other)
    est2 = ex.fit_sigma_hat("gridmaze", cfg, val)["hat"]
    big = {k: x for k, x in est2.table.items() if est2.counts[k] >= 100}  # bins of >= 25 states
    assert {k[0] for k in big} == {0, 1}
    assert all(abs(x - (1.0 if k[0] else 0.5)) < 0.1 for k, x in big.items())


def test_validation_residuals_ignore_the_networks_own_sigma():
    env = GridMaze(size=4, seed=2, fog=0.3)
    net = SimulatedValueModel(q_star=env.q_star, sigma_err=1.0, seed=2)
    r1 = validation_residuals(env=env, net=net)
    r2 = validation_residuals(env=env, net=lambda s: (net(s)[0], np.full(4, 123.0)))
    assert len(r1) == len(env.states()) and all(k1 == k2 and np.array_equal(a, b)
                                                for (k1, a), (k2, b) in zip(r1, r2, strict=True))


def test_estimated_std_model_serves_mu_with_sigma_hat_of_the_states_bin():
    cfg = ex.Config(maze_size=4)
    est = ex.fit_sigma_hat("gridmaze", cfg, [2000, 2001])
    env = GridMaze(size=4, seed=1000, fog=cfg.fog)
    model = ex.value_model(env, cfg, seed=1000, sigma="hat", est=est)
    assert isinstance(model, EstimatedStdModel)
    base = ex.network(env, cfg, seed=1000, std_mode="sigma")
    for s in env.states():
        mu, sd = model(s)
        assert np.array_equal(mu, base(s)[0]) and np.all(sd == est["hat"](env.features(s)))
    const = ex.value_model(env, cfg, seed=1000, sigma="pooled", est=est)
    assert {float(const(s)[1][0]) for s in env.states()} == {est["pooled"].pooled}
    with pytest.raises(ValueError, match="est"):
        ex.value_model(env, cfg, seed=1000, sigma="hat", est=None)
    with pytest.raises(TypeError, match="std"):
        EstimatedStdModel(base=base, std=3.0, features=env.features)


def test_spl_is_success_times_optimal_over_steps():
    cfg = ex.Config.quick()
    r = ex.episode("gridmaze", cfg, seed=1000, planner="nmcts", sigma="exact", budget=10)
    assert r["success"] == 1.0 and r["steps"] == r["optimal_steps"] and r["spl"] == 1.0
    g = ex.episode("gridmaze", cfg, seed=1000, planner="greedy", sigma="zero", budget=10)
    assert g["spl"] == (g["optimal_steps"] / g["steps"] if g["success"] else 0.0)
    for s in range(1000, 1004):
        r = ex.episode("gridmaze", cfg, seed=s, planner="tsts", budget=10, est=ex.fit_sigma_hat(
            "gridmaze", cfg, [500]))
        assert r["spl"] == pytest.approx(r["success"] * r["optimal_steps"] / r["steps"]) and 0 <= r["spl"] <= 1


def test_config_seed_sets_are_disjoint():
    with pytest.raises(ValueError, match="overlap"):
        ex.Config(test_base=500, val_base=500)
    assert ex.Config().test_base == 1000 and ex.Config().val_base == 500
