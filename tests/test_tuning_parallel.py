"""Shared helpers: ``common.tuning.tune_grid``'s tie rule on single scores and ``common.parallel.run_jobs``."""

from __future__ import annotations

import math

from icml24.common.parallel import run_jobs
from icml24.common.tuning import tune_grid


def _pick(grid, scores, *, log=True):
    table = dict(zip(grid, scores, strict=True))
    return tune_grid(lambda vs: [[table[v]] for v in vs], grid, log=log, max_extra=0).value


def test_single_scores_pick_the_best_and_ties_go_toward_the_centre():
    grid = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
    assert _pick(grid, [0.1, 0.5, 0.2, 0.9, 0.3]) == 3e-4
    assert _pick(grid, [1.0] * 5) == 1e-4  # a flat curve picks the middle, not an edge
    assert _pick(grid, [1.0, 1.0, 0.0, 0.0, 0.0]) == 3e-5  # tie: nearer the log-centre
    assert _pick((1, 2, 3), [0.2, 0.2, 0.2], log=False) == 2
    assert _pick((1, 2, 4), [0.2, 0.1, 0.2], log=False) == 1  # linear centre 2.5: both 1.5 away -> smaller


def test_run_jobs_gives_the_same_results_in_order_with_a_pool():
    jobs = [1.0, 4.0, 9.0, 16.0]
    assert run_jobs(math.sqrt, jobs) == [1.0, 2.0, 3.0, 4.0]
    assert run_jobs(math.sqrt, jobs, workers=2) == [1.0, 2.0, 3.0, 4.0]
