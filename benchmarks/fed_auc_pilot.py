"""fed_auc regime pilot (issue 29): CE-FedAvg vs federated AUC-M ONLY (never the compositional arms), on seeds the
full run does not use, to choose the harder MNIST-1D task before the full run.

Options: positives {3, 5, 8} (clean) · class 0 with 10% label noise · {3, 5, 8} with 10% label noise; p = 0.05,
R = 150, I = 4, K = 4 and 8, every stabiliser of the full run (clip 1.0, epoch decay 2e-3, η/10 at 50%/75%).
Each arm picks its step on mean validation AUC over the pilot seeds from a wide grid; test AUC is read at the pick.
Rule (declared before the pilot ran): take the option with the largest mean over K of (AUC-M − CE) test AUC among
those where AUC-M > CE at both K; report all.

    OMP_NUM_THREADS=1 python benchmarks/fed_auc_pilot.py --out /tmp/fed_auc_pilot.json
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np

from icml24.common.parallel import run_jobs
from icml24.fed_auc.experiment import Config, run_job

OPTIONS = {"pos358": dict(positive_classes=(3, 5, 8), label_noise=0.0),
           "c0_noise10": dict(positive_classes=(0,), label_noise=0.1),
           "pos358_noise10": dict(positive_classes=(3, 5, 8), label_noise=0.1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    ap.add_argument("--grid", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4, 0.8, 1.6])
    ap.add_argument("--options", nargs="+", default=list(OPTIONS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="/tmp/fed_auc_pilot.json")
    a = ap.parse_args()
    out: dict = {"seeds": a.seeds, "grid": a.grid, "options": {}}
    for name in a.options:
        cfg = Config(seeds=tuple(a.seeds), eval_every=50, **OPTIONS[name])
        jobs = [(K, arm, lr, s) for K in cfg.clients for arm in ("ce", "aucm") for lr in a.grid for s in a.seeds]
        res = dict(zip(jobs, run_jobs(functools.partial(run_job, cfg), jobs, workers=a.workers, desc=name)))
        o: dict = {}
        for K in cfg.clients:
            for arm in ("ce", "aucm"):
                val = {lr: float(np.mean([res[K, arm, lr, s]["val_auc"] for s in a.seeds])) for lr in a.grid}
                pick = max(val, key=val.get)
                o[f"K{K}/{arm}"] = {"pick": pick, "val": val,
                                    "test": [res[K, arm, pick, s]["test_auc"] for s in a.seeds]}
            d = np.subtract(o[f"K{K}/aucm"]["test"], o[f"K{K}/ce"]["test"])
            o[f"K{K}/aucm-ce"] = {"mean": float(d.mean()), "per_seed": d.tolist()}
            print(name, K, {arm: (o[f"K{K}/{arm}"]["pick"], round(float(np.mean(o[f"K{K}/{arm}"]["test"])), 2))
                            for arm in ("ce", "aucm")}, "aucm-ce", [round(x, 2) for x in d], flush=True)
        out["options"][name] = o
        json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
