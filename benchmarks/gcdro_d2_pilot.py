"""GCDRO D2 regime pilot: ERM and the DRO baselines only (never GCDRO), on seeds the full run does not use.

Computes, per seed, exactly the statistics of the experiment's D2 regime guards (``experiment.d2_regime``): the
DRO baseline selected by D2's declared rule on the noise-free D2 against ERM on the minority, and KL / χ² at their
noise-free picks trained with the 5% gross label noise against ERM. Also the fixed-strength probe of issue 29
(KL λ = 1, χ² λ = 1, CVaR 0.2). Prints a table and writes JSON.

    python benchmarks/gcdro_d2_pilot.py --seeds 100 101 102 103 104 --out /tmp/gcdro_d2_pilot.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from icml24.common.seeding import numpy_generator, seed_everything
from icml24.common.stats import one_sample_ci
from icml24.gcdro.experiment import (
    BEST,
    ORACLE_SEED_OFFSET,
    PESSIMISM_ARMS,
    Config,
    d2_data,
    d2_regime,
    make_estimator,
)

FIXED = (("erm", 0.0), ("kl", 1.0), ("chi2", 1.0), ("cvar", 0.2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102, 103, 104])
    ap.add_argument("--out", default="/tmp/gcdro_d2_pilot.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = Config()
    full = set(cfg.seeds)
    if full & set(args.seeds):
        raise SystemExit(f"the pilot's seeds must not be the full run's {sorted(full)}")
    rows, t0 = [], time.time()
    for seed in args.seeds:
        seed_everything(seed)
        d2 = d2_data(cfg, numpy_generator(seed), numpy_generator(seed + ORACLE_SEED_OFFSET))
        reg = d2_regime(cfg, seed, d2)
        fixed = {}
        for noise, y, score in (("clean", d2["y_clean"], d2["score_clean"]), ("noisy", d2["y"], d2["score"])):
            for arm, v in FIXED:
                fixed[f"{noise}/{arm}{'' if arm == 'erm' else f'({v:g})'}"] = score(
                    make_estimator(cfg, arm, v, seed).fit(d2["x"], y))["d2_rmse_minority"]
        m = reg["metrics"]
        rows.append({"seed": seed, "selected": reg["selected"], "metrics": m, "fixed": fixed,
                     "gain_log": float(np.log(m[BEST]["d2_clean_dro_rmse_minority"] / m["erm"]["d2_clean_rmse_minority"])),
                     "loss_log": {a: float(np.log(m[a]["d2_noisy_at_clean_pick_rmse_minority"]
                                                  / m["erm"]["d2_noisy_erm_rmse_minority"])) for a in PESSIMISM_ARMS}})
        print(f"seed {seed}: selected {reg['selected']}, clean log-ratio {rows[-1]['gain_log']:+.3f}, noisy "
              + ", ".join(f"{a}({m[a]['d2_clean_param']:g}) {rows[-1]['loss_log'][a]:+.3f}" for a in PESSIMISM_ARMS),
              flush=True)
    summary = {"gain_log": one_sample_ci([r["gain_log"] for r in rows]),
               **{f"loss_log_{a}": one_sample_ci([r["loss_log"][a] for r in rows]) for a in PESSIMISM_ARMS},
               "fixed_mean": {k: float(np.mean([r["fixed"][k] for r in rows])) for k in rows[0]["fixed"]},
               "wall_s": time.time() - t0}
    for k, v in summary.items():
        print(k, v)
    with open(args.out, "w") as f:
        json.dump({"seeds": args.seeds, "rows": rows, "summary": summary}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
