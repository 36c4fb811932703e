"""Quick reproduction of next_gpt (one modality, frozen parts from the cached quick fixture, built on first use)."""

from __future__ import annotations

import json

import pytest

from icml24.next_gpt.experiment import Config, run


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
    assert kinds.count("claim") == 2 and kinds.count("mechanism") == 1 and kinds.count("sanity") == 6
    for c in res.checks("claim"):
        arm_m, arm_b = c.method_arm, c.baseline_arm
        d = [r["metrics"][arm_m][c.metric] - r["metrics"][arm_b][c.metric] for r in res.per_seed]
        assert c.measured == pytest.approx(sum(d) / len(d)) and c.ci_low <= c.measured <= c.ci_high
    tuned = res.extra["tuned"]
    assert tuned["signal_lr"] in Config.quick().lr_grid and tuned["icl_k"] in Config.quick().icl_grid
    for arm in ("signal", "pipeline"):
        vals = tuned["val"][arm]
        assert float(max(vals, key=lambda k: vals[k]["score"])) == tuned[f"{arm}_lr"]
