"""Timing probe for the exp_sgdm full run (not the full run): the full Config on seed 100 (a seed the full run
never uses). Times, serially in this process with 1 thread, a few MNIST-1D cells (both arms, a stable and a
diverging η), one identity seed and one synthetic (schedule, arm, seed) column over every T, then estimates the
full run on 2 workers: its job list split over 2 processes, CPU time and wall time (the wall estimate uses this
process's wall/CPU ratio, i.e. today's load).

    OMP_NUM_THREADS=1 python benchmarks/exp_sgdm_timing_probe.py
"""

from __future__ import annotations

import time

import torch

from icml24.common.data import load_mnist1d
from icml24.exp_sgdm.experiment import ARMS, Config, _mlp_job, _synth_job, identity_estimates


def _time(fn, *args) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    torch.set_num_threads(1)
    cfg = Config().replace(seeds=(100, 101))
    s = 100
    split = load_mnist1d(seed=s, val_fraction=cfg.val_fraction)
    mlp = [_time(_mlp_job, cfg, (arm, lr, s, split)) for arm in ARMS for lr in (2.0, 8.0)]
    for (arm, lr), (w, c) in zip([(a, lr) for a in ARMS for lr in (2.0, 8.0)], mlp, strict=True):
        print(f"MNIST-1D cell {arm} η={lr:g}: wall {w:.1f} s, CPU {c:.1f} s", flush=True)
    ident = _time(identity_estimates, cfg, s)
    print(f"identity seed: wall {ident[0]:.1f} s, CPU {ident[1]:.1f} s", flush=True)
    syn = [_time(_synth_job, cfg, ("horizon", "exp_sgdm", T, s)) for T in cfg.synth_steps]
    print("synthetic cells, T = " + ", ".join(f"{T}: CPU {c:.2f} s" for T, (_, c) in zip(cfg.synth_steps, syn,
                                                                                          strict=True)), flush=True)
    n_seeds = len(Config().seeds)
    cell = sum(c for _, c in mlp) / len(mlp)
    n_cells = len(ARMS) * len(cfg.lr_grid) * n_seeds
    n_ext = len(ARMS) * cfg.grid_extra * n_seeds  # the most the tuning extensions can add
    synth_col = sum(c for _, c in syn)
    cpu = (n_cells * cell + n_seeds * ident[1] + 2 * len(ARMS) * cfg.synth_seeds * synth_col)
    cpu_max = cpu + n_ext * cell
    ratio = sum(w for w, _ in mlp) / sum(c for _, c in mlp)
    print(f"full run: {n_cells} MLP cells (+ at most {n_ext} extension cells), CPU {cpu:.0f} s ({cpu_max:.0f} s "
          f"with every extension); on 2 workers {cpu / 2 / 60:.1f} min of CPU each ({cpu_max / 2 / 60:.1f} max); "
          f"at this probe's wall/CPU ratio x{ratio:.2f}: {cpu / 2 * ratio / 60:.1f} min wall "
          f"({cpu_max / 2 * ratio / 60:.1f} max)", flush=True)


if __name__ == "__main__":
    main()
