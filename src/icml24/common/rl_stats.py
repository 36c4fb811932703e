"""The interquartile mean (IQM) with stratified-bootstrap confidence intervals, via ``rliable`` (DESIGN.md: RL
papers report the IQM with rliable's CIs; Agarwal et al., "Deep RL at the Edge of the Statistical Precipice",
NeurIPS 2021).

One helper for every paper, seeded explicitly. rliable 1.2's ``StratifiedBootstrap.update_indices`` draws the
resampling indices from numpy's *global* RNG (``np.random.choice``) whatever ``random_state`` says (that argument
only reaches ``arch``'s own generator, which the percentile interval never uses), while other versions of the
pair use the ``random_state``. So :func:`iqm_with_ci` does both: it passes a ``RandomState(seed)`` and seeds the
global RNG with the same seed, restoring the global state afterwards (the caller's random stream is untouched).
Each arm gets a fresh seed-``seed`` stream, so an arm's interval does not depend on which other arms (or in which
order) are passed, and arms with the same number of runs are resampled with the same indices.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple

import numpy as np

__all__ = ["IQMEstimate", "iqm_with_ci"]


class IQMEstimate(NamedTuple):
    """``(iqm, lo, hi)``: the point estimate (25% trimmed mean over all runs × tasks) and the CI's ends."""

    iqm: float
    lo: float
    hi: float

    def as_dict(self) -> dict[str, float]:
        """``{"iqm", "ci_low", "ci_high"}``, the keys the papers' ``results.json`` use."""
        return {"iqm": self.iqm, "ci_low": self.lo, "ci_high": self.hi}


def _scores(arm: Hashable, x: Any) -> np.ndarray:
    a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=float)
    if a.ndim == 1:  # one task: runs only
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"iqm_with_ci: scores[{arm!r}] must be a non-empty (runs × tasks) array (or a 1-D array of "
                         f"runs), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"iqm_with_ci: scores[{arm!r}] contains non-finite values")
    return a


def iqm_with_ci(scores: Mapping[Hashable, Any], *, reps: int, seed: int, confidence: float = 0.95,
                task_bootstrap: bool = False) -> dict[Hashable, IQMEstimate]:
    """rliable IQM of each arm with a stratified-bootstrap (percentile) confidence interval.

    Args:
        scores: ``{arm: array (runs × tasks)}`` (a 1-D array is one task); numpy, lists or torch.
        reps: bootstrap resamples (rliable's ``reps``; rliable's own default is 50 000).
        seed: seed of the resampling; the same seed gives the same intervals, whatever the caller's global RNG.
        confidence: coverage of the interval.
        task_bootstrap: resample tasks too (rliable's option), not only runs within each task.

    Returns:
        ``{arm: IQMEstimate(iqm, lo, hi)}`` in the order of ``scores``.
    """
    try:
        from rliable import library as rly
        from rliable import metrics
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("iqm_with_ci needs rliable; install the 'rl' extra: pip install 'icml24[rl]'") from e
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or reps < 1:
        raise ValueError(f"iqm_with_ci: reps must be an integer >= 1, got {reps!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"iqm_with_ci: seed must be an integer in [0, 2**32), got {seed!r}")
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"iqm_with_ci: confidence must lie in (0, 1), got {confidence!r}")
    if not scores:
        raise ValueError("iqm_with_ci: scores is empty")
    arrays = {arm: _scores(arm, x) for arm, x in scores.items()}

    def iqm(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x)])

    out: dict[Hashable, IQMEstimate] = {}
    state = np.random.get_state()
    try:
        for arm, a in arrays.items():
            np.random.seed(int(seed))
            with warnings.catch_warnings():  # arch's FutureWarning about RandomState, raised inside rliable
                warnings.simplefilter("ignore", FutureWarning)
                point, ci = rly.get_interval_estimates({"arm": a}, iqm, reps=int(reps),
                                                       confidence_interval_size=float(confidence),
                                                       task_bootstrap=task_bootstrap,
                                                       random_state=np.random.RandomState(int(seed)))
            out[arm] = IQMEstimate(float(point["arm"][0]), float(ci["arm"][0, 0]), float(ci["arm"][1, 0]))
    finally:
        np.random.set_state(state)
    return out
