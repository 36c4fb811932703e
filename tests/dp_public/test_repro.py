"""Quick reproduction of dp_public: run the quick experiment once and check robust claims on it."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from icml24.common.results import RunResult, verdict
from icml24.dp_public import privunitg
from icml24.dp_public.experiment import Config, e3_claim, e4_claim, linear_betas, run
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp_public_quick")
    return run(Config.quick(), out), out


def _check(result: RunResult, prefix: str):
    return [c for c in result.claim_checks if c.name.startswith(prefix)]


def test_quick_run_writes_results_and_plots(quick):
    result, out = quick
    assert result.mode == "quick"
    data = json.loads((out / "results.json").read_text())
    assert data["slug"] == "dp_public" and data["seeds"] == [0, 1]
    for png in ("mse_vs_npub_central.png", "mse_vs_npub_local.png", "linreg_mse_vs_ratio.png",
                "digits_acc_vs_eps.png"):
        assert (out / png).stat().st_size > 1000
    assert (out / "report.md").read_text().count("| E") >= 8


def test_mean_estimation_checks_are_mechanisms_and_band_claims(quick):
    result, _ = quick
    cfg = Config.quick()
    e12 = _check(result, "E1") + _check(result, "E2")
    band = [c for c in e12 if "crossover" in c.name]
    assert [c.name[:2] for c in band] == ["E1", "E2"]
    for c in e12:
        assert c.kind == ("claim" if c in band else "mechanism"), c.name  # near-identities and closed forms
    # the band claims are paired per-seed log-ratios of the band geometric means, thresholds from the notes
    for c, thr in zip(band, (np.log(0.9), 0.0), strict=True):
        m = [r["metrics"][c.method_arm]["band_mse_geomean"] for r in result.per_seed]
        b = [r["metrics"][c.baseline_arm]["band_mse_geomean"] for r in result.per_seed]
        assert c.n == len(cfg.seeds) and c.measured == pytest.approx(float(np.mean(np.log(np.divide(m, b)))))
        assert c.threshold == pytest.approx(thr) and c.passed == (c.ci_high <= thr)
    # the band: cells whose analytic baseline MSEs are within x2, non-empty in both experiments
    for tag in ("E1", "E2"):
        an = result.extra[tag]["analytic_mse"]
        ratio = np.maximum(an["throw_away"], an["treat_as_private"]) / np.minimum(an["throw_away"],
                                                                                   an["treat_as_private"])
        assert np.array_equal(np.asarray(result.extra[tag]["band"]), ratio <= 2.0) and (ratio <= 2.0).any()
    # the weighted estimator beats the better baseline on the pooled band (robust at this size)
    assert all(c.measured < 0 for c in band)


def test_training_checks_are_paired_claims(quick):
    result, _ = quick
    cfg = Config.quick()
    e3, e4 = ([c for c in _check(result, t) if c.kind == "claim"] for t in ("E3", "E4"))
    assert len(e3) == 2 * len(cfg.lin_ratios) and len(e4) == len(cfg.dig_epsilons)
    assert {c.baseline_arm.split()[1] for c in e3} == {"dp_gd_all", "semi_dp_beta_eq"}
    for c in e3 + e4:
        assert c.kind == "claim" and c.n == 2 and c.ci_low <= c.measured <= c.ci_high
        m, b = ([r["metrics"][a][c.metric] for r in result.per_seed] for a in (c.method_arm, c.baseline_arm))
        d = np.log(np.divide(m, b)) if c in e3 else np.subtract(m, b)
        assert c.measured == pytest.approx(float(np.mean(d)))
    assert all(c.threshold == 0.0 and c.passed == (c.ci_high <= 0.0) for c in e3)
    assert all(c.threshold == -0.5 and c.passed == (c.ci_low >= -0.5) for c in e4)
    v = result.verdict
    assert v["claims_total"] + v["claims_void"] == 2 + len(e3) + len(e4) and v["mechanisms_total"] == 4
    assert [c.name for c in e3] == [e3_claim(r, b) for r in cfg.lin_ratios for b in ("dp_gd_all", "semi_dp_beta_eq")]
    assert [c.name for c in e4] == [e4_claim(e) for e in cfg.dig_epsilons]


def test_equal_budgets_and_public_validation_on_quick_run(quick):
    result, _ = quick
    cfg = Config.quick()
    for row in result.extra["E3"]["per_seed"]:
        for r, res in row.items():
            assert res["budget"] == len(linear_betas(cfg, float(r))) * len(cfg.lin_lrs)
            assert res["beta_eq"] == pytest.approx(res["n_priv"] / (res["n_priv"] + cfg.lin_n_pub))
            assert res["hp"]["semi_dp_beta_eq"]["beta"] == res["beta_eq"]
    for row in result.extra["E4"]["per_seed"]:
        pool = row["n_pub"] + row["n_val"]
        assert row["n_val"] < pool < row["n_priv"] and row["budget"] == len(cfg.dig_betas) * len(cfg.dig_lrs)


def test_semi_dp_training_direction_on_quick_run(quick):
    result, _ = quick
    s = result.summary
    for r in Config.quick().lin_ratios:
        semi = s[f"E3 semi_dp ratio={r:g}"]["test_mse"]["mean"]
        # robust direction: using the private data beats throwing it away by a wide margin at this scale
        assert semi < 0.8 * s[f"E3 throw_away ratio={r:g}"]["test_mse"]["mean"]
    for eps in Config.quick().dig_epsilons:
        semi = s[f"E4 semi_dp eps={eps:g}"]["acc"]["mean"]
        best = max(s[f"E4 public_only eps={eps:g}"]["acc"]["mean"], s[f"E4 dp_sgd_all eps={eps:g}"]["acc"]["mean"])
        assert semi >= best - 10.0  # 2 seeds, a 22-point validation split, one configuration per arm


def test_epsilon_spent_by_training_is_within_target(quick):
    result, _ = quick
    assert set(result.extra) == {"E1", "E2", "E3", "E4", "tuning"}
    for row in result.extra["E4"]["per_seed"]:
        spent = row["epsilon_spent"]
        assert set(spent) == {f"{m} eps={e:g}" for m in ("dp_sgd_all", "semi_dp") for e in Config.quick().dig_epsilons}
        for key, eps in spent.items():
            target = float(key.split("eps=")[1])
            assert 0.9 * target <= eps <= target


def test_privunitg_sampler_hits_the_cap_with_the_recorded_probability(quick):
    # checks the sampler's output, not the parameter formula: for input e1 the 1-D component
    # t = z[:, 0] / scale must satisfy t >= gamma with probability p (PrivUnitG's cap probability)
    result, _ = quick
    pu = result.extra["E2"]["privunitg"]
    assert pu
    draws = 100_000
    for i, (eps, prm) in enumerate(pu.items()):
        x = torch.zeros(draws, 3, dtype=torch.float64)
        x[:, 0] = 1.0
        z = privunitg(x, epsilon=float(eps), generator=torch.Generator().manual_seed(100 + i))
        frac = float((z[:, 0] / prm["scale"] >= prm["gamma"]).double().mean())
        assert abs(frac - prm["p"]) <= 0.01, (eps, frac, prm["p"])


def test_regime_sanity_checks_compare_with_the_non_private_reference(quick):
    """Regime checks: paired against the noise-free clipped GD / SGD on all data, thresholds from the config."""
    result, _ = quick
    cfg = Config.quick()
    reg = [c for c in result.claim_checks if "regime" in c.name]
    assert len(reg) == 2 * len(cfg.lin_ratios) + len(cfg.dig_epsilons) + 1
    for c in reg:
        assert c.kind == "sanity" and c.n == len(cfg.seeds) and c.direction == ">="
        assert c.detail.startswith("the regime: ")
        # a per-cell regime check guards that cell's claims only
        if c.name.startswith("E3"):
            r = float(c.name.split("ratio ")[1].split(")")[0])
            assert c.guards == [e3_claim(r, b) for b in ("dp_gd_all", "semi_dp_beta_eq")]
        elif "ε=" in c.name:
            assert c.guards == [e4_claim(float(c.name.split("ε=")[1].split(")")[0]))]
        else:  # public-only SGD does not depend on ε: every E4 claim
            assert c.guards == [e4_claim(e) for e in cfg.dig_epsilons]
        m, b = ([r["metrics"][a][c.metric] for r in result.per_seed] for a in (c.method_arm, c.baseline_arm))
        if c.name.startswith("E3"):
            assert c.baseline_arm.startswith("E3 non_private") and c.threshold == pytest.approx(np.log(1.05))
            assert c.measured == pytest.approx(float(np.mean(np.log(np.divide(m, b)))))
        else:
            assert c.method_arm == "E4 non_private" and c.threshold == 1.0
            assert c.measured == pytest.approx(float(np.mean(np.subtract(m, b))))
        assert c.passed == (c.ci_low >= c.threshold)
    # the reference is the best-informed arm: it sees all data without noise
    s = result.summary
    for r in cfg.lin_ratios:
        ref, pub = (s[f"E3 {a} ratio={r:g}"]["test_mse"]["mean"] for a in ("non_private", "throw_away"))
        assert ref < pub


def test_tuning_checks_cover_every_tuned_knob_and_guard_their_experiment(quick):
    result, _ = quick
    cfg = Config.quick()
    inner = [c for c in result.claim_checks if c.metric == "tuned_inside_fraction"]
    assert {c.method_arm for c in inner} == {"E3 semi_dp", "E3 dp_gd_all", "E3 semi_dp_beta_eq", "E3 non_private",
                                            "E4 semi_dp", "E4 dp_sgd_all", "E4 public_only", "E4 non_private"}
    assert len(inner) == 9  # semi-DP's β and η in E3 (E4's β is fixed)
    e3_all = [e3_claim(r, b) for r in cfg.lin_ratios for b in ("dp_gd_all", "semi_dp_beta_eq")]
    for c in inner:
        assert c.kind == "sanity" and c.threshold == cfg.interior_min_fraction and c.detail.startswith("tuning: ")
        assert c.passed == (c.measured >= c.threshold)
        exp = c.method_arm.split()[0]
        if exp == "E4":
            assert c.guards == [e4_claim(e) for e in cfg.dig_epsilons]
        elif c.method_arm in ("E3 dp_gd_all", "E3 semi_dp_beta_eq"):  # only the claims against that arm
            assert c.guards == [e3_claim(r, c.method_arm.split()[1]) for r in cfg.lin_ratios]
        else:
            assert c.guards == e3_all
    # the extensions are recorded, within the budget, and the pick is in the evaluated grid
    tun = result.extra["tuning"]
    assert tun["grid_extra"] == cfg.grid_extra
    cells = [t for r in cfg.lin_ratios for row in tun["E3"][f"ratio={r:g}"] for t in row.values()]
    cells += [t for row in tun["E4"] for t in row.values()]
    assert len(cells) == len(cfg.seeds) * (5 * len(cfg.lin_ratios) + 2 + 2 * len(cfg.dig_epsilons))
    for t in cells:
        assert len(t["extensions"]) <= cfg.grid_extra and t["picked"] in t["grid"]
        assert all(e in t["grid"] for e in t["extensions"])
    for row, res in zip(tun["E3"][f"ratio={cfg.lin_ratios[0]:g}"], result.extra["E3"]["per_seed"], strict=True):
        assert row["semi_dp_beta"]["picked"] == pytest.approx(res[str(cfg.lin_ratios[0])]["hp"]["semi_dp"]["beta"])


def test_a_failed_guard_voids_exactly_the_claims_it_names(quick):
    result, _ = quick
    cfg = Config.quick()
    base = copy.deepcopy(result.claim_checks)
    for c in base:
        if c.kind == "sanity":
            c.passed = True
    claims = [c.name for c in base if c.kind == "claim"]
    r = cfg.lin_ratios[0]
    for pick, voided in (("E3 dp_gd_all's tuned η", [e3_claim(r, "dp_gd_all")]),
                         (f"E3 regime (ratio {r:g}): DP noise", [e3_claim(r, b) for b in ("dp_gd_all",
                                                                                          "semi_dp_beta_eq")]),
                         ("E4 public-only's tuned η", [e4_claim(e) for e in cfg.dig_epsilons])):
        checks = copy.deepcopy(base)
        guard = next(c for c in checks if c.kind == "sanity" and c.name.startswith(pick))
        guard.passed = False
        v = verdict(checks)
        assert sorted(c.name for c in checks if c.kind == "claim" and c.void) == sorted(voided), pick
        assert v["claims_void"] == len(voided) and v["claims_total"] == len(claims) - len(voided)
    # E1/E2 claims use no tuned arm and no regime check: nothing voids them
    assert not any(c.void for c in result.claim_checks if c.kind == "claim" and c.name[:2] in ("E1", "E2"))


def test_quick_results_pass_the_shared_checker(quick):
    result, out = quick
    data = json.loads((out / "results.json").read_text())
    assert data["schema_version"] == 3 and "claims_void" in data["verdict"]
    check_results_file(out / "results.json")
