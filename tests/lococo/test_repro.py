"""Quick reproduction of lococo: run once, check the result's contents, the tuning, the config errors."""

from __future__ import annotations

import json

import pytest

from icml24.lococo.experiment import Config, knob_grid, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("lococo_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    cfg = Config.quick()
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "lococo" and d["mode"] == "quick" and d["seeds"] == list(cfg.seeds)
    assert {"full", "best_baseline", "lococo", "lococo_lambda0", "lococo_untrained", "streaming", "h2o",
            "tova"} <= set(d["summary"])
    for name in ("loss_vs_budget.png", "passkey_vs_distance.png", "compressor_training.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == len(cfg.budgets) and "sanity" in kinds and "mechanism" in kinds
    assert all(c.ci_low is not None for c in res.claim_checks if c.kind == "claim")
    ss = res.extra["single_shot"]  # kvpress presses + ours through one DynamicCache path, in a subprocess
    assert "error" not in ss
    if "skipped" not in ss:
        for M in cfg.budgets:
            assert all(isinstance(ss[str(M)][p], float) for p in ("StreamingLLMPress", "SnapKVPress", "TOVAPress"))
            assert len(ss[str(M)]["lococo"]) == len(cfg.seeds)


def test_quick_run_tunes_every_baseline_on_validation_and_bounds_losses(quick):
    res, _ = quick
    cfg = Config.quick()
    for M in cfg.budgets:
        pb = res.extra["per_budget"][str(M)]
        for pol in ("streaming", "h2o", "tova"):
            grid = knob_grid(cfg, pol, M)
            assert len(pb["tuning"][pol]) == len(grid) and pb["tuned"][pol] in grid
            best = min(pb["tuning"][pol], key=lambda t: t["val_loss"])
            assert best["knobs"] == pb["tuned"][pol]
        tl = pb["test_loss"]
        # nothing beats the full cache by more than noise; losses are finite nats/byte
        assert all(0.0 < v < 6.0 for v in tl.values())
        assert min(tl.values()) >= res.extra["full_test_loss"] - 0.05


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="budgets"):
        Config(budgets=(64, 32))
    with pytest.raises(ValueError, match="passkey_distances"):
        Config(passkey_distances=(50,))
    with pytest.raises(ValueError, match="chunk"):
        Config(chunk=0)
