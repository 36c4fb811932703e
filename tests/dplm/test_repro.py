"""Quick reproduction of dplm: the result's contents, the checks' kinds and pairing, the config's validation."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from icml24.common.results import ClaimCheck, verdict
from icml24.common.tuning import tune_grid
from icml24.dplm.experiment import FINE_TUNED_METRICS, PLAUSIBLE, Config, run, tuning_checks
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("dplm_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "dplm" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert {"data", "dplm", "mlm", "ar", "random", "composition", "guided", "adapter"} <= set(d["summary"])
    assert "dplm_scratch" not in d["summary"]  # off by default (Config.scratch_arm)
    for arm in ("dplm", "mlm", "ar"):
        assert {"probe_acc", "pep_probe", "ss_ft", "pep_ft"} <= set(d["summary"][arm])
        assert all(0 <= r["metrics"][arm]["pep_ft"] <= 100 for r in d["per_seed"])
    for name in ("generation_probes.png", "guidance.png", "representations.png"):
        assert (out / name).stat().st_size > 1000
    assert set(d["extra"]["tuning"]) == {"dplm", "mlm", "ar"}
    cfg = Config.quick()
    assert d["schema_version"] == 3 and d["extra"]["grid_extra"] == cfg.grid_extra
    ft = d["extra"]["fine_tune_tuning"]
    assert set(ft) == {f"{a}:{m}" for a in ("dplm", "mlm", "ar") for m in ("ss_ft", "pep_ft")}
    for records, grid, key in ((d["extra"]["tuning"], cfg.lr_grid, "val_loss"), (ft, cfg.ft_lr_grid, "val_acc")):
        for t in records.values():
            # the declared grid, plus at most grid_extra extensions past its edges by the grid's ratio
            assert t["declared"] == pytest.approx(list(grid)) and len(t["extensions"]) <= cfg.grid_extra
            assert sorted(t["declared"] + t["extensions"]) == pytest.approx(t["grid"])
            assert t["lr"] == t["picked"] and any(t["picked"] == pytest.approx(g) for g in t["grid"])
            assert len(t[key]) == len(t["grid"])


def test_checks_are_labelled_and_paired(quick):
    res, _ = quick
    kinds = {(c.method_arm, c.metric, c.baseline_arm): c.kind for c in res.claim_checks}
    claims = {k for k, kind in kinds.items() if kind == "claim"}
    assert claims == {("dplm", "loglik", "mlm"), ("dplm", "probe_acc", "mlm"), ("dplm", "probe_acc", "ar"),
                      ("dplm", "scaffold_success", "mlm"), ("guided", "helix_gain", None),
                      ("guided", "loglik_drop@1", "unrealisable"), ("adapter", "ss_agreement", "dplm"),
                      *(("dplm", m, b) for m in ("pep_probe", "ss_ft", "pep_ft") for b in ("mlm", "ar"))}
    assert kinds[("unrealisable", "loglik_drop@1", None)] == kinds[("ar", "ar_excess_nll", None)] == "sanity"
    assert kinds[("dplm", "pep_probe", "random")] == kinds[("dplm", "probe_acc", "random")] == "mechanism"
    interior = [c for c in res.claim_checks if c.metric == "tuned_inside_fraction"]
    assert len(interior) == 2 and all(c.kind == "sanity" for c in interior)
    assert all(c.detail.split(":")[0] in ("tuning", "the regime", "negative control")
               for c in res.claim_checks if c.kind == "sanity")
    c = next(c for c in res.claim_checks if c.metric == "loglik" and c.method_arm == "dplm" and c.baseline_arm == "mlm")
    d = [r["metrics"]["dplm"]["loglik"] - r["metrics"]["mlm"]["loglik"] for r in res.per_seed]
    assert c.measured == pytest.approx(sum(d) / len(d)) and c.n == 2
    # held-out data are far more likely under the grammar than uniform residues (log 1/20 = -3.0)
    assert all(r["metrics"]["data"]["loglik"] > -2.6 for r in res.per_seed)


@pytest.mark.parametrize("kw, msg", [(dict(length=5), "length"), (dict(guidance_scales=(1.0, 2.0)), "start at 0"),
                                     (dict(lr_grid=()), "lr_grid"), (dict(probe_train=10 ** 6), "probe_train"),
                                     (dict(peptide_set="nope"), "peptide_set"), (dict(ft_lr_grid=(0.0,)), "ft_lr_grid"),
                                     (dict(interior_min_fraction=1.5), "interior_min_fraction")])
def test_config_rejects_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Config(**kw)


def test_tuning_run_at_the_full_budget_is_the_first_seeds_model():
    """Tuning runs on the first seed (here 3); with tune_steps == steps the picked tuning run is reused for that
    seed, and retraining gives the same weights."""
    from icml24.dplm.experiment import ARMS, _train, _train_arms, grammar_data, tune_lrs

    cfg = Config(seeds=(3, 4), length=16, n_train=64, n_val=16, n_test=16, hidden=16, layers=1, heads=2, steps=4,
                 tune_steps=4, warmup=1, batch_size=8, lr_grid=(1e-3, 4e-3, 1.6e-2), probe_train=16,
                 adapter_samples=8)
    data = grammar_data(cfg, 3)
    cache = {}
    tuning = tune_lrs(cfg, data, cache)
    lrs = {k: t.value for k, t in tuning.items()}
    nets = _train_arms(cfg, data, lrs, 3, cache)
    assert all(nets[a] is cache[(a, lrs[a], 4, 3)] for a in ARMS)
    again = _train(cfg, ARMS["dplm"], data["train"], lr=lrs["dplm"], steps=4, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(again.parameters(), nets["dplm"].parameters(), strict=True))


def test_the_shared_checker_accepts_the_quick_result(quick):
    _, out = quick
    check_results_file(out / "results.json")


def test_guards_void_exactly_the_claims_they_name(quick):
    """A failed fine-tuning tuning check voids the fine-tuned claims and nothing else; the failed negative
    control of guidance (it costs no plausibility) voids only the plausibility claim."""
    res, _ = quick
    checks = [ClaimCheck.from_dict(dataclasses.asdict(c)) for c in res.claim_checks]
    claims = [c for c in checks if c.kind == "claim"]
    edge = tune_grid(lambda lrs: [[lr] for lr in lrs], (1e-3, 2e-3, 4e-3), max_extra=0)  # the top keeps winning
    inside = tune_grid(lambda lrs: [[-abs(lr - 2e-3)] for lr in lrs], (1e-3, 2e-3, 4e-3), max_extra=0)
    pre, ft = tuning_checks(Config.quick(), claims, {a: inside for a in ("dplm", "mlm", "ar")},
                            {f"{a}:{m}": edge for a in ("dplm", "mlm", "ar") for m in sorted(FINE_TUNED_METRICS)})
    assert pre.passed and not ft.passed
    others = [c for c in checks if c.kind != "sanity"]
    v = verdict(others + [pre, ft])
    void = {c.name for c in claims if c.void}
    assert void == {c.name for c in claims if c.metric in FINE_TUNED_METRICS} and len(void) == 4
    assert v["claims_void"] == 4 and v["claims_total"] == len(claims) - 4
    control = next(c for c in checks if c.name.startswith("guidance toward an unrealisable structure lowers"))
    assert control.guards == [PLAUSIBLE]
    control.measured = control.threshold - 1.0
    failed = ClaimCheck.from_dict({**dataclasses.asdict(control), "ci_low": None, "ci_high": None})
    assert not failed.passed
    verdict(others + [pre, failed])
    assert {c.name for c in claims if c.void} == {PLAUSIBLE}
