"""Tuning sanity checks: a validation-tuned value must lie strictly inside its grid (DESIGN § Verdicts).

A value tuned on validation that sits at the end of its grid says the grid was too narrow: the arm's best
setting may lie outside it, and the comparison is then against an arm that was not really tuned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from icml24.common.results import ClaimCheck

__all__ = ["pick_best", "interior_fraction", "interior_check"]


def pick_best(grid: Sequence[float], scores: Sequence[float], *, log: bool = True) -> float:
    """The grid value with the highest validation score; exact ties go to the value nearest the grid's centre
    (in log scale when ``log``: the prior a grid is built around), then to the smaller one. A flat validation
    curve therefore picks the middle, not an edge that is no better than it."""
    if len(grid) != len(scores) or not grid:
        raise ValueError(f"pick_best: grid has {len(grid)} values, scores {len(scores)}")
    f = (lambda v: math.log(v)) if log else float
    mid = (f(min(grid)) + f(max(grid))) / 2
    best = max(scores)
    return min((g for g, sc in zip(grid, scores, strict=True) if sc == best),
               key=lambda g: (round(abs(f(g) - mid), 9), g))


def _grids(picked: Sequence[float], grid: Sequence[float] | Sequence[Sequence[float]]) -> list[list[float]]:
    if len(picked) == 0:
        raise ValueError("interior_check: picked must not be empty")
    if len(grid) and all(isinstance(g, (list, tuple)) for g in grid):
        grids = [[float(v) for v in g] for g in grid]  # type: ignore[union-attr]
        if len(grids) != len(picked):
            raise ValueError(f"interior_check: got {len(picked)} picks but {len(grids)} grids")
    else:
        grids = [[float(v) for v in grid]] * len(picked)  # type: ignore[arg-type]
    for p, g in zip(picked, grids, strict=True):
        if not g:
            raise ValueError("interior_check: a grid must not be empty")
        if not any(math.isclose(float(p), v, rel_tol=1e-9, abs_tol=1e-12) for v in g):
            raise ValueError(f"interior_check: picked value {p} is not in its grid {g}")
    return grids


def interior_fraction(picked: Sequence[float], grid: Sequence[float] | Sequence[Sequence[float]]) -> float:
    """Fraction of tuned values strictly inside their grid (``min(grid) < value < max(grid)``).

    Args:
        picked: the value chosen on validation in each cell (seed, setting).
        grid: the grid searched, one for every cell or one per cell (same length as ``picked``). A grid with
            fewer than three distinct values has no interior, so its picks never count.
    """
    grids = _grids(picked, grid)
    return sum(min(g) < float(p) < max(g) for p, g in zip(picked, grids, strict=True)) / len(picked)


def interior_check(*, name: str, picked: Sequence[float], grid: Sequence[float] | Sequence[Sequence[float]],
                   threshold: float = 0.5, arm: str | None = None, mild: str | None = None,
                   detail: str = "") -> ClaimCheck:
    """A ``sanity`` check: the fraction of cells whose tuned value is strictly inside its grid >= ``threshold``.

    Args:
        name: the check's name.
        picked: the tuned value in each cell; grid: the grid (one, or one per cell), as in
            :func:`interior_fraction`.
        threshold: the least interior fraction (fixed before the run; kd_ranking and dp_public/gcdro use 0.5).
        arm: the arm whose knob is checked.
        mild: ``"low"`` or ``"high"``: which end of the grid is the mildest setting (closest to the unregularised
            or non-private arm); reported in the detail with how many picks sit there.
        detail: text prepended to the automatic detail.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"interior_check: threshold must be in [0, 1], got {threshold}")
    if mild not in (None, "low", "high"):
        raise ValueError(f"interior_check: mild must be 'low', 'high' or None, got {mild!r}")
    grids = _grids(picked, grid)
    frac = interior_fraction(picked, grids)
    n = len(picked)
    low = sum(float(p) <= min(g) for p, g in zip(picked, grids, strict=True))
    high = n - low - round(frac * n)
    parts = [detail] if detail else []
    parts.append(f"{n} cells: {n - low - high} strictly inside, {low} at the low end, {high} at the high end")
    if mild is not None:
        at_mild = low if mild == "low" else high
        parts.append(f"{at_mild}/{n} at the mildest ({mild}) end")
    distinct = {tuple(g) for g in grids}
    if len(distinct) == 1:
        parts.append(f"grid {{{', '.join(f'{v:.4g}' for v in grids[0])}}}")
    parts.append("picks: " + ", ".join(f"{float(p):.4g}" for p in picked))
    return ClaimCheck(name=name, metric="interior_fraction", measured=frac, threshold=threshold, direction=">=",
                      kind="sanity", method_arm=arm, n=n, detail="; ".join(parts))
