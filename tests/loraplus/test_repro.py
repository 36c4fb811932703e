"""LoRA+ quick reproduction: the claim's direction at the larger width (mean over seeds, with a margin)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icml24.loraplus.experiment import Config, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("loraplus")
    return run(Config.quick(), out), out


def test_quick_run_writes_results_report_and_plots(quick):
    res, out = quick
    assert res.mode == "quick"
    assert {"results.json", "report.md", "loss_curves.png", "best_loss_vs_lambda.png", "toy_scaling.png"} <= {
        p.name for p in out.iterdir()}
    assert json.loads((out / "results.json").read_text())["slug"] == "loraplus"


def test_loraplus_beats_lora_at_the_larger_width(quick):
    res, _ = quick
    n = Config.quick().widths[-1]
    lora = res.summary["lora"][f"best_loss_n{n}"]["mean"]
    plus = res.summary["loraplus"][f"best_loss_n{n}"]["mean"]
    assert plus <= 0.9 * lora, (plus, lora)


def test_advantage_grows_with_width(quick):
    """λ=16 over λ=1 helps more at the larger width than at the smaller one (notes §5.4)."""
    res, _ = quick
    small, large = Config.quick().widths
    gain = {n: res.summary["loraplus"][f"best_loss_n{n}"]["mean"] / res.summary["lora"][f"best_loss_n{n}"]["mean"]
            for n in (small, large)}
    assert gain[large] < gain[small], gain


def test_checks_are_labelled_and_claims_are_paired_with_a_ci(quick):
    """Only the two comparisons with LoRA vote; the width law and toy algebra are mechanisms, the grid is sanity."""
    res, _ = quick
    kinds = {c.name.split(" ")[0]: c.kind for c in res.claim_checks}
    assert kinds == {"(i)": "mechanism", "(ii)": "claim", "(iii)": "claim", "setup:": "sanity", "toy:": "mechanism"}
    assert [c.kind for c in res.claim_checks].count("mechanism") == 3
    claims = res.checks("claim")
    for c in claims:
        assert c.n == len(Config.quick().seeds) and c.ci_low <= c.measured <= c.ci_high
        assert c.passed == (c.ci_high <= c.threshold)
    loss = next(c for c in claims if c.name.startswith("(ii)"))
    n = Config.quick().widths[-1]
    per = [(r["metrics"]["loraplus"][f"best_loss_n{n}"], r["metrics"]["lora"][f"best_loss_n{n}"]) for r in res.per_seed]
    assert loss.measured == pytest.approx(float(np.mean([np.log(p / b) for p, b in per])))
    assert loss.threshold == pytest.approx(np.log(0.9)) and loss.direction == "<="
    assert res.verdict["claims_total"] == 2 and res.verdict["mechanisms_total"] == 3
