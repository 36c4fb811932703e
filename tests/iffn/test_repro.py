"""Quick reproduction of the IFFN experiment (one quick run shared by every check of this module), the tokens task,
the toy tier's FLOP-matched arm, the 1-D ViT, the arms and the validation-only model selection."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from icml24.common.data import Split
from icml24.common.results import ClaimCheck, verdict
from icml24.iffn import IFFN, AGeLU, count_flops
from icml24.iffn.experiment import (
    ALL_ARMS,
    TOY_ARMS,
    Config,
    ViT1D,
    build_vit,
    ffn_costs,
    load_tokens,
    parse_arm,
    run,
    token_scores,
    token_teacher,
    toy_data,
    toy_flops,
    toy_matched_width,
    toy_model,
    train_toy,
    train_vit,
    tune_lr,
    tune_toy_lr,
    tuning_guards,
)
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("iffn_quick")
    return run(Config.quick(), out), out


def test_quick_run_writes_results(quick_result):
    result, out = quick_result
    data = json.loads((out / "results.json").read_text())
    assert data["slug"] == "iffn" and data["mode"] == "quick"
    assert (out / "report.md").exists()
    for png in ("vit_pareto.png", "vit_curves.png", "toy_mse.png"):
        assert (out / png).stat().st_size > 0


def test_quick_checks_kinds_and_pairing(quick_result):
    result, _ = quick_result
    cfg = Config.quick()
    kinds = [c.kind for c in result.claim_checks]
    assert kinds.count("claim") == 5 and kinds.count("sanity") == 4 + len(tuning_guards(cfg))
    assert kinds.count("mechanism") == 4
    lm = math.log(cfg.toy_margin)
    expected = [("toy_iffn_half", "toy_ffn_full", lm, "<=", "log_mse"),
                ("toy_iffn_half", "toy_ffn_matched", 0.0, "<=", "log_mse"),
                (cfg.claim_method, cfg.claim_matched, 0.0, ">=", "acc"),
                (cfg.claim_method, cfg.claim_full, -cfg.acc_margin, ">=", "acc"),
                (cfg.claim_agelu, cfg.claim_gelu, 0.0, ">=", "acc")]
    for c, (m, b, thr, direction, metric) in zip(result.checks("claim"), expected, strict=True):
        assert (c.method_arm, c.baseline_arm, c.threshold, c.direction, c.metric) == (m, b, thr, direction, metric)
        d = [r["metrics"][m][metric] - r["metrics"][b][metric] for r in result.per_seed]
        assert c.measured == pytest.approx(sum(d) / len(d)) and c.n == len(d)
        assert c.ci_low <= c.measured <= c.ci_high
        assert c.passed == (c.ci_low >= thr if direction == ">=" else c.ci_high <= thr)
    # the toy metric is the per-seed mean over h of the log test MSE
    for row in result.per_seed:
        for a in TOY_ARMS:
            logs = [math.log(row["metrics"][f"toy_h{h}_{a}"]["mse"]) for h in cfg.toy_hidden]
            assert row["metrics"][f"toy_{a}"]["log_mse"] == pytest.approx(sum(logs) / len(logs))
    toy_regime, toy_control, regime, control = result.checks("sanity")[:4]
    assert (toy_regime.method_arm, toy_regime.baseline_arm, toy_regime.threshold, toy_regime.direction) == (
        "toy_ffn_half", "toy_ffn_full", 0.0, ">=")
    # the toy negative control is the toy non-inferiority test applied to FFN(h/2): it must put it above the margin
    assert (toy_control.method_arm, toy_control.baseline_arm, toy_control.direction) == ("toy_ffn_half",
                                                                                         "toy_ffn_full", ">=")
    assert toy_control.threshold == pytest.approx(lm) and toy_control.passed == (toy_control.ci_low >= lm)
    assert toy_regime.passed == (toy_regime.ci_low >= 0.0)
    assert (regime.method_arm, regime.baseline_arm, regime.threshold) == (cfg.claim_full, cfg.claim_reduced,
                                                                          cfg.regime_gap)
    # the negative control is the non-inferiority test applied to FFN r1: it must put FFN r1 below -margin
    assert (control.method_arm, control.baseline_arm, control.direction) == (cfg.claim_reduced, cfg.claim_full, "<=")
    assert control.passed == (control.ci_high <= -cfg.acc_margin)


def test_quick_flop_mechanisms_hold_by_construction(quick_result):
    result, out = quick_result
    s = result.summary
    f = {a: s[a]["ffn_kflops"]["mean"] for a in ("ffn_r4", "ffn_r2", "ffn_r1", "iffn_r1")}
    assert f["ffn_r4"] == pytest.approx(4 * f["ffn_r1"]) and f["ffn_r2"] == pytest.approx(2 * f["ffn_r1"])
    assert 1.0 < f["iffn_r1"] / f["ffn_r2"] <= 1.05  # fc1 + fc2(3C') = FFN r2, plus the small (1, k) conv
    mechs = [c for c in result.checks("mechanism") if "FLOPs" in c.name]
    assert len(mechs) == 3 and all(c.passed for c in mechs)
    extra = json.loads((out / "results.json").read_text())["extra"]
    for h in Config.quick().toy_hidden:  # the toy's FLOP-matched FFN costs what the IFFN costs, counted
        fl = extra["toy_flops_per_sample"][f"h{h}"]
        assert fl["ffn_matched"] == fl["iffn_half"] and fl["ffn_half"] < fl["iffn_half"] < fl["ffn_full"]


def test_quick_model_selection_and_lr_record(quick_result):
    result, out = quick_result
    cfg = Config.quick()
    extra = json.loads((out / "results.json").read_text())["extra"]
    for arm in cfg.vit_arms:
        t = extra["tuning"][arm]
        lr = extra["tuned_lr"][arm]
        assert lr == t["picked"] and lr in t["grid"] and t["declared"] == list(cfg.lr_grid)
        assert sorted(t["declared"] + t["extensions"]) == t["grid"] and len(t["extensions"]) <= cfg.grid_extra
        sweep = extra["lr_sweep_val_acc"][arm]
        assert set(sweep) == {str(v) for v in t["grid"]}
        assert sweep[str(lr)] == max(sweep.values())  # one tuning seed: the pick is the validation best
        assert t["ok"] == (t["grid"][0] < lr < t["grid"][-1]) and (arm in extra["lr_at_grid_edge"]) == (not t["ok"])
        row0 = result.per_seed[0]["metrics"][arm]
        assert row0["val_acc"] == sweep[str(lr)] and row0["lr"] == lr  # the tuning run is seed 0's final run
        for row in result.per_seed:
            assert 1 <= row["metrics"][arm]["best_epoch"] <= cfg.epochs
            assert row["metrics"][arm]["acc"] > 45.0  # above the largest class (~31%) even in the 3-epoch quick run
    for h in cfg.toy_hidden:  # the toy lr is tuned per arm and h on the first seed's validation MSE
        for a in TOY_ARMS:
            t = extra["toy_tuning"][f"h{h}_{a}"]
            assert t["declared"] == list(cfg.toy_lr_grid) and len(t["extensions"]) <= cfg.grid_extra
            for row in result.per_seed:
                assert row["metrics"][f"toy_h{h}_{a}"]["lr"] == t["picked"]


def test_quick_run_writes_schema3_that_the_shared_checker_accepts(quick_result):
    _, out = quick_result
    data = json.loads((out / "results.json").read_text())
    assert data["schema_version"] == 3 and "claims_void" in data["verdict"]
    check_results_file(out / "results.json")


def test_quick_guards_name_exactly_their_claims(quick_result):
    result, _ = quick_result
    cfg = Config.quick()
    toy_full, toy_matched, matched, full, agelu = (c.name for c in result.checks("claim"))
    toy_regime, toy_control, regime, control, *tuning = result.checks("sanity")
    assert toy_regime.guards == [toy_full, toy_matched] and toy_control.guards == [toy_full]
    assert regime.guards == [matched, full] and control.guards == [full]
    for c in (toy_regime, regime):
        assert c.detail.startswith("the regime:")
    for c in (toy_control, control):
        assert c.detail.startswith("negative control:")
    guards = tuning_guards(cfg)
    assert {c.method_arm: c.guards for c in tuning} == guards
    assert guards[cfg.claim_gelu] == [agelu] and guards[cfg.claim_matched] == [matched]
    assert guards[cfg.claim_full] == [full] and guards[cfg.claim_reduced] == [matched, full]
    assert guards[cfg.claim_method] == [matched, full] and all(c.detail.startswith("tuning:") for c in tuning)
    assert guards["toy_iffn_half"] == [toy_full, toy_matched] and guards["toy_ffn_full"] == [toy_full]
    assert guards["toy_ffn_matched"] == [toy_matched] and guards["toy_ffn_half"] == [toy_full, toy_matched]
    assert {c.n for c in tuning if c.method_arm.startswith("toy_")} == {len(cfg.toy_hidden)}  # one pick per h
    failed = {c.name for c in result.checks("sanity") if not c.passed}
    for c in result.checks("claim"):
        assert c.void_by == sorted(s.name for s in result.checks("sanity") if s.name in failed and c.name in s.guards)

    def sanity(c, ok):
        return ClaimCheck(name=c.name, metric=c.metric, measured=float(ok), threshold=1.0, direction=">=",
                          kind="sanity", guards=c.guards)

    # a failed ViT regime check alone voids the two ViT width claims and leaves the other three to vote
    checks = [*result.checks("claim"), sanity(toy_regime, True), sanity(toy_control, True), sanity(regime, False),
              sanity(control, True), *(sanity(c, True) for c in tuning)]
    v = verdict(checks)
    assert [c.void_by for c in checks[:5]] == [[], [], [regime.name], [regime.name], []]
    assert v["claims_void"] == 2
    # a failed toy regime check voids the two toy claims only
    checks = [*result.checks("claim"), sanity(toy_regime, False), sanity(toy_control, True), sanity(regime, True),
              sanity(control, True), *(sanity(c, True) for c in tuning)]
    verdict(checks)
    assert [bool(c.void_by) for c in checks[:5]] == [True, True, False, False, False]
    # a failed tuning check of the GeLU arm voids only the AGeLU claim; of the toy's matched FFN only its claim
    checks = [*result.checks("claim"), *(sanity(c, True) for c in (toy_regime, toy_control, regime, control)),
              *(sanity(c, c.method_arm not in (cfg.claim_gelu, "toy_ffn_matched")) for c in tuning)]
    verdict(checks)
    assert [bool(c.void_by) for c in checks[:5]] == [False, True, False, False, True]


def test_tune_lr_extends_past_a_winning_edge_and_keeps_every_run(monkeypatch):
    import icml24.iffn.experiment as ex

    calls = []

    def fake(arm, split, lr, cfg, seed):  # validation accuracy peaks at lr = 4e-2, above the declared grid
        calls.append(lr)
        acc = 90.0 - 10.0 * (math.log10(lr) - math.log10(4e-2)) ** 2
        return {"val_acc": acc, "acc": acc - 1.0}, None

    monkeypatch.setattr(ex, "_train_arm", fake)
    cfg = dataclasses.replace(Config.quick(), lr_grid=(2.5e-3, 5e-3, 1e-2), grid_extra=2)
    runs: dict = {}
    t = tune_lr("ffn_r4", None, cfg, 0, runs)
    assert t.extensions == pytest.approx([2e-2, 4e-2]) and t.value == pytest.approx(4e-2) and not t.ok  # budget spent
    t = tune_lr("ffn_r4", None, dataclasses.replace(cfg, grid_extra=3), 0, runs)
    assert t.extensions == pytest.approx([2e-2, 4e-2, 8e-2]) and t.value == pytest.approx(4e-2) and t.ok
    assert set(runs) == set(t.grid)
    assert t.at("acc") == [pytest.approx(89.0)]
    t = tune_lr("ffn_r4", None, dataclasses.replace(cfg, grid_extra=0), 0, {})
    assert t.extensions == [] and t.value == pytest.approx(1e-2) and not t.ok


def test_tune_toy_lr_minimises_validation_mse_and_extends_past_a_winning_edge(monkeypatch):
    import icml24.iffn.experiment as ex

    def fake(arm, h, data, lr, cfg, seed):  # validation MSE is lowest at lr = 0.09, above the declared grid
        v = 0.2 + (math.log10(lr) - math.log10(0.09)) ** 2
        return {"val_mse": v, "mse": v + 0.01}

    monkeypatch.setattr(ex, "_train_toy_arm", fake)
    cfg = dataclasses.replace(Config.quick(), toy_lr_grid=(1e-3, 3e-3, 1e-2), grid_extra=2)
    t = tune_toy_lr("ffn_full", 8, None, cfg, 0)
    assert t.extensions == pytest.approx([1e-2 * 10 / 3, 1e-2 * (10 / 3) ** 2]) and not t.maximize
    assert t.value == pytest.approx(1e-2 * (10 / 3) ** 2) and t.at("mse")[0] == pytest.approx(
        t.at("val_mse")[0] + 0.01)


def test_quick_toy_regime_direction(quick_result):
    """Robust direction on the teacher toy (mean over 2 seeds, loose margin): halving a plain FFN costs MSE."""
    s = quick_result[0].summary
    assert s["toy_h8_ffn_half"]["mse"]["mean"] > 1.1 * s["toy_h8_ffn_full"]["mse"]["mean"]


def test_quick_run_records_the_spread_of_learned_shifts(quick_result):
    result, out = quick_result
    cfg = Config.quick()
    spread = json.loads((out / "results.json").read_text())["extra"]["agelu_shift_spread"]
    assert set(spread) == {"iffn_r1", "iffn_n1_r1"}  # the arms with learnable AGeLUs in the quick config
    for arm, n in (("iffn_r1", cfg.n_instances), ("iffn_n1_r1", 1)):
        assert set(spread[arm]) == {str(s) for s in cfg.seeds}
        for stats in spread[arm].values():
            assert stats["n_layers"] == cfg.depth and stats["n_values"] == cfg.depth * n * cfg.embed_dim
            assert stats["min"] <= stats["mean"] <= stats["max"] and stats["std"] > 0
            assert stats["moved_max_abs"] > 0  # training moved the shifts away from their init
            assert len(stats["per_instance_mean"]) == n


# ------------------------------------------------------------------------------- selection on validation
def _tiny_split(seed: int = 0) -> Split:
    cfg = dataclasses.replace(Config.quick(), tok_n_train=64, tok_n_val=16, tok_n_test=16)
    return load_tokens(cfg, seed)


def test_train_vit_selects_the_epoch_on_validation_only():
    cfg = dataclasses.replace(Config.quick(), epochs=4)
    split = _tiny_split()
    torch.manual_seed(0)
    a = train_vit(build_vit("iffn_r1", cfg, "cpu"), split, lr=3e-3, cfg=cfg, seed=0)
    best = max(range(cfg.epochs), key=lambda e: (a["val_curve"][e], -e))
    assert a["best_epoch"] == best + 1 and a["acc"] == a["test_curve"][best] and a["val_acc"] == a["val_curve"][best]
    assert a["last_acc"] == a["test_curve"][-1]
    # other test labels change the reported test numbers but never the selected epoch
    flipped = Split(split.x_train, split.y_train, split.x_test, (split.y_test + 1) % split.n_classes,
                    split.n_classes, split.x_val, split.y_val)
    torch.manual_seed(0)
    b = train_vit(build_vit("iffn_r1", cfg, "cpu"), flipped, lr=3e-3, cfg=cfg, seed=0)
    assert b["val_curve"] == a["val_curve"] and b["best_epoch"] == a["best_epoch"]
    assert b["test_curve"] != a["test_curve"]
    # same seed, same numbers; another seed, other numbers
    torch.manual_seed(0)
    c = train_vit(build_vit("iffn_r1", cfg, "cpu"), split, lr=3e-3, cfg=cfg, seed=0)
    assert c["val_curve"] == a["val_curve"] and c["test_curve"] == a["test_curve"]
    with pytest.raises(ValueError, match="lr must be"):
        train_vit(build_vit("ffn_r1", cfg, "cpu"), split, lr=0.0, cfg=cfg, seed=0)


# ------------------------------------------------------------------------------------------- model and arms
def test_vit1d_shapes_tokens_and_errors():
    vit = ViT1D(patch_size=4, stride=2, embed_dim=16, depth=1, num_heads=2, pool="cls")
    assert vit.num_patches == 19 and vit.num_prefix_tokens == 1
    x = torch.randn(3, 40)
    assert vit.tokens(x).shape == (3, 20, 16) and vit(x).shape == (3, 10)
    # token t (t >= 1) is the embedding of samples [2(t-1), 2(t-1) + 4) plus its position
    with torch.no_grad():
        ref = vit.patch_embed(x[:, 6:10]) + vit.pos_embed[0, 4]
    torch.testing.assert_close(vit.tokens(x)[:, 4], ref)
    mean = ViT1D(patch_size=4, stride=4, embed_dim=16, depth=1, num_heads=2)
    assert mean.num_prefix_tokens == 0 and mean.cls_token is None and mean.tokens(x).shape == (3, 10, 16)
    with torch.no_grad():  # the head reads the mean of the normalised tokens
        ref = mean.head(mean.norm(mean.blocks(mean.tokens(x))).mean(1))
    torch.testing.assert_close(mean(x), ref)
    with pytest.raises(ValueError, match=r"expects \(B, 40\)"):
        vit(torch.randn(3, 1, 40))
    with pytest.raises(ValueError, match="patch_size"):
        ViT1D(patch_size=41)
    with pytest.raises(ValueError, match="pool must be one of"):
        ViT1D(pool="max")


def test_cls_pooling_leaves_a_one_block_conv_branch_dead_and_mean_pooling_does_not():
    """Why MNIST-1D pools by mean: with a cls head, one block's FFN only matters on the cls token, which skips the
    depthwise conv, so the conv gets no gradient."""
    grads = {}
    for pool in ("cls", "mean"):
        cfg = dataclasses.replace(Config(), vit_task="mnist1d", patch_size=4, patch_stride=4, patch_circular=False,
                                  depth=1, pool=pool)
        torch.manual_seed(0)
        vit = build_vit("iffn_r1", cfg, "cpu")
        vit(torch.randn(4, 40)).square().sum().backward()
        grads[pool] = vit.blocks[0].mlp.dwconv.weight.grad.abs().sum().item()
    assert grads["cls"] == 0.0 and grads["mean"] > 0


def test_vit1d_circular_patches_and_token_head():
    """Tokens task: patch t covers token t and its right neighbour (cyclic), and the head predicts every token."""
    cfg = Config()
    vit = build_vit("ffn_r1", cfg, "cpu")
    p, L = cfg.tok_dim, cfg.tok_len
    assert vit.num_patches == cfg.num_patches == L and vit.num_prefix_tokens == 0
    x = torch.randn(3, cfg.series_length)
    tok = x.reshape(3, L, p)
    with torch.no_grad():
        for t in (0, 5, L - 1):
            ref = vit.patch_embed(torch.cat([tok[:, t], tok[:, (t + 1) % L]], -1)) + vit.pos_embed[0, t]
            torch.testing.assert_close(vit.tokens(x)[:, t], ref)
        out = vit(x)
        torch.testing.assert_close(out, vit.head(vit.norm(vit.blocks(vit.tokens(x)))))
    assert out.shape == (3, L, cfg.tok_classes)


def test_tokens_task_labels_each_token_by_itself_and_its_right_neighbour():
    cfg = dataclasses.replace(Config.quick(), tok_n_train=40, tok_n_val=8, tok_n_test=16)
    w1, b1, w2, offset = token_teacher(cfg)
    split = load_tokens(cfg, 3)
    x = split.x_train.reshape(-1, cfg.tok_len, cfg.tok_dim)
    assert split.y_train.shape == (40, cfg.tok_len) and split.x_train.shape == (40, cfg.series_length)
    for i in range(3):  # slow reference: one token at a time, right neighbour cyclic, GeLU's even part
        for t in range(cfg.tok_len):
            u = torch.cat([x[i, t], x[i, (t + 1) % cfg.tok_len]]) @ w1 + b1
            s = (torch.nn.functional.gelu(u) - u / 2) @ w2 - offset
            assert split.y_train[i, t] == s.argmax()
    u = torch.linspace(-4, 4, 81)
    phi = torch.nn.functional.gelu(u) - u / 2
    torch.testing.assert_close(phi, phi.flip(0))  # the teacher's activation is even: no linear part
    # changing the right neighbour (token 3) changes token 2's scores; tokens 2 and 3 are the only ones touched
    x2 = x.clone()
    x2[:, 3] = torch.randn(x2[:, 3].shape, generator=torch.Generator().manual_seed(0))
    s1, s2 = token_scores(x, (w1, b1, w2, offset)), token_scores(x2, (w1, b1, w2, offset))
    moved = (s1 - s2).abs().amax((0, 2)) > 0
    assert moved.tolist() == [t in (2, 3) for t in range(cfg.tok_len)]
    # no class dominates; the test set is fixed by task_seed, the training data are drawn per seed
    freq = torch.bincount(load_tokens(dataclasses.replace(cfg, tok_n_test=500), 0).y_test.flatten()) / (
        500 * cfg.tok_len)
    assert len(freq) == cfg.tok_classes and freq.max() < 0.45 and freq.min() > 0.1
    other = load_tokens(cfg, 4)
    assert torch.equal(other.x_test, split.x_test) and not torch.equal(other.x_train, split.x_train)
    again = load_tokens(cfg, 3)
    assert torch.equal(again.x_train, split.x_train) and torch.equal(again.y_val, split.y_val)
    assert not torch.equal(load_tokens(dataclasses.replace(cfg, task_seed=1), 3).y_train, split.y_train)


@pytest.mark.parametrize("h", [8, 16, 32, 64])
def test_toy_flop_matched_ffn_costs_exactly_what_the_iffn_costs(h):
    cfg = Config()
    w = toy_matched_width(h, in_dim=cfg.toy_in_dim, out_dim=cfg.toy_out_dim, n_instances=cfg.n_instances)
    assert w == 3 * h // 4  # d = o, n = 2: d·h/2 + 2·(h/2)·d = 2·w·d
    x = torch.zeros(1, cfg.toy_in_dim)
    flops = {a: count_flops(toy_model(a, h, cfg, "cpu"), x) for a in TOY_ARMS}
    assert flops["ffn_matched"] == flops["iffn_half"] == toy_flops("iffn_half", h, cfg)
    assert flops["ffn_full"] == 2 * flops["ffn_half"] == 2 * 2 * cfg.toy_in_dim * h
    m = toy_model("ffn_matched", h, cfg, "cpu")
    assert m.fc1.out_features == w and not isinstance(m, IFFN)
    iffn = toy_model("iffn_half", h, cfg, "cpu")
    assert isinstance(iffn, IFFN) and iffn.hidden == h // 2 and not iffn.spatial and iffn.n_instances == 2
    # other shapes: w from the same FLOP equation, and an error when no integer width matches
    with pytest.raises(ValueError, match="no integer FLOP-matched width"):
        toy_matched_width(6, in_dim=16, out_dim=16, n_instances=2)
    assert toy_matched_width(12, in_dim=8, out_dim=4, n_instances=3) == (8 * 6 + 3 * 6 * 4) // 12


_EXPECTED = {  # kind -> (channel instances n, spatial, topology, learnable channel AGeLU, spatial act type)
    "iffn": (2, True, "parallel", True, AGeLU), "iffn_nospatial": (2, False, "parallel", True, None),
    "iffn_n1": (1, True, "parallel", True, AGeLU), "dwconv_gelu": (1, True, "parallel", False, nn.GELU),
    "shifted_gelu": (2, True, "parallel", False, nn.GELU), "iffn_serial": (2, True, "serial", True, None)}


@pytest.mark.parametrize("arm", ALL_ARMS)
def test_every_arm_builds_as_described_and_its_costs_match_the_counter(arm):
    cfg = Config()
    torch.manual_seed(0)
    vit = build_vit(arm, cfg, "cpu")
    mlp = vit.blocks[0].mlp
    kind, ratio = parse_arm(arm)
    c, n_tok = cfg.embed_dim, cfg.num_patches + vit.num_prefix_tokens
    if kind == "ffn":
        assert not isinstance(mlp, IFFN) and mlp.fc1.out_features == int(ratio * c)
        assert ffn_costs(vit)["ffn_kflops"] * 1e3 == cfg.depth * n_tok * 2 * (2 * c * int(ratio * c))
        return
    n, spatial, topology, learnable, sact = _EXPECTED[kind]
    assert (mlp.n_instances, mlp.spatial, mlp.topology, mlp.hidden) == (n, spatial, topology, c)
    assert isinstance(mlp.act.a, nn.Parameter) == learnable
    assert type(getattr(mlp, "spatial_act", None)) is (sact or type(None))
    if spatial:
        assert mlp.dwconv.kernel_size == (1, cfg.kernel_size) and mlp.grid_size == (1, cfg.num_patches)
    init_c = mlp.act.per_instance("c")[:, 0].tolist()
    assert init_c == ([-cfg.agelu_shift, cfg.agelu_shift] if n == 2 else [0.0])
    assert ffn_costs(vit)["ffn_kflops"] * 1e3 == cfg.depth * mlp.flops(batch_size=1, num_tokens=n_tok)
    assert sum(p.numel() for p in mlp.parameters()) == mlp.num_params()
    vit(torch.randn(2, cfg.series_length)).sum().backward()
    if spatial:
        assert vit.blocks[0].mlp.dwconv.weight.grad.abs().sum() > 0


def test_agelu_and_gelu_claim_arms_differ_only_in_learnable_activation_parameters():
    cfg = Config()
    torch.manual_seed(0)
    agelu = build_vit(cfg.claim_agelu, cfg, "cpu")
    torch.manual_seed(0)
    gelu = build_vit(cfg.claim_gelu, cfg, "cpu")
    extra = {n for n, _ in agelu.named_parameters()} - {n for n, _ in gelu.named_parameters()}
    assert extra and all(n.split(".")[-2] in ("act", "spatial_act") for n in extra)
    x = torch.randn(4, cfg.series_length)
    torch.testing.assert_close(agelu(x), gelu(x))  # AGeLU at its GeLU init computes the GeLU arm exactly


def test_same_seed_same_numbers_toy():
    cfg = dataclasses.replace(Config.quick(), toy_steps=20)
    a, b = toy_data("teacher", cfg, 3), toy_data("teacher", cfg, 3)
    assert len(a) == 6 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert [len(t) for t in a[::2]] == [cfg.toy_n_train, cfg.toy_n_val, cfg.toy_n_test]
    mse = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        mse.append(train_toy(toy_model("iffn_half", 8, cfg, "cpu"), toy_data("teacher", cfg, seed), cfg, seed,
                             lr=3e-3))
    assert mse[0] == mse[1] and mse[0] != mse[2] and set(mse[0]) == {"val_mse", "mse"}


@pytest.mark.parametrize("change,match", [
    ({"vit_arms": ("ffn_r4", "bogus_r1")}, "arm"),
    ({"vit_arms": ("ffn_r4", "ffn_r0")}, "ratio > 0"),
    ({"claim_method": "iffn_r2"}, "claim_method"),
    ({"claim_gelu": "shifted_gelu_r1"}, "claim_gelu"),
    ({"toy_hidden": (7,)}, "toy_hidden"),
    ({"toy_hidden": (6,)}, "no integer FLOP-matched width"),
    ({"toy_target": "bogus"}, "toy_target"),
    ({"toy_margin": 0.9}, "toy_margin"),
    ({"toy_lr_grid": (1e-2, 1e-3)}, "toy_lr_grid"),
    ({"vit_task": "bogus"}, "vit_task"),
    ({"vit_task": "mnist1d"}, "pool='token' goes with"),
    ({"pool": "mean"}, "pool='token' goes with"),
    ({"kernel_size": 4}, "kernel_size must be odd"),
    ({"lr_grid": (3e-3, 1e-3)}, "strictly increasing"),
    ({"lr_grid": (0.0,)}, "lr_grid"),
    ({"lr_grid": (1e-3,)}, ">= 2 values"),
    ({"grid_extra": -1}, "grid_extra"),
    ({"n_instances": 0}, "n_instances must be an int >= 1"),
    ({"num_heads": 3}, "divisible by num_heads"),
    ({"patch_size": 65}, "patch_size"),
    ({"pool": "max"}, "pool"),
])
def test_config_validation(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(Config.quick(), **change)


def test_cli_override_types():
    cfg = Config().with_overrides({"vit_arms": "ffn_r4,iffn_r1,ffn_r1,ffn_r2,iffn_n1_r1,dwconv_gelu_r1",
                                   "lr_grid": "0.001,0.01", "epochs": "3"})
    assert cfg.vit_arms[:3] == ("ffn_r4", "iffn_r1", "ffn_r1") and cfg.lr_grid == (0.001, 0.01) and cfg.epochs == 3


@pytest.mark.slow
def test_the_numbers_do_not_depend_on_the_process_count(tmp_path):
    """The jobs seed themselves, so 2 processes give the numbers of 1 (slow: two quick runs)."""
    rows = []
    for workers in (1, 2):
        r = run(dataclasses.replace(Config.quick(), workers=workers), tmp_path / f"w{workers}")
        rows.append([{a: {k: v for k, v in m.items() if k != "train_s"} for a, m in row["metrics"].items()}
                     for row in r.per_seed])
    assert rows[0] == rows[1]
