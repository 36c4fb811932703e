"""fed_auc benchmark: rounds per second of the simulator and of torch.distributed (gloo), floats per round, K = 4.

    PYTHONPATH=src python benchmarks/fed_auc_throughput.py [--rounds 10] [--out results/fed_auc/benchmark.json]

Same task and sizes as the full run (MNIST-1D, MLP 40-64-64-1, I = 4, batch 32). The simulator runs the K clients
one after the other in one process (one thread); torch.distributed runs one process per client (torchrun,
gloo all-reduce), so its rounds/s reflects K processes on however many cores the machine has free.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

import icml24
from icml24.fed_auc.backends import simulate
from icml24.fed_auc.launch import build_problem, parser

ARMS = {"ce": ("ce", 2), "aucm": ("aucm", 2), "comp2": ("compositional", 2), "comp3": ("compositional", 3),
        "comp4": ("compositional", 4)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--skip-distributed", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("results/fed_auc/benchmark.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for arm, (obj, L) in ARMS.items():
        args = ["--objective", obj, "--levels", str(L), "--rounds", str(a.rounds)]
        algo, clients, _ = build_problem(parser().parse_args(args), a.clients)
        t0 = time.perf_counter()
        res = simulate(algo, clients, rounds=a.rounds, batch_size=32, seed=0)
        wall = time.perf_counter() - t0
        rows[arm] = {"floats_per_round": res.floats_communicated // a.rounds,
                     "floats_per_round_over_model_size": res.floats_communicated / a.rounds / algo.num_params,
                     "model_params": algo.num_params, "simulator_rounds_per_s": a.rounds / wall}
        if not a.skip_distributed:
            out = Path(f"/tmp/fed_auc_bench_{os.getpid()}_{arm}.json")
            src = str(Path(icml24.__file__).resolve().parents[1])
            env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                   str(a.clients), "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m",
                   "icml24.fed_auc.launch", *args, "--out", str(out)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if p.returncode == 0:
                d = json.loads(out.read_text())
                rows[arm]["distributed_rounds_per_s"] = d["rounds_per_s"]
                assert d["floats_communicated"] // a.rounds == rows[arm]["floats_per_round"]
            else:
                rows[arm]["distributed_error"] = p.stderr[-500:]
        print(arm, json.dumps(rows[arm]), flush=True)
    meta = {"clients": a.clients, "rounds": a.rounds, "local_steps": 4, "batch_size": 32, "task": "mnist1d",
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "threads": 1,
            "note": "wall-clock on a shared machine; distributed = K processes incl. gloo all-reduce per round"}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"meta": meta, "arms": rows}, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
