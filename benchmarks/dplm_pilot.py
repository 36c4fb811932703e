"""Pilot of the dplm full run's regime and cost on one seed outside every run (default 100): one seed of
``run_seed`` at the committed run's tuned lrs, one torch thread, with the time of each part.

    python benchmarks/dplm_pilot.py [--seed 100] [--out results/dplm/pilot.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from icml24.dplm import experiment as ex

# the committed (seeds 0-4) run's tuned lrs: every arm 4e-3; fine-tuning per (arm, task)
LRS = {"dplm": 4e-3, "mlm": 4e-3, "ar": 4e-3}
FT_LRS = {"dplm:ss_ft": 3e-3, "dplm:pep_ft": 3e-3, "mlm:ss_ft": 1e-2, "mlm:pep_ft": 3e-3, "ar:ss_ft": 1e-3,
          "ar:pep_ft": 3e-3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--out", default="results/dplm/pilot.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ex.Config(seeds=(a.seed,), workers=1)
    times: dict[str, float] = {}

    def timed(name: str, fn):
        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    for name in ("_train", "guidance_sweep", "representations", "train_structure_head", "train_adapter",
                 "_unconditional_samples", "scaffold"):
        setattr(ex, name, timed(name, getattr(ex, name)))
    t0 = time.perf_counter()
    metrics, extra = ex.run_seed(cfg, a.seed, LRS, FT_LRS)
    wall = time.perf_counter() - t0
    out = {"seed": a.seed, "wall_s": round(wall, 1), "part_s": {k: round(v, 1) for k, v in times.items()},
           "guided": metrics["guided"], "unrealisable": metrics["unrealisable"], "sweep": extra["curve"],
           "config": {"guidance_scales": cfg.guidance_scales, "guidance_samples": cfg.guidance_samples}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
