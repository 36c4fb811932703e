"""LoRA+ quick reproduction: schema-2 checks (kinds, paired CIs), artefacts, and the fine-tuning regime."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.common.progress import set_quiet
from icml24.loraplus.experiment import Config, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    set_quiet(True)
    out = tmp_path_factory.mktemp("loraplus")
    return run(Config.quick(), out), out


def test_quick_run_writes_results_report_and_plots(quick):
    res, out = quick
    assert res.mode == "quick"
    assert {"results.json", "report.md", "finetune_curves.png", "width_law.png", "toy_scaling.png"} <= {
        p.name for p in out.iterdir()}
    saved = json.loads((out / "results.json").read_text())
    assert saved["slug"] == "loraplus" and saved["schema_version"] == 3
    assert set(res.summary) == {"head", "lora", "loraplus", "width_law"}


def test_checks_have_kinds_and_claims_are_paired_with_a_ci(quick):
    res, _ = quick
    kinds = [c.kind for c in res.claim_checks]
    assert kinds == ["claim", "claim", "sanity", "sanity", "mechanism", "sanity", "mechanism", "mechanism"]
    n = len(Config.quick().seeds)
    loss, speed = res.checks("claim")
    per = [(r["metrics"]["loraplus"]["test_loss"], r["metrics"]["lora"]["test_loss"]) for r in res.per_seed]
    assert loss.measured == pytest.approx(float(np.mean([p - b for p, b in per])))
    assert loss.direction == "<=" and loss.threshold == 0.0 and loss.n == n
    assert loss.passed == (loss.ci_high <= 0.0)
    assert speed.threshold == 0.6 and speed.passed == (speed.ci_high <= 0.6)
    slope = next(c for c in res.claim_checks if c.name.startswith("width law"))
    per_slope = [r["metrics"]["width_law"]["slope"] for r in res.per_seed]
    assert slope.measured == pytest.approx(float(np.mean(per_slope))) and slope.ci_low is not None


def test_sanity_checks_can_fail_and_decide_the_verdict(quick):
    res, _ = quick
    sanity = res.checks("sanity")
    frozen = sanity[0]  # LoRA vs the frozen backbone + head, a paired interval that must clear 0
    assert frozen.method_arm == "lora" and frozen.baseline_arm == "head" and frozen.ci_high is not None
    assert frozen.passed == (frozen.ci_high <= 0.0)
    if any(not c.passed for c in sanity):
        assert res.label.startswith("inconclusive")


def test_regime_lora_adapts_features_beyond_a_new_head(quick):
    """The held-out loss of LoRA is below the frozen backbone + new head's (2-seed mean) even in the quick run."""
    s = quick[0].summary
    assert s["lora"]["test_loss"]["mean"] < s["head"]["test_loss"]["mean"]
    assert s["lora"]["test_acc"]["mean"] > 20.0  # chance is 20% (5 classes)
