"""Learned value networks with uncertainty for GridMaze: a Gaussian (mean + log-std head) Q-network and a deep
ensemble, trained on exhaustive-search labels Q*(s, a) of training mazes — the paper's question whether learned
uncertainty (MLE heads, ensembles) is accurate enough for the Bayesian planners to gain.

The official code's network has a mean head and a log-std head on the *detached* trunk features (σ = exp(head)).
Its training code is not released; here the mean head is fit by squared error and the log-std head by the
Gaussian negative log-likelihood with the mean detached, ``½ log σ² + (y − μ)² / (2σ²)``. The ensemble's
predictive std is ``√(mean_i σ_i² + var_i μ_i)``.

Run the learned-uncertainty cell (written to ``results/bayes_mcts/learned.json`` and ``learned.png``)::

    python -m icml24.bayes_mcts.learned [--out results/bayes_mcts] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from icml24.bayes_mcts.envs import GridMaze
from icml24.bayes_mcts.planners import make_planner, run_episode
from icml24.bayes_mcts.value_models import STD_FLOOR
from icml24.common import validate as v
from icml24.common.nets import MLP
from icml24.common.results import paired_check, write_atomic

__all__ = ["GaussianQNet", "maze_features", "train_value_ensemble", "EnsembleValueModel", "LEARNED_MODES"]

LEARNED_MODES = ("ensemble", "mle", "const", "gt")


def _open_cells(maze: GridMaze) -> list[tuple[int, int]]:
    return [(int(r), int(c)) for r, c in zip(*np.nonzero(~maze.wall), strict=True) if (r, c) != maze.goal]


def maze_features(maze: GridMaze, states: list[tuple[int, int]]) -> torch.Tensor:
    """Input of the network: the wall grid, a one-hot agent position and the position's coordinates scaled to
    [0, 1] (``2·(2n+1)² + 2`` features)."""
    walls = torch.as_tensor(maze.wall, dtype=torch.float32).flatten()
    n = walls.numel()
    x = torch.zeros(len(states), 2 * n + 2)
    x[:, :n] = walls
    h, w = maze.wall.shape
    for i, (r, c) in enumerate(states):
        x[i, n + r * w + c] = 1.0
        x[i, 2 * n], x[i, 2 * n + 1] = r / (h - 1), c / (w - 1)
    return x


class GaussianQNet(nn.Module):
    """Trunk MLP → mean head (|A|) and log-std head on the detached trunk features (official procgen_module)."""

    def __init__(self, *, in_features: int, n_actions: int, hidden: tuple[int, ...] = (256, 256)) -> None:
        super().__init__()
        self.trunk = MLP(in_features=in_features, hidden=hidden[:-1], out_features=hidden[-1])
        self.act = nn.ReLU()
        self.mean = nn.Linear(hidden[-1], n_actions)
        self.log_std = nn.Linear(hidden[-1], n_actions)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.act(self.trunk(x))
        return self.mean(h), self.log_std(h.detach())


def train_value_ensemble(*, mazes: list[GridMaze], n_members: int = 5, hidden: tuple[int, ...] = (256, 256),
                         epochs: int = 40, lr: float = 1e-3, batch_size: int = 256, seed: int = 0,
                         device: str = "cpu",
                         cells: list[list[tuple[int, int]]] | None = None) -> list[GaussianQNet]:
    """Train ``n_members`` Gaussian Q-networks (different initialisations and batch orders) on Q* labels
    of every open cell of ``mazes`` (or of ``cells[i]`` in maze i)."""
    v.integer("train_value_ensemble", "n_members", n_members, minimum=1)
    v.integer("train_value_ensemble", "epochs", epochs, minimum=1)
    v.positive("train_value_ensemble", "lr", lr)
    if not mazes:
        raise ValueError("train_value_ensemble: mazes must hold at least one GridMaze")
    if cells is not None and len(cells) != len(mazes):
        raise ValueError(f"train_value_ensemble: cells must give one list per maze, got {len(cells)} for "
                         f"{len(mazes)} mazes")
    xs, ys = [], []
    for i, m in enumerate(mazes):
        cs = _open_cells(m) if cells is None else cells[i]
        xs.append(maze_features(m, cs))
        ys.append(torch.as_tensor(np.stack([m.q_star(s) for s in cs]), dtype=torch.float32))
    x, y = torch.cat(xs).to(device), torch.cat(ys).to(device)
    nets = []
    for k in range(n_members):
        g = torch.Generator().manual_seed(seed * 100 + k)
        torch.manual_seed(seed * 100 + k)
        net = GaussianQNet(in_features=x.shape[1], n_actions=y.shape[1], hidden=hidden).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        for _ in range(epochs):
            perm = torch.randperm(len(x), generator=g).to(device)
            for i in range(0, len(x), batch_size):
                idx = perm[i:i + batch_size]
                mu, log_sd = net(x[idx])
                err2 = (y[idx] - mu.detach()) ** 2
                loss = ((y[idx] - mu) ** 2).mean() + (log_sd + 0.5 * err2 * torch.exp(-2 * log_sd)).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        nets.append(net.eval())
    return nets


class EnsembleValueModel:
    """A :class:`~icml24.bayes_mcts.value_models.ValueModel` for one maze from trained networks.

    Args:
        nets: trained :class:`GaussianQNet` members.
        maze: the maze being planned in (all its states are evaluated once, in one batch).
        std_mode: ``ensemble`` (√(mean σ_i² + var μ_i)), ``mle`` (the first member's σ head), ``const``
            (``const_std`` everywhere) or ``gt`` (oracle |μ − Q*|, the official ``use_gt_std``).
        const_std: the std of the ``const`` mode (e.g. the ensemble's RMSE on validation mazes).
    """

    def __init__(self, *, nets: list[GaussianQNet], maze: GridMaze,
                 std_mode: Literal["ensemble", "mle", "const", "gt"] = "ensemble", const_std: float = 1.0) -> None:
        v.one_of("EnsembleValueModel", "std_mode", std_mode, LEARNED_MODES)
        cells = _open_cells(maze)
        x = maze_features(maze, cells)
        dev = next(nets[0].parameters()).device
        with torch.no_grad():
            outs = [net(x.to(dev)) for net in nets]
        mus = torch.stack([o[0] for o in outs]).cpu().double().numpy()
        sds = torch.stack([torch.exp(o[1]) for o in outs]).cpu().double().numpy()
        mu = mus.mean(0)
        if std_mode == "ensemble":
            sd = np.sqrt((sds ** 2).mean(0) + mus.var(0))
        elif std_mode == "mle":
            mu, sd = mus[0], sds[0]
        elif std_mode == "const":
            sd = np.full_like(mu, v.positive("EnsembleValueModel", "const_std", const_std))
        else:
            sd = np.abs(mu - np.stack([maze.q_star(s) for s in cells]))
        sd = np.maximum(sd, STD_FLOOR)
        self.table = {s: (mu[i], sd[i]) for i, s in enumerate(cells)}

    def __call__(self, state: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        mu, sd = self.table[state]
        return mu.copy(), sd.copy()


# ---------------------------------------------------------------------------------------------- experiment
def run_learned(*, out: Path, quick: bool = False, tuned: dict[str, float] | None = None,
                protocol: Literal["across", "within"] = "across") -> dict[str, Any]:
    """TSTS with learned uncertainty vs N-MCTS on the experiment's test mazes (reported, no claim).

    ``across``: one ensemble trained on 200 other mazes (generalisation to new layouts; ``learned.json``).
    ``within``: per test maze, an ensemble trained on a random half of its cells (generalisation to unseen
    states of a known layout, where an ensemble's disagreement should flag the unseen half;
    ``learned_within.json``); ``const`` then uses that maze's RMSE.
    """
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    size, n_train, n_test, budget = (4, 30, 6, 10) if quick else (6, 200, 20, 20)
    tuned = tuned or {"c_puct": 1.414, "exploration": 1.0}
    members = 3 if quick else 5
    nets_for: dict[int, list[GaussianQNet]] = {}
    rmse_for: dict[int, float] = {}
    if protocol == "across":
        nets = train_value_ensemble(mazes=[GridMaze(size=size, seed=5000 + i) for i in range(n_train)],
                                    n_members=members, epochs=10 if quick else 40, seed=0)
        val = [GridMaze(size=size, seed=500 + j) for j in range(5)]
        err = [EnsembleValueModel(nets=nets, maze=m)(s)[0] - m.q_star(s) for m in val for s in _open_cells(m)]
        rmse = float(np.sqrt(np.mean(np.square(err))))
        for i in range(n_test):
            nets_for[1000 + i], rmse_for[1000 + i] = nets, rmse
    else:
        n_train = 0
        for i in range(n_test):
            maze = GridMaze(size=size, seed=1000 + i)
            cs = _open_cells(maze)
            pick = np.random.default_rng(i).permutation(len(cs))[: len(cs) // 2]
            nets_for[1000 + i] = train_value_ensemble(mazes=[maze], cells=[[cs[j] for j in pick]],
                                                      n_members=members, epochs=100 if quick else 300,
                                                      hidden=(128, 128), batch_size=64, seed=i)
            err = [EnsembleValueModel(nets=nets_for[1000 + i], maze=maze)(s)[0] - maze.q_star(s) for s in cs]
            rmse_for[1000 + i] = float(np.sqrt(np.mean(np.square(err))))
        rmse = float(np.mean(list(rmse_for.values())))
    arms = {"nmcts": ("nmcts", "ensemble"), "tsts_ensemble": ("tsts", "ensemble"), "tsts_mle": ("tsts", "mle"),
            "tsts_const": ("tsts", "const"), "tsts_gt": ("tsts", "gt"), "greedy": ("greedy", "ensemble")}
    res: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    calib: dict[str, list[float]] = {"ensemble": [], "mle": []}
    for i in range(n_test):
        seed = 1000 + i
        for a, (p, mode) in arms.items():
            maze = GridMaze(size=size, seed=seed)
            model = EnsembleValueModel(nets=nets_for[seed], maze=maze, std_mode=mode, const_std=rmse_for[seed])
            knobs = {"c_puct": tuned["c_puct"]} if p == "nmcts" else ({"exploration": tuned["exploration"]}
                                                                        if p == "tsts" else {})
            d = maze.optimal_steps()
            ep = run_episode(env=maze, planner=make_planner(p, env=maze, value_model=model, budget=budget, seed=seed,
                                                            **knobs), max_steps=2 * d + 10)
            res[a].append({"success": float(ep.success), "return": ep.ret, "steps": float(ep.steps)})
            if a in ("tsts_ensemble", "tsts_mle"):
                e = [abs(model(s)[0] - maze.q_star(s)) for s in model.table]
                sds = [model(s)[1] for s in model.table]
                calib[mode].append(float(np.corrcoef(np.concatenate(e), np.concatenate(sds))[0, 1]))
    succ = {a: float(np.mean([r["success"] for r in rs])) for a, rs in res.items()}
    diffs = {}
    for a in arms:
        if a == "nmcts":
            continue
        c = paired_check(name=a, metric="success", method=[r["success"] for r in res[a]],
                         baseline=[r["success"] for r in res["nmcts"]], direction=">=", kind="mechanism",
                         bootstrap=n_test >= 10)
        diffs[f"{a}_minus_nmcts"] = {"mean": c.measured, "ci_low": c.ci_low, "ci_high": c.ci_high}
    out_d = {"mode": "quick" if quick else "full", "protocol": protocol, "maze_size": size,
             "n_train_mazes": n_train, "n_test": n_test,
             "budget": budget, "tuned_knobs": tuned, "network_rmse_val": rmse, "success": succ,
             "paired_vs_nmcts": diffs,
             "corr_abs_error_vs_sigma": {k: float(np.mean(x)) for k, x in calib.items() if x},
             "mean_return": {a: float(np.mean([r["return"] for r in rs])) for a, rs in res.items()},
             "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = "learned" if protocol == "across" else "learned_within"
    write_atomic(out / f"{name}.json", json.dumps(out_d, indent=2) + "\n")
    from icml24.common.plotting import new_figure, save_figure

    fig, axes = new_figure(1, width=6.0)
    names = list(succ)
    axes[0].bar(names, [succ[a] for a in names], color=["tab:gray", "tab:red", "tab:orange", "tab:pink",
                                                         "tab:purple", "k"])
    axes[0].set(ylabel="success rate", ylim=(0, 1.05),
                title=f"learned Q-network ({protocol}, RMSE {rmse:.2f}), GridMaze {size}×{size}, T={budget}")
    axes[0].tick_params(axis="x", rotation=30)
    save_figure(fig, out / f"{name}.png")
    return out_d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/bayes_mcts"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--protocol", choices=("across", "within"), default="across")
    ap.add_argument("--tuned-from", type=Path, default=None,
                    help="results.json of the main run: reuse its GridMaze-tuned c_puct and TSTS exploration")
    a = ap.parse_args()
    tuned = None
    if a.tuned_from is not None:
        t = json.loads(a.tuned_from.read_text())["extra"]["tuned"]["gridmaze"]
        tuned = {"c_puct": t["nmcts"], "exploration": t["tsts"]}
    print(json.dumps(run_learned(out=a.out, quick=a.quick, tuned=tuned, protocol=a.protocol), indent=2))


if __name__ == "__main__":
    main()
