"""Pilot of the lococo regime (issue 28) on a seed the full run does not use (base and compressor seed 100).

Runs the full run's first two phases with the full Config: the base model pretrained with seed 100, then at each M
(in ``workers`` processes) the baselines tuned and scored and LoCoCo's knobs tuned with compressors trained on seed
100. Prints what the regime guards need (full cache < ``full_copy_max``, tuned StreamingLLM > ``streaming_copy_min``
on the copied half), whether the compressor trains (λ per layer against λ₀ = 0.5, trained vs untrained copied-half
loss), the tuned knobs, and the wall time of each phase with an estimate of the full run (5 seeds).

    python benchmarks/lococo_pilot.py [--seed 100] [--out /tmp/lococo_pilot.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np


def main() -> None:
    import functools

    from icml24.common.parallel import run_jobs
    from icml24.lococo.experiment import Config, _job, pretrain_base, run_budgets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--out", default="/tmp/lococo_pilot.json")
    a = ap.parse_args()
    full_cfg = Config()
    cfg = full_cfg.replace(seeds=(a.seed,), base_seed=a.seed)
    t0 = time.perf_counter()
    model, pre = pretrain_base(cfg)
    t_pre = time.perf_counter() - t0
    full, res = run_budgets(cfg, model)
    t_budgets = time.perf_counter() - t0 - t_pre
    state = {k: t.detach().cpu() for k, t in model.state_dict().items()}
    jobs = [j for M, r in res.items() for j in (("score", M, r["lococo_knobs"], a.seed, r["first_seed"]["state"]),
                                                ("lambda0", M, r["lococo_knobs"]))]
    outs = run_jobs(functools.partial(_job, cfg, state), jobs, workers=cfg.workers, threads=cfg.threads)
    t_score = time.perf_counter() - t0 - t_pre - t_budgets
    out = {"seed": a.seed, "pretrain_s": t_pre, "budgets_s": t_budgets, "score_s": t_score,
           "pretrain_loss_first_last": [pre[0], float(np.mean(pre[-20:]))],
           "full": {"copy": float(np.mean(full["copy"])), "text": float(np.mean(full["text"])),
                    "passkey": full["passkey"]}, "per_budget": {}}
    train_s = []
    for i, (M, r) in enumerate(res.items()):
        fs, sc, lam0 = r["first_seed"], outs[2 * i], outs[2 * i + 1]
        train_s.append(fs["wall_s"])
        out["per_budget"][M] = {
            "copy": {p: float(np.mean(t["copy"])) for p, t in r["test"].items()}
            | {"lococo_lambda0": float(np.mean(lam0["copy"])), "lococo": float(np.mean(sc["trained"]["copy"])),
               "lococo_untrained": float(np.mean(sc["untrained_copy"]))},
            "trained_minus_untrained_per_row": [float(np.mean(np.asarray(sc["trained"]["copy"])
                                                              - np.asarray(sc["untrained_copy"])))],
            "text": {p: float(np.mean(t["text"])) for p, t in r["test"].items()}
            | {"lococo": float(np.mean(sc["trained"]["text"]))},
            "passkey": {p: t["passkey"] for p, t in r["test"].items()} | {"lococo": sc["trained"]["passkey"]},
            "tuned": r["tuned"], "best_baseline": r["best_baseline"], "lococo_knobs": r["lococo_knobs"],
            "lococo_tuning": r["lococo_tuning"], "lambda": fs["lambda"],
            "curve_first_last10": [float(np.mean(fs["curve"][:10])), float(np.mean(fs["curve"][-10:]))],
            "tuning_ok": {k: t.ok for k, t in r["lococo_grids"].items()}
            | {f"{p}:{k}": t.ok for p in r["tuned_grids"] for k, t in r["tuned_grids"][p].items()},
            "trainings": r["trainings"], "first_seed_train_s": fs["wall_s"]}
    # the full run: these phases, then (len(seeds) - 1) × len(budgets) more trainings (scored) in `workers`
    # processes, then the single-shot subprocess (~1-2 min)
    rounds = math.ceil((len(full_cfg.seeds) - 1) * len(full_cfg.budgets) / full_cfg.workers)
    out["estimate_full_s"] = t_pre + t_budgets + t_score + rounds * (float(np.mean(train_s)) + t_score) + 120.0
    print(json.dumps(out, indent=1, default=str))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
