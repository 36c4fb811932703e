"""Quick reproduction of the IFFN claims (one quick run shared by every check of this module)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from icml24.iffn.experiment import Config, build_vit, run, toy_data, toy_model, train_toy


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("iffn_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_results(quick_result):
    result, out = quick_result
    data = json.loads((out / "results.json").read_text())
    assert data["slug"] == "iffn" and data["mode"] == "quick"
    assert (out / "report.md").exists()
    for png in ("vit_pareto.png", "vit_curves.png", "toy_mse.png"):
        assert (out / png).stat().st_size > 0
    assert {c["name"][:4] for c in data["claim_checks"]} >= {"toy[", "ViT:"}


def test_quick_flops_claim_and_learning(quick_result):
    result, _ = quick_result
    s = result.summary
    # FLOPs ratio is exact arithmetic: IFFN r=1 (n=2, 3x3 DWConv, concat) vs FFN r=4 on 16+1 tokens
    ratio = s["iffn_r1"]["ffn_mflops"]["mean"] / s["ffn_r4"]["ffn_mflops"]["mean"]
    assert 0.45 < ratio <= 0.55
    flops_check = next(c for c in result.claim_checks if "FLOPs" in c.name)
    assert flops_check.passed and flops_check.measured == pytest.approx(ratio)
    assert flops_check.kind == "mechanism"  # holds by construction
    # every ViT arm learns digits well above chance (10%) even in the short quick run (1 block, 8 epochs)
    for arm in ("ffn_r4", "ffn_r1", "iffn_r1"):
        assert s[arm]["acc"]["mean"] > 30.0, arm


def test_quick_checks_are_labelled_and_vit_claims_are_paired(quick_result):
    result, _ = quick_result
    kinds = {c.name: c.kind for c in result.claim_checks}
    assert all(k == "mechanism" for n, k in kinds.items() if n.startswith("toy[") or "FLOPs" in n)
    claims = result.checks("claim")
    cfg = Config.quick()
    assert [c.name[:4] for c in claims] == ["ViT:", "ViT:"] and len(kinds) == 2 * len(cfg.toy_targets) + 1 + 2
    for c, base, thr in zip(claims, (cfg.claim_full, cfg.claim_reduced), (-cfg.acc_margin, 0.0), strict=True):
        assert c.method_arm == cfg.claim_method and c.baseline_arm == base and c.threshold == thr
        d = [r["metrics"][c.method_arm]["acc"] - r["metrics"][base]["acc"] for r in result.per_seed]
        assert c.measured == pytest.approx(sum(d) / len(d)) and c.n == len(d)
        assert c.ci_low <= c.measured <= c.ci_high and c.passed == (c.ci_low >= thr)


def test_quick_toy_direction(quick_result):
    """Robust direction on the ridge toy (mean over 2 seeds, loose margin): IFFN(h/2) < FFN(h/2) MSE."""
    result, _ = quick_result
    s = result.summary
    iffn = s["toy_ridge_h8_iffn_half"]["mse"]["mean"]
    half = s["toy_ridge_h8_ffn_half"]["mse"]["mean"]
    assert iffn < 0.95 * half


def test_same_seed_same_numbers():
    cfg = Config.quick()
    a = toy_data("ridge", cfg, 3)
    b = toy_data("ridge", cfg, 3)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(toy_data("ridge", cfg, 4)[0], a[0])
    torch.manual_seed(0)
    m1 = build_vit("iffn_r1", cfg, "cpu")
    torch.manual_seed(0)
    m2 = build_vit("iffn_r1", cfg, "cpu")
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(m1(x), m2(x), rtol=0, atol=0)
    short = dataclasses.replace(cfg, toy_steps=20)
    mse = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        mse.append(train_toy(toy_model("iffn_half", 8, short, "cpu"), toy_data("ridge", short, seed), short, seed))
    assert mse[0] == mse[1] and mse[0] != mse[2]


@pytest.mark.parametrize("change,match", [
    ({"vit_arms": ("ffn_r4", "bogus_r1")}, "arm"),
    ({"vit_arms": ("ffn_r4", "ffn_r0")}, "ratio > 0"),
    ({"claim_method": "iffn_r2"}, "claim_method"),
    ({"toy_hidden": (7,)}, "toy_hidden"),
    ({"toy_targets": ("bogus",)}, "toy_targets"),
    ({"kernel_size": 4}, "kernel_size must be odd"),
    ({"lr": 0.0}, "lr must be a finite number > 0"),
    ({"n_instances": 0}, "n_instances must be an int >= 1"),
])
def test_config_validation(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(Config.quick(), **change)


def test_cli_override_types():
    cfg = Config().with_overrides({"vit_arms": "ffn_r4,iffn_r1,ffn_r1", "toy_hidden": "8,16", "epochs": "3"})
    assert cfg.vit_arms == ("ffn_r4", "iffn_r1", "ffn_r1") and cfg.toy_hidden == (8, 16) and cfg.epochs == 3


def test_quick_run_records_the_spread_of_learned_shifts(quick_result):
    result, out = quick_result
    cfg = Config.quick()
    spread = json.loads((out / "results.json").read_text())["extra"]["agelu_shift_spread"]
    assert set(spread) == {"iffn_r1"}  # the only arm with learnable AGeLUs in the quick config
    assert set(spread["iffn_r1"]) == {str(s) for s in cfg.seeds}
    for stats in spread["iffn_r1"].values():
        assert stats["n_layers"] == cfg.depth and stats["n_values"] == cfg.depth * cfg.n_instances * cfg.embed_dim
        assert stats["min"] < stats["mean"] < stats["max"] and stats["std"] > 0
        assert stats["moved_max_abs"] > 0  # training moved the shifts away from their init
        assert len(stats["per_instance_mean"]) == cfg.n_instances


def test_serial_arm_builds_and_trains_a_step():
    cfg = Config.quick()
    torch.manual_seed(0)
    vit = build_vit("iffn_serial_r1", cfg, "cpu")
    mlp = vit.blocks[0].mlp
    assert mlp.topology == "serial" and mlp.fc2_in == cfg.n_instances * cfg.embed_dim
    vit.forward_features(torch.randn(2, 1, 8, 8)).sum().backward()  # the cls logit alone skips the last conv
    assert mlp.dwconv.weight.grad.abs().sum() > 0
