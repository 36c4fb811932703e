"""Quick reproduction of tat: one run per module; result contents, pairing, check labels, config errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.common.results import verdict
from icml24.common.stats import paired_ci
from icml24.tat.experiment import (
    BATCH,
    MAIN_ARMS,
    ORACLE,
    Config,
    Outcomes,
    build_checks,
    claim_names,
    eval_env,
    evaluate_maze,
    run,
    train_maze_model,
)
from icml24.tat.maze import Maze, expert_return
from icml24.tat.planner import execute_plan, execute_plans
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("tat_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "tat" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(MAIN_ARMS) | {ORACLE, BATCH} <= set(d["summary"])
    for name in ("plans.png", "rates.png", "score_vs_steps.png"):
        assert (out / name).stat().st_size > 1000
    ex = res.extra
    assert set(ex["iqm_score"]) == set(MAIN_ARMS) | {ORACLE}
    for a in ex["iqm_score"]:
        assert ex["iqm_score"][a]["ci_low"] <= ex["iqm_score"][a]["iqm"] <= ex["iqm_score"][a]["ci_high"]
    assert ex["plans_per_maze"] == 12 and set(ex["train"]) == {"umaze/0", "umaze/1"}
    assert ex["train"]["umaze/0"]["loss_last100"] != ex["train"]["umaze/1"]["loss_last100"]  # two trained models
    r = ex["rates"]["umaze"]
    assert 0.0 <= r[BATCH]["infeasible"] <= 1.0 and ex["root_children_mean"]["umaze"] >= 1.0
    # the oracle picks the best executed sample, so no sample-level arm scores above it
    assert r[ORACLE]["score"] >= max(r["vanilla"]["score"], r["medoid"]["score"], r[BATCH]["score"])
    assert 1.0 <= ex["root_max_count_mean"]["umaze"] <= 16 and 0.0 <= ex["tat_plan_is_sample0"]["umaze"] <= 1.0
    t = ex["planning_time_s"]
    assert t["t_sample"] > 0 and t["t_tat"] > 0


def test_checks_are_labelled_and_paired_over_plans(quick):
    res, _ = quick
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 3 and kinds.count("sanity") == 4 and kinds.count("mechanism") == 2
    for c in res.claim_checks:
        if c.kind == "claim":
            assert c.n == 12 and c.ci_low <= c.measured <= c.ci_high and "cluster bootstrap over 2" in c.detail
    c1 = [c for c in res.claim_checks if c.name.startswith("(1)")]
    assert [c.baseline_arm for c in c1] == ["vanilla"] and all(c.direction == "<=" for c in c1)
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
    own = sorted([names["infeasible/umaze"], names["score/umaze"]])
    for c in res.checks("sanity"):
        if c.name.startswith("umaze: negative control"):
            assert c.guards == [names["infeasible/umaze"]] and c.detail.startswith("negative control:")
        else:
            assert sorted(c.guards) == own and "the regime:" in c.detail
    for c in res.checks("claim"):
        assert c.void_by == sorted(s.name for s in res.checks("sanity") if not s.passed and c.name in s.guards)


def _synthetic(umaze_batch_rate: float, n: int = 40, seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> Outcomes:
    """Per-plan outcomes for two mazes and 5 training seeds: TAT better than vanilla everywhere, the oracle above
    vanilla, the random-branch control as bad as vanilla; the U-maze batch's infeasible rate set by hand."""
    rng = np.random.default_rng(0)
    evals = {}
    for mz in ("umaze", "medium"):
        rate = umaze_batch_rate if mz == "umaze" else 0.2
        for s in seeds:
            inf = (rng.random(n) < 0.5).astype(float)
            score = 50 + 10 * rng.standard_normal(n)
            arm = lambda i, sc: {"infeasible": list(i), "score": list(sc), "success": [1.0] * n,  # noqa: E731
                                 "contact": list(i)}
            evals[mz, s] = {"arms": {
                "vanilla": arm(inf, score), "medoid": arm(inf, score + 1), "tat": arm(np.zeros(n), score + 20),
                "tat_fast": arm(np.zeros(n), score + 15), "tat_random": arm(inf, score),
                ORACLE: arm(np.zeros(n), score + 30),
                BATCH: arm(np.clip(rate + 0.01 * rng.standard_normal(n), 0, 1), score - 5)}}
    return Outcomes(("umaze", "medium"), seeds, evals)


def test_a_maze_outside_the_risky_band_voids_only_its_own_claims():
    cfg = Config(iqm_reps=10)  # the full run's mazes: U-maze and medium
    names = claim_names(cfg)
    ok = build_checks(cfg, _synthetic(0.2))
    assert verdict(ok)["label"] == "holds" and all(not c.void for c in ok if c.kind == "claim")
    for rate, failed in ((0.9, "umaze: batch infeasible rate <= 0.4 (a risky minority)"),
                         (0.005, "umaze: batch infeasible rate >= 0.02 (a risky minority)")):
        checks = build_checks(cfg, _synthetic(rate))
        v = verdict(checks)
        void = sorted(c.name for c in checks if c.kind == "claim" and c.void)
        assert void == sorted([names["infeasible/umaze"], names["score/umaze"]])  # medium and the pooled stay
        assert v["sanity_failed"] == [failed] and v["label"] == "holds 3/3, 2 void" and v["claims_void"] == 2


def test_no_room_to_select_voids_the_mazes_claims_and_the_control_rejects_a_random_branch():
    cfg = Config(iqm_reps=10)
    o = _synthetic(0.2)
    for s in o.seeds:
        o.evals["medium", s]["arms"][ORACLE] = o.evals["medium", s]["arms"]["vanilla"]  # the oracle = sample 0
        o.evals["umaze", s]["arms"]["tat_random"] = o.evals["umaze", s]["arms"]["tat"]  # a control that "works"
    checks = build_checks(cfg, o)
    v = verdict(checks)
    assert sorted(v["sanity_failed"]) == ["medium: the best of the N samples beats vanilla (room to select)",
                                         "umaze: negative control: claim (1) rejects TAT with a random branch "
                                         "choice (CI upper end >= 0)"]
    names = claim_names(cfg)
    assert sorted(c.name for c in checks if c.kind == "claim" and c.void) == sorted(
        [names["infeasible/medium"], names["score/medium"], names["infeasible/umaze"]])


def test_cluster_bootstrap_is_wider_than_plans_alone_when_models_differ():
    o = _synthetic(0.2)
    for k, s in enumerate(o.seeds):  # TAT's gain differs a lot between the trained models
        o.evals["umaze", s]["arms"]["tat"]["score"] = [x + 40 * (k - 2) for x in o.evals["umaze", s]["arms"]["tat"]["score"]]
    c = next(c for c in build_checks(Config(iqm_reps=10), o) if c.name == claim_names(Config())["score/umaze"])
    iid = paired_ci(o.get("umaze", "tat", "score"), o.get("umaze", "vanilla", "score"), bootstrap=True)
    assert c.ci_high - c.ci_low > 3 * (iid["ci_high"] - iid["ci_low"])


def test_arms_share_the_batch_and_same_seed_same_numbers():
    cfg = Config.quick().replace(train_steps=(30,), data_steps=3000, episodes_per_seed=5, n_samples=8,
                                 steps_grid=(20, 7, 4))
    planner, _ = train_maze_model(cfg, "umaze", 32)
    a = evaluate_maze(cfg, planner, seed=0, keep_example=True)
    b = evaluate_maze(cfg, planner, seed=0)
    for arm in a["arms"]:
        assert a["arms"][arm] == b["arms"][arm]
    assert set(a["arms"]) == set(MAIN_ARMS) | {"vanilla_s4", "tat_s4", ORACLE, BATCH}
    ex = a["example"]
    np.testing.assert_allclose(ex["vanilla"], ex["samples"][0])        # vanilla = the first sample of the batch
    assert any(np.allclose(ex["medoid"], s) for s in ex["samples"])     # the medoid is one of the same samples
    np.testing.assert_allclose(ex["tat"][0], ex["samples"][0, 0])       # TAT starts at the inpainted state
    pilot = evaluate_maze(cfg, planner, seed=0, vanilla_only=True)       # the pilot measures the run's numbers
    assert set(pilot["arms"]) == {"vanilla", ORACLE, BATCH}
    for arm in pilot["arms"]:
        assert pilot["arms"][arm] == a["arms"][arm]
    env, steps = eval_env(cfg, planner)
    assert env.terminate_on_contact and steps == round(2.5 * 32)
    e = ex["episode"]
    for arm, plan in (("vanilla", ex["vanilla"]), ("tat", ex["tat"])):
        r = execute_plan(env, plan, start=ex["start"], goal=ex["goal"], steps=steps)
        assert a["arms"][arm]["infeasible"][e] == r.infeasible and a["arms"][arm]["contact"][e] == r.contact
    assert all(o >= v for o, v in zip(a["arms"][ORACLE]["score"], a["arms"]["vanilla"]["score"], strict=True))
    # the oracle is the best of all N samples (sample 0 included), the batch arm their mean
    ref = max(expert_return(env, start=ex["start"], goal=ex["goal"], steps=steps), 1.0)
    every = 100.0 * execute_plans(env, ex["samples"], start=ex["start"], goal=ex["goal"], steps=steps)["ret"] / ref
    assert a["arms"][ORACLE]["score"][e] == every.max() and a["arms"][BATCH]["score"][e] == pytest.approx(every.mean())
    assert a["arms"]["vanilla"]["score"][e] == every[0]


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
    ({"seeds": (0, 1), "episodes_per_seed": 4}, ">= 10 plans"),
    ({"seeds": (0,)}, ">= 2 training seeds"),
    ({"risky_band": (0.4, 0.02)}, "risky_band"),
    ({"risky_band": (0.1,)}, "risky_band"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


class _StubPlanner:
    """A planner whose sample 0 walks the U-maze's free corridor to the goal, sample 1 runs into the wall and the
    others walk the same path 4 steps later: the oracle must pick sample 0, the batch average count the failure."""

    maze = Maze("umaze")
    horizon = 16

    class normalizer:  # noqa: N801 - the planner's interface
        @staticmethod
        def unnormalize(x):
            return x

    def sample(self, *, start, goal, n_samples, n_steps=None, generator=None):
        good = np.linspace([*start, 0, 0], [goal[0], goal[1], 0, 0], self.horizon)
        late = np.concatenate([good[:1].repeat(4, 0), good[:-4]])  # the same path, 4 steps later
        bad = np.linspace([*start, 0, 0], [start[0] + 2.0, start[1], 0, 0], self.horizon)  # down into row 2
        plans = np.stack([good, bad] + [late] * (n_samples - 2))
        return plans, plans


def test_the_oracle_takes_the_best_sample_even_when_it_is_the_first(monkeypatch):
    import icml24.tat.experiment as ex
    monkeypatch.setattr(ex, "_task", lambda m, rng: (np.array([1.0, 1.0]), np.array([1.0, 3.0])))
    cfg = Config.quick().replace(episodes_per_seed=5, n_samples=8)
    out = evaluate_maze(cfg, _StubPlanner(), seed=0, vanilla_only=True)["arms"]
    assert min(out[ORACLE]["score"]) > 0 and out[ORACLE]["score"] == out["vanilla"]["score"]
    assert out[BATCH]["contact"] == [1 / 8] * 5 and out[ORACLE]["contact"] == [0.0] * 5
    assert all(b < v for b, v in zip(out[BATCH]["score"], out["vanilla"]["score"], strict=True))
