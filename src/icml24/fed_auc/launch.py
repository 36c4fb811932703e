"""torch.distributed entry point: one process per client, the round's averaging by all-reduce.

    torchrun --nproc-per-node 4 -m icml24.fed_auc.launch --task mnist1d --objective compositional --levels 3 \\
        --rounds 20 --local-steps 4 --lr 0.05 --seed 0 --out fed_auc_dist.json

Every rank loads the same task and Dirichlet split (K = world size), builds the same initial model (seeded; rank 0's
weights are also broadcast), trains its own client and takes part in one all-reduce per round. Rank 0 writes the
test AUC (and, with ``--save-state``, the final global state) — the same numbers the in-process simulator gives for
the same arguments (``build_problem`` + ``simulate``; tested). Backend: gloo on CPU, nccl with ``--device cuda``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from icml24.common.nets import MLP
from icml24.fed_auc.algorithm import JACOBIANS, OBJECTIVES, FederatedCompositionalAUC
from icml24.fed_auc.data import TASKS, BinaryTask, dirichlet_split, load_task


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m icml24.fed_auc.launch", description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=TASKS, default="mnist1d")
    p.add_argument("--imratio", type=float, default=0.05, help="p, positive ratio of train/val")
    p.add_argument("--dirichlet-alpha", type=float, default=0.3)
    p.add_argument("--objective", choices=OBJECTIVES, default="compositional")
    p.add_argument("--levels", type=int, default=3, help="L (compositional objective)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--local-steps", type=int, default=4, help="I")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05, help="η = η_x = η_y = η0")
    p.add_argument("--beta", type=float, default=0.9)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--loss-version", choices=("v1", "v2"), default="v2")
    p.add_argument("--jacobian", choices=JACOBIANS, default="hvp")
    p.add_argument("--eta0", type=float, default=None, help="η0 of the inner CE maps (default: --lr)")
    p.add_argument("--clip-value", type=float, default=None, help="elementwise gradient clip (LibAUC: 1.0)")
    p.add_argument("--epoch-decay", type=float, default=0.0, help="λ0 of the epoch-decay proximal term (LibAUC 2e-3)")
    p.add_argument("--hidden", type=str, default="64,64", help="MLP hidden widths, comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", type=Path, default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--save-state", type=Path, default=None, help="rank 0 saves the final global state here")
    return p


def build_problem(args: argparse.Namespace, num_clients: int,
                  device: str | torch.device = "cpu") -> tuple[FederatedCompositionalAUC, list, BinaryTask]:
    """The algorithm (initial model seeded by ``args.seed``, on ``device``), the K clients' data and the task."""
    task = load_task(args.task, seed=args.seed, imratio=args.imratio)
    parts = dirichlet_split(task.y_train, num_clients=num_clients, alpha=args.dirichlet_alpha, seed=args.seed)
    clients = [(task.x_train[p], task.y_train[p]) for p in parts]
    torch.manual_seed(args.seed)
    hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    net = MLP(in_features=task.x_train.shape[1], hidden=hidden, out_features=1).to(device)
    eta0 = args.lr if getattr(args, "eta0", None) is None else args.eta0
    algo = FederatedCompositionalAUC(net, objective=args.objective, levels=args.levels, eta0=eta0, lr_x=args.lr,
                                     lr_y=args.lr, beta=args.beta, gamma=args.gamma, local_steps=args.local_steps,
                                     imratio=task.imratio, loss_version=args.loss_version, jacobian=args.jacobian,
                                     clip_value=getattr(args, "clip_value", None),
                                     epoch_decay=getattr(args, "epoch_decay", 0.0))
    return algo, clients, task


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    import torch.distributed as dist
    from sklearn.metrics import roc_auc_score

    from icml24.fed_auc.backends import run_distributed

    args = parser().parse_args(argv)
    torch.set_num_threads(1)
    if "RANK" not in os.environ:
        raise SystemExit("icml24.fed_auc.launch: start it with torchrun (torchrun --nproc-per-node K -m "
                         "icml24.fed_auc.launch ...); for one process use the simulator (icml24 run fed_auc)")
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        algo, clients, task = build_problem(args, world, dev)
        x, y = (t.to(dev) for t in clients[rank])
        t0 = time.perf_counter()
        state, floats = run_distributed(algo, x, y, rounds=args.rounds, batch_size=args.batch_size, seed=args.seed)
        wall = time.perf_counter() - t0
        if rank != 0:
            return None
        s = algo.scores(state, task.x_test.to(dev)).cpu().numpy()
        out = {"world_size": world, "rounds": args.rounds, "objective": args.objective, "levels": args.levels,
               "test_auc": float(roc_auc_score(task.y_test.numpy(), s)), "floats_communicated": floats,
               "wall_s": wall, "rounds_per_s": args.rounds / wall, "backend": dist.get_backend()}
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=2))
        if args.save_state is not None:
            torch.save({k: t.cpu() for k, t in state.items()}, args.save_state)
        print(json.dumps(out))
        return out
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
