"""Learning-speed experiment: the baselines (LSTM, orthogonal RNN) and the wave initialisations, steps to
criterion with censoring, the tuning score, the claim statistic from per-seed numbers, the negative-control guard
and its scope."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from icml24.common.results import verdict
from icml24.common.tuning import tune_grid
from icml24.traveling_waves import (
    Curriculum,
    ElmanRNN,
    LSTMNet,
    eigenvalues,
    orthogonal_rnn,
    train_rnn,
    wave_init_rnn,
)
from icml24.traveling_waves.experiment import BASELINES, SPEED, STRICT, Config, speed_checks, tune_score
from icml24.traveling_waves.speed import SpeedSetting, build_arm, steps_to_criterion

ST = SpeedSetting(d=2, s=3, control_s=2, hidden=16, lstm_hidden=8, horizon=6, cap=40, check_every=10,
                  criterion=0.99, val_batches=1, test_batches=1, batch_size=16, clip=1.0)


def _orth_err(W: torch.Tensor) -> float:
    W = W.detach().double()
    return float((W @ W.T - torch.eye(W.shape[0], dtype=W.dtype)).abs().max())


@pytest.mark.parametrize("make", [lambda: LSTMNet(d=3, hidden=8), lambda: orthogonal_rnn(d=3, hidden=8),
                                  lambda: wave_init_rnn(d=3, hidden=8, s=2)])
def test_baselines_construct_and_train_a_step(make):
    torch.manual_seed(0)
    m = make()
    x = torch.randn(4, 7, 3)
    assert m(x).shape == (4, 7, 3) and m.hidden_states(x).shape == (4, 7, 8)
    before = [p.detach().clone() for p in m.parameters()]
    r = train_rnn(m, task="T1", s=2, steps=1, generator=torch.Generator().manual_seed(1), val_generator_seed=2,
                  val_every=1, val_horizon=4, curriculum=Curriculum(horizons=(4,)), batch_size=8)
    assert r.steps == 1 and 0.0 <= r.best_val_accuracy <= 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))  # it trained
    with pytest.raises(ValueError, match="x must have 3 features"):
        m.hidden_states(torch.randn(2, 3, 4))


def test_lstm_is_a_torch_lstm_with_about_the_elman_parameter_count():
    lstm, elman = LSTMNet(d=6, hidden=64), ElmanRNN(d=6, hidden=128)
    assert isinstance(lstm.rnn, torch.nn.LSTM) and lstm.rnn.hidden_size == 64
    n_l, n_e = (sum(p.numel() for p in m.parameters()) for m in (lstm, elman))
    assert 0.9 < n_l / n_e < 1.1


def test_orthogonal_init_is_orthogonal_and_differs_from_the_default():
    torch.manual_seed(0)
    m = orthogonal_rnn(d=3, hidden=32, generator=torch.Generator().manual_seed(0))
    assert _orth_err(m.W_hh) < 1e-5
    assert np.allclose(np.abs(eigenvalues(m.W_hh)), 1.0, atol=1e-5)  # every eigenvalue on the unit circle
    torch.manual_seed(0)
    assert _orth_err(ElmanRNN(d=3, hidden=32).W_hh) > 0.5  # PyTorch's default is not orthogonal


@pytest.mark.parametrize("s", [2, 3, 5])
def test_wave_init_is_orthogonal_and_carries_the_window_s_wave(s):
    d, H = 3, 32
    m = wave_init_rnn(d=d, hidden=H, s=s, generator=torch.Generator().manual_seed(1))
    assert _orth_err(m.W_hh) < 1e-5
    W = m.W_hh.detach().double()
    # the wave subspace: s·d directions on which W^s is the identity (the s-th roots of unity, each d times)
    ev = eigenvalues(m.W_hh)
    assert np.sum(np.abs(ev ** s - 1) < 1e-4) >= s * d
    rank_fixed = int(torch.linalg.matrix_rank(torch.linalg.matrix_power(W, s) - torch.eye(H, dtype=W.dtype),
                                              atol=1e-5))
    assert H - rank_fixed >= s * d
    # the random orthogonal baseline has no such subspace
    o = orthogonal_rnn(d=d, hidden=H, generator=torch.Generator().manual_seed(1)).W_hh.detach().double()
    assert H - int(torch.linalg.matrix_rank(torch.linalg.matrix_power(o, s) - torch.eye(H, dtype=o.dtype),
                                            atol=1e-5)) < s * d
    with pytest.raises(ValueError, match="s\\*d <= hidden"):
        wave_init_rnn(d=4, hidden=8, s=3)


def test_elman_arms_of_a_seed_differ_only_in_the_recurrent_matrix():
    nets = {arm: build_arm(arm, st=ST, seed=7) for arm in ("wave", "wrong_window", "orthogonal", "default")}
    for arm in ("wrong_window", "orthogonal", "default"):
        assert torch.equal(nets[arm].W_uh, nets["wave"].W_uh) and torch.equal(nets[arm].W_r, nets["wave"].W_r)
        assert not torch.equal(nets[arm].W_hh, nets["wave"].W_hh)
    ev = eigenvalues(nets["wrong_window"].W_hh)
    assert np.sum(np.abs(ev ** ST.control_s - 1) < 1e-4) >= ST.control_s * ST.d
    assert isinstance(build_arm("lstm", st=ST, seed=7), LSTMNet)
    with pytest.raises(ValueError, match="arm"):
        build_arm("gru", st=ST, seed=7)


def test_steps_to_criterion_censors_at_the_cap_and_counts_checks():
    r = steps_to_criterion("lstm", 1e-4, 0, ST)  # a tiny lr: never reaches 0.99 within 40 steps
    assert not r["reached"] and r["steps"] == ST.cap
    easy = SpeedSetting(**{**ST.__dict__, "criterion": 0.05})  # any network reaches 5% sign accuracy
    r = steps_to_criterion("wave", 1e-3, 0, easy)
    assert r["reached"] and r["steps"] == easy.check_every  # the first check
    assert r == {**steps_to_criterion("wave", 1e-3, 0, easy), "wall_s": r["wall_s"]}  # seeded: same numbers


def test_tune_score_ranks_censored_runs_below_reached_ones_and_by_their_accuracy():
    reached = {"steps": 990, "reached": True, "best_val_acc": 0.991}
    close = {"steps": 1000, "reached": False, "best_val_acc": 0.98}
    far = {"steps": 1000, "reached": False, "best_val_acc": 0.6}
    s = [tune_score(r, criterion=0.99) for r in (reached, close, far)]
    assert s[0] == pytest.approx(math.log(990)) and s[0] < s[1] < s[2]
    assert s[1] == pytest.approx(math.log(1000) + 0.01)


# ------------------------------------------------------------------ the claim statistic and its guard
def _runs(steps: dict[str, list[int]], cap: int = 1000):
    return {arm: [{"steps": x, "reached": x < cap, "best_val_acc": 0.995 if x < cap else 0.7, "lr": 3e-3}
                  for x in xs] for arm, xs in steps.items()}


def _tuned():
    return {arm: tune_grid(lambda lrs: [[float(abs(math.log(lr / 3e-3))), 0.0] for lr in lrs], [1e-3, 3e-3, 1e-2],
                           score="score", maximize=False) for arm in SPEED}


def _checks(steps):
    cfg = Config()
    claims, mechs, guards = speed_checks(_runs(steps), _tuned(), cfg=cfg)
    return {c.baseline_arm: c for c in claims}, mechs, guards


STEPS = {"wave": [100, 120, 90, 110, 130], "wrong_window": [160, 200, 150, 170, 210],
         "orthogonal": [140, 150, 160, 130, 170], "lstm": [1000, 1000, 900, 1000, 1000]}


def test_claim_statistic_is_the_paired_log_ratio_of_the_per_seed_steps():
    claims, mechs, _ = _checks(STEPS)
    for b in BASELINES:
        d = np.log(STEPS["wave"]) - np.log(STEPS[b])
        lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        c = claims[b]
        assert c.kind == "claim" and c.method_arm == "wave" and c.n == 5
        assert c.measured == pytest.approx(d.mean()) and (c.ci_low, c.ci_high) == pytest.approx((lo, hi))
        assert c.passed == (hi < 0)
    assert claims["lstm"].passed and claims["orthogonal"].passed
    (m,) = mechs
    assert m.kind == "mechanism" and m.baseline_arm == "wrong_window" and m.passed


def test_claim_fails_when_the_wave_is_not_faster_or_every_seed_ties_at_the_cap():
    slower = {**STEPS, "wave": [150, 170, 160, 140, 180]}  # wave ≈ orthogonal
    assert not _checks(slower)[0]["orthogonal"].passed
    tied = {**STEPS, "wave": [1000] * 5, "lstm": [1000] * 5}  # all censored: [0, 0] must not pass
    c = _checks(tied)[0]["lstm"]
    assert (c.ci_low, c.ci_high) == (0.0, 0.0) and not c.passed
    assert STRICT > 0


def test_negative_control_guard_is_the_claim_statistic_on_the_control_and_voids_only_its_baseline():
    # the wrong-window wave beats the LSTM as clearly as the right one does, but not the orthogonal RNN
    steps = {**STEPS, "wrong_window": [150, 140, 170, 125, 180]}
    claims, mechs, guards = _checks(steps)
    ctrl = {g.baseline_arm: g for g in guards if g.method_arm == "wrong_window" and g.metric.startswith("ci_high")}
    assert set(ctrl) == set(BASELINES)
    for b in BASELINES:
        d = np.log(steps["wrong_window"]) - np.log(steps[b])
        hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))[1]
        assert ctrl[b].kind == "sanity" and ctrl[b].measured == pytest.approx(hi)
        assert ctrl[b].passed == (hi >= 0) and ctrl[b].guards == [claims[b].name]
    assert not ctrl["lstm"].passed  # the control passes the LSTM claim's statistic: the guard fails
    assert ctrl["orthogonal"].passed
    checks = [*claims.values(), *mechs, *guards]
    v = verdict(checks)
    assert claims["lstm"].void_by == [ctrl["lstm"].name] and not claims["orthogonal"].void_by
    assert v["claims_void"] == 1 and v["claims_total"] == 1 and v["label"].startswith("holds")


def test_tuning_guards_name_the_claims_of_their_arm():
    _, _, guards = _checks(STEPS)
    tun = {g.method_arm: g for g in guards if g.metric == "tuned_inside_fraction"}
    assert set(tun) == set(SPEED) and all(g.passed for g in tun.values())
    names = {b: n for b, n in ((c.baseline_arm, c.name) for c in _checks(STEPS)[0].values())}
    assert tun["lstm"].guards == [names["lstm"]] and tun["orthogonal"].guards == [names["orthogonal"]]
    assert sorted(tun["wave"].guards) == sorted(names.values()) == sorted(tun["wrong_window"].guards)


@pytest.mark.parametrize("kw, match", [
    ({"lr_grid": (1e-3, 3e-3)}, "lr_grid"),
    ({"tune_seeds": (0, 1000)}, "tune_seeds"),
    ({"speed_cap": 0}, "speed_cap"),
    ({"speed_criterion": 0.0}, "speed_criterion"),
    ({"hidden": 30}, "s\\*d <= hidden"),
])
def test_bad_speed_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_the_networks_have_no_readout_bias_and_the_elman_rnn_no_bias_at_all():
    from icml24.traveling_waves import ElmanRNN, LSTMNet

    assert [n for n, _ in ElmanRNN(d=3, hidden=8).named_parameters()] == [
        "rnn.weight_ih_l0", "rnn.weight_hh_l0", "readout.weight"]  # the paper's code: bias=False everywhere
    assert LSTMNet(d=3, hidden=8).readout.bias is None
