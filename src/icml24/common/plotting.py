"""Plotting with matplotlib's Agg backend: one figure per claim, curves with ± std bands over seeds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plt", "new_figure", "band", "save_figure"]


def new_figure(ncols: int = 1, *, width: float = 5.0, height: float = 3.6, **kw):
    """A figure with ``ncols`` axes side by side (returns ``fig, axes`` with axes always a list)."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, **kw)
    return fig, list(axes[0])


def band(ax, x: Sequence[float], runs: Sequence[Sequence[float]], *, label: str, color=None, log_y: bool = False,
         marker: str | None = None) -> None:
    """Plot the mean of ``runs`` (seeds × points) against ``x`` with a ± std band."""
    y = np.asarray(runs, dtype=float)
    if y.ndim == 1:
        y = y[None]
    m = y.mean(0)
    s = y.std(0, ddof=1) if y.shape[0] > 1 else np.zeros_like(m)
    (line,) = ax.plot(x, m, label=label, color=color, marker=marker)
    lo, hi = m - s, m + s
    if log_y:
        lo = np.maximum(lo, np.nanmin(m[m > 0]) * 1e-2 if np.any(m > 0) else 1e-12)
        ax.set_yscale("log")
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` as PNG (dpi 120, tight) and close it; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
