"""Quick reproduction of bayes_mcts: run once, check the result's contents, the headline direction, the config."""

from __future__ import annotations

import json

import pytest

from icml24.bayes_mcts.experiment import Config, episode, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bayes_mcts_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "bayes_mcts" and d["mode"] == "quick" and len(d["seeds"]) == 10
    assert {"nmcts", "bts", "tsts", "tsts_const", "tsts_zero", "greedy"} <= set(d["summary"])
    for name in ("success_vs_budget.png", "example_tree.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 2 and kinds.count("sanity") == 5  # GridMaze only in quick mode
    assert set(res.extra["tuned"]["gridmaze"]) == {"nmcts", "bts", "tsts"}
    iqm = res.extra["iqm"]["success"]
    assert set(iqm) >= {"tsts", "nmcts"} and all(v["ci_low"] <= v["iqm"] <= v["ci_high"] for v in iqm.values())


def test_quick_run_headline_direction(quick):
    res, _ = quick
    checks = {c.name: c for c in res.claim_checks}
    tsts = next(c for n, c in checks.items() if "TSTS − N-MCTS" in n)
    # fixed seeds, deterministic: TSTS solves mazes N-MCTS does not (prototype: 1.0 vs 0.0)
    assert tsts.passed and tsts.measured >= 0.5
    regime = next(c for n, c in checks.items() if n.startswith("regime"))
    exact = next(c for n, c in checks.items() if "exact network" in n)
    assert regime.passed and exact.passed


def test_episode_metrics_are_consistent():
    cfg = Config.quick()
    r = episode("gridmaze", cfg, seed=1000, planner="tsts", budget=10)
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
    assert Config.quick().budget == 10 and Config().budget == 20 and Config().sigma_err == 1.0
