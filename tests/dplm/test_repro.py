"""Quick reproduction of dplm: the result's contents, the checks' kinds and pairing, the config's validation."""

from __future__ import annotations

import json

import pytest

from icml24.dplm.experiment import Config, run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("dplm_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "dplm" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert {"data", "dplm", "mlm", "ar", "dplm_scratch", "guided", "adapter"} <= set(d["summary"])
    for name in ("generation_probes.png", "guidance.png"):
        assert (out / name).stat().st_size > 1000
    assert set(d["extra"]["tuning"]) == {"dplm", "mlm", "ar"}


def test_checks_are_labelled_and_paired(quick):
    res, _ = quick
    kinds = {(c.method_arm, c.metric, c.baseline_arm): c.kind for c in res.claim_checks}
    claims = {k for k, kind in kinds.items() if kind == "claim"}
    assert claims == {("dplm", "loglik", "mlm"), ("dplm", "probe_acc", "mlm"), ("dplm", "probe_acc", "ar"),
                      ("dplm", "scaffold_success", "mlm"), ("guided", "helix_gain", None),
                      ("guided", "loglik_drop", None), ("adapter", "ss_agreement", "dplm")}
    assert kinds[("guided", "unrealisable_loglik_drop", None)] == kinds[("ar", "ar_excess_nll", None)] == "sanity"
    assert kinds[("dplm_scratch", "loglik", "mlm")] == "mechanism"
    c = next(c for c in res.claim_checks if c.metric == "loglik" and c.method_arm == "dplm" and c.baseline_arm == "mlm")
    d = [r["metrics"]["dplm"]["loglik"] - r["metrics"]["mlm"]["loglik"] for r in res.per_seed]
    assert c.measured == pytest.approx(sum(d) / len(d)) and c.n == 2
    # held-out data are far more likely under the grammar than uniform residues (log 1/20 = -3.0)
    assert all(r["metrics"]["data"]["loglik"] > -2.6 for r in res.per_seed)


@pytest.mark.parametrize("kw, msg", [(dict(length=5), "length"), (dict(guidance_scales=(1.0, 2.0)), "start at 0"),
                                     (dict(lr_grid=()), "lr_grid"), (dict(probe_train=10 ** 6), "probe_train")])
def test_config_rejects_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Config(**kw)
