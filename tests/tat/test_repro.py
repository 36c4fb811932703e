"""Quick reproduction of tat: one run per module; result contents, pairing, check labels, config errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.common.results import verdict
from icml24.tat.experiment import (
    MAIN_ARMS,
    Config,
    build_checks,
    claim_names,
    evaluate_maze,
    run,
    train_maze_model,
)
from tests.shared_checker import check_results_file


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


def test_results_file_is_schema_3_and_passes_the_shared_checker(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_sanity_checks_guard_only_the_claims_they_condition(quick):
    res, _ = quick
    names = claim_names(Config.quick())
    by_name = {c.name: c for c in res.claim_checks}
    room = by_name["umaze: vanilla success < 0.9 (room to improve)"]
    assert room.guards == [names["score/umaze"]] and room.detail.startswith("the regime:")
    neg = next(c for c in res.checks("sanity") if c.name.startswith("negative control"))
    assert neg.guards == names["infeasible"] and neg.detail.startswith("negative control:")
    for c in res.checks("claim"):
        assert c.void_by == sorted(s.name for s in res.checks("sanity") if not s.passed and c.name in s.guards)


def _synthetic(umaze_vanilla_success: float, n: int = 40):
    """Per-plan outcomes for two mazes: TAT better than vanilla and the medoid everywhere; vanilla's U-maze
    success set by hand (1.0: no room to improve there); the random-branch control as bad as vanilla."""
    rng = np.random.default_rng(0)
    base = {"infeasible": (rng.random(n) < 0.5).astype(float), "score": 50 + 10 * rng.standard_normal(n)}
    data = {}
    for mz in ("umaze", "medium"):
        sv = umaze_vanilla_success if mz == "umaze" else 0.4
        data[mz] = {
            "vanilla": {"infeasible": base["infeasible"], "score": base["score"],
                        "success": (np.arange(n) < sv * n).astype(float)},
            "medoid": {"infeasible": base["infeasible"], "score": base["score"] + 1, "success": np.full(n, 0.5)},
            "tat": {"infeasible": np.zeros(n), "score": base["score"] + 20, "success": np.full(n, 0.9)},
            "tat_fast": {"infeasible": np.zeros(n), "score": base["score"] + 15, "success": np.full(n, 0.8)},
            "tat_random": {"infeasible": base["infeasible"], "score": base["score"], "success": np.full(n, 0.4)}}

    def per_plan(maze, arm, metric):
        ms = ("umaze", "medium") if maze is None else (maze,)
        return [float(x) for mz in ms for x in data[mz][arm][metric]]
    return per_plan


def test_a_maze_without_room_to_improve_voids_only_its_own_score_claim():
    cfg = Config(iqm_reps=10)  # the full run's mazes: U-maze and medium
    names = claim_names(cfg)
    ok = build_checks(cfg, _synthetic(0.5), batch_rate=0.5)
    assert verdict(ok)["label"] == "holds" and all(not c.void for c in ok if c.kind == "claim")
    checks = build_checks(cfg, _synthetic(1.0), batch_rate=0.5)  # vanilla always succeeds on U-maze
    v = verdict(checks)
    void = [c.name for c in checks if c.kind == "claim" and c.void]
    assert void == [names["score/umaze"]]  # the medium maze's claim and the pooled claims stay testable
    assert v["sanity_failed"] == ["umaze: vanilla success < 0.9 (room to improve)"]
    assert v["label"] == "holds 4/4, 1 void" and v["claims_void"] == 1


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
