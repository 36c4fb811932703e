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

__all__ = ["DiffuserPlanner", "EpisodeResult", "execute_plan", "execute_plans"]


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
    contact: bool = False


def execute_plan(env: PointMaze2D, plan: np.ndarray, *, start: np.ndarray, goal: np.ndarray,
                 steps: int) -> EpisodeResult:
    """Run ``plan`` (unnormalised ``[H, 4]``) open loop from ``start``: at step t track plan[t + 1], after the
    plan's end the last waypoint with zero velocity, for ``steps`` steps or until the env terminates (a wall
    contact when ``env.terminate_on_contact``). ``success``: the agent came within the goal radius."""
    plan = _check_plans("execute_plan", plan, ndim=2)
    obs, _ = env.reset(options={"start": start, "goal": goal})
    ret, path, contact = 0.0, [obs[:2].copy()], False
    last = np.concatenate([plan[-1, :2], np.zeros(2)])
    for t in range(steps):
        target = plan[t + 1] if t + 1 < len(plan) else last
        obs, r, terminated, _, info = env.step(env.tracking_action(target))
        ret += r
        contact = contact or info["contact"]
        path.append(obs[:2].copy())
        if terminated:
            break
    p = np.array(path)
    return EpisodeResult(success=ret > 0, ret=ret, infeasible=bool(plan_infeasible(env.maze, plan)),
                         final_dist=float(np.linalg.norm(p[-1] - goal)), path=p, contact=contact)


def execute_plans(env: PointMaze2D, plans: np.ndarray, *, start: np.ndarray, goal: np.ndarray,
                  steps: int) -> dict[str, np.ndarray]:
    """:func:`execute_plan` for a batch of plans ``[K, H, 4]`` from the same start and goal, vectorised over the
    batch (the same numbers as K calls of :func:`execute_plan`). Returns per-plan arrays ``ret``, ``success``,
    ``contact`` (a wall stopped the agent), ``infeasible`` (the plan crosses a wall) and ``final_dist``."""
    plans = _check_plans("execute_plans", plans, ndim=3)
    s = env.maze.check_position("execute_plans", "start", start)[:2]
    g = env.maze.check_position("execute_plans", "goal", goal)[:2]
    k, n = len(plans), plans.shape[1]
    state = np.tile(np.array([s[0], s[1], 0.0, 0.0]), (k, 1))
    last = np.concatenate([plans[:, -1, :2], np.zeros((k, 2))], axis=1)
    ret, contact, alive = np.zeros(k), np.zeros(k, dtype=bool), np.ones(k, dtype=bool)
    for t in range(steps):
        idx = np.flatnonzero(alive)
        if not idx.size:
            break
        target = plans[idx, t + 1] if t + 1 < n else last[idx]
        nxt, hit = env.step_batch(state[idx], env.tracking_actions(state[idx], target))
        state[idx] = nxt
        ret[idx] += np.linalg.norm(nxt[:, :2] - g, axis=1) <= env.goal_radius
        contact[idx] |= hit
        if env.terminate_on_contact:
            alive[idx[hit]] = False
    return {"ret": ret, "success": ret > 0, "contact": contact,
            "infeasible": np.asarray(plan_infeasible(env.maze, plans), dtype=bool).reshape(k),
            "final_dist": np.linalg.norm(state[:, :2] - g, axis=1)}


def _check_plans(owner: str, plans: Any, *, ndim: int) -> np.ndarray:
    plans = np.asarray(plans, dtype=float)
    if plans.ndim != ndim or plans.shape[-1] != 4 or plans.shape[-2] < 2:
        shape = "[H, 4]" if ndim == 2 else "[K, H, 4]"
        raise ValueError(f"{owner}: plans must be {shape} with H >= 2, got {plans.shape}")
    if not np.isfinite(plans).all():
        raise ValueError(f"{owner}: plans contain non-finite values")
    return plans
