"""Quick reproduction of alh: one run, the result's contents, the checks' kinds and pairing, the tuning protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.alh.experiment import ARMS, Config, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("alh_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "alh" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(d["summary"]) == {*ARMS, "td3_unbiased"}
    for name in ("eval_return.png", "iqm.png"):
        assert (out / name).stat().st_size > 1000
    assert not (out / "cache").exists()  # the per-run resume cache is removed once the run finished
    cfg = Config.quick()
    curves = res.extra["curves"]
    # evaluations: before training, at the end of the warm-up, then every eval_every steps
    assert curves["td3"]["steps"] == [0, 1000, 1250, 1500]
    for arm in ARMS:
        r = np.asarray(curves[arm]["returns"])
        assert r.shape == (2, 4) and np.all(np.isfinite(r))
        finals = [row["metrics"][arm]["final_return"] for row in d["per_seed"]]
        np.testing.assert_allclose(finals, r[:, -2:].mean(1))
    for arm, iqm in res.extra["iqm_final_return"].items():
        assert iqm["ci_low"] <= iqm["iqm"] <= iqm["ci_high"], arm
    assert set(res.extra["tuned_lr"].values()) == {cfg.lr_grid[0]}


def test_checks_are_labelled_and_paired(quick):
    res, _ = quick
    claims = res.checks("claim")
    assert [c.method_arm for c in claims] == ["alh_g", "alh_a"]
    for c in claims:  # paired per seed, with an interval, against TD3, threshold 0 fixed by the issue
        assert c.baseline_arm == "td3" and c.threshold == 0.0 and c.n == 2 and c.ci_low <= c.measured <= c.ci_high
    names = [c.name for c in res.checks("sanity")]
    assert any(n.startswith("regime") for n in names) and any("finite" in n for n in names)
    assert res.verdict["claims_total"] == 2


def test_tuning_uses_validation_seeds_only(tmp_path, monkeypatch):
    """Each tuned arm tries every lr on the validation seeds, the winner is used on the test seeds."""
    import icml24.alh.experiment as ex

    calls = []

    def fake(cfg, *, arm, seed, lr, biased=None, mujoco=False, checkpoint=None):
        calls.append((arm, seed, lr, biased))
        good = (arm == "td3" and lr == 1e-3) or (arm.startswith("alh") and lr == 3e-4)
        r = [0.0, 1.0, 2.0 if good else -2.0, 2.0 if good else -2.0]
        return {"steps": [0, 1, 2, 3], "returns": r, "critic_loss": [0.0] * 4, "finite": True, "episodes": 1,
                "final": float(np.mean(r[-2:])), "lr": lr}

    monkeypatch.setattr(ex, "run_one", fake)
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3), seeds=(0, 1, 2), val_seeds=(50, 51))
    res = ex.run(cfg, tmp_path)
    assert res.extra["tuned_lr"] == {"td3": 1e-3, "alh_g": 3e-4, "alh_a": 3e-4}
    tune = [c for c in calls if c[1] in (50, 51)]
    assert sorted({(a, lr) for a, _, lr, _ in tune}) == sorted((a, lr) for a in ("td3", "alh_g") for lr in cfg.lr_grid)
    assert len(tune) == 2 * 2 * 2  # same budget: 2 lrs x 2 validation seeds for each tuned arm
    test = [c for c in calls if c[1] in (0, 1, 2)]
    assert all(lr == res.extra["tuned_lr"][a] for a, _, lr, b in test if b is None)
    assert {(s, b) for a, s, _, b in test if b is False} == {(0, False), (1, False)}  # regime control seeds


def _fake_run_one(best):
    """A stand-in for ``run_one``: ``best[arm]`` is the lr that scores highest on validation."""
    def fake(cfg, *, arm, seed, lr, biased=None, mujoco=False, checkpoint=None):
        good = best.get(arm, best.get("alh_g")) == lr
        r = [0.0, 1.0, 2.0 if good else -2.0, 2.0 if good else -2.0]
        if biased is False:
            r = [0.0, 1.0, 5.0 + seed, 5.0 + seed]
        return {"steps": [0, 1, 2, 3], "returns": r, "critic_loss": [0.0] * 4, "finite": True, "episodes": 1,
                "final": float(np.mean(r[-2:])), "lr": lr}
    return fake


@pytest.mark.parametrize(("best", "inside"), [({"td3": 1e-3, "alh_g": 1e-3}, True),
                                              ({"td3": 3e-3, "alh_g": 1e-3}, False),
                                              ({"td3": 1e-3, "alh_g": 3e-4}, False)])
def test_interior_check_fails_on_an_edge_pick(tmp_path, monkeypatch, best, inside):
    import icml24.alh.experiment as ex

    monkeypatch.setattr(ex, "run_one", _fake_run_one(best))
    cfg = Config.quick().replace(lr_grid=(3e-4, 1e-3, 3e-3), seeds=(0, 1, 2), val_seeds=(50, 51),
                                 regime_seeds=(0, 1, 2))
    res = ex.run(cfg, tmp_path)
    assert res.extra["tuned_lr"]["td3"] == best["td3"] and res.extra["tuned_lr"]["alh_g"] == best["alh_g"]
    interior = [c for c in res.checks("sanity") if "inside its grid" in c.name]
    assert [c.method_arm for c in interior] == ["td3", "alh_g"]
    for c in interior:
        assert c.passed == (1e-3 == best[c.method_arm])
    assert all(c.passed for c in res.checks("sanity") if c not in interior)  # regime + finite hold here
    assert res.verdict["label"].startswith("inconclusive") == (not inside)


def test_pick_lr_and_interior_check():
    from icml24.alh.experiment import interior_check
    from icml24.common.tuning import pick_best as pick_lr  # alh's lr pick (the shared rule)

    g = (3e-4, 1e-3, 3e-3)
    assert pick_lr(g, [-5.0, -3.0, -4.0]) == 1e-3
    assert pick_lr(g, [-1.0, -3.0, -4.0]) == 3e-4
    assert pick_lr(g, [-5.0, -3.0, -3.0]) == 1e-3  # exact tie: nearest the grid's middle (log scale)
    assert pick_lr(g, [-3.0, -4.0, -3.0]) == 3e-4  # tie at both edges, equally far: the smaller
    assert pick_lr((1e-4, 1e-3, 1e-2, 1e-1), [0.0, 0.0, 0.0, -1.0]) == 1e-3
    with pytest.raises(ValueError, match="pick_best"):
        pick_lr(g, [0.0, 1.0])
    ok = interior_check(arm="td3", lr=1e-3, grid=g, val_means=[-5.0, -3.0, -4.0], n_val=2)
    edge = interior_check(arm="alh_g", lr=3e-3, grid=g, val_means=[-5.0, -4.0, -3.0], n_val=2)
    assert ok.kind == edge.kind == "sanity" and ok.passed and not edge.passed
    assert not interior_check(arm="td3", lr=3e-4, grid=(3e-4, 1e-3), val_means=[0.0, -1.0], n_val=1).passed


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
