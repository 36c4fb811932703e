"""The GridLeaper cell (the paper's Leaper analog), reported as measured: TSTS / BTS vs N-MCTS at σ_err = 1, T = 20,
every planner's knob tuned on validation instances with the issue's grids by ``tune_grid`` (the main run's
``tune_knob``: extended past an edge that keeps winning, at most ``grid_extra`` points; written to
``leaper.json``)::

    python -m icml24.bayes_mcts.extras [--out results/bayes_mcts] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from icml24.bayes_mcts.envs import GridLeaper
from icml24.bayes_mcts.experiment import KNOB, Config, _iqm, tune_knob, tuning_record
from icml24.bayes_mcts.planners import make_planner, run_episode
from icml24.bayes_mcts.value_models import SimulatedValueModel
from icml24.common.results import paired_check, write_atomic

STEPS = 25  # official: 25 closed-loop steps in Leaper
SIGMA_ERR = 1.0  # the cell's network error std, the same in every state (the main run's setting before issue 30)


def leaper_episode(*, seed: int, planner: str, std_mode: str = "gt", budget: int, sigma_err: float,
                   **knobs: Any) -> dict[str, float]:
    env = GridLeaper(seed=seed)
    net = SimulatedValueModel(q_star=env.q_star, sigma_err=sigma_err, std_mode=std_mode, seed=seed)
    ep = run_episode(env=env, planner=make_planner(planner, env=env, value_model=net, budget=budget, seed=seed,
                                                   **knobs), max_steps=STEPS)
    return {"success": float(ep.success), "return": ep.ret, "steps": float(ep.steps)}


def run_leaper(*, out: Path, quick: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = Config.quick() if quick else Config()
    test = [1000 + i for i in cfg.seeds]
    val = [500 + j for j in range(cfg.n_val)]
    grids = {"nmcts": cfg.c_grid, "bts": cfg.bts_scale_grid, "tsts": cfg.tsts_scale_grid}
    tunings = {p: tune_knob(leaper_episode, p, grid, val, budget=cfg.budget, max_extra=cfg.grid_extra,
                            sigma_err=SIGMA_ERR) for p, grid in grids.items()}
    tuned = {p: t.value for p, t in tunings.items()}
    val_success = {p: {str(x): t.mean(x) for x in t.grid} for p, t in tunings.items()}
    arms = {"greedy": ("greedy", "gt"), "nmcts": ("nmcts", "gt"), "bts": ("bts", "gt"), "tsts": ("tsts", "gt"),
            "tsts_const": ("tsts", "const"), "tsts_zero": ("tsts", "zero")}
    res = {a: [leaper_episode(seed=s, planner=p, std_mode=m, budget=cfg.budget, sigma_err=SIGMA_ERR,
                              **({KNOB[p]: tuned[p]} if p in KNOB else {})) for s in test]
           for a, (p, m) in arms.items()}
    succ = {a: float(np.mean([r["success"] for r in rs])) for a, rs in res.items()}
    diffs = {}
    for a in ("bts", "tsts", "tsts_const", "tsts_zero"):
        c = paired_check(name=a, metric="success", method=[r["success"] for r in res[a]],
                         baseline=[r["success"] for r in res["nmcts"]], direction=">=", kind="mechanism",
                         bootstrap=len(test) >= 10)
        diffs[f"{a}_minus_nmcts"] = {"mean": c.measured, "ci_low": c.ci_low, "ci_high": c.ci_high}
    iqm = _iqm({a: np.array([[r["return"] for r in rs]]).T for a, rs in res.items()}, cfg.iqm_reps)
    d = {"mode": "quick" if quick else "full", "env": "GridLeaper(lanes=4, width=9, density=0.35)",
         "sigma_err": SIGMA_ERR, "budget": cfg.budget, "n_test": len(test), "n_val": len(val),
         "tuned": tuned, "validation_success": val_success,
         "tuning": {p: tuning_record(t) for p, t in tunings.items()}, "success": succ, "paired_vs_nmcts": diffs,
         "mean_return": {a: float(np.mean([r["return"] for r in rs])) for a, rs in res.items()},
         "iqm_return": iqm, "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "leaper.json", json.dumps(d, indent=2) + "\n")
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/bayes_mcts"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    print(json.dumps(run_leaper(out=a.out, quick=a.quick), indent=2))


if __name__ == "__main__":
    main()
