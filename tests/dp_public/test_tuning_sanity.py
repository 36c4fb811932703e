"""dp_public's tuning (common.tuning.tune_grid per cell, semi-DP's β outside η) and its grids and thresholds."""

from __future__ import annotations

import math

import pytest

from icml24.dp_public.experiment import Config, linear_betas, tune_beta_lr, tune_lr, tuning_grids


def test_tune_lr_extends_a_winning_edge_by_its_ratio_and_stops_at_the_budget():
    calls: list[float] = []

    def fit(lr):  # validation MSE falls with η: the top edge keeps winning
        calls.append(lr)
        return 1.0 / lr, 2.0 / lr

    t = tune_lr(fit, [0.1, 0.3, 0.9], maximize=False, max_extra=2)
    assert t.extensions == pytest.approx([2.7, 8.1]) and t.value == pytest.approx(8.1) and not t.ok
    assert calls == pytest.approx([0.1, 0.3, 0.9, 2.7, 8.1])
    assert t.at("test") == [pytest.approx(2.0 / 8.1)]  # the test metric of the picked value
    # an interior optimum: no extension, the pick is inside
    t = tune_lr(lambda lr: (-abs(math.log(lr / 0.3)), 0.0), [0.1, 0.3, 0.9], maximize=True, max_extra=2)
    assert t.extensions == [] and t.value == pytest.approx(0.3) and t.ok


def test_tune_lr_scores_a_diverged_run_as_the_worst():
    t = tune_lr(lambda lr: (math.nan if lr > 0.5 else lr, lr), [0.1, 0.3, 0.9], maximize=False, max_extra=1)
    assert t.value == pytest.approx(0.1 / 3) and t.extensions == pytest.approx([0.1 / 3])  # low edge wins, extends
    assert t.mean(0.9) == 1e30


def test_tune_beta_lr_tunes_beta_on_the_public_weight_and_eta_inside():
    seen: list[tuple[float, float]] = []

    def fit(beta, lr):  # best β = 0.9, best η = 0.3 at every β
        seen.append((round(beta, 12), lr))
        return (beta - 0.9) ** 2 + (math.log(lr / 0.3)) ** 2, 0.0

    outer, inner, beta = tune_beta_lr(fit, (0.8, 0.9, 0.95, 0.99), [0.1, 0.3, 0.9], maximize=False, max_extra=2)
    assert beta == pytest.approx(0.9) and inner.value == pytest.approx(0.3) and outer.ok and inner.ok
    assert outer.grid == pytest.approx(sorted(1 - b for b in (0.8, 0.9, 0.95, 0.99)))  # no extension needed
    assert {b for b, _ in seen} == {0.8, 0.9, 0.95, 0.99}
    # β close to 1 keeps winning: the public weight 1 − β extends geometrically toward 0, never to β = 1
    outer, _, beta = tune_beta_lr(lambda b, lr: (1 - b, 0.0), (0.9, 0.95, 0.99), [0.1, 0.3], maximize=False,
                                  max_extra=2)
    assert [round(1 - w, 12) for w in outer.extensions] == pytest.approx([0.998, 0.9996]) and not outer.ok
    assert beta == pytest.approx(0.9996)
    # a single β: only η is tuned
    outer, inner, beta = tune_beta_lr(fit, (0.5,), [0.1, 0.3, 0.9], maximize=False, max_extra=2)
    assert outer is None and beta == 0.5 and inner.value == pytest.approx(0.3)


def test_full_grids_have_an_interior_and_equal_budgets():
    cfg = Config()
    assert len(cfg.lin_lrs) >= 3 and len(cfg.dig_lrs) >= 3
    for k in cfg.lin_n_pubs:
        betas = linear_betas(cfg, k)
        assert len(set(betas)) == len(betas) >= 4  # n_priv/n is not counted twice
        grid, one = tuning_grids(betas, cfg.lin_lrs)
        assert len(grid) == len(one) == len(betas) * len(cfg.lin_lrs)
        assert min(one) == pytest.approx(min(cfg.lin_lrs)) and max(one) == pytest.approx(max(cfg.lin_lrs))
        # n_priv/n lies strictly inside the β grid at every fraction, and values above it exist
        assert min(betas) < betas[0] < max(betas)
    # at n_pub = 25 of n = 2500, n_priv/n = 0.99 is in lin_betas: it is dropped once
    assert linear_betas(cfg, 25).count(0.99) == 1


def test_sanity_thresholds_and_tuning_budget_are_validated():
    for kw in ({"regime_mse_ratio": 0.9}, {"regime_acc_gap": -1.0}, {"interior_min_fraction": 1.5},
               {"grid_extra": -1}, {"lin_lrs": (0.3,)}, {"dig_lrs": (1.0, 1.0)}, {"dig_folds": 1},
               {"lin_n_pubs": (50,)}, {"lin_n_pubs": (75, 75)}, {"lin_n_pubs": (2500,)}, {"lin_epsilons": (0.0,)},
               {"workers": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            Config(**kw)
    with pytest.raises(ValueError, match="dig_betas"):
        Config(dig_betas=(0.5, 1.0))  # several β are tuned on 1 − β: β = 1 has no log
    Config(dig_betas=(1.0,))  # one β is not tuned
    cfg = Config()
    assert cfg.regime_mse_ratio == 1.05 and cfg.regime_acc_gap == 1.0 and cfg.interior_min_fraction == 0.5
    assert cfg.grid_extra == 2 and math.log(cfg.regime_mse_ratio) > 0


def test_tune_lr_takes_one_score_per_fold_as_replicate_units():
    # k-fold CV: the fold scores are the replicate units; no test metric is recorded (the caller refits)
    t = tune_lr(lambda lr: ([1.0 / lr, 1.1 / lr, 0.9 / lr], None), [0.1, 0.3, 0.9], maximize=False, max_extra=0)
    assert t.records[0.9]["val"] == pytest.approx([1 / 0.9, 1.1 / 0.9, 0.9 / 0.9]) and "test" not in t.records[0.9]
    assert t.se(0.9) > 0
    # a fold whose run diverged scores as the worst possible value
    t = tune_lr(lambda lr: ([lr, math.inf], None), [0.1, 0.3], maximize=True, max_extra=0)
    assert t.records[0.1]["val"] == [0.1, -1e30]
    # (β, η) with fold scores and no test metric
    outer, inner, beta = tune_beta_lr(lambda b, lr: ([(b - 0.9) ** 2 + lr, (b - 0.9) ** 2 + lr], None),
                                      (0.8, 0.9, 0.95), [0.1, 0.3], maximize=False, max_extra=0)
    assert beta == pytest.approx(0.9) and "test" not in outer.records[outer.value]
