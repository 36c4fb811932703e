"""Planning time per decision: vanilla Diffuser (sample a batch, execute sample 0) vs Diffuser + TAT (sample the
same batch, build the tree, roll it out), at N = 64 and 128 samples and several denoising-step counts; TAT's
overhead is the tree alone. "before" is the first, object-per-node tree (kept as the tests' reference,
``tests/tat/_tree_reference.py``), "now" the array-backed, depth-by-depth one; both give the same plan (checked).
A last line times both trees on the issue's batch of 100 feasible + 28 through-the-wall U-maze paths (N = 128,
L = 40), with the official cosine rule and with a Euclidean threshold of 0.1 (many merges). An untrained MLP
denoiser has the trained one's cost, so no training is needed here.
Score per unit of planning time across step counts comes from a full run's ``score_vs_steps`` and
``planning_time_s`` (``results/tat/results.json``), printed when that file exists.

    python benchmarks/tat_planning_time.py [--horizon 48] [--samples 64,128] [--steps 20,7] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sys

import numpy as np
import torch

from icml24.tat import GaussianDiffusion, LimitsNormalizer, MLPDenoiser, aggregate_plan
from icml24.tat.maze import Maze
from icml24.tat.planner import DiffuserPlanner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--horizon", type=int, default=48)
    ap.add_argument("--samples", default="64,128")
    ap.add_argument("--steps", default="20,7")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(1)
    H = a.horizon
    diff = GaussianDiffusion(MLPDenoiser(horizon=H, transition_dim=4, hidden=a.hidden), horizon=H, transition_dim=4,
                             n_timesteps=20).to(a.device).eval()
    norm = LimitsNormalizer(np.array([[0.5, 0.5, -3, -3], [3.5, 3.5, 3, 3]]))
    planner = DiffuserPlanner(diffusion=diff, normalizer=norm, maze=Maze("umaze"))
    print(f"U-maze, H={H}, MLP denoiser (hidden {a.hidden}), device {a.device}; seconds per decision "
          f"(median of {a.repeats})")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.tat._tree_reference import aggregate_plan as aggregate_plan_before

    print("| N | steps | vanilla (sample) | tree before | tree now | TAT overhead before | TAT overhead now |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.samples.split(",")]:
        for s in [int(x) for x in a.steps.split(",")]:
            ts, tb, tt = [], [], []
            for r in range(a.repeats):
                g = torch.Generator(device=a.device).manual_seed(r)
                t0 = time.perf_counter()
                xn, _ = planner.sample(start=(1.0, 1.0), goal=(3.0, 1.0), n_samples=n, n_steps=s, generator=g)
                t1 = time.perf_counter()
                p_before = aggregate_plan_before(xn)
                t2 = time.perf_counter()
                p_now = aggregate_plan(xn)
                t3 = time.perf_counter()
                assert np.array_equal(p_before, p_now)
                ts.append(t1 - t0)
                tb.append(t2 - t1)
                tt.append(t3 - t2)
            v, b, t = float(np.median(ts)), float(np.median(tb)), float(np.median(tt))
            print(f"| {n} | {s} | {v:.4f} | {b:.4f} | {t:.4f} | {100 * b / v:.0f}% | {100 * t / v:.1f}% |")
    from tests.tat.test_tree_reference import _umaze_batch

    x = _umaze_batch(0)
    print()
    for kw in ({}, {"distance": "euclidean", "merge_threshold": 0.1}):
        tb, tt = [], []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            p_before, i_before = aggregate_plan_before(x, return_tree=True, **kw)
            t1 = time.perf_counter()
            p_now, i_now = aggregate_plan(x, return_tree=True, **kw)
            tt.append(time.perf_counter() - t1)
            tb.append(t1 - t0)
            assert np.array_equal(p_before, p_now) and i_before == i_now
        print(f"Issue batch (100 + 28 U-maze paths), {kw.get('distance', 'cosine')}: {i_now['n_nodes']} nodes, "
              f"largest root child {i_now['root_max_count']} paths; tree before {np.median(tb):.4f} s, "
              f"now {np.median(tt):.4f} s")
    res = Path(__file__).resolve().parents[1] / "results" / "tat" / "results.json"
    if res.exists():
        full_json = json.loads(res.read_text())
        d, T = full_json["extra"], int(full_json["config"]["n_timesteps"])
        pt = d["planning_time_s"]
        print("\nFull run: normalised score per second of planning (time per decision measured in the run)")
        print("| maze | arm | steps | score | s / decision | score / s |")
        print("|---|---|---|---|---|---|")
        full = pt["t_sample"]
        for mz, arms in d["score_vs_steps"].items():
            for arm, by in arms.items():
                for s, sc in by.items():
                    # sampling cost scales with the step count; TAT adds its measured tree time
                    t = full * int(s) / T + (pt["t_tat"] if arm == "tat" else 0.0)
                    print(f"| {mz} | {arm} | {s} | {sc:.1f} | {t:.3f} | {sc / t:.0f} |")


if __name__ == "__main__":
    main()
