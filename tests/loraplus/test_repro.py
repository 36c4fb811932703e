"""LoRA+ quick reproduction: schema-3 checks (kinds, paired CIs, guards), tune_grid picks, artefacts, and the
fine-tuning regime."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.common.progress import set_quiet
from icml24.common.results import ClaimCheck, verdict
from icml24.loraplus.experiment import FT_ARMS, Config, run
from tests.shared_checker import check_results_file


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
    assert kinds == ["claim", "claim", "sanity", "sanity", "sanity", "sanity", "mechanism", "mechanism", "mechanism"]
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
    # every sanity check conditions both fine-tuning claims (explicitly or with guards=[]), so any failure voids both
    if any(not c.passed for c in sanity):
        assert res.label.startswith("inconclusive (0/2 testable)")
    for c in sanity:
        assert c.detail.split(":")[0] in ("the regime", "tuning"), c.detail  # names what it guards against first


def test_results_file_is_schema_3_and_passes_the_shared_checker(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_every_arm_is_tuned_with_tune_grid_on_the_same_budget(quick):
    res, _ = quick
    cfg = Config.quick()
    tuning = res.extra["tuning"]
    for arm in FT_ARMS:
        t = tuning[arm]
        assert t["declared"] == sorted(cfg.ft_lrs) and len(t["extensions"]) <= cfg.grid_extra
        assert t["picked"] in t["grid"] and set(t["declared"]) <= set(t["grid"])
        assert res.extra["ft_best_lr"][arm] == t["picked"]
    by_name = {c.name: c for c in res.claim_checks}
    lora = by_name["setup: tuned η of LoRA inside the fine-tuning grid"]
    claims = [c.name for c in res.checks("claim")]
    assert lora.kind == "sanity" and lora.guards == claims and lora.passed == tuning["lora"]["ok"]
    # the width law is tuned the same way (η_A per (n, λ), λ per width and per seed) and votes on nothing
    law = tuning["width_law"]
    assert set(law["lambda_by_width"]) == {str(n) for n in cfg.widths}
    for n in cfg.widths:
        assert set(law["eta_a_by_width_lambda"][str(n)]) >= {f"{lam:g}" for lam in cfg.ratios}
        for s in cfg.seeds:
            assert res.per_seed[cfg.seeds.index(s)]["metrics"]["width_law"][f"best_lambda_n{n}"] == \
                law["lambda_by_seed_width"][str(s)][str(n)]["picked"]
    assert not any(c.name.startswith("width law") and c.kind == "sanity" for c in res.claim_checks)
    slope = by_name["width law: slope of log(best λ) vs log(n) > 0"]
    assert "tuning (not a vote" in slope.detail


def test_a_failed_tuning_guard_voids_exactly_the_claims_it_names(quick):
    res, _ = quick
    claims = [ClaimCheck.from_dict({**c.__dict__}) for c in res.checks("claim")]
    bad = ClaimCheck(name="setup: tuned η of LoRA inside the fine-tuning grid", metric="tuned_inside_fraction",
                     measured=0.0, threshold=1.0, direction=">=", kind="sanity", guards=[claims[0].name])
    v = verdict([*claims, bad])
    assert claims[0].void_by == [bad.name] and claims[1].void_by == []
    assert v["claims_void"] == 1 and v["claims_total"] == 1


def test_regime_lora_adapts_features_beyond_a_new_head(quick):
    """The held-out loss of LoRA is below the frozen backbone + new head's (2-seed mean) even in the quick run."""
    s = quick[0].summary
    assert s["lora"]["test_loss"]["mean"] < s["head"]["test_loss"]["mean"]
    assert s["lora"]["test_acc"]["mean"] > 20.0  # chance is 20% (5 classes)
