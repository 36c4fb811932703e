"""The max-of-Gaussians backup against Monte Carlo and Clark's closed form; the Gaussian edge transform; the
Bayes-UCB quantile schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from icml24.bayes_mcts import (
    MIN_VAR,
    bts_percentile,
    gaussian_quantile,
    linear_transform,
    max_of_gaussians,
    max_of_gaussians_mc,
    max_of_two_gaussians,
)
from icml24.bayes_mcts.distributions import _max1d


def _cases(n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        k = int(rng.integers(2, 6))
        yield rng.normal(0, 2, k), rng.uniform(0.3, 2.0, k)


@pytest.mark.parametrize("i", range(12))
def test_max_matches_monte_carlo(i):
    mu, sd = list(_cases())[i]
    m, s = max_of_gaussians(mu, sd)
    m_mc, s_mc = max_of_gaussians_mc(mu, sd, n_samples=400_000, seed=i)
    # issue 18: 2% on the mean (relative to the max's spread, so shift-invariant), 5% on the std
    assert abs(float(m) - m_mc) <= 0.02 * s_mc
    assert abs(float(s) - s_mc) <= 0.05 * s_mc


@pytest.mark.parametrize("m1,s1,m2,s2", [(0, 1, 0, 1), (0, 1, 0.5, 2), (3, 0.5, 1, 1.5), (-1, 2, 1, 0.4)])
def test_max_of_two_matches_clark(m1, s1, m2, s2):
    e, sd = max_of_two_gaussians(m1, s1, m2, s2)
    m, s = max_of_gaussians(np.array([m1, m2], float), np.array([s1, s2], float))
    assert abs(float(m) - e) <= 0.02 * sd and abs(float(s) - sd) <= 0.05 * sd
    # Clark's formula itself against Monte Carlo
    m_mc, s_mc = max_of_gaussians_mc([m1, m2], [s1, s2], n_samples=400_000)
    assert abs(e - m_mc) <= 0.01 * s_mc and abs(sd - s_mc) <= 0.01 * s_mc


def test_batched_equals_loop_and_fast_path():
    cases = [c for c in _cases(8, seed=3) if c[0].size == 3] + [(np.array([0.0, 1.0, 2.0]), np.array([1.0, 1, 1]))]
    mu = np.stack([c[0] for c in cases])
    sd = np.stack([c[1] for c in cases])
    bm, bs = max_of_gaussians(mu, sd)
    assert bm.shape == (len(cases),)
    for j, (m, s) in enumerate(cases):
        lm, ls = max_of_gaussians(m, s)
        fm, fs = _max1d(m, s)
        assert math.isclose(float(lm), bm[j], abs_tol=1e-12) and math.isclose(float(ls), bs[j], abs_tol=1e-12)
        assert math.isclose(fm, bm[j], abs_tol=1e-10) and math.isclose(fs, bs[j], abs_tol=1e-10)


def test_variance_floor_and_point_masses():
    m, s = max_of_gaussians(np.array([1.0, -2.0]), np.array([0.0, 0.0]))
    assert float(m) == pytest.approx(1.0) and float(s) == pytest.approx(math.sqrt(MIN_VAR))
    # one dominant, almost certain input: the max is that input, std floored (a variance floor, not a std floor)
    m, s = max_of_gaussians(np.array([5.0, 0.0]), np.array([0.01, 0.01]))
    assert float(m) == pytest.approx(5.0, abs=1e-3) and float(s) == pytest.approx(math.sqrt(1e-3))
    # a single input is returned unchanged (up to discretisation)
    m, s = max_of_gaussians(np.array([2.0]), np.array([1.5]))
    assert float(m) == pytest.approx(2.0, abs=0.02) and float(s) == pytest.approx(1.5, rel=0.03)


def test_truncated_tail_and_wider_range():
    # a wide low-mean input has a tail above a sharp high one: the official 0.001-0.999 grid drops that mass;
    # a wider grid recovers the Monte-Carlo std
    mu, sd = np.array([5.0, -3.0]), np.array([0.1, 3.0])
    s_mc = max_of_gaussians_mc(mu, sd, n_samples=1_000_000)[1]
    _, s_off = max_of_gaussians(mu, sd)
    _, s_wide = max_of_gaussians(mu, sd, q_range=(1e-6, 1 - 1e-6), n_bins=400)
    assert abs(float(s_wide) - s_mc) < abs(float(s_off) - s_mc)
    assert abs(float(s_wide) - s_mc) <= 0.05 * s_mc


def test_linear_transform_is_the_gaussian_closed_form():
    m, s = linear_transform(np.array([1.0, -2.0]), np.array([0.5, 2.0]), bias=-1.0, scale=0.9)
    np.testing.assert_allclose(m, [-1.0 + 0.9, -1.0 - 1.8])
    np.testing.assert_allclose(s, [0.45, 1.8])
    rng = np.random.default_rng(0)
    x = -1.0 + 0.9 * rng.normal(1.0, 0.5, 200_000)
    assert abs(x.mean() - m[0]) < 0.01 and abs(x.std() - s[0]) < 0.01


def test_bts_schedule_values():
    assert bts_percentile(1) == pytest.approx(0.5)
    assert bts_percentile(4) == pytest.approx(1 - 0.5 * math.exp(-1), abs=1e-12)  # ≈ 0.816
    assert bts_percentile(4) == pytest.approx(0.816, abs=1e-3)
    assert bts_percentile(10) == pytest.approx(0.975, abs=1e-3)
    assert bts_percentile(20) == pytest.approx(0.999, abs=1e-3)
    assert bts_percentile(10_000) == bts_percentile(150)  # capped at MAX_NODE_VISITS
    ps = [bts_percentile(n) for n in range(1, 40)]
    assert all(b > a for a, b in zip(ps, ps[1:], strict=False))
    assert bts_percentile(1, init=0.7, scale=10) == pytest.approx(0.7)
    assert gaussian_quantile(0.5) == pytest.approx(0.0, abs=1e-12)
    assert gaussian_quantile(0.975) == pytest.approx(1.959964, abs=1e-5)
    assert gaussian_quantile(1.0) == pytest.approx(5.199, abs=1e-2)  # saturates like the official z-table


def test_bad_inputs():
    with pytest.raises(ValueError, match="share a shape"):
        max_of_gaussians(np.zeros(3), np.ones(2))
    with pytest.raises(ValueError, match="n_bins"):
        max_of_gaussians(np.zeros(2), np.ones(2), n_bins=2)
    with pytest.raises(ValueError, match="q_range"):
        max_of_gaussians(np.zeros(2), np.ones(2), q_range=(0.5, 0.4))
    with pytest.raises(ValueError, match="scale"):
        bts_percentile(3, scale=0.0)
