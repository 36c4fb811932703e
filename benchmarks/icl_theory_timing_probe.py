"""Timing probe for the icl_theory full run (not the full run): the full Config with mc_seed 99 and seed 99
(numbers the full run never computes). Times the two Monte Carlo jobs and one transformer training serially
(1 thread each), then two trainings in 2 processes through run_jobs, and prints the estimated wall time of the
full run's job list on 2 workers (longest-processing-time list schedule, the order run() submits them).

    OMP_NUM_THREADS=1 python benchmarks/icl_theory_timing_probe.py
"""

from __future__ import annotations

import functools
import time

import torch

from icml24.common.parallel import run_jobs
from icml24.icl_theory.experiment import Config, _job, _part3_arms


def main() -> None:
    torch.set_num_threads(1)
    cfg = Config().replace(mc_seed=99, seeds=(99, 100))
    t = {}
    for job in (("part1",), ("part2",), ("arm", 99, "icl", max(cfg.icl_M))):
        t0 = time.perf_counter()
        _job(cfg, job)
        t[job[0]] = time.perf_counter() - t0
        print(f"{job}: {t[job[0]]:.1f} s", flush=True)
    t0 = time.perf_counter()
    run_jobs(functools.partial(_job, cfg), [("arm", s, "icl", min(cfg.icl_M)) for s in (99, 100)], workers=2,
             threads=1)
    pair = time.perf_counter() - t0
    print(f"two trainings in 2 processes (spawn included): {pair:.1f} s", flush=True)
    n_arm = len(Config().seeds) * len(_part3_arms(cfg))
    costs = [t["part1"], t["part2"]] + [t["arm"]] * n_arm
    free = [0.0, 0.0]
    for c in costs:  # jobs are taken in submission order by the first free worker
        i = free.index(min(free))
        free[i] += c
    print(f"serial CPU {sum(costs):.0f} s over {len(costs)} jobs; 2-worker estimate {max(free):.0f} s "
          f"(+ spawn); with the measured 2-process slowdown x{pair / t['arm']:.2f} per training: "
          f"{max(free) * max(1.0, pair / t['arm']):.0f} s")


if __name__ == "__main__":
    main()
