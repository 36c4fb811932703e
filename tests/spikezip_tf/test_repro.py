"""The quick reproduction, run once: exact equivalence on trained models, ablations lose it, artefacts."""

from __future__ import annotations

import json

import pytest

from icml24.spikezip_tf.experiment import Config, run


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
        assert m["vit_snn"]["quiescent_step"] is not None and m["vit_snn"]["quiescent_step"] < 255
        # the plateau, measured past quiescence without stopping: exactly the QANN's accuracy, from T <= q + 1
        assert m["vit_snn"]["plateau_gap"] == 0.0
        assert 1 <= m["vit_snn"]["plateau_step"] <= m["vit_snn"]["quiescent_step"] + 1
        # the accuracy of a trained QANN is far above chance (10 classes)
        assert m["vit_qann"]["acc"] > 50.0


def test_quick_ablations_lose_equivalence(quick):
    res, _ = quick
    s = res.summary
    for arm in ("vit_no_negative", "vit_no_half_init", "vit_classic_if"):
        assert s[arm]["max_abs_diff"]["mean"] > 1e-3
        assert s[arm]["agreement"]["mean"] < s["vit_snn"]["agreement"]["mean"]


def test_quick_artefacts_and_claims(quick):
    res, out = quick
    assert res.mode == "quick"
    data = json.loads((out / "results.json").read_text())
    assert {c["name"] for c in data["claim_checks"]} >= {"snn_logits_equal_qann_fp64", "identical_accuracy",
                                                          "no_negative_spikes_loses_agreement"}
    assert (out / "accuracy_vs_time_step.png").stat().st_size > 1000
    kinds = {c["name"]: c["kind"] for c in data["claim_checks"]}
    # exactness and its consequences are mechanisms, the ablations negative controls: no claim is made
    assert {n for n, k in kinds.items() if k == "sanity"} == {"no_negative_spikes_loses_agreement",
                                                               "no_half_init_loses_agreement"}
    assert set(kinds.values()) == {"mechanism", "sanity"} and kinds["identical_accuracy"] == "mechanism"
    assert data["verdict"]["claims_total"] == 0 and data["verdict"]["label"].startswith("no claim (mechanisms")
    assert (out / "spikes_per_layer.png").stat().st_size > 1000
    curve = data["extra"]["acc_curve_mean"]["vit_snn"]
    assert curve[0] < curve[-1]  # accuracy rises with time steps (latency before the plateau)


def test_config_validation():
    with pytest.raises(ValueError, match=r"level \(signed quantizers\) must be an int >= 4"):
        Config(level=3)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        Config(max_steps=0)
    with pytest.raises(ValueError, match="divisible"):
        Config(embed_dim=30, num_heads=4)
