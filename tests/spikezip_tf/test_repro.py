"""The quick reproduction, run once: exact equivalence on trained models, ablations lose it, artefacts."""

from __future__ import annotations

import json

import pytest

from icml24.spikezip_tf.experiment import Config, run
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("spikezip_tf")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_snn_equals_qann_on_trained_models(quick):
    res, _ = quick
    for row in res.per_seed:
        m = row["metrics"]
        assert m["vit_snn"]["max_abs_diff"] < 1e-9
        assert m["vit_snn"]["agreement"] == 1.0
        assert m["vit_snn"]["acc"] == m["vit_qann"]["acc"]
        assert m["text_snn"]["max_abs_diff"] < 1e-9
        assert m["vit_snn"]["quiescent_step"] is not None and m["vit_snn"]["quiescent_step"] < 63
        # the plateau, measured past quiescence without stopping: exactly the QANN's accuracy, from T <= q + 1
        assert m["vit_snn"]["plateau_gap"] == 0.0
        assert 1 <= m["vit_snn"]["plateau_step"] <= m["vit_snn"]["quiescent_step"] + 1
        # the accuracy of a trained QANN is far above chance (10 classes)
        assert m["vit_qann"]["acc"] > 50.0


def test_quick_ablations_lose_equivalence(quick):
    res, _ = quick
    s = res.summary
    for arm in ("vit_no_negative", "vit_no_negative_unsigned", "vit_no_negative_signed", "vit_no_half_init",
                "vit_classic_if"):
        assert s[arm]["max_abs_diff"]["mean"] > 1e-3
        assert s[arm]["agreement"]["mean"] < s["vit_snn"]["agreement"]["mean"]
    # signed neurons without -1 spikes cannot carry negative values: far worse than unsigned ones without them
    assert s["vit_no_negative_signed"]["agreement"]["mean"] < s["vit_no_negative_unsigned"]["agreement"]["mean"]


def test_quick_conventional_conversion_side_by_side(quick):
    res, _ = quick
    grid = Config.quick().time_steps
    for row in res.per_seed:
        m = row["metrics"]
        assert set(m["vit_rate"]) >= {f"acc_T{t}" for t in grid} | {"acc_at_tstar", "T_within_ann"}
        t_star = m["vit_snn"]["T_match_qann"]
        assert t_star in grid and abs(m["vit_snn"]["acc_at_tstar"] - m["vit_qann"]["acc"]) <= 0.5
        assert m["vit_rate"]["acc_at_tstar"] == m["vit_rate"][f"acc_T{int(t_star)}"]
        # SpikeZIP-TF has reached its QANN by the last T; the rate code has not reached its ANN at T*
        assert m["vit_snn"][f"acc_T{grid[-1]}"] == m["vit_qann"]["acc"]
        assert m["vit_rate"]["acc_at_tstar"] < m["vit_ann"]["acc"] - 2.0


def test_quick_artefacts_and_claims(quick):
    res, out = quick
    assert res.mode == "quick"
    data = json.loads((out / "results.json").read_text())
    kinds = {c["name"]: c["kind"] for c in data["claim_checks"]}
    assert {n for n, k in kinds.items() if k == "claim"} == {"conventional_below_ann_at_spikezip_match_T",
                                                             "qat_cost_le_1pt"}
    assert {n for n, k in kinds.items() if k == "sanity"} == {
        "exactness_rejects_no_negative", "exactness_rejects_no_negative_unsigned",
        "exactness_rejects_no_negative_signed", "exactness_rejects_no_half_init",
        "claim1_test_rejects_a_matched_converter", "rate_baseline_improves_with_T", "qat_cost_test_rejects_ptq"}
    assert kinds["identical_accuracy"] == "mechanism" and kinds["snn_logits_equal_qann_fp64"] == "mechanism"
    for c in data["claim_checks"]:
        if c["kind"] == "claim":
            assert c["ci_low"] is not None and c["ci_high"] is not None
    assert data["verdict"]["claims_total"] == 2
    for name in ("accuracy_vs_time_step.png", "accuracy_vs_T_vs_conventional.png", "spikes_per_layer.png"):
        assert (out / name).stat().st_size > 1000
    curve = data["extra"]["acc_curve_mean"]["vit_snn"]
    assert curve[0] < curve[-1]  # accuracy rises with time steps (latency before the plateau)


def test_config_validation():
    with pytest.raises(ValueError, match=r"level \(signed quantizers\) must be an int >= 4"):
        Config(level=3)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        Config(max_steps=0)
    with pytest.raises(ValueError, match="divisible"):
        Config(embed_dim=30, num_heads=4)
    with pytest.raises(ValueError, match="increasing"):
        Config(time_steps=(8, 4))
    with pytest.raises(ValueError, match="max_steps"):
        Config(max_steps=64, time_steps=(4, 128))
    with pytest.raises(ValueError, match="rate_percentile"):
        Config(rate_percentile=0.0)


def test_quick_result_is_schema_3_and_passes_the_shared_checker(quick):
    _, out = quick
    assert json.loads((out / "results.json").read_text())["schema_version"] == 3
    check_results_file(out / "results.json")
