"""Quick reproduction of fed_auc: run once, check the result's contents, the communication cost, the config."""

from __future__ import annotations

import json

import pytest

from icml24.fed_auc.experiment import Config, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("fed_auc_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "fed_auc" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(d["summary"]) == {"ce", "aucm", "comp2", "comp3", "comp4", "comp3_frozen", "local"}
    for name in ("auc_vs_round.png", "auc_vs_floats.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 3 and kinds.count("sanity") == 3
    cfg = Config.quick()
    curves = res.extra["curves"]["K4/comp3"]
    assert curves["round"] == list(range(cfg.eval_every, cfg.rounds + 1, cfg.eval_every))
    assert all(0.0 <= a <= 100.0 for run_ in curves["test_auc"] for a in run_)


def test_quick_run_communication_cost_and_regime(quick):
    res, _ = quick
    fpr = res.extra["floats_per_round"]
    # per client: CE sends x, m; AUC-M adds a, b, α and their momenta; level L adds L−1 model-sized estimators
    P = (fpr["K4/ce"] // 4) // 2
    assert fpr["K4/aucm"] == 4 * (2 * P + 6)
    assert fpr["K4/comp2"] == 4 * (3 * P + 6) and fpr["K4/comp3"] == 4 * (4 * P + 6)
    assert fpr["K4/comp4"] == 4 * (5 * P + 6)
    pos = res.extra["positives_per_client"]["K4/seed0"]
    assert min(pos) <= 0.25 * max(pos)  # non-IID: a client is nearly positive-free
    frozen = [c for c in res.claim_checks if "negative control" in c.name][0]
    assert frozen.passed  # frozen estimators leave the predictor at its start: rejected


@pytest.mark.parametrize("kw, match", [
    ({"clients": (0,)}, "clients"),
    ({"rounds": 0}, "rounds must be >= 1"),
    ({"local_steps": 0}, "local_steps must be >= 1"),
    ({"levels": 1}, "levels"),
    ({"lr_grid": (-0.1,)}, "lr_grid"),
    ({"margin": 0.0}, "margin"),
    ({"imratio": 0.0}, "imratio"),
    ({"task": "cifar10"}, "task"),
    ({"beta": 0.0}, "beta"),
    ({"loss_version": "v3"}, "loss_version"),
    ({"margin_points": float("nan")}, "margin_points"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)
