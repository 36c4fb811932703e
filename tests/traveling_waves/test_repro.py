"""Quick reproduction of traveling_waves: run once; the result's contents, the theory's signatures on trained
RNNs (spectrum, decoding), the controls, determinism, the config's validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icml24.traveling_waves import Curriculum, ElmanRNN, eigenvalues, near_unit_count, train_rnn
from icml24.traveling_waves.experiment import Config, run, twm_exactness
from tests.shared_checker import check_results_file


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("traveling_waves_quick")
    return run(Config.quick().replace(threads=1), out), out


def test_quick_run_writes_a_complete_result(quick):
    res, out = quick
    d = json.loads((out / "results.json").read_text())
    assert d["slug"] == "traveling_waves" and d["mode"] == "quick" and d["seeds"] == [0, 1]
    assert set(d["summary"]) == {"T1", "T2", "untrained", "control", "wave", "wrong_window", "orthogonal", "lstm"}
    for name in ("eigenvalues.png", "gradient_norms.png", "decoded_lags.png"):
        assert (out / name).stat().st_size > 1000
    kinds = [c.kind for c in res.claim_checks]
    assert kinds.count("claim") == 4 and kinds.count("mechanism") == 14 and kinds.count("sanity") == 12
    guarded = {c.name: c.guards for c in res.checks("sanity")}
    assert all(g for g in guarded.values())  # every sanity check names the claims it conditions
    assert res.extra["twm_max_abs_diff"] == 0.0
    # the learning-speed claims and their negative-control guards: the control's guard names only its own claim
    speed = {c.baseline_arm: c for c in res.checks("claim") if c.method_arm == "wave"}
    assert set(speed) == {"lstm", "orthogonal"}
    for b, c in speed.items():
        (g,) = [x for x in res.checks("sanity") if x.method_arm == "wrong_window" and x.baseline_arm == b]
        assert g.guards == [c.name]
    ls = d["extra"]["learning_speed"]
    assert set(ls["tuning"]) == {"wave", "wrong_window", "orthogonal", "lstm"}
    for arm, runs in ls["runs"].items():  # per claim seed, at the arm's tuned lr; censored runs at the cap
        assert [r["seed"] for r in runs] == [0, 1]
        assert all(r["lr"] == ls["tuning"][arm]["picked"] for r in runs)
        assert all(r["steps"] == Config.quick().speed_cap for r in runs if not r["reached"])
        assert ls["censored"][arm] == sum(not r["reached"] for r in runs)


def test_quick_run_trained_rnns_carry_the_wave_and_the_controls_do_not(quick):
    res, _ = quick
    s = res.summary
    cfg = Config.quick()
    # trained on T1 / T2: the task is solved and the spectrum is the TWM's (counts s·d and Σ(s-k))
    assert s["T1"]["test_acc"]["mean"] > 0.9 and s["T2"]["test_acc"]["mean"] > 0.9
    assert s["T1"]["count"]["mean"] == cfg.s * cfg.d
    assert s["T2"]["count"]["mean"] == sum(cfg.s - k for k in range(cfg.d))
    assert s["T1"]["spectral_error"]["mean"] < 0.2 and s["T2"]["spectral_error"]["mean"] < 0.2
    assert s["T1"]["r2_min_window"]["mean"] > 0.9
    # controls: the untrained RNN has no near-unit eigenvalue; the s' control's count follows s'
    assert s["untrained"]["count"]["mean"] == 0 and s["untrained"]["spectral_error"]["mean"] > 0.5
    assert s["control"]["count"]["mean"] == cfg.control_s * cfg.d
    assert s["control"]["spectral_error"]["mean"] > 0.2 > s["control"]["spectral_error_own"]["mean"]
    # the untrained RNN's test accuracy is at chance
    assert s["untrained"]["test_acc"]["mean"] < 0.7


def test_twm_exactness_helper_is_zero():
    assert twm_exactness(d=3, s=4, steps=50) == 0.0


def test_same_seed_same_numbers():
    def once():
        torch.manual_seed(0)
        m = ElmanRNN(d=2, hidden=8)
        r = train_rnn(m, task="T1", s=2, steps=30, generator=torch.Generator().manual_seed(1), val_generator_seed=2,
                      val_every=10, val_horizon=20, curriculum=Curriculum(horizons=(4, 8)))
        return r.history, near_unit_count(eigenvalues(r.model.W_hh), threshold=0.1)
    assert once() == once()


@pytest.mark.parametrize("kw, match", [
    ({"d": 0}, "d must be an int >= 1"),
    ({"s": 0}, "s must be an int >= 1"),
    ({"d": 7}, "d must be <= s"),
    ({"control_s": 6}, "control_s must differ from s"),
    ({"steps": 0}, "steps must be an int >= 1"),
    ({"horizons": (20, 10)}, "horizons"),
    ({"lr": 0.0}, "lr and clip"),
    ({"lr": float("nan")}, "lr must be finite"),
    ({"acc_threshold": 1.5}, "acc_threshold"),
    ({"flat_ratio": 1.0}, "flat_ratio"),
    ({"decode_delay": -1}, "decode_delay"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Config(**kw)


def test_quick_config_is_small_and_full_config_is_the_documented_one():
    q, f = Config.quick(), Config()
    assert q.steps < f.steps and len(f.seeds) >= 5
    assert (f.d, f.s, f.hidden, f.test_horizon) == (6, 6, 128, 200)
    assert np.isclose(f.spectral_threshold, 0.2) and np.isclose(f.r2_threshold, 0.9)


def test_quick_result_is_schema_3_and_passes_the_shared_checker(quick):
    _, out = quick
    assert json.loads((out / "results.json").read_text())["schema_version"] == 3
    check_results_file(out / "results.json")
