"""MoLA reproduction: data, sampler, loss and metric helpers, config validation, and one quick run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml24.common.progress import set_quiet
from icml24.common.results import ClaimCheck, verdict
from icml24.mola.experiment import (
    ARMS,
    CLAIMS,
    CONFLICT_CHECK,
    CONFLICT_GUARDS,
    MOLA_ARMS,
    N_TASKS,
    TUNING_GUARDS,
    Config,
    arm_grid,
    build_arm,
    cosine_gap,
    domain_heads,
    input_maps,
    make_domains,
    nearest_centroid_task_acc,
    pretrained_backbone,
    run,
    stratified_batches,
    task_sum_ce,
    train_arm,
    train_job,
    tune_arm,
)
from tests.shared_checker import check_results_file


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
    n_tuning = sum(1 + (a in MOLA_ARMS) for a in TUNING_GUARDS)
    assert [c.kind for c in res.claim_checks] == ["claim", "claim", "sanity", "mechanism"] + ["sanity"] * n_tuning
    for c in res.claim_checks[:4]:  # every comparison is a paired interval over the seeds of this run
        d = [r["metrics"][c.method_arm][c.metric] - r["metrics"][c.baseline_arm][c.metric] for r in res.per_seed]
        assert c.measured == pytest.approx(float(np.mean(d)))
        assert c.n == 2 and c.ci_low <= c.measured <= c.ci_high
        assert c.passed == (c.ci_low >= c.threshold)
    grad, twd, conflict, gates = res.claim_checks[:4]
    assert (grad.method_arm, grad.baseline_arm, twd.method_arm, twd.baseline_arm) == (
        "mola_grad", "hps", "mola_router_twd", "hps")
    assert (conflict.method_arm, conflict.baseline_arm, conflict.threshold) == ("stl", "hps", 0.0)
    assert conflict.name == CONFLICT_CHECK
    assert [c.threshold for c in (grad, twd, gates)] == [0.0, 0.0, 0.1]
    v = res.verdict  # schema 3: claims_total counts the claims no failed guard voids
    assert v["claims_total"] + v["claims_void"] == 2 and v["mechanisms_total"] == 1
    if not conflict.passed:  # no conflict, no verdict
        assert res.label.startswith("inconclusive")


def test_quick_run_learns_and_counts_parameters(quick_result):
    res, _ = quick_result
    for arm in ARMS:
        assert res.summary[arm]["mean_acc"]["mean"] > 15.0, arm  # chance is 10%
    hps, grad = res.summary["hps"]["params"]["mean"], res.summary["mola_grad"]["params"]["mean"]
    h = Config.quick().hidden
    assert grad - hps == N_TASKS * Config.quick().rank * ((40 + h) + (h + h))  # experts on the two hidden layers
    assert hps == (40 * h + h) + (h * h + h) + N_TASKS * (10 * h + 10)  # features + one head per domain
    assert "gate_task_acc" not in res.summary["hps"] and "gate_task_acc" in res.summary["mola_router_twd"]


def test_input_maps_are_identity_then_fixed_permutations_or_rotations():
    for kind in ("permute", "rotate"):
        m = input_maps(kind)
        assert m.shape == (N_TASKS, 40, 40) and torch.equal(m[0], torch.eye(40))
        for md in m[1:]:
            torch.testing.assert_close(md @ md.T, torch.eye(40), atol=1e-5, rtol=0)  # orthogonal
            assert not torch.allclose(md, torch.eye(40))
            if kind == "permute":
                assert set(md.flatten().tolist()) == {0.0, 1.0} and md.sum(0).eq(1).all()
        assert len({tuple(x.flatten().tolist()) for x in m}) == N_TASKS  # the domains differ
        torch.testing.assert_close(m, input_maps(kind), rtol=0, atol=0)  # fixed
    assert input_maps("none").eq(torch.eye(40)).all()
    with pytest.raises(ValueError, match="conflict"):
        input_maps("swap")


def test_domains_maps_offsets_labels_and_determinism():
    from icml24.common.data import load_mnist1d
    d = make_domains(seed=0, num_samples=1000, offset=1.0, conflict="permute")
    assert d.x_train.shape[1] == 40 and set(d.t_train.tolist()) == set(range(N_TASKS))
    counts = torch.bincount(d.t_test, minlength=N_TASKS)
    assert counts.max() - counts.min() <= 1
    s = load_mnist1d(seed=0, val_fraction=0.2, num_samples=1000)
    torch.testing.assert_close(d.y_train, s.y_train, rtol=0, atol=0)  # original labels: each domain has its head
    z = (s.x_train - s.x_train.mean()) / s.x_train.std()
    m = input_maps("permute")
    for t in range(N_TASKS):  # domain t: M_t z + offset·(t − 1.5)
        k = d.t_train == t
        torch.testing.assert_close(d.x_train[k], z[k] @ m[t].T + (t - 1.5), atol=1e-5, rtol=0)
    d2 = make_domains(seed=0, num_samples=1000)
    torch.testing.assert_close(d.x_test, d2.x_test, rtol=0, atol=0)


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_has_its_own_head_per_domain(arm):
    cfg = Config(hidden=8)
    data = make_domains(seed=0, num_samples=600)
    bb = pretrained_backbone(data, Config(hidden=8, pretrain_epochs=1), 0)
    net = build_arm(arm, bb, cfg)
    heads = domain_heads(net)
    assert len(heads) == N_TASKS and all(isinstance(h, torch.nn.Linear) for h in heads)
    assert len({id(h.weight) for h in heads}) == N_TASKS  # distinct parameters, not one head shared
    for h in heads:  # each starts from the pretrained head
        torch.testing.assert_close(h.weight, bb[-1].weight, rtol=0, atol=0)
    x, t = data.x_test[:64], data.t_test[:64]
    for d, name in ((1, "bias"), (0, "weight"), (2, "weight")):  # a change to domain d's head (its weight or its
        with torch.no_grad():                                       # bias) moves domain d's logits only
            before = net(x, t)
            getattr(heads[d], name).add_(1.0)
            diff = (net(x, t) - before).abs().amax(1)
        assert torch.all(diff[t != d] == 0), (d, name)
        assert (diff[t == d].min() > 0.5) if name == "bias" else (diff[t == d].max() > 0), (d, name)


def test_every_arm_gets_the_same_lr_grid_and_mola_arms_the_same_alpha_grid():
    cfg = Config()
    lrs = {a: sorted({lr for lr, _ in arm_grid(a, cfg)}) for a in ARMS}
    assert all(v == sorted(cfg.lrs) for v in lrs.values())
    for a in ("mola_grad", "mola_router", "mola_router_twd"):
        assert len(arm_grid(a, cfg)) == len(cfg.lrs) * len(cfg.alpha_over_r)
    flat = {a: tune_arm(a, cfg, lambda lr, al: [50.0, 51.0, 49.0]) for a in ARMS}  # a flat curve: no extension
    for a, t in flat.items():
        assert t["lr"].declared == list(cfg.lrs) and t["lr"].max_extra == cfg.grid_extra and not t["lr"].extensions
        assert (t["alpha_over_r"] is None) == (a not in MOLA_ARMS)
        if t["alpha_over_r"] is not None:
            assert t["alpha_over_r"].declared == list(cfg.alpha_over_r) and t["alpha_over_r"].max_extra == cfg.grid_extra


def test_tune_arm_tunes_lr_inside_alpha_and_extends_both_grids():
    calls = []

    def point(lr, a):  # validation accuracy peaks at lr = 1e-2 for every α/r, and at α/r = 8 (past the grid's top)
        calls.append((lr, a))
        base = 90.0 - 20.0 * (math.log10(lr) + 2) ** 2 - 5.0 * (math.log2(a) - 3) ** 2
        return [base + e for e in (-0.1, 0.0, 0.1)]

    cfg = Config(grid_extra=2)
    t = tune_arm("mola_grad", cfg, point)
    a = t["alpha_over_r"]
    assert a.extensions == [16.0] and a.value == 4.0 and a.ok and a.grid == [1.0, 4.0, 16.0]  # 4 and 16 tie at 8
    assert set(t["lr_per_alpha"]) == {1.0, 4.0, 16.0} and t["lr"] is t["lr_per_alpha"][4.0]
    assert all(x.value == pytest.approx(1e-2) and x.ok and not x.extensions for x in t["lr_per_alpha"].values())
    assert len(calls) == len(set(calls)) == 3 * len(cfg.lrs)  # every (lr, α/r) trained once
    # an lr that keeps improving past the top of the grid extends it, up to grid_extra points
    t = tune_arm("hps", Config(grid_extra=1), lambda lr, al: [math.log10(lr) + e for e in (-0.01, 0.0, 0.01)])
    assert t["alpha_over_r"] is None and t["lr"].extensions == [pytest.approx(9e-2)] and not t["lr"].ok


def test_quick_run_writes_schema3_that_the_shared_checker_accepts(quick_result):
    _, out = quick_result
    check_results_file(out / "results.json")
    extra = json.loads((out / "results.json").read_text())["extra"]
    for arm in ARMS:  # every tuning (and its extensions) is recorded
        t = extra["tuning"][arm]
        assert t["lr"]["picked"] == extra["tuned"][arm]["lr"] and len(t["lr"]["extensions"]) <= 1
        assert (t["alpha_over_r"] is None) == (arm not in MOLA_ARMS)


def test_quick_guards_name_exactly_their_claims(quick_result):
    res, _ = quick_result
    grad, twd, conflict, _gates, *tuning = res.claim_checks
    assert (grad.name, twd.name) == (CLAIMS["mola_grad"], CLAIMS["mola_router_twd"])
    assert conflict.guards == list(CONFLICT_GUARDS) == [grad.name, twd.name]  # the regime guards both claims
    assert conflict.detail.startswith("the regime:")
    assert all(c.detail.startswith("tuning:") and c.guards == TUNING_GUARDS[c.method_arm] for c in tuning)
    assert {c.method_arm for c in tuning} == {"hps", "mola_grad", "mola_router_twd"}
    failed = {c.name for c in res.checks("sanity") if not c.passed}
    for c in (grad, twd):
        assert c.void_by == sorted(s.name for s in res.checks("sanity")
                                   if s.name in failed and (not s.guards or c.name in s.guards))

    def sanity(c, ok):
        return ClaimCheck(name=c.name, metric=c.metric, measured=float(ok), threshold=1.0, direction=">=",
                          kind="sanity", guards=c.guards)
    # a MoLA-Grad tuning check that fails voids only the MoLA-Grad claim; HPS's voids both
    for arm, void in (("mola_grad", [True, False]), ("mola_router_twd", [False, True]), ("hps", [True, True])):
        checks = [grad, twd, sanity(conflict, True), *(sanity(c, c.method_arm != arm) for c in tuning)]
        v = verdict(checks)
        assert [bool(c.void_by) for c in checks[:2]] == void and v["claims_void"] == sum(void)
    # a failed conflict check (no regime) voids exactly the claims it names, both, with every tuning check passing
    checks = [grad, twd, sanity(conflict, False), *(sanity(c, True) for c in tuning)]
    v = verdict(checks)
    assert v["label"].startswith("inconclusive (0/2 testable)") and v["claims_void"] == 2
    assert all(c.void_by == [CONFLICT_CHECK] for c in checks[:2])
    checks = [grad, twd, sanity(conflict, True), *(sanity(c, True) for c in tuning)]
    assert verdict(checks)["claims_void"] == 0 and not any(c.void_by for c in checks[:2])


def test_same_seed_same_numbers():
    cfg = Config(seeds=(3,), num_samples=600, hidden=16, epochs=1, pretrain_epochs=1)
    data = make_domains(seed=3, num_samples=600)
    bb = pretrained_backbone(data, cfg, 3)
    a = train_arm("mola_router_twd", data, cfg, 3, backbone=bb, lr=1e-3)
    b = train_arm("mola_router_twd", data, cfg, 3, backbone=bb, lr=1e-3)
    assert a["metrics"] == b["metrics"]
    torch.testing.assert_close(a["gates_test"], b["gates_test"], rtol=0, atol=0)


def test_train_job_equals_train_arm_and_keeps_gates_of_the_first_seed_only():
    cfg = Config(seeds=(3, 4), num_samples=600, hidden=8, epochs=1, pretrain_epochs=1, workers=1)
    a = train_job(cfg, ("mola_router", 4, 1e-3, 1.0))
    data = make_domains(seed=4, num_samples=600, offset=cfg.offset, conflict=cfg.conflict)
    b = train_arm("mola_router", data, cfg, 4, backbone=pretrained_backbone(data, cfg, 4), lr=1e-3, alpha_over_r=1.0)
    assert a["metrics"] == b["metrics"] and "gates_test" not in a
    assert "gates_test" in train_job(cfg, ("mola_router", 3, 1e-3, 1.0))


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
    (dict(alpha_over_r=(4.0,)), "alpha_over_r must hold >= 2"),
    (dict(lrs=(1e-3, 1e-3)), "lrs must hold >= 2"),
    (dict(grid_extra=-1), "grid_extra"),
    (dict(conflict="swap"), "conflict must be one of"),
    (dict(workers=0), "workers"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_config_cli_overrides():
    cfg = Config.quick().with_overrides({"rank": "8", "tau": "0.5", "seeds": "1,2"})
    assert cfg.rank == 8 and cfg.tau == 0.5 and cfg.seeds == (1, 2)
    assert Config().threads == 1 and len(Config().seeds) == 5


@pytest.mark.slow
def test_run_gives_the_same_numbers_in_one_or_two_processes(tmp_path):
    set_quiet(True)
    cfg = Config(seeds=(0, 1), num_samples=600, hidden=8, pretrain_epochs=1, epochs=1, lrs=(3e-3, 1e-2),
                 grid_extra=0, workers=1)
    one = run(cfg, tmp_path / "one")
    two = run(cfg.with_overrides({"workers": "2"}), tmp_path / "two")
    assert one.per_seed == two.per_seed
