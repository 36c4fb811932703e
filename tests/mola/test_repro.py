"""MoLA reproduction: data, sampler, loss and metric helpers, config validation, and one quick run."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from icml24.common.progress import set_quiet
from icml24.mola.experiment import (
    ARMS,
    N_TASKS,
    Config,
    cosine_gap,
    make_domains,
    nearest_centroid_task_acc,
    run,
    stratified_batches,
    task_sum_ce,
    train_arm,
)


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    set_quiet(True)
    out = tmp_path_factory.mktemp("mola_quick")
    return run(Config.quick(), out), out


def test_quick_run_outputs_and_claim_checks(quick_result):
    res, out = quick_result
    saved = json.loads((out / "results.json").read_text())
    assert saved["mode"] == "quick" and saved["slug"] == "mola"
    assert (out / "report.md").exists()
    assert {"per_domain_accuracy.png", "gate_embeddings.png"} <= set(res.artifacts)
    assert all((out / a).stat().st_size > 1000 for a in res.artifacts)
    assert set(res.summary) == set(ARMS)
    assert len(res.claim_checks) == 2
    assert [c.kind for c in res.claim_checks] == ["claim", "mechanism"]  # gate separation is what TwD optimises
    for c in res.claim_checks:  # verdicts follow from the measured numbers of this run
        s = res.summary
        expected = s[c.method_arm][c.metric]["mean"] - s[c.baseline_arm][c.metric]["mean"]
        assert c.measured == pytest.approx(expected)
    claim, mech = res.claim_checks
    assert claim.n == 2 and claim.ci_low <= claim.measured <= claim.ci_high
    assert claim.passed == (claim.ci_low >= claim.threshold)  # the paired interval must clear +1 point
    assert mech.ci_low is None and mech.passed == (mech.measured >= mech.threshold)
    assert [c.threshold for c in res.claim_checks] == [1.0, 0.1]
    assert res.verdict["claims_total"] == 1 and res.verdict["mechanisms_total"] == 1


def test_quick_run_learns_every_domain(quick_result):
    res, _ = quick_result
    for arm in ARMS:
        assert res.summary[arm]["mean_acc"]["mean"] > 80.0, arm  # chance is 10%
        assert res.summary[arm]["acc_permuted"]["mean"] > 75.0, arm
    # MoLA adds E·r·(in + out) parameters per adapted layer on top of the shared backbone
    hps, grad = res.summary["hps"]["params"]["mean"], res.summary["mola_grad"]["params"]["mean"]
    assert grad - hps == 4 * 4 * ((64 + 128) + (128 + 128))


def test_quick_run_twd_direction(quick_result):
    """TwD is a supervised-contrastive loss on the routing: its gates must cluster by domain more (2-seed mean)."""
    s = quick_result[0].summary
    assert s["mola_router_twd"]["gate_cos_gap"]["mean"] > s["mola_router"]["gate_cos_gap"]["mean"]
    assert s["mola_router_twd"]["gate_task_acc"]["mean"] > s["mola_router"]["gate_task_acc"]["mean"]
    assert "gate_task_acc" not in s["hps"] and "gate_task_acc" not in s["mola_grad"]


def test_same_seed_same_numbers():
    data = make_domains(seed=3)
    cfg = Config(seeds=(3,), epochs=1)
    a = train_arm("mola_router_twd", data, cfg, 3)
    b = train_arm("mola_router_twd", data, cfg, 3)
    assert a["metrics"] == b["metrics"]
    torch.testing.assert_close(a["gates_test"], b["gates_test"], rtol=0, atol=0)


def test_domains_are_disjoint_transformed_quarters():
    d = make_domains(seed=0, test_fraction=0.3)
    n = len(d.y_train) + len(d.y_test)
    assert n == 1797
    assert d.x_train.shape[1] == 64 and set(d.t_train.tolist()) == set(range(N_TASKS))
    for t in range(N_TASKS):
        n_t = int((d.t_train == t).sum() + (d.t_test == t).sum())
        assert abs(n_t - 1797 / 4) <= 1
        assert abs(int((d.t_test == t).sum()) / n_t - 0.3) < 0.01
    mean = [float(d.x_train[d.t_train == t].mean()) for t in range(N_TASKS)]
    assert mean[1] > 0.6 > 0.4 > mean[0]  # D1 is the intensity inversion of mostly dark digits
    assert abs(mean[2] - mean[0]) < 0.05  # a pixel permutation keeps the intensity distribution
    assert float(d.x_train[d.t_train == 3].min()) < -0.2  # Gaussian noise leaves [0, 1]
    d2 = make_domains(seed=0)
    torch.testing.assert_close(d.x_test, d2.x_test, rtol=0, atol=0)


def test_stratified_batches_balance_tasks_and_cover_every_sample():
    t = torch.tensor([0] * 10 + [1] * 7 + [2] * 12 + [3] * 5)
    b = stratified_batches(t, 4, torch.Generator().manual_seed(0))
    assert b.shape == (3, 16)
    for row in b:
        assert torch.bincount(t[row], minlength=4).tolist() == [4, 4, 4, 4]
    assert set(b.flatten().tolist()) == set(range(len(t)))


def test_task_sum_ce_equals_loop():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(12, 10, generator=g), torch.randint(0, 10, (12,), generator=g)
    t = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 2, 0])
    ref = sum(F.cross_entropy(logits[t == k], y[t == k]) for k in range(4))
    torch.testing.assert_close(task_sum_ce(logits, y, t), ref)


def test_gate_separability_metrics():
    t = torch.arange(4).repeat_interleave(5)
    sep = F.one_hot(t, 4).float() * 0.9 + 0.025
    assert nearest_centroid_task_acc(sep, t, sep, t) == 1.0
    assert cosine_gap(sep, t) > 0.5
    same = torch.full((20, 4), 0.25)
    assert cosine_gap(same, t) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=30), "batch_size must be a multiple of 4"),
    (dict(batch_size=4), "batch_size"),
    (dict(rank=0), "rank must be an int >= 1"),
    (dict(tau=0.0), "tau must be a finite number > 0"),
    (dict(lr=0.0), "lr must be a finite number > 0"),
    (dict(alpha=-1.0), "alpha must be a finite number > 0"),
    (dict(test_fraction=0.95), "test_fraction"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_config_cli_overrides():
    cfg = Config.quick().with_overrides({"rank": "8", "tau": "0.5", "seeds": "1,2"})
    assert cfg.rank == 8 and cfg.tau == 0.5 and cfg.seeds == (1, 2)
    assert Config().threads == 1 and len(Config().seeds) == 5
