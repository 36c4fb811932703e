"""LoRA+ quick reproduction: the claim's direction at the larger width (mean over seeds, with a margin)."""

from __future__ import annotations

import json

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
