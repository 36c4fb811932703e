"""Quick reproduction of icl_theory: run once; the result's contents, the robust mechanism checks, the config."""

from __future__ import annotations

import json

import pytest

from icml24.icl_theory.experiment import Config, run
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("icl_theory_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "icl_theory" and d["mode"] == "quick" and d["seeds"] == [0, 1, 2]
    for name in ("error_vs_T.png", "meta_MT_vs_lnMT.png", "transformer_nll_vs_position.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 0 and kinds.count("sanity") == 2  # a theory paper: mechanisms only
    assert res.label.startswith("no claim (mechanisms ")
    ctx = next(c for c in res.checks("mechanism") if c.metric == "ctx_excess" and c.method_arm == "icl_M1024")
    assert ctx.ci_low is not None and ctx.n == 3 and ctx.baseline_arm == "icl_M64"
    assert {"icl_M64", "icl_M1024", "noctx_M64", "noctx_M1024", "bayes_M64", "oracle_psi"} <= set(res.summary)
    assert len(res.extra["grid"]) == 6 and len(res.extra["subspace"]) == 3


def test_quick_run_theory_mechanisms(quick):
    res, _ = quick
    by_metric = {c.metric: c for c in res.claim_checks}
    for metric in ("decomposition_max_abs_z", "intra_bound_max_ratio", "meta_max_consecutive_ratio",
                   "meta_asym_min_ratio", "meta_asym_max_ratio", "ordering_min_z", "sub_d2_grid_abs_diff"):
        assert by_metric[metric].passed, by_metric[metric]
    # the Bayes predictor beats the oracle-free baselines on the transformer's test set, and oracle-ψ beats Bayes
    s = res.summary
    assert s["oracle_psi"]["nll"]["mean"] <= s["bayes_M64"]["nll"]["mean"] + 1e-9
    assert s["bayes_M64"]["nll"]["mean"] < s["noctx_M64"]["nll"]["mean"]


@pytest.mark.parametrize("kw, match", [
    ({"d_grid": (0, 4)}, "d_grid"), ({"M_grid": (4, 1)}, "strictly increasing"), ({"T_grid": ()}, "T_grid"),
    ({"icl_M": (64,)}, "icl_M needs"), ({"sigma": 0.0}, "sigma must be"), ({"icl_sigma_theta": -1.0}, "icl_sigma"),
    ({"sigma_psi": float("nan")}, "sigma_psi"), ({"sub_cells": (4, 8, 16)}, "sub_cells"),
    ({"icl_width": 30}, "divisible"), ({"icl_T": 2}, "icl_T"), ({"min_reps": 1}, "min_reps"),
    ({"seeds": (0,)}, ">= 2 seeds"), ({"sub_d": 1}, "sub_d"), ({"icl_steps": 0}, "icl_steps"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_quick_result_is_schema_3_and_passes_the_shared_checker(quick):
    _, out = quick
    assert json.loads((out / "results.json").read_text())["schema_version"] == 3
    check_results_file(out / "results.json")
