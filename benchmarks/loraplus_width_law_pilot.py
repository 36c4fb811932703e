"""Pilot of the amended LoRA+ width law (issue 31) on seed 100, which no run uses: the full run's widths, λ grid and
η_A grid, one seed, scored on the final normalised training loss (held-out loss beside it).

Prints, per width, the tuned η_A and the training / held-out loss of each λ, the best λ, and LoRA+ (λ = 16) over
LoRA (λ = 1). With one seed there is no standard error, so the pick is the plain argmin (no grid extension).
``python benchmarks/loraplus_width_law_pilot.py`` (2 processes).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from icml24.common.parallel import run_jobs
from icml24.loraplus.experiment import Config, _law_job

SEED = 100


def main() -> None:
    cfg = Config(seeds=(SEED,))
    t0 = time.perf_counter()
    jobs = [(n, SEED, tuple((lam, lr) for lr in cfg.lrs)) for n in sorted(cfg.widths, reverse=True)
            for lam in cfg.ratios]
    outs = run_jobs(functools.partial(_law_job, cfg), jobs, workers=cfg.workers, threads=1)
    res = {(n, lam): dict(zip(cfg.lrs, o, strict=True)) for (n, _, cells), o in zip(jobs, outs, strict=True)
           for lam in [cells[0][0]]}
    print(f"{len(jobs) * len(cfg.lrs)} runs in {time.perf_counter() - t0:.0f} s (2 processes)")
    best_lam, ratio, ratio_h = [], [], []
    for n in cfg.widths:
        rows = {}
        for lam in cfg.ratios:
            lr = min(cfg.lrs, key=lambda x, lam=lam: res[n, lam][x][0])
            rows[lam] = (lr, *res[n, lam][lr])
        b = min(cfg.ratios, key=lambda lam: rows[lam][1])
        best_lam.append(b)
        ratio.append(rows[cfg.default_ratio][1] / rows[1.0][1])
        ratio_h.append(rows[cfg.default_ratio][2] / rows[1.0][2])
        print(f"n={n}: " + "; ".join(f"λ={lam:g}: η_A={r[0]:g} train {r[1]:.4g} held-out {r[2]:.4g}"
                                    for lam, r in rows.items()))
        print(f"  best λ {b:g}; LoRA+/LoRA training {ratio[-1]:.3f}, held-out {ratio_h[-1]:.3f}")
    log_n = np.log(np.asarray(cfg.widths, dtype=float))
    print(f"slope log(best λ) ~ log n: {np.polyfit(log_n, np.log(best_lam), 1)[0]:+.3f}; "
          f"slope log(training ratio) ~ log n: {np.polyfit(log_n, np.log(ratio), 1)[0]:+.3f}; "
          f"held-out: {np.polyfit(log_n, np.log(ratio_h), 1)[0]:+.3f}")


if __name__ == "__main__":
    main()
