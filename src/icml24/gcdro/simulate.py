"""Synthetic regression data with distribution shift for GCDRO (no network, explicit generators).

* :func:`selection_bias_regression` — the GDRO (NeurIPS 2022, §4.1) selection-bias simulation, as described by
  the ``regression_LWLC`` generator of namkoong-lab/dro, re-derived here with an explicit ``np.random.Generator``:
  S ∈ R^5 correlated Gaussians, ``Y = Sβ + N(0, 0.5²) + 0.1·S1S2S3`` with ``β_j = (−1)^j (j mod 3 + 1)``,
  ``V_b ~ N(Y, 2²)`` spurious, ``V ~ N(0, 2²)`` noise features; a sample is kept with probability
  ``|r|^(−5 |sign(r)·V_b − Y|)`` (r > 1: V_b ≈ Y in training; r < −1: V_b ≈ −Y in the shifted tests).
* :func:`subpopulation_regression` — DN20-style sub-population shift: x ∈ R², a majority with
  ``y = x·(1, 1) + ε`` and a minority (10 %) with ``y = x·(1, 0.1) + ε``. By default (``layout="region"``,
  issue 29) the minority is a region of x, ``{x₁ > Φ⁻¹(1 − share)}`` (x₁ > 1.28 for 10 %), so that it is a set
  of neighbouring nodes of a kNN graph built on x; ``layout="independent"`` draws the group independently of x
  (DN20_2, the earlier protocol).
* :func:`corrupt_labels` — gross label noise on a fraction of the training labels.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr, ndtri

from icml24.common import validate as val

__all__ = ["selection_bias_regression", "subpopulation_regression", "corrupt_labels", "LWLC_BETA"]

LWLC_BETA = np.array([(-1) ** j * (j % 3 + 1) for j in range(5)], dtype=np.float64)


def selection_bias_regression(*, n: int, r: float, rng: np.random.Generator, n_pool: int = 100_000,
                              ps: int = 5, pv: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` samples ``(X, y)`` (X = [S, V, V_b], d = ps + pv + 1) under selection bias ``r`` (|r| > 1).

    Pools of ``n_pool`` are drawn until ``n`` samples survive the selection.
    """
    if not abs(r) > 1:
        raise ValueError(f"gcdro: selection bias r must satisfy |r| > 1, got {r}")
    val.integer("gcdro", "n", n, minimum=1)
    val.integer("gcdro", "n_pool", n_pool, minimum=1)
    beta = np.array([(-1) ** j * (j % 3 + 1) for j in range(ps)], dtype=np.float64)
    xs, ys, kept = [], [], 0
    for _ in range(1000):
        z = rng.normal(0.0, 1.0, size=(n_pool, ps + 1))
        s = 0.8 * z[:, :ps] + 0.2 * z[:, 1:ps + 1]
        y = s @ beta + rng.normal(0.0, 0.5, size=n_pool) + 0.1 * s[:, 0] * s[:, 1] * s[:, 2]
        v = rng.normal(0.0, 2.0, size=(n_pool, pv))
        vb = rng.normal(y, 2.0)
        keep = rng.random(n_pool) < np.power(abs(r), -5.0 * np.abs(np.sign(r) * vb - y))
        xs.append(np.column_stack([s, v, vb])[keep])
        ys.append(y[keep])
        kept += int(keep.sum())
        if kept >= n:
            break
    x, yy = np.concatenate(xs), np.concatenate(ys)
    idx = rng.permutation(x.shape[0])[:n]
    return x[idx], yy[idx]


def subpopulation_regression(*, n: int, rng: np.random.Generator, minority: float = 0.1, noise: float = 0.1,
                             group: str | None = None, layout: str = "region"
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DN20-style sub-population data: returns ``(X, y, g)`` with ``g = 1`` for the minority.

    Args:
        n: samples.
        rng: the generator of every draw.
        minority: the minority's share of the population.
        noise: standard deviation of ε.
        group: ``"majority"``/``"minority"`` draws a single group (test environments); None the mixture.
        layout: ``"region"`` (default): the minority is the region ``{x₁ > Φ⁻¹(1 − minority)}`` of x ~ N(0, I₂)
            (its own slope (1, 0.1) there), so it is a region of any graph built on x; ``"independent"``: g is
            drawn independently of x (DN20_2; the minority is then no region of x).
    """
    val.integer("gcdro", "n", n, minimum=1)
    val.probability("gcdro", "minority", minority, open_low=True, open_high=True)
    val.one_of("gcdro", "layout", layout, ("region", "independent"))
    if group not in (None, "majority", "minority"):
        raise ValueError(f"gcdro: group must be None, 'majority' or 'minority', got {group!r}")
    if layout == "independent":
        x = rng.normal(size=(n, 2))
        if group is None:
            g = (rng.random(n) < minority).astype(np.int64)
        else:
            g = np.full(n, int(group == "minority"), dtype=np.int64)
    else:
        cut = float(ndtri(1.0 - minority))  # P(x₁ > cut) = minority
        if group is None:
            x = rng.normal(size=(n, 2))
        else:  # x ~ N(0, I₂) conditioned on the group's side of the cut (inverse-CDF draw of x₁)
            lo, hi = (ndtr(cut), 1.0) if group == "minority" else (0.0, ndtr(cut))
            u = lo + (hi - lo) * rng.random(n)
            x1 = ndtri(np.clip(u, 1e-300, 1.0 - 1e-16))
            x = np.column_stack([np.clip(x1, cut, None) if group == "minority" else np.clip(x1, None, cut),
                                 rng.normal(size=n)])
        g = (x[:, 0] > cut).astype(np.int64)
        if group is not None:  # the boundary itself (a measure-zero draw) belongs to the requested group
            g[:] = int(group == "minority")
    theta = np.where(g[:, None] == 1, np.array([1.0, 0.1]), np.array([1.0, 1.0]))
    y = (x * theta).sum(1) + noise * rng.normal(size=n)
    return x, y, g


def corrupt_labels(y: np.ndarray, *, frac: float, scale: float, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Add ``N(0, (scale·std(y))²)`` to a random ``frac`` of the labels; returns ``(y_noisy, is_noisy)``."""
    val.in_range("gcdro", "frac (noise fraction)", frac, 0.0, 1.0, high_open=True)
    n = y.shape[0]
    k = int(round(frac * n))
    noisy = np.zeros(n, dtype=bool)
    noisy[rng.choice(n, size=k, replace=False)] = True
    out = y.copy()
    out[noisy] += rng.normal(0.0, scale * y.std(), size=k)
    return out, noisy
