"""Quick reproduction of alh: one run, the result's contents, the checks' kinds and pairing, the tuning protocol,
the bias mechanisms (issue 30) and the slow tier's settings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.alh.experiment import ARMS, Config, run
from tests.shared_checker import check_results_file

UNBIASED_ARMS = ("td3_unbiased", "alh_g_unbiased")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("alh_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "alh" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(d["summary"]) == {*ARMS, *UNBIASED_ARMS}
    for name in ("eval_return.png", "iqm.png"):
        assert (out / name).stat().st_size > 1000
    assert not (out / "cache").exists()  # the per-run resume cache is removed once the run finished
    cfg = Config.quick()
    curves = res.extra["curves"]
    # evaluations: before training, at the end of the warm-up, then every eval_every steps
    assert curves["td3"]["steps"] == [0, 1000, 1250, 1500]
    for arm in (*ARMS, *UNBIASED_ARMS):  # the unbiased arms on every test seed too (issue 30)
        r = np.asarray(curves[arm]["returns"])
        assert r.shape == (2, 4) and np.all(np.isfinite(r))
        finals = [row["metrics"][arm]["final_return"] for row in d["per_seed"]]
        np.testing.assert_allclose(finals, r[:, -2:].mean(1))
    for arm, iqm in res.extra["iqm_final_return"].items():
        assert iqm["ci_low"] <= iqm["iqm"] <= iqm["ci_high"], arm
    # tuned with tune_grid on the validation seed: ALH-a takes ALH-g's lr, extensions within the quick budget
    tr = res.extra["tuning"]
    assert set(tr) == {"td3", "alh_g"} and res.extra["tuned_lr"]["alh_a"] == res.extra["tuned_lr"]["alh_g"]
    for arm, t in tr.items():
        assert t["declared"] == list(cfg.lr_grid) and len(t["extensions"]) <= cfg.grid_extra
        assert t["picked"] == res.extra["tuned_lr"][arm] and t["picked"] in t["grid"]
        assert sorted(t["grid"]) == sorted([*cfg.lr_grid, *t["extensions"]])


def test_quick_run_writes_schema_3_that_the_shared_checker_accepts(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_checks_are_labelled_and_paired(quick):
    res, _ = quick
    claims = res.checks("claim")
    assert [c.method_arm for c in claims] == ["alh_g", "alh_a"]
    for c in claims:  # paired per seed, with an interval, against TD3, threshold 0 fixed by the issue
        assert c.baseline_arm == "td3" and c.threshold == 0.0 and c.n == 2 and c.ci_low <= c.measured <= c.ci_high
    assert all(c.name.endswith("improves TD3 early in training (biased data, 500 updates; mean of the last 2 "
                               "evals)") for c in claims)  # what the claims test, not the bias story
    sanity = res.checks("sanity")
    finite = next(c for c in sanity if "finite" in c.name)
    assert finite.guards == [] and finite.detail.startswith("convergence: ")  # a global precondition
    assert sum(c.name.endswith("inside its grid") for c in sanity) == 2 and len(sanity) == 3  # no regime gate
    mech = res.checks("mechanism")
    assert [c.method_arm for c in mech] == ["td3_unbiased", "alh_g"] and all(c.n == 2 for c in mech)
    assert all(c.guards == [] and c.name.startswith("mechanism: ") for c in mech)
    held, void = res.verdict["claims_held"], res.verdict["claims_void"]
    assert res.verdict["claims_total"] + void == 2 and held <= res.verdict["claims_total"]


def test_tuning_uses_validation_seeds_only(tmp_path, monkeypatch):
    """Each tuned arm tries every lr on the validation seeds (plus the extensions tune_grid makes past an edge that
    wins), and the winner is used on the test seeds."""
    import icml24.alh.experiment as ex

    calls = []

    def fake(cfg, *, arm, seed, lr, biased=None, mujoco=False, checkpoint=None):
        calls.append((arm, seed, lr, biased))
        good = (arm == "td3" and lr == 1e-3) or (arm.startswith("alh") and lr == 3e-4)
        r = [0.0, 1.0, 2.0 if good else -2.0, 2.0 if good else -2.0]
        return {"steps": [0, 1, 2, 3], "returns": r, "critic_loss": [0.0] * 4, "finite": True, "episodes": 1,
                "final": float(np.mean(r[-2:])), "lr": lr}

    monkeypatch.setattr(ex, "run_one", fake)
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3), seeds=(0, 1, 2), val_seeds=(50, 51), grid_extra=2)
    res = ex.run(cfg, tmp_path)
    assert res.extra["tuned_lr"] == {"td3": 1e-3, "alh_g": 3e-4, "alh_a": 3e-4}
    tune = [c for c in calls if c[1] in (50, 51)]
    # both picks sat at an edge that beat its neighbour: one extension each by the grid's ratio, which lost
    tr = res.extra["tuning"]
    assert tr["td3"]["extensions"] == pytest.approx([1e-3 * 1e-3 / 3e-4]) and tr["td3"]["ok"]
    assert tr["alh_g"]["extensions"] == pytest.approx([3e-4 * 3e-4 / 1e-3]) and tr["alh_g"]["ok"]
    assert tr["td3"]["declared"] == list(cfg.lr_grid) and len(tr["td3"]["grid"]) == 3
    want = {(a, lr) for a in ("td3", "alh_g") for lr in cfg.lr_grid} | {
        ("td3", tr["td3"]["extensions"][0]), ("alh_g", tr["alh_g"]["extensions"][0])}
    assert {(a, lr) for a, _, lr, _ in tune} == want
    assert len(tune) == 2 * 3 * 2  # same budget: 3 evaluated lrs x 2 validation seeds for each tuned arm
    test = [c for c in calls if c[1] in (0, 1, 2)]
    assert all(lr == res.extra["tuned_lr"][a] for a, _, lr, b in test)  # the unbiased arms too
    # every test seed: each arm on the biased data, TD3 and ALH-g on the unbiased data as well (issue 30)
    assert sorted((a, s) for a, s, _, b in test if b is None) == sorted((a, s) for a in ARMS for s in (0, 1, 2))
    assert sorted((a, s) for a, s, _, b in test if b is False) == sorted(
        (a, s) for a in ("td3", "alh_g") for s in (0, 1, 2))


def _fake_run_one(opt, *, gain=1.0, unbiased=5.0):
    """A stand-in for ``run_one``: an arm's final return peaks at the lr ``opt[arm]`` (falling by 1 per decade,
    the same on every seed); on the test seeds the ALH arms sit ``gain`` above TD3 on the biased data, and every
    arm ``unbiased`` higher on the unbiased data; MuJoCo runs return 300 (TD3 does not learn the task)."""
    def fake(cfg, *, arm, seed, lr, biased=None, mujoco=False, checkpoint=None):
        if mujoco:
            f = 300.0 + seed
        else:
            f = -abs(np.log10(lr / opt.get(arm, opt.get("alh_g")))) + 0.1 * (seed % 3)
            f += (gain * arm.startswith("alh") if biased is not False else 0.0) + unbiased * (biased is False)
        r = [0.0, 1.0, f, f]
        return {"steps": [0, 1, 2, 3], "returns": r, "critic_loss": [0.0] * 4, "finite": True, "episodes": 1,
                "final": f, "lr": lr}
    return fake


@pytest.mark.parametrize(("opt_td3", "extensions", "inside"), [(1e-3, [], True),     # interior optimum
                                                               (9e-3, [9e-3, 2.7e-2], True),  # found past the top
                                                               (1.0, [9e-3, 2.7e-2], False)])  # beyond the budget
def test_an_edge_that_keeps_winning_extends_and_the_tuning_check_guards_the_claims(tmp_path, monkeypatch, opt_td3,
                                                                                  extensions, inside):
    import icml24.alh.experiment as ex

    monkeypatch.setattr(ex, "run_one", _fake_run_one({"td3": opt_td3, "alh_g": 1e-3}))
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3, 3e-3), seeds=(0, 1, 2), val_seeds=(50, 51),
                                 grid_extra=2)
    res = ex.run(cfg, tmp_path)
    tr = res.extra["tuning"]
    assert tr["td3"]["extensions"] == pytest.approx(extensions) and tr["alh_g"]["extensions"] == []
    assert res.extra["tuned_lr"]["td3"] == pytest.approx(min(opt_td3, 2.7e-2)) and tr["alh_g"]["picked"] == 1e-3
    tuning = [c for c in res.checks("sanity") if "inside its grid" in c.name]
    assert [c.method_arm for c in tuning] == ["td3", "alh_g"]
    assert [c.passed for c in tuning] == [inside, True]
    claims = [c.name for c in res.checks("claim")]
    assert all(c.guards == claims for c in tuning)  # TD3 is every claim's baseline; ALH-a uses ALH-g's lr
    assert all(c.detail.startswith("tuning: ") for c in tuning)
    assert all(c.passed for c in res.checks("claim"))
    assert res.verdict["label"] == ("holds" if inside else "inconclusive (0/2 testable)")


def test_a_guard_voids_exactly_the_claims_it_names(tmp_path, monkeypatch):
    """ALH-a tuned on its own: its lr stuck at the edge voids ALH-a's claim only; ALH-g's still votes."""
    import icml24.alh.experiment as ex

    monkeypatch.setattr(ex, "run_one", _fake_run_one({"td3": 1e-3, "alh_g": 1e-3, "alh_a": 1.0}))
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3, 3e-3), seeds=(0, 1, 2), val_seeds=(50, 51),
                                 grid_extra=1, tune_arms=("td3", "alh_g", "alh_a"))
    res = ex.run(cfg, tmp_path)
    g, a = res.checks("claim")
    by_arm = {c.method_arm: c for c in res.checks("sanity") if "inside its grid" in c.name}
    assert by_arm["alh_a"].guards == [a.name] and not by_arm["alh_a"].passed
    assert by_arm["alh_g"].guards == [g.name] and by_arm["td3"].guards == [g.name, a.name]
    assert a.void_by == [by_arm["alh_a"].name] and g.void_by == []
    assert res.verdict["label"] == "holds 1/1, 1 void" and res.verdict["claims_void"] == 1


def test_lr_source_and_tuning_guards():
    from icml24.alh.experiment import lr_source, tuning_guards

    cfg = Config(test_arms=ARMS)
    assert [lr_source(cfg, a) for a in ARMS] == ["td3", "alh_g", "alh_g"]
    both = [f"{m} improves TD3 early in training (biased data, 20000 updates; mean of the last 2 evals)"
            for m in ("ALH-g", "ALH-a")]
    assert tuning_guards(cfg, "td3") == both and tuning_guards(cfg, "alh_g") == both
    assert tuning_guards(Config(), "td3") == both[:1]  # the default full run has no ALH-a runs (amendment)
    own = cfg.replace(tune_arms=("td3", "alh_g", "alh_a"))
    assert tuning_guards(own, "alh_g") == both[:1] and tuning_guards(own, "alh_a") == both[1:]
    assert Config().grid_extra == 2
    with pytest.raises(ValueError, match="grid_extra"):
        Config(grid_extra=-1)


def test_the_full_run_shows_the_mujoco_checks_beside_the_verdict(tmp_path, monkeypatch):
    """Per environment: with a MuJoCo task in the full run, its checks are mechanisms (MuJoCo has no claim), so
    TD3 failing to learn it voids none of MultiNormEnv's claims."""
    import icml24.alh.experiment as ex

    monkeypatch.setattr(ex, "run_one", _fake_run_one({"td3": 1e-3, "alh_g": 1e-3}))
    monkeypatch.setattr(ex, "make_env", lambda *a, **k: type("E", (), {"close": lambda self: None})())
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3, 3e-3), seeds=(0, 1, 2), val_seeds=(50, 51),
                                 mujoco_env="Hopper-v5", mujoco_seeds=(0, 1))
    res = ex.run(cfg, tmp_path)
    mj = [c for c in res.claim_checks if "Hopper-v5" in c.name]
    assert len(mj) == 2 and all(c.kind == "mechanism" for c in mj)
    assert not mj[1].passed and mj[1].detail.startswith("the regime: TD3 must learn Hopper-v5")
    assert res.verdict["label"] == "holds" and res.verdict["mechanisms_total"] == 2 + 2  # + the two bias ones


def test_mujoco_only_job_is_separate_and_keeps_its_checkpoints(tmp_path, monkeypatch):
    import icml24.alh.experiment as ex

    with pytest.raises(ValueError, match="mujoco_only needs mujoco_env"):
        Config(mujoco_only=True)
    calls = []

    def fake(cfg, *, arm, seed, lr, biased=None, mujoco=False, checkpoint=None):
        calls.append((arm, seed, mujoco, checkpoint))
        r = [0.0, 500.0, 1000.0, 1000.0 - 10.0 * (arm == "alh_g")]
        return {"steps": [0, 1, 2, 3], "returns": r, "critic_loss": [0.0] * 4, "finite": True, "episodes": 1,
                "final": float(np.mean(r[-2:])), "lr": lr}

    monkeypatch.setattr(ex, "run_one", fake)
    monkeypatch.setattr(ex, "make_env", lambda *a, **k: type("E", (), {"close": lambda self: None})())
    cfg = Config.quick().replace(mujoco_only=True, mujoco_env="InvertedPendulum-v5", mujoco_seeds=(3, 4))
    res = ex.run(cfg, tmp_path)
    assert [(a, s) for a, s, _, _ in calls] == [("td3", 3), ("alh_g", 3), ("td3", 4), ("alh_g", 4)]  # seed-major
    assert all(m and c is not None for _, _, m, c in calls)
    (c, learned, fin) = res.checks("sanity")
    assert c.measured == pytest.approx(-5.0) and c.threshold == -50.0 and c.passed and fin.passed
    assert learned.measured == pytest.approx(1000.0) and learned.threshold == 500.0 and learned.passed
    assert res.checks("claim") == [] and res.verdict["label"].startswith("no claim")
    assert len(list((tmp_path / "cache_mujoco").glob("*/mujoco_*.json"))) == 4  # kept: the job can be extended
    n = len(calls)
    ex.run(cfg, tmp_path)
    assert len(calls) == n  # a rerun reuses the finished runs


def test_mujoco_regime_check_fails_when_td3_does_not_learn():
    import icml24.alh.experiment as ex

    cfg = Config.quick().replace(mujoco_env="Hopper-v5", mujoco_seeds=(0, 1))
    logs = {a: {s: {"final": v} for s, v in zip((0, 1), vals, strict=True)}
            for a, vals in (("td3", [300.0, 500.0]), ("alh_g", [295.0, 492.0]))}
    near, learned = ex._mujoco_checks(cfg, logs)
    assert near.threshold == -0.05 * 3600.0 and near.passed  # margin from RETURN_RANGE
    assert learned.measured == 400.0 and not learned.passed  # 400 < 1800: "no worse" would say nothing
    with pytest.raises(ValueError, match="no known return range"):
        Config(mujoco_env="Walker2d-v5")
    assert Config(mujoco_env="Walker2d-v5", mujoco_return_range=4000.0).mujoco_return_range == 4000.0
