"""MoLA reproduction: data, sampler, loss and metric helpers, config validation, and one quick run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml24.common.progress import set_quiet
from icml24.mola.experiment import (
    ARMS,
    N_TASKS,
    Config,
    arm_grid,
    cosine_gap,
    label_maps,
    make_domains,
    nearest_centroid_task_acc,
    pretrained_backbone,
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


def test_quick_run_outputs_and_check_kinds(quick_result):
    res, out = quick_result
    saved = json.loads((out / "results.json").read_text())
    assert saved["mode"] == "quick" and saved["slug"] == "mola" and saved["schema_version"] == 3
    assert (out / "report.md").exists()
    assert {"per_domain_accuracy.png", "gate_embeddings.png"} <= set(res.artifacts)
    assert set(res.summary) == set(ARMS)
    assert [c.kind for c in res.claim_checks] == ["claim", "claim", "sanity", "mechanism"]
    for c in res.claim_checks:  # every check is a paired interval over the seeds of this run
        d = [r["metrics"][c.method_arm][c.metric] - r["metrics"][c.baseline_arm][c.metric] for r in res.per_seed]
        assert c.measured == pytest.approx(float(np.mean(d)))
        assert c.n == 2 and c.ci_low <= c.measured <= c.ci_high
        assert c.passed == (c.ci_low >= c.threshold)
    grad, twd, conflict, gates = res.claim_checks
    assert (grad.method_arm, grad.baseline_arm, twd.method_arm, twd.baseline_arm) == (
        "mola_grad", "hps", "mola_router_twd", "hps")
    assert (conflict.method_arm, conflict.baseline_arm, conflict.threshold) == ("stl", "hps", 2.0)
    assert [c.threshold for c in (grad, twd, gates)] == [0.0, 0.0, 0.1]
    assert res.verdict["claims_total"] == 2 and res.verdict["mechanisms_total"] == 1
    if not conflict.passed:  # no conflict, no verdict
        assert res.label.startswith("inconclusive")


def test_quick_run_learns_and_counts_parameters(quick_result):
    res, _ = quick_result
    for arm in ARMS:
        assert res.summary[arm]["mean_acc"]["mean"] > 15.0, arm  # chance is 10%
    hps, grad = res.summary["hps"]["params"]["mean"], res.summary["mola_grad"]["params"]["mean"]
    h = Config.quick().hidden
    assert grad - hps == N_TASKS * Config.quick().rank * ((40 + h) + (h + h) + (h + 10))
    assert "gate_task_acc" not in res.summary["hps"] and "gate_task_acc" in res.summary["mola_router_twd"]


def test_label_maps_conflict_by_disjoint_swaps():
    maps = label_maps(swaps=2)
    assert maps.shape == (N_TASKS, 10) and maps[0].tolist() == list(range(10))
    for pi in maps[1:]:
        assert sorted(pi.tolist()) == list(range(10))  # a permutation
        assert torch.equal(pi[pi], torch.arange(10))  # made of swaps (an involution)
        assert int((pi != torch.arange(10)).sum()) == 4  # two pairs moved
    assert len({tuple(p.tolist()) for p in maps}) == N_TASKS  # the domains disagree
    assert label_maps(swaps=0).eq(torch.arange(10)).all()


def test_domains_offsets_labels_and_determinism():
    d = make_domains(seed=0, num_samples=1000, offset=1.0, swaps=2)
    assert d.x_train.shape[1] == 40 and set(d.t_train.tolist()) == set(range(N_TASKS))
    counts = torch.bincount(d.t_test, minlength=N_TASKS)
    assert counts.max() - counts.min() <= 1
    means = [float(d.x_train[d.t_train == t].mean()) for t in range(N_TASKS)]
    assert np.allclose(np.diff(means), 1.0, atol=0.25)  # offset·(d − 1.5): one step per domain
    maps = label_maps(swaps=2)
    torch.testing.assert_close(d.y_train, maps[d.t_train, d.y0_train])
    d2 = make_domains(seed=0, num_samples=1000)
    torch.testing.assert_close(d.x_test, d2.x_test, rtol=0, atol=0)


def test_every_arm_gets_the_same_lr_grid_and_mola_arms_the_same_alpha_grid():
    cfg = Config()
    lrs = {a: sorted({lr for lr, _ in arm_grid(a, cfg)}) for a in ARMS}
    assert all(v == sorted(cfg.lrs) for v in lrs.values())
    for a in ("mola_grad", "mola_router", "mola_router_twd"):
        assert len(arm_grid(a, cfg)) == len(cfg.lrs) * len(cfg.alpha_over_r)


def test_same_seed_same_numbers():
    cfg = Config(seeds=(3,), num_samples=600, hidden=16, epochs=1, pretrain_epochs=1)
    data = make_domains(seed=3, num_samples=600)
    bb = pretrained_backbone(data, cfg, 3)
    a = train_arm("mola_router_twd", data, cfg, 3, backbone=bb, lr=1e-3)
    b = train_arm("mola_router_twd", data, cfg, 3, backbone=bb, lr=1e-3)
    assert a["metrics"] == b["metrics"]
    torch.testing.assert_close(a["gates_test"], b["gates_test"], rtol=0, atol=0)


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
    (dict(lrs=(1e-3, 0.0)), "lrs"),
    (dict(alpha_over_r=()), "alpha_over_r"),
    (dict(swaps=6), "swaps"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_config_cli_overrides():
    cfg = Config.quick().with_overrides({"rank": "8", "tau": "0.5", "seeds": "1,2"})
    assert cfg.rank == 8 and cfg.tau == 0.5 and cfg.seeds == (1, 2)
    assert Config().threads == 1 and len(Config().seeds) == 5
