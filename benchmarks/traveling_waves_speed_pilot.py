"""Pilot of the traveling_waves learning-speed experiment on seed 100 (not a full-run seed): per arm and lr, the
steps to criterion, whether the criterion was reached, and the wall time per step.

    python benchmarks/traveling_waves_speed_pilot.py [--horizon 10] [--cap 3000] [--lrs 3e-4,1e-3,3e-3]
"""

from __future__ import annotations

import argparse
import functools
import json

from icml24.common.parallel import run_jobs
from icml24.traveling_waves.speed import SPEED_ARMS, SpeedSetting, steps_to_criterion


def _job(job, st):
    arm, lr, seed = job
    return steps_to_criterion(arm, lr, seed, st)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--cap", type=int, default=3000)
    ap.add_argument("--check-every", type=int, default=25)
    ap.add_argument("--criterion", type=float, default=0.99)
    ap.add_argument("--lrs", default="3e-4,1e-3,3e-3")
    ap.add_argument("--arms", default=",".join(SPEED_ARMS))
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    st = SpeedSetting(d=6, s=6, control_s=4, hidden=128, lstm_hidden=64, horizon=a.horizon, cap=a.cap,
                      check_every=a.check_every, criterion=a.criterion, val_batches=4, test_batches=10,
                      batch_size=64, clip=1.0)
    jobs = [(arm, float(lr), a.seed) for arm in a.arms.split(",") for lr in a.lrs.split(",")]
    out = run_jobs(functools.partial(_job, st=st), jobs, workers=a.workers)
    for r in out:
        steps_run = r["steps"]
        print(f"{r['arm']:>13} lr={r['lr']:<7g} steps={r['steps']:>5} reached={r['reached']!s:5} "
              f"val={r['best_val_acc']:.4f} test={r['test_acc']:.4f} wall={r['wall_s']:.1f}s "
              f"({1e3 * r['wall_s'] / max(steps_run, 1):.1f} ms/step)")
    print(json.dumps(out))
