"""SimPro quick reproduction: one module-scoped quick run, the claim's robust direction, config errors."""

from __future__ import annotations

import json

import pytest
import torch

from icml24.simpro.experiment import Config, _data, run, run_arm


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("simpro_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "simpro" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert {"supervised", "fixmatch", "fixmatch_la", "simpro", "simpro_no_em", "bayes_optimal"} <= set(d["summary"])
    for name in ("balanced_accuracy.png", "kl_vs_step.png", "per_class_recall.png"):
        assert (out / name).stat().st_size > 1000
    kinds = {c.kind for c in res.claim_checks}
    assert kinds == {"claim", "mechanism", "sanity"}
    assert set(res.extra["best_baseline"]) == {"gauss/consistent", "gauss/reversed", "mnist1d/reversed"}


def test_quick_run_direction_on_the_gaussian_tier(quick):
    res, _ = quick
    acc = res.extra["mean_bal_acc"]["gauss/reversed"]
    # reversed unlabeled prior: SimPro far above both FixMatch variants and the no-M-step control
    assert acc["simpro"] > max(acc["fixmatch"], acc["fixmatch_la"]) + 10
    assert acc["simpro"] > acc["simpro_no_em"] + 5
    by_name = {c.name: c for c in res.claim_checks}
    assert by_name["gauss/reversed: KL(π_u ‖ π̂_u) ends below KL(π_u ‖ π_l)"].passed
    assert by_name["gauss/reversed: FixMatch is head-biased (head − tail recall >= 20 pts)"].measured > 20
    # nobody beats the Bayes-optimal classifier by more than noise
    bayes = res.summary["bayes_optimal"]["gauss_reversed_bal_acc"]["mean"]
    assert acc["simpro"] <= bayes + 2


def test_labeled_validation_and_test_draws_do_not_depend_on_the_distribution():
    cfg = Config.quick()
    for tier in ("gauss", "mnist1d"):
        a, b = _data(cfg, tier, "consistent", 3), _data(cfg, tier, "head-tail", 3)
        for k in ("x_l", "y_l", "x_val", "x_test", "y_test"):
            assert torch.equal(a[k], b[k]), (tier, k)
        assert not torch.equal(a["pi_u"], b["pi_u"])


def test_same_seed_same_numbers():
    cfg = Config.quick().replace(gauss_steps=30, updates_per_run=3)
    data = _data(cfg, "gauss", "reversed", 0)
    hp = {"threshold": 0.7, "lr_factor": 1.0}
    a, b = run_arm(cfg, data, "simpro", hp, 0), run_arm(cfg, data, "simpro", hp, 0)
    c = run_arm(cfg, data, "simpro", hp, 1)
    assert a == b and a["recall"] != c["recall"]


@pytest.mark.parametrize("kw, match", [
    ({"threshold_grid": (0.7, 1.0)}, "threshold_grid"),
    ({"sup_lr_factors": (1.0,)}, "sup_lr_factors"),
    ({"gauss_gamma_l": 0.5}, "imbalance ratio"),
    ({"mu": 0}, "mu must be >= 1"),
    ({"gauss_distributions": ("reversed", "skewed")}, "gauss_distributions"),
    ({"mnist1d_num_seeds": 20}, "mnist1d_num_seeds"),
    ({"pi_estimate_on": "some"}, "pi_estimate_on"),
    ({"tau": float("nan")}, "tau must be finite"),
    ({"ema_u": 1.0}, "ema_u"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)
