"""Quick reproduction of exp_sgdm: run once, check the result's contents, the claims' direction, the config."""

from __future__ import annotations

import json

import pytest

from icml24.common.data import load_sklearn
from icml24.exp_sgdm.experiment import Config, run, train_mlp


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp_sgdm_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "exp_sgdm" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(d["summary"]) == {"sgdm", "exp_sgdm"}
    for name in ("lr_sweep.png", "train_curves.png", "stationarity.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "report.md").read_text().count("holds") >= 4
    assert len(res.claim_checks) == 4
    # random scaling really happened in the Exp-SGDM arm (an Exp(1) draw > 1 in ~230 steps is certain)
    assert res.extra["max_scale_seen"] > 1.5
    assert set(res.extra["tuned_lr"]) == {"digits", "breast_cancer"}


def test_quick_run_claim_directions(quick):
    res, _ = quick
    s = res.summary
    checks = {c.name.split(":")[0]: c for c in res.claim_checks}
    # comparable accuracy (mean over seeds, with the claim's margin) and high absolute accuracy on digits
    assert checks["digits"].passed
    assert s["exp_sgdm"]["digits_test_acc"]["mean"] > 90.0 and s["sgdm"]["digits_test_acc"]["mean"] > 90.0
    assert abs(s["exp_sgdm"]["breast_cancer_test_acc"]["mean"] - s["sgdm"]["breast_cancer_test_acc"]["mean"]) <= 3.0
    by_metric = {c.metric: c for c in res.claim_checks}
    assert by_metric["failed_runs"].passed
    # the EMA output's stationarity bound falls with the horizon
    assert by_metric["stat_ema"].passed
    assert s["exp_sgdm"]["stat_ema_T3000"]["mean"] < s["exp_sgdm"]["stat_ema_T300"]["mean"]


def test_checks_are_labelled_and_accuracy_claims_are_paired(quick):
    """Only the accuracy comparisons vote (paired per-seed differences with a CI); the stationarity bound is a
    mechanism of the theory and "no divergence" a precondition."""
    res, _ = quick
    by_metric = {c.metric: c for c in res.claim_checks}
    assert {m: c.kind for m, c in by_metric.items()} == {
        "digits_test_acc": "claim", "breast_cancer_test_acc": "claim", "failed_runs": "sanity",
        "stat_ema": "mechanism"}
    margin = Config.quick().margin_points
    for ds in ("digits", "breast_cancer"):
        c = by_metric[f"{ds}_test_acc"]
        d = [r["metrics"]["exp_sgdm"][f"{ds}_test_acc"] - r["metrics"]["sgdm"][f"{ds}_test_acc"] for r in res.per_seed]
        assert c.measured == pytest.approx(sum(d) / len(d)) and c.n == len(d) == 2
        assert c.ci_low <= c.measured <= c.ci_high and c.threshold == -margin
        assert c.passed == (c.ci_low >= -margin)
    assert res.verdict["claims_total"] == 2 and res.verdict["sanity_failed"] == []


def test_same_seed_same_numbers():
    cfg = Config.quick().replace(epochs=2, hidden=(32,))
    split = load_sklearn("breast_cancer", seed=0, test_size=0.2)
    a = train_mlp(split, cfg=cfg, lr=0.5, random_scaling="exponential", seed=3)
    b = train_mlp(split, cfg=cfg, lr=0.5, random_scaling="exponential", seed=3)
    c = train_mlp(split, cfg=cfg, lr=0.5, random_scaling=None, seed=3)
    assert a == b
    assert a["curve"] != c["curve"]  # the scalar changes the trajectory


@pytest.mark.parametrize("kw, match", [
    ({"momentum": 1.0}, "momentum must be in"),
    ({"lr_grid": (1.0, 0.5)}, "strictly increasing"),
    ({"lr_grid": (0.0, 0.5)}, r"lr_grid\[0\] must be a finite number > 0"),
    ({"synth_steps": (100,)}, "synth_steps"),
    ({"datasets": ("mnist",)}, "datasets"),
    ({"epochs": 0}, "epochs must be an int >= 1"),
    ({"margin_points": -1.0}, "margin_points"),
    ({"val_fraction": 1.0}, "val_fraction"),
    ({"lr_grid": (0.5, float("nan"))}, "lr_grid"),
    ({"lr_grid": (0.5, float("inf"))}, "lr_grid"),
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
