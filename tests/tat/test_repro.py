"""Quick reproduction of tat: one run per module; result contents, pairing, check labels, config errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.tat.experiment import MAIN_ARMS, Config, evaluate_maze, run, train_maze_model


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("tat_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "tat" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(MAIN_ARMS) <= set(d["summary"])
    for name in ("plans.png", "rates.png", "score_vs_steps.png"):
        assert (out / name).stat().st_size > 1000
    ex = res.extra
    assert set(ex["iqm_score"]) == set(MAIN_ARMS)
    for a in MAIN_ARMS:
        assert ex["iqm_score"][a]["ci_low"] <= ex["iqm_score"][a]["iqm"] <= ex["iqm_score"][a]["ci_high"]
    assert ex["plans_per_maze"] == 12
    assert 0.0 <= ex["batch_infeasible"]["umaze"] <= 1.0 and ex["root_children_mean"]["umaze"] >= 1.0
    assert 1.0 <= ex["root_max_count_mean"]["umaze"] <= 16 and 0.0 <= ex["tat_plan_is_sample0"]["umaze"] <= 1.0
    t = ex["planning_time_s"]
    assert t["t_sample"] > 0 and t["t_tat"] > 0


def test_checks_are_labelled_and_paired_over_plans(quick):
    res, _ = quick
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 4 and kinds.count("sanity") == 2 and kinds.count("mechanism") == 1
    for c in res.claim_checks:
        if c.kind == "claim":
            assert c.n == 12 and c.ci_low <= c.measured <= c.ci_high
    c1 = [c for c in res.claim_checks if c.name.startswith("(1)")]
    assert {c.baseline_arm for c in c1} == {"vanilla", "medoid"} and all(c.direction == "<=" for c in c1)
    # claim (1) needs the interval strictly below 0: equal rates do not pass
    for c in c1:
        assert c.passed == (c.ci_high < 0)


def test_arms_share_the_batch_and_same_seed_same_numbers():
    cfg = Config.quick().replace(train_steps=(30,), data_steps=3000, episodes_per_seed=5, n_samples=8,
                                 steps_grid=(20, 7, 4))
    planner, _ = train_maze_model(cfg, "umaze", 32)
    a = evaluate_maze(cfg, planner, seed=0, keep_example=True)
    b = evaluate_maze(cfg, planner, seed=0)
    for arm in a["arms"]:
        assert a["arms"][arm] == b["arms"][arm]
    assert set(a["arms"]) == set(MAIN_ARMS) | {"vanilla_s4", "tat_s4"}
    ex = a["example"]
    np.testing.assert_allclose(ex["vanilla"], ex["samples"][0])        # vanilla = the first sample of the batch
    assert any(np.allclose(ex["medoid"], s) for s in ex["samples"])     # the medoid is one of the same samples
    np.testing.assert_allclose(ex["tat"][0], ex["samples"][0, 0])       # TAT starts at the inpainted state


@pytest.mark.parametrize("kw, match", [
    ({"mazes": ("tiny",)}, "mazes"),
    ({"horizons": (1,)}, r"horizons\[0\] must be an int >= 2"),
    ({"mazes": ("umaze", "medium"), "horizons": (32,)}, "one H per maze"),
    ({"lambda_": 0.0}, r"lambda_ must be in \(0, 1\]"),
    ({"lambda_": 1.01}, r"lambda_ must be in \(0, 1\]"),
    ({"merge_threshold": -1e-3}, "merge_threshold must be a finite number >= 0"),
    ({"fast_steps": 20}, "fast_steps"),
    ({"n_samples": 1}, "n_samples"),
    ({"train_steps": (100,)}, "one count per maze"),
    ({"denoiser": "transformer"}, "denoiser"),
    ({"distance": "manhattan"}, "distance"),
    ({"seeds": (0,), "episodes_per_seed": 5}, ">= 10 plans"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)
