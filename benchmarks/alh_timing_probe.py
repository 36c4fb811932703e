"""Timing probe of the alh full run: one short run per network type (TD3, ALH-g) at the full run's sizes on
seed 100 (not a test seed), timing updates and evaluations separately (CPU time, 1 torch thread as in the
full run's workers), from which the full run's cost is estimated (README, "Amendment").

    python benchmarks/alh_timing_probe.py [updates] [--slow]    # --slow: Config.slow_bias()'s sizes
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

import icml24.alh.experiment as ex
import icml24.alh.runner as runner


def probe(arm: str, updates: int, base: ex.Config) -> dict[str, float]:
    t_eval: list[float] = []
    t_upd: list[float] = []
    real_eval, real_agent = runner.evaluate, ex._agent

    def timed_eval(*a: Any, **k: Any) -> float:
        t = time.process_time()
        out = real_eval(*a, **k)
        t_eval.append(time.process_time() - t)
        return out

    def timed_agent(*a: Any, **k: Any) -> Any:
        agent = real_agent(*a, **k)
        upd = agent.update

        def timed_update(batch: Any) -> Any:
            t = time.process_time()
            out = upd(batch)
            t_upd.append(time.process_time() - t)
            return out

        agent.update = timed_update
        return agent

    runner.evaluate, ex._agent = timed_eval, timed_agent
    try:
        cfg = base.replace(total_steps=base.start_steps + updates, eval_every=min(base.eval_every, updates // 2),
                           workers=1)
        t = time.process_time()
        ex.run_one(cfg, arm=arm, seed=100, lr=1e-4)
        total = time.process_time() - t
    finally:
        runner.evaluate, ex._agent = real_eval, real_agent
    return {"total": total, "update_ms": 1e3 * sum(t_upd) / len(t_upd), "eval_s": sum(t_eval) / len(t_eval),
            "rest": total - sum(t_upd) - sum(t_eval)}


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--slow"]
    updates = int(args[0]) if args else 1_000
    base = ex.Config.slow_bias() if "--slow" in sys.argv else ex.Config()
    torch.set_num_threads(1)
    print(f"B = {base.batch_size}, m = {base.subset_size}, widths {base.hidden}/{base.mem_hidden}")
    for arm in ("td3", "alh_g"):
        r = probe(arm, updates, base)
        print(f"{arm}: {updates} updates: total CPU {r['total']:.1f} s; update {r['update_ms']:.2f} ms; one "
              f"evaluation (10 episodes) {r['eval_s']:.3f} s; rest (warm-up, acting, buffer) {r['rest']:.1f} s")


if __name__ == "__main__":
    main()
