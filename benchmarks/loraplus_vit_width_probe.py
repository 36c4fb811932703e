"""Timing probe for the LoRA+ fine-tuning tier: seconds per pretraining step and per fine-tuning run (T steps and
its evaluations) of the 1-D ViT at several token widths d, one torch thread, seed 100 (a seed no run uses).

It measures cost only (no claim metric is read) and fixes ``Config.ft_dim`` before the full run:
``python benchmarks/loraplus_vit_width_probe.py [d ...]``.
"""

from __future__ import annotations

import sys
import time

import torch

from icml24.loraplus.experiment import Config
from icml24.loraplus.finetune import finetune_transformer, make_transfer_task, pretrain


def main(dims: list[int]) -> None:
    torch.set_num_threads(1)
    cfg = Config()
    task = make_transfer_task(seed=100, num_samples=cfg.ft_samples)
    probe_steps = 50
    for d in dims:
        t0, c0 = time.perf_counter(), time.process_time()
        net = pretrain(task, dim=d, depth=cfg.ft_depth, steps=probe_steps, lr=cfg.pretrain_lr,
                       batch_size=cfg.ft_batch, seed=100)
        t_pre = (time.perf_counter() - t0) / probe_steps
        c_pre = (time.process_time() - c0) / probe_steps
        t0, c0 = time.perf_counter(), time.process_time()
        finetune_transformer(net, task, mode="lora", lr=1e-3, ratio=16.0, rank=cfg.ft_rank, steps=probe_steps,
                             batch_size=cfg.ft_batch, eval_every=probe_steps // 2, seed=100)
        t_ft = time.perf_counter() - t0  # 50 steps + 3 evaluations
        c_ft = time.process_time() - c0
        # a full-length run: T steps and T / eval_every + 1 evaluations, approximated from the probe
        evals = cfg.ft_steps // cfg.ft_eval_every + 1
        t_eval = t_ft / probe_steps  # upper bound: charge evaluations as steps
        run_s = t_eval * cfg.ft_steps * (1 + (evals - 3) / cfg.ft_steps)
        print(f"d={d}: pretrain {t_pre * 1e3:.1f} ms/step, fine-tune {t_ft / probe_steps * 1e3:.1f} ms/step "
              f"(incl. evals), ~{run_s:.1f} s per T={cfg.ft_steps} run, ~{cfg.pretrain_steps * t_pre:.1f} s "
              f"pretraining (wall); CPU: pretrain {c_pre * 1e3:.1f} ms/step, fine-tune "
              f"{c_ft / probe_steps * 1e3:.1f} ms/step, ~{c_ft / probe_steps * cfg.ft_steps * (1 + (evals - 3) / cfg.ft_steps):.1f} s per run",
              flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [64, 128, 192, 256])
