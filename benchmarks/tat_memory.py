"""Memory of a closed-loop TAT episode: 1000 steps of integrate → act → prune with :class:`icml24.tat.TATPlanner`.

Sizes of the official locomotion setting (``config/locomotion.py``): H = 32, 64 plans sampled and the first
``tree_batch_size = 32`` integrated, Hopper's transition (3 actions + 11 states), λ = 0.98, 1 − α = 5e-3; and the
official Maze2D threshold 5e-4 (more branching). The planner is a toy: noisy rollouts of a stable linear system
from the observation, in three action modes, so plans merge and branch as a diffusion planner's do; its arrays are
freed after each call, so what tracemalloc still holds after a step is the tree (plus the planner's state).

Each setting runs twice on the same plans: with the tree's storage following the live tree (pruned nodes freed,
merge log folded: the default) and with compaction switched off (the storage before: every pruned node and merge
entry kept). Reported: tracemalloc's current memory after steps 1, 10, 100, 250, 500, 1000 and its peak, the live
node count, the node rows allocated, and the CPU time per step (tracemalloc on, so slower than in use).

    python benchmarks/tat_memory.py [--steps 1000] [--batch 64] [--tree-batch 32] [--horizon 32]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from icml24.tat import TATPlanner

A, S = 3, 11


class ToyPlanner:
    def __init__(self, *, batch: int, horizon: int, seed: int) -> None:
        rng = np.random.default_rng(1234)
        q, _ = np.linalg.qr(rng.normal(size=(S, S)))
        self.M = 0.97 * q                                   # stable rotation-like dynamics
        self.Bm = rng.normal(0, 0.3, (S, A))
        self.K = rng.normal(0, 0.2, (A, S))
        self.batch, self.horizon = batch, horizon
        self.rng = np.random.default_rng(seed)

    def step(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        return self.M @ s + self.Bm @ a + 0.3

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        B, H = self.batch, self.horizon
        mode = self.rng.integers(0, 3, B)[:, None] - 1.0
        s = np.repeat(np.asarray(obs, float)[None], B, 0)
        out = np.empty((B, H, A + S))
        for i in range(H):
            a = np.tanh(s @ self.K.T + 0.5 * mode + self.rng.normal(0, 0.02, (B, A)))
            out[:, i, :A], out[:, i, A:] = a, s
            s = s @ self.M.T + a @ self.Bm.T + 0.3 + self.rng.normal(0, 0.005, (B, S))
        out[:, 0, A:] = obs
        return out / 3.0  # roughly normalised


def run(*, steps: int, batch: int, tree_batch: int, horizon: int, threshold: float, compact: bool) -> dict:
    planner = ToyPlanner(batch=batch, horizon=horizon, seed=0)
    tat = TATPlanner(planner, transition_dim=A + S, action_dim=A, lambda_=0.98, merge_threshold=threshold,
                     tree_batch_size=tree_batch)
    tat.tree._auto_compact = compact
    s = np.zeros(S)
    marks = {1, 10, 100, 250, 500, steps}
    rows = {}
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.process_time()
    for t in range(1, steps + 1):
        a = tat.act(s)
        s = planner.step(s, a * 3.0)
        if t in marks:
            cur = tracemalloc.get_traced_memory()[0] - base
            st = tat.tree.storage()
            rows[t] = {"MiB": cur / 2**20, "live": st["live"], "allocated": st["allocated"],
                       "merge_entries": st["merge_log"] + st["steps_kept"]}
    cpu = (time.process_time() - t0) / steps
    peak = (tracemalloc.get_traced_memory()[1] - base) / 2**20
    tracemalloc.stop()
    return {"rows": rows, "peak_MiB": peak, "ms_per_step": 1e3 * cpu,
            "root_count": tat.last_info["count"], "root_children": tat.last_info["root_children"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tree-batch", type=int, default=32)
    ap.add_argument("--horizon", type=int, default=32)
    args = ap.parse_args()
    print(f"steps={args.steps}, sampled {args.batch}, integrated {args.tree_batch}, H={args.horizon}, "
          f"D={A}+{S}, lambda=0.98")
    for thr in (5e-3, 5e-4):
        for compact in (True, False):
            r = run(steps=args.steps, batch=args.batch, tree_batch=args.tree_batch, horizon=args.horizon,
                    threshold=thr, compact=compact)
            name = "freed (default)" if compact else "kept (no compaction)"
            print(f"\n1-alpha={thr:g}, pruned nodes {name}: peak {r['peak_MiB']:.2f} MiB, "
                  f"{r['ms_per_step']:.2f} ms/step, last root child: {r['root_count']} merged, "
                  f"{r['root_children']} root children")
            print("  step |   MiB | live nodes | rows allocated | merge entries")
            for t, row in r["rows"].items():
                print(f"  {t:4d} | {row['MiB']:5.2f} | {row['live']:10d} | {row['allocated']:14d} | "
                      f"{row['merge_entries']:13d}")


if __name__ == "__main__":
    main()
