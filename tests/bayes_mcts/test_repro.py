"""Quick reproduction of bayes_mcts: run once, check the result's contents, the headline direction, the config."""

from __future__ import annotations

import json

import pytest

from icml24.bayes_mcts.experiment import Config, episode, run
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bayes_mcts_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "bayes_mcts" and d["mode"] == "quick" and len(d["seeds"]) == 10
    assert {"nmcts", "bts", "tsts", "tsts_const", "tsts_zero", "tsts_sigma", "tsts_oracle", "greedy",
            "nmcts_exact"} <= set(d["summary"])
    for name in ("success_vs_budget.png", "example_tree.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    # GridMaze only in quick mode: regime, heteroscedastic regime, zero-σ control, 3 tuning checks, exact network;
    # the σ̂(s) vs constant-σ̂ mechanism
    assert kinds.count("claim") == 2 and kinds.count("sanity") == 7 and kinds.count("mechanism") == 1
    assert set(res.extra["tuned"]["gridmaze"]) == {"nmcts", "bts", "tsts", "tsts_const"}
    cfg = Config.quick()
    declared = {"nmcts": cfg.c_grid, "bts": cfg.bts_scale_grid, "tsts": cfg.tsts_scale_grid,
                "tsts_const": cfg.tsts_scale_grid}
    for p, t in res.extra["tuning"]["gridmaze"].items():
        assert t["declared"] == list(declared[p]) and len(t["extensions"]) <= cfg.grid_extra
        assert t["picked"] == res.extra["tuned"]["gridmaze"][p] and t["picked"] in t["grid"]
        assert sorted(t["grid"]) == sorted([*declared[p], *t["extensions"]])
        assert min(t["grid"]) >= 0.0  # c >= 0: an extension never crosses the domain's edge
    for k in ("success", "spl"):
        iqm = res.extra["iqm"][k]
        assert set(iqm) >= {"tsts", "nmcts"} and all(v["ci_low"] <= v["iqm"] <= v["ci_high"] for v in iqm.values())
    sh = res.extra["sigma_hat"]["gridmaze"]
    assert set(sh) == {"hat", "pooled"} and sh["pooled"]["pooled_only"] and len(sh["hat"]["table"]) >= 2
    # SPL beside success, per arm; success 1 needs SPL > 0
    for a, x in res.extra["success_rates"].items():
        assert 0 <= res.extra["spl"][a] <= x


def test_quick_run_headline_direction(quick):
    res, _ = quick
    checks = {c.name: c for c in res.claim_checks}
    tsts = next(c for n, c in checks.items() if "TSTS(σ̂(s)) − N-MCTS" in n)
    # fixed seeds, deterministic: TSTS with σ̂(s) solves mazes N-MCTS does not (quick: 0.5 vs 0.1)
    assert tsts.measured > 0 and tsts.method_arm == "tsts" and tsts.baseline_arm == "nmcts"
    rates = res.extra["success_rates"]
    assert rates["gridmaze_T10_tsts_oracle"] >= rates["gridmaze_T10_tsts_zero"]
    # the claims and the mechanism compare the arms they name, on success, with the declared margins
    cfg = Config.quick()
    bts = next(c for n, c in checks.items() if "BTS(σ̂(s)) − N-MCTS" in n)
    (mech,) = res.checks("mechanism")
    for c, a, b, m in ((tsts, "tsts", "nmcts", cfg.claim_margin), (bts, "bts", "nmcts", cfg.claim_margin),
                       (mech, "tsts", "tsts_const", 1e-9)):
        assert c.measured == pytest.approx(rates[f"gridmaze_T10_{a}"] - rates[f"gridmaze_T10_{b}"])
        assert c.threshold == m and c.direction == ">=" and c.ci_low <= c.measured <= c.ci_high
        assert c.passed == (c.ci_low >= m)
    regime = next(c for n, c in checks.items() if n.startswith("regime"))
    exact = next(c for n, c in checks.items() if "exact network" in n)
    assert regime.passed and exact.passed


def test_quick_run_writes_schema_3_that_the_shared_checker_accepts(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_each_sanity_check_guards_its_environments_claims(quick):
    """Per environment and per arm: the regime, the exact network and N-MCTS's tuning guard both claims (N-MCTS is
    their baseline); TSTS's controls and tuning guard the TSTS claim; BTS's tuning the BTS claim."""
    from dataclasses import replace

    from icml24.common.results import verdict

    res, _ = quick
    tsts, bts = (c.name for c in res.checks("claim"))
    assert "TSTS" in tsts and "BTS" in bts
    want = {"regime": [tsts, bts], "heteroscedastic regime": [tsts, bts], "negative control (GridMaze": [tsts],
            "N-MCTS tuned": [tsts, bts], "BTS tuned": [bts], "TSTS tuned": [tsts], "N-MCTS solves": [tsts, bts]}
    sanity = res.checks("sanity")
    for start, guards in want.items():
        (c,) = [c for c in sanity if c.name.startswith(start)]
        assert c.guards == guards, c.name
    lead = ("the regime: ", "negative control", "tuning: ", "implementation: ")
    assert all(c.detail.startswith(lead) for c in sanity)
    # a failing guard voids exactly the claims it names: every sanity check passing but BTS's tuning check
    bts_tuning = next(c.name for c in sanity if c.name.startswith("BTS tuned"))
    checks = [replace(c) for c in res.checks("claim")]
    checks += [replace(c, measured=c.threshold - (c.name == bts_tuning)) for c in sanity]
    v = verdict(checks)
    assert [c.void_by for c in checks[:2]] == [[], [bts_tuning]] and v["sanity_failed"] == [bts_tuning]
    assert v["claims_void"] == 1 and v["claims_total"] == 1
    # the mechanism is no guard: a failing mechanism voids nothing
    (mech,) = res.checks("mechanism")
    assert "constant σ̂" in mech.name and mech.method_arm == "tsts" and mech.baseline_arm == "tsts_const"
    checks2 = [replace(c) for c in res.checks("claim")] + [replace(mech, measured=-1.0, ci_low=-1.0, ci_high=-1.0)]
    checks2 += [replace(c, measured=c.threshold) for c in sanity]
    v2 = verdict(checks2)
    assert v2["claims_void"] == 0 and v2["sanity_failed"] == [] and v2["mechanisms_held"] == 0
    # the heteroscedastic regime guard failing voids both claims
    het = next(c.name for c in sanity if c.name.startswith("heteroscedastic"))
    checks3 = [replace(c) for c in res.checks("claim")] + [replace(c, measured=c.threshold - (c.name == het))
                                                            for c in sanity]
    assert verdict(checks3)["claims_void"] == 2


def test_tune_knob_extends_past_a_winning_edge_and_c_stops_at_zero():
    import math

    from icml24.bayes_mcts.experiment import tune_knob

    def fake(curve):
        def episode_fn(*, seed, planner, budget, **knob):
            (x,) = knob.values()
            return {"success": curve(x) + 0.001 * seed, "return": -1.0, "spl": 0.0}  # a clear curve, a small spread
        return episode_fn

    val = [0, 1, 2, 3]
    t = tune_knob(fake(lambda c: -c), "nmcts", (0.0, 0.5, 1.414), val, budget=10, max_extra=2)
    assert t.value == 0.0 and t.extensions == [] and t.at_limit and t.ok  # c = 0: the domain limit, no extension
    t = tune_knob(fake(lambda c: c), "nmcts", (0.0, 0.5, 1.414), val, budget=10, max_extra=2)
    assert t.extensions == pytest.approx([1.414 + 0.914, 1.414 + 2 * 0.914])  # a linear grid: by its last step
    t = tune_knob(fake(lambda x: math.log2(x) / 10), "tsts", (1.0, 2.0, 4.0), val, budget=10, max_extra=2)
    assert t.extensions == pytest.approx([8.0, 16.0]) and t.value == 16.0 and not t.ok  # by the grid's ratio
    t = tune_knob(fake(lambda x: -(math.log2(x) - 3) ** 2), "bts", (1.0, 2.0, 4.0), val, budget=10, max_extra=2)
    assert t.extensions == pytest.approx([8.0, 16.0]) and t.value == 8.0 and t.ok  # an optimum found past the top
    assert t.records[8.0]["return"] == [-1.0] * 4


def test_nmcts_at_c_zero_is_no_other_arm():
    """c = 0 is N-MCTS's hard limit, not a natural bound: it still searches (best-first on Q̂), so it is neither
    the greedy arm nor TSTS without sampling noise."""
    cfg = Config.quick().replace(fog=0.0, sigma_lo=1.0)  # σ_err = 1 in every state (the pre-issue-30 network)
    runs = {s: [episode("gridmaze", cfg, seed=s, budget=10, sigma="gt", **kw)["steps"] for kw in (
        dict(planner="nmcts", c_puct=0.0), dict(planner="greedy"), dict(planner="tsts", exploration=0.0))]
        for s in (500, 502)}
    assert runs[500][0] != runs[500][1] and runs[502][0] != runs[502][2]


def test_episode_metrics_are_consistent():
    cfg = Config.quick()
    r = episode("gridmaze", cfg, seed=1000, planner="tsts", sigma="sigma", budget=10)
    assert r["success"] in (0.0, 1.0) and r["steps"] >= r["optimal_steps"]
    if r["success"]:
        assert r["return"] == pytest.approx(10.0 - r["steps"]) and 0 < r["spl"] <= 1


def test_config_validation():
    with pytest.raises(ValueError, match="same size"):
        Config(c_grid=(1.0,))
    with pytest.raises(ValueError, match="increasing"):
        Config(c_grid=(4.0, 1.0, 0.5, 0.25, 0.0))
    with pytest.raises(ValueError, match="maze_size"):
        Config(maze_size=1)
    with pytest.raises(ValueError, match="n_sweep"):
        Config(seeds=(0, 1), n_sweep=3)
    assert Config.quick().budget == 10 and Config().budget == 20
    assert (Config().fog, Config().sigma_hi, Config().sigma_lo) == (0.3, 3.0, 0.25)  # issue 30's setting
    assert Config().grid_extra == 2
    with pytest.raises(ValueError, match="grid_extra"):
        Config(grid_extra=-1)


def test_checks_compare_the_arms_they_name():
    """Every check reads the arms it names: each arm gets a different success rate, so a swapped arm shows."""
    import numpy as np

    from icml24.bayes_mcts.experiment import ARMS, TUNED, _checks, tune_knob
    from icml24.bayes_mcts.value_models import BinnedResidualStd

    cfg = Config.quick()
    per = {a: [1.0] * (i + 1) + [0.0] * (9 - i) for i, a in enumerate(ARMS)}  # arm i solves i + 1 of 10

    def vals(e, T, a, k="success"):
        return per[a] if k == "success" else [0.5 * x for x in per[a]]

    def mean(e, T, a, k="success"):
        return float(np.mean(vals(e, T, a, k)))

    def flat(*, seed, planner, budget, **knob):
        (x,) = knob.values()
        return {"success": -abs(np.log(x)) + 0.001 * seed, "return": 0.0, "spl": 0.0}

    grids = {"nmcts": (0.5, 1.0, 2.0), "bts": (0.5, 1.0, 2.0), "tsts": (0.5, 1.0, 2.0), "tsts_const": (0.5, 1.0, 2.0)}
    tunings = {"gridmaze": {a: tune_knob(flat, TUNED[a][0], grids[a], [0, 1, 2], budget=10, max_extra=1)
                            for a in TUNED}}
    est = {"gridmaze": {"hat": BinnedResidualStd([("fog", [3.0] * 30), ("clear", [0.25] * 30)]),
                        "pooled": BinnedResidualStd([("fog", [3.0] * 30), ("clear", [0.25] * 30)], pooled=True)}}
    checks = {c.name.split(":")[0].split(" (")[0] if c.kind != "claim" else c.name: c
              for c in _checks(cfg, ["gridmaze"], 10, vals, mean, tunings, est, True)}
    d = {a: mean("gridmaze", 10, a) for a in ARMS}
    (tsts,) = [c for n, c in checks.items() if "TSTS(σ̂(s)) − N-MCTS" in n]
    (bts,) = [c for n, c in checks.items() if "BTS(σ̂(s)) − N-MCTS" in n]
    assert tsts.measured == pytest.approx(d["tsts"] - d["nmcts"]) and bts.measured == pytest.approx(d["bts"] - d["nmcts"])
    assert checks["mechanism"].measured == pytest.approx(d["tsts"] - d["tsts_const"])
    assert checks["regime"].measured == d["greedy"] and checks["N-MCTS solves the instances with an exact network"] \
        .measured == d["nmcts_exact"]
    assert checks["heteroscedastic regime"].measured == pytest.approx(12.0)
    zero = checks["negative control"]
    assert zero.method_arm == "tsts_zero" and f"{d['tsts_zero'] - d['nmcts']:.4g}" in zero.detail


def test_a_bin_with_exactly_min_count_residuals_gets_its_own_sigma():
    from icml24.bayes_mcts.value_models import BinnedResidualStd

    est = BinnedResidualStd([("fog", [3.0] * 5), ("clear", [0.25] * 4), ("open", [1.0] * 50)], min_count=5)
    assert est("fog") == pytest.approx(3.0)  # 5 residuals = min_count: its own RMS
    assert est("clear") == pytest.approx(est.pooled) and est("never seen") == pytest.approx(est.pooled)
    assert est.pooled == pytest.approx(((5 * 9 + 4 * 0.0625 + 50) / 59) ** 0.5)
