"""Quick reproduction of dp_public: run the quick experiment once and check robust claims on it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icml24.common.results import RunResult
from icml24.dp_public import privunitg
from icml24.dp_public.experiment import Config, run


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


def test_mean_estimation_checks_hold_on_quick_run(quick):
    result, _ = quick
    band = [c for c in _check(result, "E1") if "crossover" in c.name][0]
    for c in _check(result, "E1") + _check(result, "E2"):
        assert c.kind == ("claim" if c is band else "mechanism"), c.name  # near-identities and closed forms
        assert c.passed, (c.name, c.measured, c.threshold)
    # the crossover band is non-empty and the gain there is real: per-seed log-ratios, CI below log 0.9
    per_seed = [r["metrics"]["E1 weighted"]["band_ratio"] for r in result.per_seed]
    assert max(per_seed) < 0.9 and band.n == len(per_seed) == 2
    assert band.measured == pytest.approx(float(np.mean(np.log(per_seed))))
    assert band.ci_high <= np.log(0.9) and band.threshold == pytest.approx(np.log(0.9))


def test_training_checks_are_paired_claims(quick):
    result, _ = quick
    e3, e4 = _check(result, "E3"), _check(result, "E4")
    assert len(e3) == len(Config.quick().lin_ratios) and len(e4) == len(Config.quick().dig_epsilons)
    for c in e3 + e4:
        assert c.kind == "claim" and c.n == 2 and c.ci_low <= c.measured <= c.ci_high
        m, b = ([r["metrics"][a][c.metric] for r in result.per_seed] for a in (c.method_arm, c.baseline_arm))
        d = np.log(np.divide(m, b)) if c in e3 else np.subtract(m, b)
        assert c.measured == pytest.approx(float(np.mean(d)))
    assert all(c.threshold == 0.0 and c.passed == (c.ci_high <= 0.0) for c in e3)
    assert all(c.threshold == -0.5 and c.passed == (c.ci_low >= -0.5) for c in e4)
    assert result.verdict["claims_total"] == 1 + len(e3) + len(e4) and result.verdict["mechanisms_total"] == 4


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
        assert semi >= best - 2.0


def test_epsilon_spent_by_training_is_within_target(quick):
    result, _ = quick
    assert set(result.extra) == {"E1", "E2", "E3", "E4"}
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
