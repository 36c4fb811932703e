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
