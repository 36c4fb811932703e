"""MoLA regime pilot: STL vs HPS (both with per-domain heads) only, never the MoLA arms, on seeds the full run
does not use (100-102). For each setting (input conflict × backbone width × series generated), each arm's lr is
picked from the full run's grid by the mean validation accuracy over the pilot seeds, and the paired STL − HPS test
mean accuracy (points) is reported with its 95% t interval over the seeds.

The last three settings were added after the first ten rows (STL and HPS only) showed the gap growing with the
series per domain. Selection rule (fixed before the pilot): among the settings whose interval is above 0, the one with the largest
mean gap; none above 0 is reported as such.

    python benchmarks/mola_regime_pilot.py            # one process, one torch thread
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
import torch
from scipy import stats

from icml24.mola.experiment import Config, make_domains, pretrained_backbone, train_arm

SEEDS = (100, 101, 102)
SETTINGS = [*itertools.product(("permute", "rotate"), (16, 32, 64), (8000,)),
            *itertools.product(("permute", "rotate"), (16, 32), (16000,)),
            # added after the rows above showed more series per domain widening the gap (STL/HPS rows only)
            ("permute", 64, 16000), ("permute", 32, 32000), ("permute", 64, 32000)]


def pilot(conflict: str, hidden: int, num_samples: int) -> dict:
    cfg = Config(seeds=SEEDS, conflict=conflict, hidden=hidden, num_samples=num_samples, workers=1)
    val = {a: {lr: [] for lr in cfg.lrs} for a in ("stl", "hps")}
    test = {a: {lr: [] for lr in cfg.lrs} for a in ("stl", "hps")}
    for seed in SEEDS:
        data = make_domains(seed=seed, num_samples=num_samples, offset=cfg.offset, conflict=conflict)
        bb = pretrained_backbone(data, cfg, seed)
        for arm in ("stl", "hps"):
            for lr in cfg.lrs:
                m = train_arm(arm, data, cfg, seed, backbone=bb, lr=lr)["metrics"]
                val[arm][lr].append(m["val_mean_acc"])
                test[arm][lr].append(m["mean_acc"])
    pick = {a: max(cfg.lrs, key=lambda lr, a=a: np.mean(val[a][lr])) for a in val}
    d = np.array(test["stl"][pick["stl"]]) - np.array(test["hps"][pick["hps"]])
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    return {"pick": pick, "stl": float(np.mean(test["stl"][pick["stl"]])),
            "hps": float(np.mean(test["hps"][pick["hps"]])), "diff": d.tolist(), "mean": float(d.mean()),
            "ci": (float(lo), float(hi))}


def main() -> None:
    torch.set_num_threads(1)
    only = sys.argv[1:]
    rows = []
    print("| conflict | hidden | series | lr STL / HPS | STL | HPS | STL − HPS per seed | mean [95% CI] | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for conflict, hidden, n in SETTINGS:
        if only and f"{conflict}-{hidden}-{n}" not in only:
            continue
        t0 = time.process_time()
        r = pilot(conflict, hidden, n)
        rows.append(((conflict, hidden, n), r))
        print(f"| {conflict} | {hidden} | {n} | {r['pick']['stl']:g} / {r['pick']['hps']:g} | {r['stl']:.2f} | "
              f"{r['hps']:.2f} | {', '.join(f'{x:+.2f}' for x in r['diff'])} | {r['mean']:+.2f} "
              f"[{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}] | {time.process_time() - t0:.0f} |", flush=True)
    ok = [(s, r) for s, r in rows if r["ci"][0] > 0]
    print("chosen:", max(ok, key=lambda sr: sr[1]["mean"])[0] if ok else "none has STL − HPS above 0")


if __name__ == "__main__":
    main()
