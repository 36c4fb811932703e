"""Quick reproduction of kd_ranking: runs the quick experiment once and checks its structure, tuning and controls."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from icml24.common.data import load_mnist1d
from icml24.common.results import ClaimCheck, verdict
from icml24.kd_ranking import KLDistillLoss, RankingKDLoss
from icml24.kd_ranking.experiment import (
    Config,
    _shuffle_ranking,
    correlation_difference_permutation,
    run,
    spearman_permutation,
    teacher_table_markdown,
    train_student,
)
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("kd_ranking_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_results(quick):
    result, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "kd_ranking" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert (out / "kd_gain_vs_teacher_ece.png").stat().st_size > 1000
    cfg = Config.quick()
    for row in d["per_seed"]:  # CE + per teacher: its metrics, tuned KL, tuned rank, shuffled control
        assert set(row["metrics"]) == {"ce", "overconfident"} | {
            f"{a}:c{c}" for c in cfg.teacher_channels for a in ("teacher", "kl", "rank", "rank_shuffled")}
    assert teacher_table_markdown(result).count("\n") == 1 + len(cfg.teacher_channels)


def test_checks_are_labelled(quick):
    result, _ = quick
    kinds = [c.kind for c in result.claim_checks]
    assert kinds == ["claim", "sanity", "sanity", "sanity", "sanity", "mechanism", "mechanism", "mechanism", "sanity"]
    assert result.verdict["claims_total"] == 1


def test_the_claim_is_paired_over_zoos_against_best_tuned_kl(quick):
    result, _ = quick
    (claim,) = result.checks("claim")
    cfg = Config.quick()
    d = []
    for row in result.per_seed:
        m = row["metrics"]
        over = [c for c in cfg.teacher_channels if m[f"teacher:c{c}"]["overconfidence"] > cfg.overconfidence]
        d.append(np.mean([m[f"rank:c{c}"]["acc"] for c in over]) - np.mean([m[f"kl:c{c}"]["acc"] for c in over]))
    assert claim.measured == pytest.approx(float(np.mean(d))) and claim.n == len(d) == 2
    assert claim.ci_low <= claim.measured <= claim.ci_high and claim.threshold == 0.0
    assert claim.passed == (claim.ci_low >= 0.0)


def test_both_arms_get_the_same_tuning_budget(quick):
    result, _ = quick
    cfg = Config.quick()
    for key, v in result.extra["tuned"].items():
        arm = key.rsplit(":", 1)[1]
        grid = cfg.kl_taus if arm == "kl" else cfg.rank_tau_s
        assert v["tau"] in v["grid"] and set(grid) <= set(v["grid"]) and v["lam"] in cfg.kd_weights
        assert len(v["grid"]) == len(grid) + len(v["extensions"])  # the declared grid plus its extensions
        for ext in v["extensions_per_lam"].values():
            assert len(ext) <= cfg.grid_extra
            for e in ext:  # each extension is one grid ratio past the edge of the grid so far
                assert any(math.isclose(e, g * r) for g in (grid[0], grid[-1]) for r in (2.0, 0.5, 4.0, 0.25))
    assert len(cfg.kl_taus) == len(cfg.rank_tau_s)
    with pytest.raises(ValueError, match="same tuning budget"):
        Config.quick().replace(rank_tau_s=(1.0,))


def test_tuning_checks_count_the_tuned_temperatures_and_guard_the_claim(quick):
    result, _ = quick
    cfg = Config.quick()
    (claim,) = result.checks("claim")
    checks = [c for c in result.claim_checks if c.metric == "tuned_inside_fraction"]
    assert [c.method_arm for c in checks] == ["kl:*", "rank:*"]
    n_cells = len(cfg.seeds) * len(cfg.teacher_channels)
    for c in checks:
        arm = c.method_arm.split(":")[0]
        cells = {k: v for k, v in result.extra["tuned"].items() if k.endswith(f":{arm}")}
        assert len(cells) == n_cells == c.n
        inside = sum(v["grid"][0] < v["tau"] < v["grid"][-1] for v in cells.values())  # of the evaluated grid
        assert c.measured == pytest.approx(inside / n_cells) == result.extra["tau_interior_fraction"][arm]
        assert result.extra["tau_at_grid_edge"][arm] == n_cells - inside
        assert sum(result.extra["tuned_tau_counts"][arm].values()) == n_cells
        assert c.kind == "sanity" and c.threshold == 0.5 and c.passed == (c.measured >= 0.5)
        assert c.guards == [claim.name] and c.detail.startswith("tuning: ")
        t = result.extra["tuning"][arm]
        assert t["grid_extra"] == cfg.grid_extra and set(t["picked"]) == {k.rsplit(":", 1)[0] for k in cells}
    if not all(c.passed for c in checks):  # a failed tuning check voids the claim it guards
        assert result.verdict["label"].startswith("inconclusive")


def test_every_sanity_check_names_what_it_guards_against_and_voids_only_the_claim(quick):
    result, _ = quick
    (claim,) = result.checks("claim")
    sanity = result.checks("sanity")
    starts = ("the regime: ", "negative control: ", "tuning: ")
    assert all(c.detail.startswith(starts) and c.guards == [claim.name] for c in sanity)
    for s in sanity:  # each guard, failed on its own, voids the claim and leaves the mechanisms shown
        failed = ClaimCheck(**{**{k: getattr(s, k) for k in ("name", "metric", "kind", "guards", "detail")},
                               "measured": float("nan"), "threshold": 0.0, "direction": ">="})
        checks = [copy.deepcopy(c) if c is not s else failed for c in result.claim_checks]
        v = verdict(checks)
        assert v["label"] == "inconclusive (0/1 testable)" and v["claims_void"] == 1
        assert v["sanity_failed"] == [s.name] and v["mechanisms_total"] == 3


def test_quick_run_writes_schema_3_that_the_shared_checker_accepts(quick):
    _, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["schema_version"] == 3 and "claims_void" in d["verdict"]
    check_results_file(out / "results.json")


def test_rank_students_invariant_and_kl_students_not(quick):
    result, _ = quick
    inv = next(c for c in result.claim_checks if c.metric == "max_abs_logit_diff" and c.kind == "mechanism")
    ctl = next(c for c in result.claim_checks if c.metric == "max_abs_logit_diff" and c.kind == "sanity")
    assert inv.measured == 0.0 and inv.passed
    assert ctl.measured > 1e-3 and ctl.passed


def test_the_claims_test_rejects_the_shuffled_ranking_control(quick):
    result, _ = quick
    c = next(c for c in result.claim_checks if c.method_arm == "rank_shuffled")
    assert c.kind == "sanity" and c.passed and c.measured < 0.0


def test_shuffle_ranking_keeps_each_rows_values_and_breaks_the_order():
    t = torch.randn(50, 10)
    s = _shuffle_ranking(t, 0)
    torch.testing.assert_close(s.sort(1).values, t.sort(1).values)
    assert (s.argmax(1) != t.argmax(1)).float().mean() > 0.5
    torch.testing.assert_close(s, _shuffle_ranking(t, 0), rtol=0, atol=0)


def test_spearman_permutation_detects_a_negative_trend_and_not_noise():
    rng = np.random.default_rng(0)
    x = np.tile(np.arange(4.0), 5)
    groups = np.repeat(np.arange(5), 4)
    y = -x + 0.3 * rng.standard_normal(20)
    rho, p = spearman_permutation(x, y, groups, n_permutations=999)
    assert rho < -0.8 and p <= 0.002
    rho0, p0 = spearman_permutation(x, rng.standard_normal(20), groups, n_permutations=999)
    assert p0 > 0.05
    d, pd = correlation_difference_permutation(x, y, -y, n_permutations=999)
    assert d < -1.5 and pd <= 0.002
    _, pd_same = correlation_difference_permutation(x, y, y + 1e-3 * rng.standard_normal(20), n_permutations=999)
    assert pd_same > 0.05


def test_student_same_seed_same_numbers():
    cfg = Config.quick().replace(student_max_epochs=1, student_hidden=(8,))
    split = load_mnist1d(seed=0)
    t = torch.randn(len(split.y_train), 10)
    for loss in (None, KLDistillLoss(tau=4.0), RankingKDLoss()):
        a = train_student(cfg, split, seed=3, teacher_train_logits=t, loss=loss)
        b = train_student(cfg, split, seed=3, teacher_train_logits=t, loss=loss)
        torch.testing.assert_close(a["test_logits"], b["test_logits"], rtol=0, atol=0)
    a = train_student(cfg, split, seed=3, teacher_train_logits=t, loss=RankingKDLoss())
    c = train_student(cfg, split, seed=4, teacher_train_logits=t, loss=RankingKDLoss())
    assert not torch.equal(a["test_logits"], c["test_logits"])


@pytest.mark.parametrize("changes, match", [
    ({"teacher_epochs": 0}, "teacher_epochs"),
    ({"kl_taus": (0.0, 1.0)}, "kl_taus"),
    ({"kl_taus": (float("nan"), 1.0)}, "kl_taus"),
    ({"rank_tau_s": (-1.0, 1.0)}, "rank_tau_s"),
    ({"kl_taus": (4.0, 1.0, 2.0)}, "kl_taus"),
    ({"rank_tau_s": (0.5, 0.5, 1.0)}, "rank_tau_s"),
    ({"interior_min_fraction": 1.5}, "interior_min_fraction"),
    ({"grid_extra": -1}, "grid_extra"),
    ({"grid_extra": 1.5}, "grid_extra"),
    ({"rank_kind": "bogus"}, "rank_kind"),
    ({"kd_weights": (0.0,)}, "kd_weights"),
    ({"kd_weights": (1.5,)}, "kd_weights"),
    ({"kd_weights": ()}, "kd_weights"),
    ({"teacher_channels": (8,)}, "teacher_channels"),
    ({"teacher_channels": (8, 8)}, "teacher_channels"),
    ({"seeds": (0,)}, "seeds"),
    ({"n_bins": 0}, "n_bins"),
    ({"overconfidence": 2.0}, "overconfidence"),
    ({"p_level": 0.0}, "p_level"),
    ({"claim_threshold": float("inf")}, "claim_threshold"),
    ({"student_lr": float("nan")}, "student_lr"),
])
def test_config_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        Config.quick().replace(**changes)
