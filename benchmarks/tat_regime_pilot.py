"""Vanilla-only regime pilot for the tat experiment (issue 30): per maze, on training seeds the full run does not
use, train one Diffuser and evaluate snapshots at several training lengths with ``evaluate_maze(vanilla_only=True)``
(vanilla, the oracle best of the N samples and the batch average; no aggregation is run or looked at).

    python benchmarks/tat_regime_pilot.py --maze medium --horizon 72 --milestones 6000 12000 20000 --seed 100
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from icml24.common.seeding import seed_everything
from icml24.tat.diffuser import LimitsNormalizer
from icml24.tat.experiment import BATCH, ORACLE, Config, evaluate_maze, train_maze_model
from icml24.tat.maze import Maze, collect_dataset
from icml24.tat.planner import DiffuserPlanner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maze", default="umaze")
    ap.add_argument("--horizon", type=int, default=48)
    ap.add_argument("--milestones", type=int, nargs="+", default=[1500, 3000, 4500])
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=Config.hidden)
    ap.add_argument("--data-steps", type=int, default=Config.data_steps)
    ap.add_argument("--batch-size", type=int, default=Config.batch_size)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = Config(mazes=(a.maze,), horizons=(a.horizon,), train_steps=(max(a.milestones),), seeds=(a.seed, a.seed + 1),
                 episodes_per_seed=a.episodes, workers=1, hidden=a.hidden, data_steps=a.data_steps,
                 batch_size=a.batch_size)
    seed_everything(a.seed)
    # the normaliser train_maze_model fits: the same dataset (same maze, length and seed)
    norm = LimitsNormalizer(collect_dataset(a.maze, n_steps=cfg.data_steps, seed=a.seed).observations)

    def on_step(k: int, ema) -> None:
        if k in a.milestones:
            t_train = time.perf_counter() - t0
            p = DiffuserPlanner(diffusion=ema.eval(), normalizer=norm, maze=Maze(a.maze))
            t1 = time.perf_counter()
            ev = evaluate_maze(cfg, p, seed=a.seed, vanilla_only=True)
            ema.train()
            r = {"maze": a.maze, "seed": a.seed, "hidden": a.hidden, "data_steps": a.data_steps,
                 "batch_size": a.batch_size, "train_steps": k, "train_s": round(t_train, 1),
                 "eval_s": round(time.perf_counter() - t1, 1)}
            for arm in ("vanilla", ORACLE, BATCH):
                for m in ("infeasible", "contact", "success", "score"):
                    r[f"{arm}_{m}"] = round(float(np.mean(ev["arms"][arm][m])), 4)
            print(json.dumps(r), flush=True)

    t0 = time.perf_counter()
    train_maze_model(cfg, a.maze, a.horizon, seed=a.seed, train_steps=max(a.milestones), on_step=on_step)


if __name__ == "__main__":
    main()
