"""Cost of random scaling: optimizer step of RandomScaling(SGD) and ExpSGDM vs torch.optim.SGD(foreach=True).

The optimizer step alone (no forward/backward) on ``--tensors`` parameters of ``--size``×``--size`` with fixed
gradients, SGD with momentum 0.9 (``torch.utils.benchmark``, median over repeats; arms interleaved in rounds so
that load on a shared machine hits them alike). The goal: RandomScaling(SGD) <= 1.2× plain SGD.
``--clock cpu`` (default on CPU) times with the thread's CPU time (``time.thread_time``), which a loaded shared
machine's descheduling does not inflate; ``--clock wall`` uses wall-clock time (always on CUDA).

    python benchmarks/exp_sgdm_step_cost.py [--tensors 300] [--size 64] [--device cpu] [--rounds 3] [--clock cpu]
"""

from __future__ import annotations

import argparse
import time
import timeit

import torch
from torch.utils import benchmark

from icml24.exp_sgdm import ExpSGDM, RandomScaling


def _params(a: argparse.Namespace) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    ps = []
    for _ in range(a.tensors):
        p = torch.nn.Parameter(torch.randn(a.size, a.size, generator=g).to(a.device))
        p.grad = torch.randn(a.size, a.size, generator=g).to(a.device)
        ps.append(p)
    return ps


ARMS = {
    "torch.optim.SGD(foreach=True)": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True),
    "RandomScaling(SGD), mode='lr' (auto)": lambda ps: RandomScaling(
        torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True), mode="lr"),
    "RandomScaling(SGD), mode='snapshot'": lambda ps: RandomScaling(
        torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True), mode="snapshot"),
    "ExpSGDM": lambda ps: ExpSGDM(ps, lr=1e-2, momentum=0.9),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=300)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per arm and round")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    a = ap.parse_args()
    clock = time.thread_time if a.clock == "cpu" and a.device == "cpu" else timeit.default_timer
    torch.set_num_threads(a.threads)
    steps = {}
    for name, make in ARMS.items():
        opt = make(_params(a))
        opt.step()  # create the state
        steps[name] = opt.step
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    for _ in range(a.rounds):
        for name, step in steps.items():
            m = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=a.threads,
                                timer=clock).blocked_autorange(
                min_run_time=a.min_run_time)
            times[name].append(m.median)
    base = min(times["torch.optim.SGD(foreach=True)"])
    print(f"{a.tensors} tensors of {a.size}x{a.size}, {a.device}, {a.threads} thread(s); best of {a.rounds} rounds; "
          f"{'thread CPU' if clock is time.thread_time else 'wall-clock'} time")
    print("| arm | ms/step | × SGD(foreach) |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts) * 1e3:.3f} | {min(ts) / base:.2f} |")


if __name__ == "__main__":
    main()
