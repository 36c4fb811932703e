"""Quick reproduction (run once per module): the contract's outputs and the claims' directions, with margins."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.private_density.experiment import Config, run, theory_slope


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("private_density_quick")
    return run(Config.quick(), out), out


def test_outputs_written(quick):
    res, out = quick
    data = json.loads((out / "results.json").read_text())
    assert data["mode"] == "quick" and data["slug"] == "private_density"
    assert (out / "report.md").exists() and (out / "mise_vs_n.png").exists() and (out / "cutoff_vs_n.png").exists()
    # closed form, one slope check per (d, beta), the constant-cost regime, three adaptivity checks
    assert len(res.claim_checks) == 1 + 2 + 1 + 3
    assert all(np.isfinite(c.measured) for c in res.claim_checks)


def test_checks_are_labelled_and_the_lepskii_claim_has_a_ci(quick):
    """The closed form and the rate slopes are mechanisms, the constant-cost regime and the privacy-naive cutoffs
    are sanity checks, and only the adaptivity of private Lepskii votes, as a per-seed log-ratio to the oracle."""
    res, _ = quick
    kinds = [(c.name.split(" ")[0], c.kind) for c in res.claim_checks]
    assert kinds == [("C1", "mechanism")] + [("C2", "mechanism")] * 2 + [("C2", "sanity")] + [
        ("C3", "claim"), ("C3", "sanity"), ("C3", "sanity")]
    (claim,) = res.checks("claim")
    per_seed = [np.log(r["metrics"]["lepskii_private"]["worst_ratio_to_oracle"]) for r in res.per_seed]
    assert all(r["metrics"]["oracle"]["worst_ratio_to_oracle"] == 1.0 for r in res.per_seed)
    assert claim.measured == pytest.approx(float(np.mean(per_seed))) and claim.n == len(Config.quick().seeds)
    assert claim.threshold == pytest.approx(np.log(Config.quick().lepskii_factor))
    assert claim.ci_low <= claim.measured <= claim.ci_high and claim.passed == (claim.ci_high <= claim.threshold)


def test_closed_form_matches_oracle_arm(quick):
    """Every cell's empirical oracle MISE is within 35% of the closed form (C1 at experiment scale, 12 reps)."""
    res, _ = quick
    for c in res.extra["cells"]:
        assert c["mise"]["oracle"] == pytest.approx(c["closed_form_oracle_mise"], rel=0.35)


def test_privacy_costs_and_naive_choices_are_worse(quick):
    res, _ = quick
    cells = res.extra["cells"]
    assert sum(c["privacy_dominated"] for c in cells) >= len(cells) // 2
    for c in cells:
        assert c["mise"]["oracle"] > c["mise"]["nonprivate_oracle"]  # privacy has a price
        assert c["cut_oracle"] <= c["cut_nonprivate"]  # ... and the optimal cutoff shrinks under privacy
    dom = [c for c in cells if c["privacy_dominated"]]
    lep = np.median([c["median_ise"]["lepskii_private"] / c["median_ise"]["oracle"] for c in dom])
    naive = np.median([c["median_ise"]["lepskii_naive"] / c["median_ise"]["oracle"] for c in dom])
    assert lep < 3.0 and naive > 3.0 * lep


def test_slope_direction(quick):
    res, _ = quick
    cfg = Config.quick()
    for d in cfg.dims:
        for beta in cfg.betas:
            s = res.summary["oracle_scaled"][f"slope_d{d}_b{beta:g}"]["mean"]
            assert abs(s - theory_slope(beta, d)) < 0.3


def test_scaled_rho_holds_the_privacy_cost_and_c1_is_recorded(quick):
    """rho_n puts the closed-form privacy cost at cost_target in every cell; the measured cost stays near it
    (the regime check), and C1 compares the empirical MISE of both oracle arms with the closed form."""
    res, _ = quick
    cfg = Config.quick()
    for c in res.extra["cells"]:
        sc = c["scaled"]
        assert sc["closed_form_mise"] / c["closed_form_nonprivate_mise"] == pytest.approx(cfg.cost_target, rel=1e-6)
        assert cfg.cost_target / 3 < sc["measured_cost"] < 3 * cfg.cost_target
    rhos = [[c["scaled"]["rho"] for c in res.extra["cells"] if c["seed"] == 0 and c["d"] == d] for d in cfg.dims]
    assert all(r[0] > r[-1] for r in rhos)  # the budget shrinks as n grows at constant cost
    (c1,) = [c for c in res.claim_checks if c.name.startswith("C1")]
    ratios = res.extra["closed_form_ratio_mean_over_seeds"]
    assert len(ratios) == 2 * len(cfg.dims) * len(cfg.betas) * len(cfg.n_grid)
    assert c1.measured == pytest.approx(max(abs(v - 1) for v in ratios.values())) and c1.measured < 0.35
