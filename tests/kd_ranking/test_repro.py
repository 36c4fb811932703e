"""Quick reproduction of kd_ranking: runs the quick experiment once and checks what is robust at that scale."""

from __future__ import annotations

import json

import pytest
import torch

from icml24.kd_ranking import KLDistillLoss, RankingKDLoss
from icml24.kd_ranking.experiment import Config, make_data, run, train_student


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("kd_ranking_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_results(quick):
    result, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "kd_ranking" and d["mode"] == "quick"
    assert {c["name"] for c in d["claim_checks"]} == {
        "kl_student_acc_vs_teacher_ece_spearman", "rank_students_identical_across_logit_scaling",
        "rank_vs_kl_for_most_overconfident_teacher", "teacher_ece_grows_with_width"}
    assert (out / "student_acc_vs_teacher_ece.png").stat().st_size > 0
    assert (out / "teacher_width_and_students.png").stat().st_size > 0
    # every arm on every seed: CE + (KL, rank) x teacher variants
    n_variants = len(result.extra["teachers"])
    for row in d["per_seed"]:
        assert len(row["metrics"]) == 1 + 2 * n_variants


def test_only_the_rank_vs_kl_comparison_is_a_claim_with_a_paired_ci(quick):
    result, _ = quick
    kinds = {c.name: c.kind for c in result.claim_checks}
    assert kinds == {"kl_student_acc_vs_teacher_ece_spearman": "mechanism",
                     "rank_students_identical_across_logit_scaling": "mechanism",
                     "rank_vs_kl_for_most_overconfident_teacher": "claim",
                     "teacher_ece_grows_with_width": "sanity"}
    (claim,) = result.checks("claim")
    d = [r["metrics"][claim.method_arm]["acc"] - r["metrics"][claim.baseline_arm]["acc"] for r in result.per_seed]
    assert claim.method_arm.startswith("rank:") and claim.baseline_arm == "kl:" + claim.method_arm[5:]
    assert claim.measured == pytest.approx(sum(d) / len(d)) and claim.n == len(d)
    assert claim.ci_low <= claim.measured <= claim.ci_high and claim.threshold == -0.5
    assert claim.passed == (claim.ci_low >= -0.5)


def test_rank_students_bit_identical_across_logit_scaled_teachers(quick):
    result, _ = quick
    check = next(c for c in result.claim_checks if c.name == "rank_students_identical_across_logit_scaling")
    assert check.measured == 0.0 and check.passed and check.kind == "mechanism"
    family = result.extra["rank_scaled_family"]
    assert len(family) >= 3
    for row in result.per_seed:
        accs = {row["metrics"][f"rank:{n}"]["acc"] for n in family}
        assert len(accs) == 1


def test_kl_students_differ_across_logit_scaled_teachers_negative_control(quick):
    result, _ = quick
    family = result.extra["rank_scaled_family"]
    for row in result.per_seed:
        accs = {row["metrics"][f"kl:{n}"]["acc"] for n in family}
        assert len(accs) > 1


def test_logit_scaled_teachers_share_accuracy_but_not_calibration(quick):
    result, _ = quick
    rows = {r["teacher"]: r for r in result.extra["teachers"]}
    family = [rows[n] for n in result.extra["rank_scaled_family"]]
    assert len({r["acc"] for r in family}) == 1
    eces = sorted(r["ece"] for r in family)
    assert eces[-1] > eces[0] + 0.05
    # temperature scaling (T* fitted on val) gives the best-calibrated member of the family on test
    cal = next(r for r in family if r["teacher"].endswith("_cal"))
    assert cal["ece"] <= min(r["ece"] for r in family) + 0.02


def test_wider_teacher_more_overconfident_on_quick(quick):
    result, _ = quick
    rows = {r["teacher"]: r for r in result.extra["teachers"]}
    assert rows["w256"]["ece"] > rows["w16"]["ece"]
    assert rows["w256"]["ece_over"] > rows["w256"]["ece_under"]
    # the over-trained wide teacher is (near) one-hot on its training samples: less dark knowledge
    assert rows["w256"]["train_non_gt_entropy"] < rows["w16"]["train_non_gt_entropy"]


def test_student_same_seed_same_numbers():
    cfg = Config.quick().replace(n_train=300, n_test=200, student_epochs=2)
    data = make_data(cfg)
    t = torch.randn(cfg.n_train, cfg.n_super * cfg.n_sub)
    for loss in (None, KLDistillLoss(tau=4.0), RankingKDLoss()):
        a = train_student(cfg, 3, data, t, loss, "cpu")
        b = train_student(cfg, 3, data, t, loss, "cpu")
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for loss in (None, RankingKDLoss()):  # the same loss, seeds 3 vs 4: only the seed differs
        a = train_student(cfg, 3, data, t, loss, "cpu")
        c = train_student(cfg, 4, data, t, loss, "cpu")
        assert not torch.equal(a, c)


@pytest.mark.parametrize("changes, match", [
    ({"teacher_epochs": 0}, "teacher_epochs"),
    ({"kl_tau": 0.0}, "kl_tau"),
    ({"rank_kind": "bogus"}, "rank_kind"),
    ({"kappas": (1.0,)}, "kappas"),
    ({"kappas": (-2.0,)}, "kappas"),
    ({"early_epochs": (500,)}, "early_epochs"),
    ({"early_width": 3}, "early_width"),
    ({"kd_weight": 0.0}, "kd_weight"),
    ({"n_bins": 0}, "n_bins"),
    ({"rank_top_k": 99}, "rank_top_k"),
    ({"kappas": (float("nan"),)}, "kappas"),
    ({"kappas": (float("inf"),)}, "kappas"),
    ({"kappas": (0.5, float("-inf"))}, "kappas"),
    ({"sub_scale": float("nan")}, "sub_scale"),
    ({"sub_scale": float("inf")}, "sub_scale"),
    ({"noise": float("nan")}, "noise"),
    ({"kl_tau": float("inf")}, "kl_tau"),
    ({"student_lr": float("nan")}, "student_lr"),
    ({"n_super": 1, "n_sub": 2, "rank_top_k": 0}, "n_super"),
    ({"n_super": 2, "n_sub": 1, "rank_top_k": 0}, "n_super"),
])
def test_config_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        Config.quick().replace(**changes)


def test_config_three_classes_is_the_minimum():
    cfg = Config.quick().replace(n_super=1, n_sub=3)
    assert cfg.n_super * cfg.n_sub == 3
