"""Planning in the maze: a goal-conditioned Diffuser planner, the arms that turn its batch into one plan
(vanilla = first sample, medoid, TAT), and closed-loop execution with a waypoint controller (Diffuser's maze2d
protocol: plan once at t = 0, track the plan's states, then hold the last waypoint)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from icml24.common import validate as v
from icml24.tat.diffuser import GaussianDiffusion, LimitsNormalizer
from icml24.tat.maze import Maze, PointMaze2D, plan_infeasible

__all__ = ["DiffuserPlanner", "EpisodeResult", "execute_plan"]


class DiffuserPlanner:
    """Samples a batch of N plans from ``start`` to ``goal`` (both inpainted) with a trained
    :class:`GaussianDiffusion`; any other planner returning ``[N, H, D]`` states can feed TAT the same way."""

    def __init__(self, *, diffusion: GaussianDiffusion, normalizer: LimitsNormalizer, maze: Maze) -> None:
        self.diffusion, self.normalizer, self.maze = diffusion, normalizer, maze

    @property
    def horizon(self) -> int:
        return self.diffusion.horizon

    def sample(self, *, start: Any, goal: Any, n_samples: int, n_steps: int | None = None,
               generator: torch.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Returns ``(normalised [N, H, 4], unnormalised [N, H, 4])`` plans.

        Args:
            start: current state (x, y[, vx, vy]); goal: (x, y), targeted with zero velocity at step H − 1.
            n_samples: N; n_steps: denoising steps (None = all T; fewer = strided schedule).
        """
        s = self.maze.check_position("DiffuserPlanner", "start", start)
        g = self.maze.check_position("DiffuserPlanner", "goal", goal)
        v.integer("DiffuserPlanner", "n_samples", n_samples, minimum=1)
        s4 = np.zeros(4)
        s4[:min(4, s.size)] = s[:4]
        g4 = np.array([g[0], g[1], 0.0, 0.0])
        dev = self.diffusion.alphas_cumprod.device
        cond = {0: torch.as_tensor(self.normalizer.normalize(s4), dtype=torch.float32, device=dev),
                self.horizon - 1: torch.as_tensor(self.normalizer.normalize(g4), dtype=torch.float32, device=dev)}
        x = self.diffusion.sample(cond, batch_size=n_samples, n_steps=n_steps, generator=generator)
        xn = x.detach().cpu().double().numpy()
        return xn, self.normalizer.unnormalize(xn)


@dataclass
class EpisodeResult:
    success: bool
    ret: float
    infeasible: bool
    final_dist: float
    path: np.ndarray


def execute_plan(env: PointMaze2D, plan: np.ndarray, *, start: np.ndarray, goal: np.ndarray,
                 steps: int) -> EpisodeResult:
    """Run ``plan`` (unnormalised ``[H, 4]``) open loop from ``start``: at step t track plan[t + 1], after the
    plan's end the last waypoint with zero velocity. ``success``: the agent came within the goal radius."""
    plan = np.asarray(plan, dtype=float)
    if plan.ndim != 2 or plan.shape[1] != 4:
        raise ValueError(f"execute_plan: plan must be [H, 4], got {plan.shape}")
    obs, _ = env.reset(options={"start": start, "goal": goal})
    ret, path = 0.0, [obs[:2].copy()]
    last = np.concatenate([plan[-1, :2], np.zeros(2)])
    for t in range(steps):
        target = plan[t + 1] if t + 1 < len(plan) else last
        obs, r, _, _, _ = env.step(env.tracking_action(target))
        ret += r
        path.append(obs[:2].copy())
    p = np.array(path)
    return EpisodeResult(success=ret > 0, ret=ret, infeasible=bool(plan_infeasible(env.maze, plan)),
                         final_dist=float(np.linalg.norm(p[-1] - goal)), path=p)
