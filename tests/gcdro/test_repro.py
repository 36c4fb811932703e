"""GCDRO quick reproduction: one quick run (module-scoped), several checks on its measured numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.common.progress import set_quiet
from icml24.common.results import is_quick
from icml24.gcdro.experiment import (ARMS, BEST, C1_ARMS, C1_BASELINES, MILD_END, Config, _candidates, _flow_steps,
                                     grid_specs, run)


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    set_quiet(True)
    out = tmp_path_factory.mktemp("gcdro_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_results_and_plots(quick_result):
    res, out = quick_result
    data = json.loads((out / "results.json").read_text())
    assert data["mode"] == "quick" and data["slug"] == "gcdro"
    assert set(ARMS) | {BEST, "gcdro_alpha0"} == set(res.summary)
    for name in ("c1_matched_tv.png", "worst_case_weights.png", "rmse_per_environment.png", "sensitivity.png"):
        assert (out / name).exists()
    for arm in ARMS:
        assert res.summary[arm]["d1_rmse_mean"]["n"] == len(Config.quick().seeds)


def test_quick_c1_arms_are_matched_in_tv(quick_result):
    """Every C1 arm's worst case sits at each TV level (the knob found by bisection), CVaR's exactly."""
    res, _ = quick_result
    cfg = Config.quick()
    for row in res.per_seed:
        for level in cfg.tv_levels:
            for arm in C1_ARMS:
                tv = row["metrics"][arm][f"c1_tv_tv{level:g}"]
                assert abs(tv - level) <= cfg.c1_rtol * level, (arm, level, tv)
            # CVaR at TV L is uniform on the top 1 − L: its noisy mass is at most frac / (1 − L)
            assert row["metrics"]["cvar"][f"c1_noisy_mass_tv{level:g}"] <= cfg.noise_frac / (1 - level) + 1e-9


def test_quick_checks_are_labelled_and_claims_are_paired(quick_result):
    res, _ = quick_result
    cfg = Config.quick()
    kinds = [c.kind for c in res.claim_checks]
    assert kinds == ["claim"] * 3 + ["mechanism"] * 3 + ["claim"] * 2 + ["sanity"] * (5 + len(grid_specs(cfg)))
    c1 = res.checks("claim")[:3]
    for level, c in zip(cfg.tv_levels, c1, strict=True):
        assert c.metric == f"c1_noisy_mass_tv{level:g}" and c.method_arm == "gcdro"
        assert c.baseline_arm in C1_BASELINES and c.threshold == 0.0 and c.direction == "<="
        # the baseline is the one with the lowest mean noisy mass at that level
        means = {a: res.summary[a][c.metric]["mean"] for a in C1_BASELINES}
        assert c.baseline_arm == min(means, key=means.get)
        d = [r["metrics"]["gcdro"][c.metric] - r["metrics"][c.baseline_arm][c.metric] for r in res.per_seed]
        assert c.measured == pytest.approx(float(np.mean(d))) and c.n == len(d)
    for c in res.checks("claim")[3:]:
        assert c.baseline_arm == BEST and c.direction == "<=" and c.threshold == 0.0
        d = [np.log(r["metrics"]["gcdro"][c.metric] / r["metrics"][BEST][c.metric]) for r in res.per_seed]
        assert c.measured == pytest.approx(float(np.mean(d)))
        assert c.passed == (c.ci_high <= 0.0)


def test_quick_best_baseline_is_selected_on_validation(quick_result):
    res, out = quick_result
    extra = json.loads((out / "results.json").read_text())["extra"]
    for d, metric in (("d1", "d1_rmse_mean"), ("d2", "d2_rmse_minority")):
        for row, arm in zip(res.per_seed, extra["best_baseline"][d], strict=True):
            m = row["metrics"]
            assert arm != "gcdro" and m[BEST][metric] == m[arm][metric]
            assert m[arm][f"{d}_val_rmse"] == min(m[a][f"{d}_val_rmse"] for a in ARMS if a != "gcdro")


def test_quick_calibration_beats_uncalibrated_flow(quick_result):
    """α, β > 0 (GCDRO, warm flow) vs α = β = 0 (GDRO, restarted): GCDRO's trained worst case puts less mass on noise."""
    res, _ = quick_result
    s = res.summary
    assert s["gcdro"]["d1_train_noisy_mass"]["mean"] < s["gdro"]["d1_train_noisy_mass"]["mean"]


def test_config_validation_and_quick_mode():
    assert is_quick(Config.quick()) and not is_quick(Config())
    with pytest.raises(ValueError, match="n_neighbors"):
        Config(n_neighbors=0)
    with pytest.raises(ValueError, match="n_neighbors"):
        Config(n_train=10, n_neighbors=10)
    with pytest.raises(ValueError, match="noise_frac"):
        Config(noise_frac=1.5)
    with pytest.raises(ValueError, match="alphas"):
        Config(alphas=(-1.0,))
    with pytest.raises(ValueError, match="cvar_grid"):
        Config(cvar_grid=(2.0,))
    with pytest.raises(ValueError, match="tv_levels"):
        Config(tv_levels=(0.0, 0.1))
    with pytest.raises(ValueError, match="gdro_flow_times"):
        Config(gdro_flow_times=(0.0,))
    with pytest.raises(ValueError, match="interior_min_fraction"):
        Config(interior_min_fraction=1.5)
    with pytest.raises(ValueError, match="wass_radii"):
        Config(wass_radii=())


def test_quick_interior_checks_fail_on_single_value_grids(quick_result):
    """The quick config tunes one value per arm: every pick is at the grid's edge, so every interior check fails
    (and the verdict is inconclusive)."""
    res, _ = quick_result
    cfg = Config.quick()
    inner = [c for c in res.claim_checks if c.metric == "interior_fraction"]
    assert sorted(c.method_arm for c in inner) == sorted(grid_specs(cfg))
    for c in inner:
        assert c.kind == "sanity" and c.measured == 0.0 and not c.passed and c.n == 2 * len(cfg.seeds)
    assert res.label.startswith("inconclusive")


def test_grids_are_wide_and_name_their_mild_end():
    cfg = Config()
    specs = grid_specs(cfg)
    assert set(specs) == set(ARMS) - {"erm"} == set(MILD_END)
    for arm, grid in specs.items():
        assert len(set(grid)) >= 5, arm
    # the first run's grids sit strictly inside the new ones, with two milder values outside them
    assert min(cfg.kl_grid) == 1.0 and max(cfg.kl_grid) == 1e4
    assert max(cfg.cvar_grid) > 0.5 and min(cfg.wass_radii) < 1e-3 and min(cfg.gdro_flow_times) < 0.5


def test_gdro_flow_time_maps_to_steps_of_at_most_half():
    assert [_flow_steps(t) for t in (0.05, 0.15, 0.5, 1.5, 5.0)] == [1, 1, 1, 3, 10]
    cfg = Config()
    for t, est in _candidates(cfg, 0)["gdro"]:
        assert est.n_inner * est.step_scale == pytest.approx(t)
        assert 0 < est.step_scale <= 0.5 and est.restart and est.alpha == 0.0 and est.beta == 0.0
