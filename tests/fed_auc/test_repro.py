"""Quick reproduction of fed_auc: run once, check the result's contents, the communication cost, the config."""

from __future__ import annotations

import copy
import json
import math

import pytest

from icml24.common.results import ClaimCheck, verdict
from icml24.fed_auc.experiment import TUNED_ARMS, Config, run
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("fed_auc_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "fed_auc" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(d["summary"]) == {"ce", "aucm", "comp2", "comp3", "comp4", "comp3_frozen", "local", "comp3_hvp",
                                 "comp3_identity"}
    for name in ("auc_vs_round.png", "auc_vs_floats.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    # per K: two regime checks, negative control, one tuning check per tuned arm; then the ceiling
    assert kinds.count("claim") == 3 and kinds.count("sanity") == 3 + len(TUNED_ARMS) + 1
    cfg = Config.quick()
    curves = res.extra["curves"]["K4/comp3"]
    assert curves["round"] == list(range(cfg.eval_every, cfg.rounds + 1, cfg.eval_every))
    assert all(0.0 <= a <= 100.0 for run_ in curves["test_auc"] for a in run_)


def test_quick_run_communication_cost_and_regime(quick):
    res, _ = quick
    fpr = res.extra["floats_per_round"]
    # per client: CE sends x, m; AUC-M adds a, b, α and their momenta; level L adds L−1 model-sized function
    # estimators and (the claim arm's JVP estimators) L−1 model-sized JVP estimators; exact HVP / identity do not
    P = (fpr["K4/ce"] // 4) // 2
    assert fpr["K4/aucm"] == 4 * (2 * P + 6)
    assert fpr["K4/comp2"] == 4 * (4 * P + 6) and fpr["K4/comp3"] == 4 * (6 * P + 6)
    assert fpr["K4/comp4"] == 4 * (8 * P + 6)
    assert fpr["K4/comp3_hvp"] == fpr["K4/comp3_identity"] == 4 * (4 * P + 6)
    pos = res.extra["positives_per_client"]["K4/seed0"]
    assert min(pos) <= 0.25 * max(pos)  # non-IID: a client is nearly positive-free
    frozen = [c for c in res.claim_checks if "negative control" in c.name][0]
    assert frozen.passed  # frozen estimators leave the predictor at its start: rejected


def test_each_arm_is_tuned_with_tune_grid_and_its_extensions_recorded(quick):
    res, _ = quick
    cfg = Config.quick()
    for arm in TUNED_ARMS:
        t = res.extra["tuning"][f"K4/{arm}"]
        assert t["declared"] == sorted(cfg.lr_grid) and t["grid_extra"] == cfg.grid_extra
        assert t["grid"] == sorted(t["declared"] + t["extensions"]) and len(t["extensions"]) <= cfg.grid_extra
        assert t["picked"] == res.extra["tuned_lr"][f"K4/{arm}"] and t["picked"] in t["grid"]
        g = list(t["declared"])
        for e in t["extensions"]:  # each one the grid's own ratio past an edge of the grid so far
            assert math.isclose(e, g[-1] ** 2 / g[-2]) or math.isclose(e, g[0] ** 2 / g[1])
            g = sorted([*g, e])
        # the pick is the validation-best value or within one standard error of it (the one-SE rule)
        means = {lr: res.extra["grid_val_auc_mean"][f"K4/{arm}/{lr}"] for lr in t["grid"]}
        assert means[t["picked"]] <= max(means.values())
        c = next(c for c in res.claim_checks if c.name == f"K=4: tuning: {arm}'s step η lies inside its grid")
        assert c.passed == (t["edge"] is None) and c.detail.startswith("tuning: ")
    # the controls (and the extra L = 4 row) run at comp3's tuned step, extensions included
    assert res.extra["control_lr"]["K4"] == res.extra["tuning"]["K4/comp3"]["picked"]


def test_guards_name_the_claims_they_condition_and_void_only_those(quick):
    res, _ = quick
    claims = {c.name: c for c in res.checks("claim")}
    by_arm = {c.baseline_arm: c.name for c in claims.values()}
    sanity = {c.name: c for c in res.checks("sanity")}
    assert sanity["K=4: tuning: comp3's step η lies inside its grid"].guards == list(claims)
    for arm in ("ce", "aucm", "comp2"):
        assert sanity[f"K=4: tuning: {arm}'s step η lies inside its grid"].guards == [by_arm[arm]]
    neg = next(c for n, c in sanity.items() if "negative control" in n)
    assert neg.guards == [by_arm["aucm"]] and neg.detail.startswith("negative control: ")
    assert next(c for n, c in sanity.items() if "clients training alone" in n).guards == list(claims)
    premise = sanity["K=4: regime: AUC-M minimax >= CE-FedAvg (AUC maximisation matters)"]
    assert premise.guards == [by_arm["comp2"], by_arm["aucm"]]  # the compositional claims, not the CE claim
    assert (premise.method_arm, premise.baseline_arm, premise.threshold) == ("aucm", "ce", 0.0)
    assert next(c for n, c in sanity.items() if "ceiling" in n).guards == []  # global: every claim
    assert all(c.detail.startswith(("the regime: ", "negative control: ", "tuning: ")) for c in sanity.values())
    for s in sanity.values():  # fail each guard alone (the others passing): it voids exactly the claims it names
        failed = ClaimCheck(name=s.name, metric=s.metric, kind="sanity", guards=s.guards, measured=float("nan"),
                            threshold=0.0, direction=">=")
        checks = [failed if c is s else copy.deepcopy(c) for c in res.claim_checks]
        for c in checks:
            if c.kind == "sanity" and c is not failed:  # pretend every other guard passed
                c.passed = True
        verdict(checks)
        void = {c.name for c in checks if c.kind == "claim" and c.void}
        assert void == (set(s.guards) or set(claims)), s.name
    # the run itself: the failed guards void exactly their claims
    for c in claims.values():
        assert c.void_by == sorted(n for n, s in sanity.items() if not s.passed and (not s.guards or c.name in s.guards))


def test_quick_run_writes_schema_3_that_the_shared_checker_accepts(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


@pytest.mark.parametrize("kw, match", [
    ({"clients": (0,)}, "clients"),
    ({"rounds": 0}, "rounds must be >= 1"),
    ({"local_steps": 0}, "local_steps must be >= 1"),
    ({"levels": 1}, "levels"),
    ({"lr_grid": (-0.1, 0.1)}, "lr_grid"),
    ({"lr_grid": (0.1,)}, "lr_grid"),
    ({"lr_grid": (0.1, 0.1)}, "lr_grid"),
    ({"grid_extra": -1}, "grid_extra"),
    ({"grid_extra": 1.0}, "grid_extra"),
    ({"margin": 0.0}, "margin"),
    ({"imratio": 0.0}, "imratio"),
    ({"task": "cifar10"}, "task"),
    ({"beta": 0.0}, "beta"),
    ({"loss_version": "v3"}, "loss_version"),
    ({"margin_points": float("nan")}, "margin_points"),
    ({"jacobian": "fd"}, "jacobian"),
    ({"jacobian_variants": ("estimator",)}, "jacobian"),
    ({"positive_classes": (3, 3)}, "positive_classes"),
    ({"positive_classes": (10,)}, "positive_classes"),
    ({"label_noise": 1.0}, "label_noise"),
    ({"eta0": -0.1}, "eta0"),
    ({"clip_value": 0.0}, "clip_value"),
    ({"epoch_decay": -1.0}, "epoch_decay"),
    ({"decay_fractions": (0.5, 1.0)}, "decay_fractions"),
    ({"aucm_ce_points": float("nan")}, "aucm_ce_points"),
    ({"workers": 0}, "workers"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_config_declares_the_claim_arm_and_libauc_schedule():
    cfg = Config()
    assert cfg.jacobian == "estimator" and set(cfg.jacobian_variants) == {"hvp", "identity"}
    assert (cfg.rounds, cfg.local_steps, cfg.imratio, cfg.eta0) == (150, 4, 0.05, 0.1)
    assert cfg.decay_rounds == (75, 112) and cfg.decay_at == (300, 448)
    assert (cfg.clip_value, cfg.decay_factor) == (1.0, 10.0) and cfg.epoch_decay > 0


def test_quick_run_records_the_jacobian_variants_beside_the_claim_arm(quick):
    res, _ = quick
    assert res.extra["claim_arm_jacobian"] == "estimator"
    var = res.extra["jacobian_variants"]
    assert set(var) == {"K4/comp3_hvp", "K4/comp3_identity", "K4/comp3"}
    assert var["K4/comp3_hvp"]["test_auc"] != var["K4/comp3"]["test_auc"]  # a different algorithm ran
    assert not any(c.method_arm in ("comp3_hvp", "comp3_identity") for c in res.claim_checks)  # not claims
