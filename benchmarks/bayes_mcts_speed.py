"""Search iterations per second of TSTS (per-level and frontier), BTS and N-MCTS at budgets 20-500.

One decision from the start of a GridMaze (σ_err = 1, accurate σ), median over repeats; also the cost of the
hot path, the max-of-Gaussians backup (the 1-D fast path used by the planners and the batched function).

    python benchmarks/bayes_mcts_speed.py [--size 8] [--budgets 20,100,500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from icml24.bayes_mcts import GridMaze, SimulatedValueModel, make_planner, max_of_gaussians
from icml24.bayes_mcts.distributions import _max1d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--budgets", default="20,100,500")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    budgets = [int(b) for b in a.budgets.split(",")]
    arms = {"nmcts": {}, "bts": {}, "tsts": {}, "tsts_frontier": {"variant": "frontier"}}
    print(f"GridMaze {a.size}x{a.size}, one decision from the start; iterations / s (median of {a.repeats})")
    print("| planner | " + " | ".join(f"T={T}" for T in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for arm, kw in arms.items():
        row = []
        for T in budgets:
            ts = []
            for r in range(a.repeats):
                env = GridMaze(size=a.size, seed=r)
                net = SimulatedValueModel(q_star=env.q_star, sigma_err=1.0, std_mode="gt", seed=r)
                pl = make_planner(arm.split("_")[0], env=env, value_model=net, budget=T, seed=r, **kw)
                t0 = time.perf_counter()
                pl.plan()
                ts.append(time.perf_counter() - t0)
            row.append(f"{T / float(np.median(ts)):,.0f}")
        print(f"| {arm} | " + " | ".join(row) + " |")
    rng = np.random.default_rng(0)
    mu, sd = rng.normal(size=4), rng.uniform(0.1, 1, 4)
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        _max1d(mu, sd)
    t1 = time.perf_counter()
    B = rng.normal(size=(n, 4)), rng.uniform(0.1, 1, (n, 4))
    max_of_gaussians(*B)
    t2 = time.perf_counter()
    print(f"max-of-Gaussians, K=4: fast path {(t1 - t0) / n * 1e6:.1f} µs/call; "
          f"batched {(t2 - t1) / n * 1e6:.2f} µs/row")


if __name__ == "__main__":
    main()
