"""Summary statistics over seeds: mean, sample std, Student-t 95% CI, and the one rule for comparing arms.

DESIGN.md § Verdicts: arms share seeds and data, so they are compared *paired*: the per-unit differences (or
log-ratios) method − baseline, their mean and a 95% interval — Student-t over seeds (``scipy.stats.t.interval``),
a paired bootstrap (``scipy.stats.bootstrap(..., paired=True)``) only over >= 10 units (mazes, documents...),
or a two-stage cluster bootstrap when the units come in clusters (plans of one trained model): resample the
clusters, then the units within each drawn cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for a single value)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_std needs at least one value")
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def ci95(values: Sequence[float]) -> tuple[float, float]:
    """Two-sided 95% Student-t confidence interval of the mean (degenerate for n=1)."""
    x = np.asarray(values, dtype=float)
    m, s = mean_std(x)
    if x.size < 2:
        return m, m
    h = _st.t.ppf(0.975, x.size - 1) * s / math.sqrt(x.size)
    return m - h, m + h


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """``{mean, std, n, ci_low, ci_high}`` of ``values``."""
    m, s = mean_std(values)
    lo, hi = ci95(values)
    return {"mean": m, "std": s, "n": len(values), "ci_low": lo, "ci_high": hi}


def paired_difference(method: Sequence[float], baseline: Sequence[float]) -> dict[str, float | int]:
    """Summary of per-seed differences ``method - baseline`` (paired over seeds) and a paired t-test p-value."""
    a, b = np.asarray(method, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired_difference needs equal lengths, got {a.shape} and {b.shape}")
    d = a - b
    out = summarize(d)
    out["p_value"] = float(_st.ttest_rel(a, b).pvalue) if d.size > 1 and np.any(d != d[0]) else float("nan")
    return out


def cluster_bootstrap_ci(values: Sequence[float], clusters: Sequence, *, confidence: float = 0.95,
                         n_resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` by a two-stage bootstrap: draw the clusters with
    replacement, then within each drawn cluster its units with replacement (the mean is over all drawn units).

    Args:
        values: per-unit values; clusters: a label per unit (e.g. the training seed that produced the unit).
    """
    x = np.asarray(values, dtype=float).ravel()
    labels = np.asarray(clusters).ravel()
    if labels.shape != x.shape:
        raise ValueError(f"cluster_bootstrap_ci: {labels.size} cluster labels for {x.size} values")
    groups = [x[labels == c] for c in dict.fromkeys(labels.tolist())]
    if len(groups) < 2:
        raise ValueError("cluster_bootstrap_ci needs >= 2 clusters")
    rng = np.random.default_rng(seed)
    k = len(groups)
    pick = rng.integers(0, k, (n_resamples, k))
    sums, counts = np.zeros(n_resamples), np.zeros(n_resamples)
    for slot in range(k):
        for c, g in enumerate(groups):
            rows = np.flatnonzero(pick[:, slot] == c)
            if rows.size:
                sums[rows] += g[rng.integers(0, g.size, (rows.size, g.size))].sum(axis=1)
                counts[rows] += g.size
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(sums / counts, [a, 1.0 - a])
    return float(lo), float(hi)


def _interval(d: np.ndarray, *, bootstrap: bool, confidence: float, seed: int,
              clusters: Sequence | None = None) -> tuple[float, float]:
    """Two-sided interval of the mean of ``d``: Student-t, a BCa bootstrap (needs >= 10 units), or the
    two-stage cluster bootstrap when ``clusters`` labels the units."""
    m = float(d.mean())
    if d.size < 2:
        return float("nan"), float("nan")
    if np.ptp(d) <= 1e-12 * max(1.0, abs(m)):  # no spread (up to rounding): the interval is the point
        return m, m
    if clusters is not None:
        return cluster_bootstrap_ci(d, clusters, confidence=confidence, seed=seed)
    if bootstrap:
        if d.size < 10:
            raise ValueError(f"a bootstrap interval needs >= 10 units, got {d.size}; use the t interval")
        res = _st.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=9999, method="BCa",
                            random_state=np.random.default_rng(seed))
        return float(res.confidence_interval.low), float(res.confidence_interval.high)
    lo, hi = _st.t.interval(confidence, d.size - 1, loc=m, scale=_st.sem(d))
    return float(lo), float(hi)


def paired_ci(method: Sequence[float], baseline: Sequence[float], *, log_ratio: bool = False,
              bootstrap: bool = False, confidence: float = 0.95, seed: int = 0,
              clusters: Sequence | None = None) -> dict[str, float | int]:
    """Paired comparison of two arms over shared units (seeds, documents, ...).

    Args:
        method, baseline: per-unit values, aligned (unit i of both arms saw the same data and seed).
        log_ratio: compare ``log(method / baseline)`` (for losses/MSEs spanning scales) instead of differences.
        bootstrap: paired bootstrap over units (>= 10 units) instead of the Student-t interval.
        clusters: a cluster label per unit pair (e.g. its training seed): the two-stage cluster bootstrap.

    Returns:
        ``{mean, ci_low, ci_high, n, p_value}`` of the per-unit differences; ``p_value`` is the two-sided paired
        t-test (``scipy.stats.ttest_rel``; NaN when every difference is equal). The CI is NaN for n < 2.
    """
    a, b = np.asarray(method, dtype=float).ravel(), np.asarray(baseline, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired_ci needs aligned values, got {a.size} method and {b.size} baseline values")
    if a.size == 0:
        raise ValueError("paired_ci needs at least one pair")
    if log_ratio:
        if np.any(a <= 0) or np.any(b <= 0):
            raise ValueError("log_ratio needs positive values in both arms")
        d = np.log(a) - np.log(b)
    else:
        d = a - b
    lo, hi = _interval(d, bootstrap=bootstrap, confidence=confidence, seed=seed, clusters=clusters)
    p = float(_st.ttest_1samp(d, 0.0).pvalue) if d.size > 1 and lo != hi else float("nan")
    return {"mean": float(d.mean()), "ci_low": lo, "ci_high": hi, "n": int(d.size), "p_value": p}


def one_sample_ci(values: Sequence[float], *, bootstrap: bool = False, confidence: float = 0.95,
                  seed: int = 0, clusters: Sequence | None = None) -> dict[str, float | int]:
    """Mean of a per-unit statistic (a per-seed slope, ratio, correlation...) with its 95% interval."""
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("one_sample_ci needs at least one value")
    lo, hi = _interval(x, bootstrap=bootstrap, confidence=confidence, seed=seed, clusters=clusters)
    return {"mean": float(x.mean()), "ci_low": lo, "ci_high": hi, "n": int(x.size)}


def format_mean_std(summary: dict[str, float] | None, digits: int = 4) -> str:
    """``"mean ± std"`` with ``digits`` significant digits, or an em dash when missing."""
    if not summary:
        return "—"
    m, s = summary["mean"], summary.get("std", 0.0)
    return f"{m:.{digits}g} ± {s:.{max(1, digits - 2)}g}"
