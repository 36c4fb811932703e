"""Quick reproduction of next_gpt (one modality, frozen parts from the cached quick fixture, built on first use)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from icml24.next_gpt.experiment import CLAIMS_OF_ARM, Config, run

CHECKER = Path(__file__).resolve().parents[2].parent / "shared" / "tools" / "check_results.py"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("next_gpt_quick")
    return run(Config.quick(), out), out


@pytest.mark.slow
def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "next_gpt" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert {"signal", "pipeline", "stage2_icl", "stage1_icl", "untrained_proj", "gold", "stage1",
            "stage2"} <= set(d["summary"])
    assert (out / "claims.png").stat().st_size > 1000 and (out / "gallery_image.png").stat().st_size > 1000
    assert res.extra["frozen_hashes_identical"] == [1.0, 1.0]
    frac = res.extra["trainable_fraction"]
    assert 0 < frac["stage1"]["fraction"] < frac["stage2"]["fraction"] < frac["stage3"]["fraction"] < 1


@pytest.mark.slow
def test_checks_are_labelled_paired_and_tuned_on_validation(quick):
    res, _ = quick
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 2 and kinds.count("mechanism") == 1 and kinds.count("sanity") == 9
    for c in res.checks("claim"):
        arm_m, arm_b = c.method_arm, c.baseline_arm
        d = [r["metrics"][arm_m][c.metric] - r["metrics"][arm_b][c.metric] for r in res.per_seed]
        assert c.measured == pytest.approx(sum(d) / len(d)) and c.ci_low <= c.measured <= c.ci_high
    tuned = res.extra["tuned"]
    cfg = Config.quick()
    assert tuned["signal_lr"] in cfg.lr_grid and tuned["icl_k"] in cfg.icl_grid and tuned["grid_extra"] == 0
    for arm in ("signal", "pipeline", "stage2_icl"):
        t, vals = tuned["tuning"][arm], tuned["val"][arm]
        assert t["declared"] == list(cfg.lr_grid if arm != "stage2_icl" else cfg.icl_grid) and t["extensions"] == []
        best = max(v["score"] for v in vals.values())  # one validation number per value: the pick is the best
        assert vals[f"{t['picked']:g}"]["score"] == best
        check = next(c for c in res.claim_checks if c.method_arm == arm and c.metric == "tuned_inside_fraction")
        assert check.guards == list(CLAIMS_OF_ARM[arm]) and check.detail.startswith("tuning:")
        assert not check.passed  # a 2-point grid without extensions has no interior
    assert all(c.detail.split(":")[0] in ("tuning", "the regime", "negative control")
               for c in res.claim_checks if c.kind == "sanity")


@pytest.mark.slow
@pytest.mark.skipif(not CHECKER.exists(), reason="the shared checker is not beside this checkout")
def test_the_shared_checker_accepts_the_quick_result(quick):
    _, out = quick
    spec = importlib.util.spec_from_file_location("check_results", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and mod.check(str(out / "results.json")) is None
