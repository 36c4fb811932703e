"""Quick reproduction of exp_sgdm: run once, check the result's contents, the checks' labels and controls, the config."""

from __future__ import annotations

import json
import math

import pytest

from icml24.common.data import load_mnist1d
from icml24.exp_sgdm.experiment import Config, identity_p_value, run, train_mlp


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
    grid = list(Config.quick().lr_grid)
    for arm in ("sgdm", "exp_sgdm"):
        by_lr = res.extra["val_acc_mean_by_lr"][arm]
        assert [float(k) for k in by_lr] == grid
        best = max(grid, key=lambda lr: by_lr[str(lr)])
        assert res.extra["tuned_lr"][arm] == best  # argmax of validation, never of test
        # the recorded per-seed runs are the ones at the tuned η: their validation mean is the grid's maximum
        recorded = [row["metrics"][arm]["val_acc"] for row in res.per_seed]
        assert sum(recorded) / len(recorded) == pytest.approx(by_lr[str(best)])


def test_checks_are_labelled_and_the_claim_is_paired(quick):
    """Only the accuracy comparison votes (paired per-seed differences with a CI); the identity and the
    stationarity bound are mechanisms; the regime, the tuning and the negative controls are sanity checks."""
    res, _ = quick
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 1 and kinds.count("mechanism") == 2 and kinds.count("sanity") == 7
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
        assert mech[arm].kind == "sanity" and mech[arm].passed and mech[arm].measured < 1e-3


def test_the_claims_test_rejects_the_small_lr_control(quick):
    res, _ = quick
    c = next(c for c in res.claim_checks if c.method_arm == "sgdm_min_lr")
    assert c.kind == "sanity" and c.passed and c.measured < -Config.quick().margin_points


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
