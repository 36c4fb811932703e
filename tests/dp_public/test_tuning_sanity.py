"""The shared 'tuned value inside its grid' sanity check (icml24.common.tuning) and dp_public's grids."""

from __future__ import annotations

import math

import pytest

from icml24.common.tuning import interior_check, interior_fraction
from icml24.dp_public.experiment import Config, linear_betas, tuning_grids


def test_interior_check_fails_on_edge_picks_and_passes_on_interior_ones():
    grid = (0.1, 0.3, 1.0)
    edge = interior_check(name="x", picked=[1.0, 1.0, 0.1, 0.3], grid=grid, threshold=0.5, arm="a", mild="low")
    assert edge.kind == "sanity" and edge.measured == 0.25 and not edge.passed and edge.n == 4
    assert "1 strictly inside, 1 at the low end, 2 at the high end" in edge.detail
    assert "1/4 at the mildest (low) end" in edge.detail
    inside = interior_check(name="x", picked=[0.3, 0.3, 1.0], grid=grid, threshold=0.5)
    assert inside.measured == pytest.approx(2 / 3) and inside.passed
    # exactly at the threshold passes (">=")
    assert interior_check(name="x", picked=[0.3, 0.1], grid=grid, threshold=0.5).passed


def test_interior_fraction_per_cell_grids_and_degenerate_grids():
    # one grid per cell: 0.99 is inside {0.95, 0.99, 0.995} but the top of {0.9, 0.99}
    assert interior_fraction([0.99, 0.99], [[0.95, 0.99, 0.995], [0.9, 0.99]]) == 0.5
    # a grid with fewer than three distinct values has no interior
    assert interior_fraction([0.2, 0.6], (0.2, 0.6)) == 0.0
    assert interior_fraction([0.3], (0.3,)) == 0.0
    # float picks from np.geomspace match their grid values
    grid = [0.2 * (9.0 ** (k / 11)) for k in range(12)]
    assert interior_fraction([grid[5], grid[0], grid[11]], grid) == pytest.approx(1 / 3)


def test_interior_check_errors_name_the_argument():
    with pytest.raises(ValueError, match="not in its grid"):
        interior_fraction([0.5], (0.1, 0.3, 1.0))
    with pytest.raises(ValueError, match="2 picks but 1 grids"):
        interior_fraction([0.1, 0.3], [[0.1, 0.3, 1.0]])
    with pytest.raises(ValueError, match="picked must not be empty"):
        interior_fraction([], (0.1,))
    with pytest.raises(ValueError, match="threshold"):
        interior_check(name="x", picked=[0.1], grid=(0.1,), threshold=1.5)
    with pytest.raises(ValueError, match="mild"):
        interior_check(name="x", picked=[0.1], grid=(0.1,), mild="middle")


def test_full_grids_have_an_interior_and_equal_budgets():
    cfg = Config()
    assert len(cfg.lin_lrs) >= 3 and len(cfg.dig_lrs) >= 3
    for r in cfg.lin_ratios:
        betas = linear_betas(cfg, r)
        assert len(set(betas)) == len(betas) >= 4  # n_priv/n is not counted twice
        grid, one = tuning_grids(betas, cfg.lin_lrs)
        assert len(grid) == len(one) == len(betas) * len(cfg.lin_lrs)
        assert min(one) == pytest.approx(min(cfg.lin_lrs)) and max(one) == pytest.approx(max(cfg.lin_lrs))
        # n_priv/n lies strictly inside the β grid at every fraction, and values above it exist
        assert min(betas) < betas[0] < max(betas)
    # at fraction 0.01, n_priv/n = 0.99 is in lin_betas: it is dropped once
    assert linear_betas(cfg, 0.01).count(0.99) == 1


def test_sanity_thresholds_are_validated():
    for kw in ({"regime_mse_ratio": 0.9}, {"regime_acc_gap": -1.0}, {"interior_min_fraction": 1.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            Config(**kw)
    cfg = Config()
    assert cfg.regime_mse_ratio == 1.05 and cfg.regime_acc_gap == 1.0 and cfg.interior_min_fraction == 0.5
    assert math.log(cfg.regime_mse_ratio) > 0
