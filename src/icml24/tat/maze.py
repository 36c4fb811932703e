"""A numpy point-mass maze with the D4RL Maze2D layouts, a D4RL-like dataset generator and an exact
infeasibility check (does a straight segment between consecutive plan waypoints cross a wall?).

Geometry (as D4RL's ``maze_model``): cell ``(i, j)`` of the layout string (row ``i``, column ``j``) is the unit
square ``[i - 0.5, i + 0.5] × [j - 0.5, j + 0.5]``; the state is ``(x, y, vx, vy)`` with ``x`` along rows and
``y`` along columns. A wall cell is a solid square; the agent is a square of half-width ``agent_radius``.

Dynamics (semi-implicit Euler): ``v ← clip(v + gain · dt · a, ±v_max)``, ``p ← p + dt · v``, each axis moved
separately and stopped (velocity component zeroed) at the first wall it would enter.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from icml24.common import validate as v

__all__ = ["LAYOUTS", "MAZE_NAMES", "Maze", "PointMaze2D", "MazeDataset", "collect_dataset",
           "segments_cross_walls", "plan_infeasible", "expert_return"]

# D4RL maze2d layout strings (d4rl/pointmaze/maze_model.py); 'G' marks D4RL's fixed goal, free here.
LAYOUTS: dict[str, str] = {
    "umaze": "#####\\#GOO#\\###O#\\#OOO#\\#####",
    "medium": "########\\#OO##OO#\\#OO#OOO#\\##OOO###\\#OO#OOO#\\#O#OO#O#\\#OOO#OG#\\########",
    "large": ("############\\#OOOO#OOOOO#\\#O##O#O#O#O#\\#OOOOOO#OOO#\\#O####O###O#\\#OO#O#OOOOO#\\"
              "##O#O#O#O###\\#OO#OOO#OGO#\\############"),
}
MAZE_NAMES: tuple[str, ...] = tuple(LAYOUTS)


class Maze:
    """A grid maze: wall cells, free cells, BFS shortest paths and point/segment collision queries."""

    def __init__(self, name: str = "umaze", *, layout: str | None = None) -> None:
        """Args:
            name: ``"umaze"``, ``"medium"`` or ``"large"`` (D4RL Maze2D), ignored when ``layout`` is given.
            layout: a custom layout string, rows separated by a backslash, ``#`` wall, ``O``/``G`` free.
        """
        if layout is None:
            v.one_of("Maze", "name", name, MAZE_NAMES)
            layout = LAYOUTS[name]
        rows = layout.split("\\")
        if len({len(r) for r in rows}) != 1 or not set("".join(rows)) <= set("#OG"):
            raise ValueError(f"Maze: layout must be equal-length rows of '#', 'O', 'G', got {layout!r}")
        self.name = name
        self.walls = np.array([[c == "#" for c in r] for r in rows], dtype=bool)
        if not (self.walls[0].all() and self.walls[-1].all() and self.walls[:, 0].all() and self.walls[:, -1].all()):
            raise ValueError("Maze: layout must be enclosed by walls")
        self.shape = self.walls.shape
        self.free_cells: list[tuple[int, int]] = [tuple(map(int, c)) for c in np.argwhere(~self.walls)]
        self.wall_cells = np.argwhere(self.walls).astype(float)
        self._dist: dict[tuple[int, int], np.ndarray] = {}

    # ------------------------------------------------------------------ cells
    def cell_of(self, pos: Any) -> tuple[int, int]:
        """The cell containing position ``pos = (x, y)`` (rounded to the nearest integer)."""
        return int(np.floor(pos[0] + 0.5)), int(np.floor(pos[1] + 0.5))

    def in_map(self, pos: Any) -> bool:
        return -0.5 <= pos[0] < self.shape[0] - 0.5 and -0.5 <= pos[1] < self.shape[1] - 0.5

    def is_free(self, pos: Any) -> bool:
        """Whether ``pos`` lies inside the map and in a free cell."""
        if not self.in_map(pos):
            return False
        i, j = self.cell_of(pos)
        return not self.walls[i, j]

    def check_position(self, owner: str, name: str, pos: Any) -> np.ndarray:
        """``pos`` as a float array (x, y); ``ValueError`` naming the cell if it is outside the map or in a wall."""
        p = np.asarray(pos, dtype=float).reshape(-1)
        if p.size < 2 or not np.all(np.isfinite(p[:2])):
            raise ValueError(f"{owner}: {name} must be a finite (x, y) position, got {pos!r}")
        if not self.in_map(p):
            raise ValueError(f"{owner}: {name} ({p[0]:g}, {p[1]:g}) is outside the {self.name} map "
                             f"(x in [-0.5, {self.shape[0] - 0.5}), y in [-0.5, {self.shape[1] - 0.5}))")
        i, j = self.cell_of(p)
        if self.walls[i, j]:
            raise ValueError(f"{owner}: {name} ({p[0]:g}, {p[1]:g}) is inside the wall cell ({i}, {j}) of the "
                             f"{self.name} maze")
        return p

    def distances_from(self, cell: tuple[int, int]) -> np.ndarray:
        """BFS distance (in cells, 4-connected) from ``cell`` to every cell (-1 for walls/unreachable)."""
        if cell not in self._dist:
            d = np.full(self.shape, -1, dtype=int)
            d[cell] = 0
            q = deque([cell])
            while q:
                i, j = q.popleft()
                for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                    a, b = i + di, j + dj
                    if not self.walls[a, b] and d[a, b] < 0:
                        d[a, b] = d[i, j] + 1
                        q.append((a, b))
            self._dist[cell] = d
        return self._dist[cell]

    def shortest_path(self, start: tuple[int, int], goal: tuple[int, int]) -> list[tuple[int, int]]:
        """Cells of a BFS shortest path from ``start`` to ``goal`` (both included)."""
        d = self.distances_from(goal)
        if d[start] < 0:
            raise ValueError(f"Maze: no path from {start} to {goal}")
        path = [start]
        while path[-1] != goal:
            i, j = path[-1]
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                if d[i + di, j + dj] == d[i, j] - 1 and d[i + di, j + dj] >= 0:
                    path.append((i + di, j + dj))
                    break
        return path

    # ------------------------------------------------------------------ geometry
    def box_hits_wall(self, x: float, y: float, r: float) -> bool:
        """Whether the open square of half-width ``r`` centred at (x, y) overlaps a wall cell's interior."""
        i0, i1 = int(np.floor(x - r + 0.5)), int(np.floor(x + r + 0.5 - 1e-12))
        j0, j1 = int(np.floor(y - r + 0.5)), int(np.floor(y + r + 0.5 - 1e-12))
        if i0 < 0 or j0 < 0 or i1 >= self.shape[0] or j1 >= self.shape[1]:
            return True
        return bool(self.walls[i0:i1 + 1, j0:j1 + 1].any())

    def boxes_hit_walls(self, x: np.ndarray, y: np.ndarray, r: float) -> np.ndarray:
        """:meth:`box_hits_wall` for arrays of centres (``r < 0.5``: a box overlaps at most 2 × 2 cells)."""
        i0, i1 = np.floor(x - r + 0.5).astype(int), np.floor(x + r + 0.5 - 1e-12).astype(int)
        j0, j1 = np.floor(y - r + 0.5).astype(int), np.floor(y + r + 0.5 - 1e-12).astype(int)
        out = (i0 < 0) | (j0 < 0) | (i1 >= self.shape[0]) | (j1 >= self.shape[1])
        h, w = self.shape[0] - 1, self.shape[1] - 1
        for i in (np.clip(i0, 0, h), np.clip(i1, 0, h)):
            for j in (np.clip(j0, 0, w), np.clip(j1, 0, w)):
                out |= self.walls[i, j]
        return out


def segments_cross_walls(maze: Maze, p: np.ndarray, q: np.ndarray, *, radius: float = 0.0) -> np.ndarray:
    """Exact test of straight segments ``p[k] → q[k]`` against the wall squares (slab method).

    A segment is infeasible when it enters the open interior of a wall square inflated by ``radius``
    (touching an edge or corner is allowed), or when an end point lies outside the map.

    Args:
        maze: the maze.
        p, q: arrays ``[..., 2]`` of segment end points (x, y).
        radius: agent half-width; walls are inflated by it (0 = a point agent).

    Returns:
        bool array of shape ``p.shape[:-1]``.
    """
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    shp = p.shape[:-1]
    p2, q2 = p.reshape(-1, 2)[:, None, :], q.reshape(-1, 2)[:, None, :]          # [S, 1, 2]
    w = maze.wall_cells[None, :, :]                                               # [1, W, 2]
    lo, hi = w - 0.5 - radius, w + 0.5 + radius
    d = q2 - p2
    eps = 1e-12
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (lo - p2) / d
        t2 = (hi - p2) / d
    tmin = np.where(np.abs(d) < eps, np.where((p2 > lo) & (p2 < hi), -np.inf, np.inf), np.minimum(t1, t2))
    tmax = np.where(np.abs(d) < eps, np.where((p2 > lo) & (p2 < hi), np.inf, -np.inf), np.maximum(t1, t2))
    enter = np.maximum(np.max(tmin, axis=-1), 0.0)
    leave = np.minimum(np.min(tmax, axis=-1), 1.0)
    hit = (leave - enter > 1e-9).any(axis=-1)
    pf, qf = p.reshape(-1, 2), q.reshape(-1, 2)
    outside = ~((pf >= -0.5).all(-1) & (pf[:, 0] < maze.shape[0] - 0.5) & (pf[:, 1] < maze.shape[1] - 0.5)
                & (qf >= -0.5).all(-1) & (qf[:, 0] < maze.shape[0] - 0.5) & (qf[:, 1] < maze.shape[1] - 0.5))
    return (hit | outside).reshape(shp)


def plan_infeasible(maze: Maze, plan: np.ndarray, *, radius: float = 0.0) -> np.ndarray | bool:
    """Whether a plan (``[H, >=2]`` or a batch ``[B, H, >=2]`` of states) has consecutive waypoints whose
    connecting segment crosses a wall (or a waypoint outside the map); exact geometry, see
    :func:`segments_cross_walls`."""
    x = np.asarray(plan, dtype=float)
    if x.ndim not in (2, 3) or x.shape[-1] < 2 or x.shape[-2] < 1:
        raise ValueError(f"plan_infeasible: plan must be [H, D] or [B, H, D] with D >= 2, got {x.shape}")
    xy = x[..., :2]
    if xy.shape[-2] == 1:
        seg = segments_cross_walls(maze, xy, xy, radius=radius)
    else:
        seg = segments_cross_walls(maze, xy[..., :-1, :], xy[..., 1:, :], radius=radius)
    out = seg.any(axis=-1)
    return bool(out) if x.ndim == 2 else out


# ---------------------------------------------------------------------------------------------- env
def _gym_base() -> type:
    try:
        import gymnasium
        return gymnasium.Env
    except ImportError:  # pragma: no cover - gymnasium is a core dependency of the rl extra
        return object


class PointMaze2D(_gym_base()):  # type: ignore[misc]
    """Point mass in a Maze2D layout with a gymnasium API (``reset``/``step``, Box spaces).

    Observation ``(x, y, vx, vy)``; action a force in ``[-1, 1]²``; reward 1 while within ``goal_radius`` of
    the goal (D4RL's sparse maze2d reward); episodes truncate after ``max_episode_steps``. With
    ``terminate_on_contact`` a step in which a wall stops the agent ends the episode (``terminated``; its reward
    still counts), so a plan through a wall fails instead of sliding along it; ``info["contact"]`` says whether
    a wall stopped the agent in that step either way.
    """

    metadata = {"render_modes": []}

    def __init__(self, maze: str | Maze = "umaze", *, dt: float = 0.1, gain: float = 10.0, v_max: float = 3.0,
                 agent_radius: float = 0.1, goal_radius: float = 0.5, max_episode_steps: int = 300,
                 reset_noise: float = 0.1, terminate_on_contact: bool = False) -> None:
        """Args:
            maze: a layout name or a :class:`Maze`.
            dt: time step; gain: force-to-acceleration factor; v_max: speed limit per axis (cells / time).
            agent_radius: half-width of the agent's square; goal_radius: reward radius.
            max_episode_steps: truncation; reset_noise: uniform noise on the start position (D4RL: 0.1).
            terminate_on_contact: end the episode at the first wall contact.
        """
        self.maze = maze if isinstance(maze, Maze) else Maze(maze)
        for n, x in (("dt", dt), ("gain", gain), ("v_max", v_max), ("goal_radius", goal_radius)):
            v.positive("PointMaze2D", n, x)
        v.in_range("PointMaze2D", "agent_radius", agent_radius, 0.0, 0.5, high_open=True)
        v.in_range("PointMaze2D", "reset_noise", reset_noise, 0.0, 0.5 - agent_radius)
        v.integer("PointMaze2D", "max_episode_steps", max_episode_steps, minimum=1)
        self.dt, self.gain, self.v_max = float(dt), float(gain), float(v_max)
        self.r, self.goal_radius, self.max_episode_steps = float(agent_radius), float(goal_radius), max_episode_steps
        self.reset_noise = float(reset_noise)
        self.terminate_on_contact = bool(terminate_on_contact)
        try:
            from gymnasium import spaces
            h, w = self.maze.shape
            self.observation_space = spaces.Box(low=np.array([-0.5, -0.5, -v_max, -v_max], dtype=np.float32),
                                                high=np.array([h - 0.5, w - 0.5, v_max, v_max], dtype=np.float32))
            self.action_space = spaces.Box(low=-1.0, high=1.0, shape=(2,), dtype=np.float32)
        except ImportError:  # pragma: no cover
            pass
        self.state = np.zeros(4)
        self.goal = np.zeros(2)
        self.t = 0
        self._rng = np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Reset; ``options`` may give ``start`` (x, y) and ``goal`` (x, y), else random free cells."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        options = options or {}
        cells = self.maze.free_cells
        if "start" in options:
            start = self.maze.check_position("PointMaze2D", "start", options["start"])[:2]
        else:
            c = cells[self._rng.integers(len(cells))]
            start = np.array(c, float) + self._rng.uniform(-self.reset_noise, self.reset_noise, 2)
        if "goal" in options:
            goal = self.maze.check_position("PointMaze2D", "goal", options["goal"])[:2]
        else:
            goal = np.array(cells[self._rng.integers(len(cells))], float)
        self.state = np.array([start[0], start[1], 0.0, 0.0])
        self.goal = np.array(goal, float)
        self.t = 0
        return self.state.copy(), {"goal": self.goal.copy()}

    def set_state(self, state: np.ndarray) -> None:
        self.state = np.asarray(state, float).copy()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = np.asarray(action, dtype=float).reshape(1, 2)
        nxt, hit = self.step_batch(self.state[None], a)
        self.state, contact = nxt[0], bool(hit[0])
        self.t += 1
        reward = float(np.linalg.norm(self.state[:2] - self.goal) <= self.goal_radius)
        return (self.state.copy(), reward, contact and self.terminate_on_contact, self.t >= self.max_episode_steps,
                {"goal": self.goal.copy(), "contact": contact})

    def step_batch(self, states: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The dynamics of :meth:`step` for a batch of independent agents, without touching the env's own state:
        ``states [K, 4]``, ``actions [K, 2]`` → ``(next states [K, 4], wall contact [K])``. Per axis, an agent
        whose move would enter a wall stops at the wall face (bisection of the free fraction of the step) with
        that velocity component zeroed."""
        a = np.clip(np.asarray(actions, dtype=float), -1.0, 1.0)
        pos, vel = states[:, :2].copy(), states[:, 2:].copy()
        vel = np.clip(vel + self.gain * self.dt * a, -self.v_max, self.v_max)
        contact = np.zeros(len(pos), dtype=bool)
        for k in (0, 1):
            new = pos.copy()
            new[:, k] = pos[:, k] + self.dt * vel[:, k]
            hit = self.maze.boxes_hit_walls(new[:, 0], new[:, 1], self.r)
            free = ~hit
            pos[free, k] = new[free, k]
            if hit.any():
                p, vk = pos[hit], vel[hit, k]
                lo, hi = np.zeros(len(p)), np.ones(len(p))
                trial = p.copy()
                for _ in range(30):
                    mid = 0.5 * (lo + hi)
                    trial[:, k] = p[:, k] + mid * self.dt * vk
                    bad = self.maze.boxes_hit_walls(trial[:, 0], trial[:, 1], self.r)
                    hi = np.where(bad, mid, hi)
                    lo = np.where(bad, lo, mid)
                pos[hit, k] = p[:, k] + lo * self.dt * vk
                vel[hit, k] = 0.0
            contact |= hit
        return np.concatenate([pos, vel], axis=1), contact

    def tracking_action(self, target: np.ndarray) -> np.ndarray:
        """Force that drives the state to ``target = (x, y, vx, vy)`` in one step where the limits allow
        (the role of Diffuser's maze2d waypoint controller ``a = (wp_xy − xy) + (wp_v − v)``)."""
        return self.tracking_actions(self.state[None], np.asarray(target)[None])[0]

    def tracking_actions(self, states: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """:meth:`tracking_action` for a batch: ``states [K, 4]``, ``targets [K, ≥2]`` → ``[K, 2]``."""
        v_need = (targets[:, :2] - states[:, :2]) / self.dt
        return np.clip((v_need - states[:, 2:]) / (self.gain * self.dt), -1.0, 1.0)


# ---------------------------------------------------------------------------------------------- data
@dataclass
class MazeDataset:
    """A D4RL-like maze2d stream: ``observations [N, 4]``, ``actions [N, 2]``, ``goals [N, 2]`` and
    ``timeouts [N]`` (True at the last step before the goal changes: episode ends)."""

    observations: np.ndarray
    actions: np.ndarray
    goals: np.ndarray
    timeouts: np.ndarray

    def episodes(self) -> list[tuple[int, int]]:
        """``(begin, end)`` index ranges of the episodes (segments between goal switches)."""
        ends = np.flatnonzero(self.timeouts) + 1
        starts = np.concatenate([[0], ends[:-1]])
        out = [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
        if not len(ends) or ends[-1] < len(self.timeouts):
            out.append((int(ends[-1]) if len(ends) else 0, len(self.timeouts)))
        return out

    def windows(self, horizon: int) -> np.ndarray:
        """Start indices of all length-``horizon`` windows of the stream (crossing goal switches, as Diffuser's
        maze2d setting with max_path_length 40000 does)."""
        v.integer("MazeDataset", "horizon", horizon, minimum=2, maximum=len(self.observations))
        return np.arange(len(self.observations) - horizon + 1)


def collect_dataset(maze: str | Maze, *, n_steps: int, seed: int = 0, kp: float = 1.0, kd: float = 0.35,
                    action_noise: float = 0.3, env_kwargs: dict[str, Any] | None = None) -> MazeDataset:
    """D4RL's maze2d recipe: BFS waypoints to a random goal cell, a noisy PD controller on the next waypoint,
    a new random goal when within 0.5 of it; one long stream segmented at goal switches.

    Args:
        maze: layout name or :class:`Maze`.
        n_steps: stream length.
        seed: RNG seed (goals, start, action noise).
        kp, kd: PD gains of ``a = clip(kp·(wp − p) − kd·v + ε)``, ``ε ~ N(0, action_noise²)``.
    """
    v.integer("collect_dataset", "n_steps", n_steps, minimum=2)
    v.non_negative("collect_dataset", "action_noise", action_noise)
    env = PointMaze2D(maze, **(env_kwargs or {}))
    m = env.maze
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    cells = m.free_cells

    def new_goal(cur: tuple[int, int]) -> tuple[tuple[int, int], list[tuple[int, int]]]:
        while True:
            g = cells[rng.integers(len(cells))]
            if g != cur:
                return g, m.shortest_path(cur, g)

    goal, path = new_goal(m.cell_of(obs))
    k = 1
    O, A, G, T = (np.zeros((n_steps, 4)), np.zeros((n_steps, 2)), np.zeros((n_steps, 2)),
                  np.zeros(n_steps, dtype=bool))
    for t in range(n_steps):
        pos, vel = obs[:2], obs[2:]
        while k < len(path) - 1 and np.linalg.norm(pos - np.array(path[k], float)) < 0.5:
            k += 1
        wp = np.array(path[k], float)
        a = np.clip(_pd(pos, vel, wp, kp, kd) + rng.normal(0.0, action_noise, 2), -1.0, 1.0)
        O[t], A[t], G[t] = obs, a, goal
        obs, _, _, _, _ = env.step(a)
        if np.linalg.norm(obs[:2] - np.array(goal, float)) < 0.5:
            T[t] = True
            goal, path = new_goal(goal)
            k = 1
    return MazeDataset(observations=O, actions=A, goals=G, timeouts=T)


def _pd(pos: np.ndarray, vel: np.ndarray, wp: np.ndarray, kp: float, kd: float) -> np.ndarray:
    return np.clip(kp * (wp - pos) - kd * vel, -1.0, 1.0)


def expert_return(env: PointMaze2D, *, start: np.ndarray, goal: np.ndarray, steps: int, kp: float = 1.0,
                  kd: float = 0.35) -> float:
    """Return of the noise-free BFS + PD expert from ``start`` to ``goal`` over ``steps`` steps: the reference
    maximum of the normalised score (D4RL normalises maze2d returns by an expert reference); it ends early
    where ``env`` terminates (a wall contact when ``env.terminate_on_contact``)."""
    m = env.maze
    obs, _ = env.reset(options={"start": start, "goal": goal})
    path = m.shortest_path(m.cell_of(obs), m.cell_of(goal))
    path = path if len(path) > 1 else path * 2
    k, total = 1, 0.0
    for _ in range(steps):
        pos = obs[:2]
        while k < len(path) - 1 and np.linalg.norm(pos - np.array(path[k], float)) < 0.5:
            k += 1
        wp = np.array(goal, float) if k == len(path) - 1 else np.array(path[k], float)
        obs, r, terminated, _, _ = env.step(_pd(pos, obs[2:], wp, kp, kd))
        total += r
        if terminated:
            break
    return total
