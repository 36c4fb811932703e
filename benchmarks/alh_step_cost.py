"""Training steps per second of TD3 and ALH (one ``update`` on a replay batch) at the paper's and the CPU sizes.

Sizes: ``paper`` = MuJoCo Hopper dims (11/3), B = 256, actor/critic width 256, E/D width 256, m = B/2 = 128
(official ``main.py``); ``cpu`` = the MultiNormEnv reproduction (1/1, B = 128, width 64, E/D 64, m = 32).
On the CPU the process's CPU time is measured (``time.process_time``; wall time on a shared machine measures the
neighbours' load), on CUDA wall time with synchronisation. Also times the hypothesis of the update batch two ways: the encoder on all B·m subset rows (as the official
``sample_encode`` does) and once per row then gathered (``SetMemory.subset_encode``: same numbers). Arms are
interleaved in rounds (best of rounds) so that load on a shared machine hits them alike.

    python benchmarks/alh_step_cost.py [--rounds 3] [--steps 50] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from icml24.alh import ALHAgent, ReplayBuffer, TD3Agent, subset_indices

SIZES = {
    "paper": dict(state_dim=11, action_dim=3, batch=256, hidden=256, mem_hidden=256, subset=128),
    "cpu": dict(state_dim=1, action_dim=1, batch=128, hidden=64, mem_hidden=64, subset=32),
}


def _buffer(sz: dict, device: str) -> ReplayBuffer:
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(state_dim=sz["state_dim"], action_dim=sz["action_dim"], capacity=5000, seed=0)
    for _ in range(5000):
        buf.add(rng.normal(size=sz["state_dim"]), rng.uniform(-1, 1, sz["action_dim"]),
                rng.normal(size=sz["state_dim"]), float(rng.normal()), 0.0)
    return buf


def _agents(sz: dict, device: str) -> dict[str, TD3Agent]:
    kw = dict(state_dim=sz["state_dim"], action_dim=sz["action_dim"], max_action=1.0, hidden=sz["hidden"],
              device=device)
    return {"TD3": TD3Agent(**kw),
            "ALH": ALHAgent(hypo_dim=64, mem_hidden=sz["mem_hidden"], subset_size=sz["subset"], **kw)}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


_clock = time.perf_counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50, help="updates timed per arm and round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    global _clock
    # on a shared CPU, wall time measures the neighbours' load: time this process's CPU instead
    _clock = time.process_time if a.device == "cpu" else time.perf_counter
    print(f"{'CPU time' if a.device == 'cpu' else 'wall time'}, {a.device}, {a.threads} thread(s), best of {a.rounds} rounds of {a.steps} updates")
    print("| size | arm | ms/update | updates/s | × TD3 |")
    print("|---|---|---|---|---|")
    for size, sz in SIZES.items():
        buf = _buffer(sz, a.device)
        agents = _agents(sz, a.device)
        batches = [buf.sample(sz["batch"], a.device) for _ in range(a.steps)]
        best: dict[str, float] = {}
        for name, ag in agents.items():  # warm-up
            for b in batches[:5]:
                ag.update(b)
        for _ in range(a.rounds):
            for name, ag in agents.items():
                _sync(a.device)
                t = _clock()
                for b in batches:
                    ag.update(b)
                _sync(a.device)
                best[name] = min(best.get(name, float("inf")), (_clock() - t) / a.steps)
        for name, t in best.items():
            print(f"| {size} | {name} | {t * 1e3:.2f} | {1 / t:.0f} | {t / best['TD3']:.2f} |")
        # the batch hypothesis: encoder on B·m rows (official) vs once per row, gathered (ours)
        mem = agents["ALH"].mem
        x = mem.transitions(*batches[0][:2], batches[0][3])
        g = torch.Generator(device=a.device)
        enc: dict[str, float] = {}
        with torch.no_grad():
            for _ in range(a.rounds):
                for how in ("B·m rows (official)", "B rows, gathered"):
                    _sync(a.device)
                    t = _clock()
                    for _ in range(a.steps):
                        idx = subset_indices(x.shape[0], sz["subset"], generator=g, device=a.device)
                        if how.startswith("B·m"):
                            mem.codes(x[idx]).mean(1)
                        else:
                            mem.codes(x)[idx].mean(1)
                    _sync(a.device)
                    enc[how] = min(enc.get(how, float("inf")), (_clock() - t) / a.steps)
        for how, t in enc.items():
            print(f"| {size} | batch hypothesis, E on {how} | {t * 1e3:.2f} | {1 / t:.0f} | — |")


if __name__ == "__main__":
    main()
