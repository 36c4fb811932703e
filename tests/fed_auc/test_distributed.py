"""The torch.distributed back end (2 processes, gloo, localhost) gives the simulator's model for the same seeds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import icml24
from icml24.fed_auc.backends import simulate
from icml24.fed_auc.launch import build_problem, parser

ARGS = ["--task", "breast_cancer", "--imratio", "0.1", "--objective", "compositional", "--levels", "3",
        "--rounds", "2", "--local-steps", "2", "--batch-size", "8", "--hidden", "8", "--lr", "0.1", "--seed", "3"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available in this build")
def test_two_process_gloo_run_equals_the_simulator(tmp_path: Path):
    state_path, out_path = tmp_path / "state.pt", tmp_path / "out.json"
    src = str(Path(icml24.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m", "icml24.fed_auc.launch", *ARGS,
           "--save-state", str(state_path), "--out", str(out_path)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish within 240 s: {e.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist_state = torch.load(state_path)

    algo, clients, _ = build_problem(parser().parse_args(ARGS), 2)
    sim = simulate(algo, clients, rounds=2, batch_size=8, seed=3)
    for k in algo.comm_keys:
        torch.testing.assert_close(dist_state[k], sim.state[k], rtol=1e-5, atol=1e-6)
    assert (dist_state["w"] - algo.init_state()["w"]).abs().max() > 1e-4  # it trained
    assert '"world_size": 2' in out_path.read_text() and '"backend": "gloo"' in out_path.read_text()


def test_launch_refuses_to_run_without_torchrun(monkeypatch):
    from icml24.fed_auc import launch

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        launch.main(ARGS)
