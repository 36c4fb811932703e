"""Independent, fully seeded jobs run in this process or in a pool of spawned processes (same numbers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from icml24.common.progress import progress

J = TypeVar("J")


def _worker_init(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def run_jobs(fn: Callable[[J], Any], jobs: Sequence[J], *, workers: int = 1, threads: int = 1,
             desc: str = "") -> list[Any]:
    """``[fn(job) for job in jobs]``, in ``workers`` spawned processes when ``workers > 1`` (each with
    ``threads`` torch threads). ``fn`` must be picklable (a module-level function or a ``functools.partial`` of
    one) and every job must seed itself, so that the results do not depend on ``workers``."""
    jobs = list(jobs)
    if workers <= 1 or len(jobs) <= 1:
        return [fn(j) for j in progress(jobs, desc=desc)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn"),
                             initializer=_worker_init, initargs=(threads,)) as pool:
        futures = {pool.submit(fn, j): i for i, j in enumerate(jobs)}
        out: list[Any] = [None] * len(jobs)
        for f in progress(as_completed(futures), desc=desc, total=len(jobs)):
            out[futures[f]] = f.result()
    return out
