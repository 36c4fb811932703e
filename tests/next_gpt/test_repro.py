"""Quick reproduction of next_gpt (one modality, frozen parts from the cached quick fixture, built on first use),
and, in the default suite, the same pipeline end to end on a reduced quick config (frozen parts built from scratch
in a temporary cache; ~20 s on 2 cores): the results file, not the claims' direction."""

from __future__ import annotations

import json

import pytest

import icml24.next_gpt.experiment as E
from icml24.next_gpt.experiment import CLAIM_IMPLICIT, CLAIM_SELECTION, CLAIMS_OF_ARM, Config, run
from tests.shared_checker import check_results_file

# Config.quick() shrunk until the whole run (frozen parts included) fits the default suite; every stage, arm, tuning
# grid, check and artefact is still there, only too small to train anything.
REDUCED = dict(llm_steps=20, encoder_steps=5, decoder_steps=5, decoder_channels=8, decoder_batch=8, oracle_steps=5,
               llm_hidden=32, projector_hidden=16, stage1_steps=4, stage2_steps=4, stage3_steps=4, batch=4, n_eval=2,
               n_dialogues=1, ddim_steps=2)
ARMS = {"signal", "pipeline", "stage2_icl", "stage2_icl_redraw", "stage1_icl", "untrained_proj", "gold", "stage1",
        "stage2", "best_text"}


def test_reduced_quick_run_end_to_end_writes_a_schema_3_result_the_checker_accepts(tmp_path):
    cfg = Config.quick().replace(cache_dir=str(tmp_path / "cache"), **REDUCED)
    res = run(cfg, tmp_path / "out")
    d = json.loads((tmp_path / "out" / "results.json").read_text())
    assert d["schema_version"] == 3 and d["slug"] == "next_gpt" and d["mode"] == "quick"
    assert d["seeds"] == [0, 1] and d["config"]["stage3_steps"] == 4 and len(d["per_seed"]) == 2
    assert set(d["summary"]) == ARMS and all(set(r["metrics"]) == ARMS for r in d["per_seed"])
    kinds = [c["kind"] for c in d["claim_checks"]]
    assert kinds.count("claim") == 2 and kinds.count("mechanism") == 1 and kinds.count("sanity") == 9
    claims = {c["name"]: c for c in d["claim_checks"] if c["kind"] == "claim"}
    assert set(claims) == {CLAIM_IMPLICIT, CLAIM_SELECTION}
    for c in claims.values():  # a claim is the mean paired difference over the seeds, inside its interval
        diffs = [r["metrics"][c["method_arm"]][c["metric"]] - r["metrics"][c["baseline_arm"]][c["metric"]]
                 for r in d["per_seed"]]
        assert c["n"] == 2 and c["measured"] == pytest.approx(sum(diffs) / 2)
        assert c["ci_low"] <= c["measured"] <= c["ci_high"]
    assert d["verdict"]["claims_total"] + d["verdict"]["claims_void"] == 2
    assert res.extra["frozen_hashes_identical"] == [1.0, 1.0]  # the frozen parts stayed frozen in every arm
    tb = d["extra"]["tuned"]["text_baseline"]  # claim 2's baseline: the text-side arm picked on validation
    assert tb["picked"] == E.pick_text_baseline(tb["val"]) == d["extra"]["claim2_baseline"]
    k = d["extra"]["tuned"]["icl_k"]
    assert tb["val"]["stage2_icl"] == d["extra"]["tuned"]["val"]["stage2_icl"][f"{k:g}"]["score"]
    for r in d["per_seed"]:
        assert r["metrics"]["best_text"]["selection_acc"] == r["metrics"][tb["picked"]]["selection_acc"]
    assert claims[CLAIM_SELECTION]["baseline_arm"] == "best_text"
    pl = d["extra"]["tuned"]["icl_plateau"]
    assert (pl["k_max"], pl["k_half"]) == (2, 1) and set(d["extra"]["tuned"]["icl_prompt_fit"]) == {"1", "2", "3"}
    assert {"claims.png", "gallery_image.png", "stage_curves.png"} <= set(d["artifacts"])
    assert all((tmp_path / "out" / a).stat().st_size > 1000 for a in d["artifacts"])
    check_results_file(tmp_path / "out" / "results.json")


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
        if arm == "stage2_icl":  # k's top fills the context: the plateau check instead of an interior rule
            check = next(c for c in res.claim_checks if c.metric == "icl_plateau_gain")
            assert check.guards == list(CLAIMS_OF_ARM[arm]) and check.detail.startswith("tuning:")
            continue
        check = next(c for c in res.claim_checks if c.method_arm == arm and c.metric == "tuned_inside_fraction")
        assert check.guards == list(CLAIMS_OF_ARM[arm]) and check.detail.startswith("tuning:")
        assert not check.passed  # a 2-point grid without extensions has no interior
    assert all(c.detail.split(":")[0] in ("tuning", "the regime", "negative control")
               for c in res.claim_checks if c.kind == "sanity")


@pytest.mark.slow
def test_the_shared_checker_accepts_the_quick_result(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3
    check_results_file(out / "results.json")
