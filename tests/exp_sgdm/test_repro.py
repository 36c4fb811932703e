"""Quick reproduction of exp_sgdm: run once, check the result's contents, the checks' labels and controls, the config."""

from __future__ import annotations

import copy
import json
import math

import pytest

from icml24.common.data import load_mnist1d
from icml24.common.results import ClaimCheck, verdict
from icml24.exp_sgdm.experiment import (
    Config,
    _largest_stable,
    identity_p_value,
    largest_stable_report,
    run,
    train_mlp,
)
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp_sgdm_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "exp_sgdm" and d["mode"] == "quick" and d["seeds"] == [0, 1, 2]
    assert {"sgdm", "exp_sgdm", "sgdm_min_lr", "identity_exponential", "identity_one", "identity_uniform2",
            "identity_per_coordinate"} == set(d["summary"])
    for name in ("lr_sweep.png", "train_curves.png", "stationarity.png", "identity.png"):
        assert (out / name).stat().st_size > 1000
    # random scaling really happened in the Exp-SGDM arm (an Exp(1) draw > 1.5 in ~300 steps is certain)
    assert res.extra["max_scale_seen"] > 1.5
    assert set(res.extra["tuned_lr"]) == {"sgdm", "exp_sgdm"}


def test_each_arm_is_tuned_on_validation_with_the_same_grid(quick):
    res, _ = quick
    cfg = Config.quick()
    for arm in ("sgdm", "exp_sgdm"):
        t = res.extra["tuning"][arm]
        assert t["declared"] == list(cfg.lr_grid) and t["grid_extra"] == cfg.grid_extra  # the same budget
        assert t["grid"] == sorted(t["declared"] + t["extensions"]) and len(t["extensions"]) <= cfg.grid_extra
        g = list(t["declared"])
        for e in t["extensions"]:  # each one the grid's own ratio past an edge of the grid so far
            assert math.isclose(e, g[-1] ** 2 / g[-2]) or math.isclose(e, g[0] ** 2 / g[1])
            g = sorted([*g, e])
        by_lr = res.extra["val_acc_mean_by_lr"][arm]
        assert [float(k) for k in by_lr] == t["grid"]
        picked = res.extra["tuned_lr"][arm]
        assert picked == t["picked"] and picked in t["grid"]
        best = max(t["grid"], key=lambda lr: by_lr[str(lr)])  # on validation, never on test
        assert by_lr[str(best)] - by_lr[str(picked)] <= t["val_acc_se_by_lr"][str(best)] + 1e-9  # one-SE rule
        # the recorded per-seed runs are the ones at the tuned η
        recorded = [row["metrics"][arm]["val_acc"] for row in res.per_seed]
        assert sum(recorded) / len(recorded) == pytest.approx(by_lr[str(picked)])
        c = next(c for c in res.claim_checks if c.name == f"{arm}'s tuned η lies inside its grid")
        assert c.kind == "sanity" and c.passed == (t["edge"] is None) and c.detail.startswith("tuning: ")


def test_checks_are_labelled_and_the_claim_is_paired(quick):
    """Only the accuracy comparison votes (paired per-seed differences with a CI); the identity and the
    stationarity bound are mechanisms, and so are the identity's negative controls (they condition no claim); the
    regime, convergence, the two tuning checks and the claim's negative control are sanity checks."""
    res, _ = quick
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 1 and kinds.count("mechanism") == 6 and kinds.count("sanity") == 5
    (c,) = res.checks("claim")
    margin = Config.quick().margin_points
    d = [r["metrics"]["exp_sgdm"]["test_acc"] - r["metrics"]["sgdm"]["test_acc"] for r in res.per_seed]
    assert c.measured == pytest.approx(sum(d) / len(d)) and c.n == len(d) == 3
    assert c.ci_low <= c.measured <= c.ci_high and c.threshold == -margin
    assert c.passed == (c.ci_low >= -margin)
    assert res.verdict["claims_total"] == 1


def test_identity_holds_and_every_negative_control_is_rejected(quick):
    res, _ = quick
    mech = {c.method_arm: c for c in res.claim_checks if c.metric == "identity_p"}
    assert set(mech) == {"identity_exponential", "identity_one", "identity_uniform2", "identity_per_coordinate"}
    assert mech["identity_exponential"].kind == "mechanism" and mech["identity_exponential"].passed
    for arm in ("identity_one", "identity_uniform2", "identity_per_coordinate"):
        assert mech[arm].kind == "mechanism" and mech[arm].passed and mech[arm].measured < 1e-3
        assert mech[arm].detail.startswith("negative control")


def test_guards_name_the_claim_and_a_failed_guard_voids_it(quick):
    res, _ = quick
    (claim,) = res.checks("claim")
    sanity = {c.name: c for c in res.checks("sanity")}
    assert sanity["no divergence at the tuned η (either arm)"].guards == []  # training converged: every claim
    assert all(c.guards == [claim.name] for n, c in sanity.items() if n != "no divergence at the tuned η (either arm)")
    assert all(c.detail.startswith(("the regime: ", "negative control: ", "tuning: ", "training converged: "))
               for c in sanity.values())
    for s in sanity.values():  # each guard failed alone voids the claim; the mechanisms are still shown
        failed = ClaimCheck(name=s.name, metric=s.metric, kind="sanity", guards=s.guards, measured=float("nan"),
                            threshold=0.0, direction=">=")
        v = verdict([failed if c is s else copy.deepcopy(c) for c in res.claim_checks])
        assert v["label"] == "inconclusive (0/1 testable)" and v["claims_void"] == 1 and v["mechanisms_total"] == 6
    # a failed identity control (a mechanism) voids nothing
    checks = [copy.deepcopy(c) for c in res.claim_checks]
    for i, c in enumerate(checks):
        if c.method_arm == "identity_one":
            checks[i] = ClaimCheck(name=c.name, metric=c.metric, kind="mechanism", measured=1.0,
                                   threshold=c.threshold, direction="<=")
    assert verdict(checks)["claims_void"] == 0


def test_quick_run_writes_schema_3_that_the_shared_checker_accepts(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_the_claims_test_rejects_the_small_lr_control(quick):
    res, _ = quick
    c = next(c for c in res.claim_checks if c.method_arm == "sgdm_min_lr")
    assert c.kind == "sanity" and c.passed and c.measured < -Config.quick().margin_points


def test_two_workers_give_the_numbers_of_one(quick, tmp_path):
    """Every (arm, η, seed) cell, identity seed and synthetic cell is a self-seeded job: the same numbers in
    one process as in two spawned workers."""
    res, _ = quick
    assert Config.quick().workers == 1
    par = run(Config.quick().replace(threads=1, workers=2), tmp_path)
    assert par.per_seed == res.per_seed
    assert par.summary == res.summary
    drop = {"timing"}
    assert {k: v for k, v in par.extra.items() if k not in drop} == {k: v for k, v in res.extra.items() if k not in drop}
    assert [(c.name, c.measured, c.ci_low, c.ci_high, c.passed) for c in par.claim_checks] == \
        [(c.name, c.measured, c.ci_low, c.ci_high, c.passed) for c in res.claim_checks]


def test_largest_stable_eta_is_the_top_of_the_first_stable_stretch():
    lrs = [0.5, 1.0, 2.0, 4.0, 8.0]
    assert _largest_stable(lrs, [False, False, False, True, True]) == 2.0
    assert _largest_stable(lrs, [False, False, False, False, False]) == 8.0
    assert _largest_stable(lrs, [True, False, False, True, False]) == 2.0  # under-trained at 0.5, unstable at 4
    assert _largest_stable(lrs, [False, True, False, False, False]) == 0.5
    assert _largest_stable(lrs, [True] * 5) == 0.0


def test_largest_stable_eta_is_reported_per_arm_with_its_interval(quick):
    res, _ = quick
    cfg = Config.quick()
    rep = res.extra["largest_stable_lr"]
    assert rep["grid"] == list(cfg.lr_grid)
    failed = res.extra["failed_runs_by_lr"]
    for arm in ("sgdm", "exp_sgdm"):
        r = rep[arm]
        assert r["n"] == len(cfg.seeds) and r["ci_low"] <= r["mean"] <= r["ci_high"]
        assert r["mean"] == pytest.approx(sum(rep["per_seed"][arm]) / len(cfg.seeds))
        # consistent with the failure counts: a stretch never ends at an η that failed on every seed
        assert all(failed[arm][str(v)] < len(cfg.seeds) for v in rep["per_seed"][arm] if v > 0)
    # a constructed case: SGDM stable up to 8, Exp-SGDM up to 2 or 4 -> difference CI below 0, censoring counted
    seeds = tuple(range(4))
    c = Config.quick().replace(seeds=seeds, lr_grid=(1.0, 2.0, 4.0, 8.0))
    tops = {"sgdm": [8.0, 8.0, 4.0, 8.0], "exp_sgdm": [2.0, 4.0, 2.0, 2.0]}
    failed = {(arm, lr, s): lr > tops[arm][s] for arm in tops for lr in c.lr_grid for s in seeds}
    r = largest_stable_report(c, failed)
    assert r["per_seed"] == tops and r["sgdm"]["censored"] == 3 and r["exp_sgdm"]["censored"] == 0
    assert r["sgdm"]["mean"] == 7.0 and r["exp_sgdm"]["mean"] == 2.5
    d = r["difference_exp_sgdm_minus_sgdm"]
    assert d["mean"] == -4.5 and d["ci_high"] < 0
    assert r["log2_ratio_exp_sgdm_vs_sgdm"]["mean"] == pytest.approx((-2 - 1 - 1 - 2) / 4)


def test_the_stable_eta_gap_is_a_mechanism_with_its_interval_that_never_votes(quick):
    """Issue 31: the narrower stable η range under random scaling is shown beside the verdict with its CI (the
    paired log2 ratio on the declared grid, threshold from the Config); flipping it changes no claim."""
    res, _ = quick
    cfg = Config.quick()
    (c,) = [c for c in res.claim_checks if c.metric == "max_stable_lr"]
    rep = res.extra["largest_stable_lr"]
    lg = rep["log2_ratio_exp_sgdm_vs_sgdm"]
    assert c.kind == "mechanism" and c.guards == [] and c.direction == "<="
    assert c.threshold == cfg.stable_lr_log2_threshold == 0.0
    assert (c.measured, c.ci_low, c.ci_high, c.n) == (lg["mean"], lg["ci_low"], lg["ci_high"], len(cfg.seeds))
    assert c.passed == (c.ci_high <= c.threshold)
    # the per-seed metric (mean ± std in the report's tables) is the same per-seed value on the declared grid
    for i, row in enumerate(res.per_seed):
        for arm in ("sgdm", "exp_sgdm"):
            assert row["metrics"][arm]["max_stable_lr"] == rep["per_seed"][arm][i]
    logs = [math.log2(e if e > 0 else cfg.lr_grid[0] / 2) - math.log2(b if b > 0 else cfg.lr_grid[0] / 2)
            for e, b in zip(rep["per_seed"]["exp_sgdm"], rep["per_seed"]["sgdm"], strict=True)]
    assert c.measured == pytest.approx(sum(logs) / len(logs))
    for arm in ("sgdm", "exp_sgdm"):  # each arm's mean with its interval is in the check's detail
        assert f"{arm} {rep[arm]['mean']:.3g} [" in c.detail
    flipped = [ClaimCheck(name=x.name, metric=x.metric, kind="mechanism", measured=1.0, threshold=0.0,
                          direction="<=") if x is c else copy.deepcopy(x) for x in res.claim_checks]
    v0, v1 = verdict([copy.deepcopy(x) for x in res.claim_checks]), verdict(flipped)
    assert {k: v for k, v in v0.items() if k != "mechanisms_held"} == \
        {k: v for k, v in v1.items() if k != "mechanisms_held"}
    with pytest.raises(ValueError, match="stable_lr_log2_threshold"):
        Config.quick().replace(stable_lr_log2_threshold=float("nan"))


def test_identity_p_value_is_a_chi_square_over_the_points():
    est = [{"mean": 0.1, "se": 0.1}, {"mean": -0.2, "se": 0.1}]
    stat, p = identity_p_value(est)
    assert stat == pytest.approx(5.0) and p == pytest.approx(math.exp(-2.5))  # χ²_2 survival = exp(-x/2)
    assert identity_p_value([{"mean": 0.3, "se": 0.0}]) == (math.inf, 0.0)  # exact non-zero gap: rejected
    assert identity_p_value([{"mean": 0.0, "se": 0.0}])[1] == 1.0


def test_same_seed_same_numbers():
    cfg = Config.quick().replace(epochs=2, hidden=(16,))
    split = load_mnist1d(seed=0)
    a = train_mlp(split, cfg=cfg, lr=0.5, random_scaling="exponential", seed=3)
    b = train_mlp(split, cfg=cfg, lr=0.5, random_scaling="exponential", seed=3)
    c = train_mlp(split, cfg=cfg, lr=0.5, random_scaling=None, seed=3)
    assert a == b
    assert a["curve"] != c["curve"]  # the scalar changes the trajectory


@pytest.mark.parametrize("kw, match", [
    ({"momentum": 1.0}, "momentum must be in"),
    ({"lr_grid": (1.0, 0.5, 2.0)}, "strictly increasing"),
    ({"lr_grid": (0.0, 0.5)}, r"lr_grid\[0\] must be a finite number > 0"),
    ({"synth_steps": (100,)}, "synth_steps"),
    ({"lr_grid": (0.5, 1.0)}, ">= 3 strictly increasing"),
    ({"seeds": (0,)}, ">= 2 seeds"),
    ({"grid_extra": -1}, "grid_extra"),
    ({"grid_extra": 2.0}, "grid_extra"),
    ({"identity_level": 0.0}, "identity_level"),
    ({"identity_samples": 1}, "identity_samples"),
    ({"ceiling_points": float("nan")}, "ceiling_points"),
    ({"epochs": 0}, "epochs must be an int >= 1"),
    ({"margin_points": -1.0}, "margin_points"),
    ({"val_fraction": 1.0}, "val_fraction"),
    ({"lr_grid": (0.5, 1.0, float("nan"))}, "lr_grid"),
    ({"lr_grid": (0.5, 1.0, float("inf"))}, "lr_grid"),
    ({"synth_lr": float("nan")}, "synth_lr must be a finite number"),
    ({"synth_lr": float("inf")}, "synth_lr must be a finite number"),
    ({"synth_noise": float("nan")}, "synth_noise must be a finite number"),
    ({"synth_noise": float("inf")}, "synth_noise must be a finite number"),
    ({"synth_c": float("nan")}, "synth_c must be a finite number"),
    ({"synth_c": float("inf")}, "synth_c must be a finite number"),
    ({"synth_alpha": float("nan")}, "synth_alpha must be a finite number"),
    ({"synth_alpha": float("inf")}, "synth_alpha must be a finite number"),
    ({"synth_exponent": float("inf")}, "synth_exponent must be a finite number"),
    ({"weight_decay": float("nan")}, "weight_decay must be a finite number"),
    ({"weight_decay": float("inf")}, "weight_decay must be a finite number"),
    ({"margin_points": float("nan")}, "margin_points must be a finite number"),
    ({"margin_points": float("inf")}, "margin_points must be a finite number"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)
