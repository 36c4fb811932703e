"""Shared helpers: ``common.tuning.pick_best`` (validation picks, tie rule) and ``common.parallel.run_jobs``."""

from __future__ import annotations

import math

import pytest

from icml24.common.parallel import run_jobs
from icml24.common.tuning import pick_best


def test_pick_best_takes_the_highest_score_and_breaks_ties_toward_the_centre():
    grid = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
    assert pick_best(grid, [0.1, 0.5, 0.2, 0.9, 0.3]) == 3e-4
    assert pick_best(grid, [1.0] * 5) == 1e-4  # a flat curve picks the middle, not an edge
    assert pick_best(grid, [1.0, 1.0, 0.0, 0.0, 0.0]) == 3e-5  # tie: nearer the log-centre
    assert pick_best((1, 2, 3), [0.2, 0.2, 0.2], log=False) == 2
    assert pick_best((1, 2, 4), [0.2, 0.1, 0.2], log=False) == 1  # linear centre 2.5: both 1.5 away -> smaller
    with pytest.raises(ValueError, match="grid has 2 values, scores 1"):
        pick_best((1.0, 2.0), [0.0])


def test_run_jobs_gives_the_same_results_in_order_with_a_pool():
    jobs = [1.0, 4.0, 9.0, 16.0]
    assert run_jobs(math.sqrt, jobs) == [1.0, 2.0, 3.0, 4.0]
    assert run_jobs(math.sqrt, jobs, workers=2) == [1.0, 2.0, 3.0, 4.0]
