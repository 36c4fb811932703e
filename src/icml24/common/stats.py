"""Summary statistics over seeds: mean, sample std, Student-t 95% CI, paired differences."""

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


def format_mean_std(summary: dict[str, float] | None, digits: int = 4) -> str:
    """``"mean ± std"`` with ``digits`` significant digits, or an em dash when missing."""
    if not summary:
        return "—"
    m, s = summary["mean"], summary.get("std", 0.0)
    return f"{m:.{digits}g} ± {s:.{max(1, digits - 2)}g}"
