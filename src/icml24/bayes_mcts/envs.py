"""Environments for online planning: the simulator Protocol, a numpy ``GridMaze``, MiniGrid and gymnasium adapters,
and exact ground-truth Q by exhaustive search.

A planner needs a deterministic simulator it can rewind: :class:`PlanningEnv` (``actions``, ``get_state``,
``set_state``, ``step`` -> ``(reward, terminal)``, ``is_terminal``). Rewards follow the official code's Procgen
maze wrapper: −1 per step and +10 on reaching the goal (γ = 1), so ``Q*(s, a) = 9 − d(s')`` where ``d`` is the
number of steps from ``s'`` to the goal (``Q* = 9`` when ``s'`` is the goal).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from icml24.common import validate as v

__all__ = ["PlanningEnv", "check_env", "fog_mask", "GridMaze", "GridLeaper", "GymnasiumAdapter", "MiniGridAdapter", "make_minigrid",
           "brute_force_q", "GOAL_REWARD", "STEP_PENALTY"]

GOAL_REWARD = 10.0  # official procgen wrapper: env reward 10 at the goal
STEP_PENALTY = 1.0  # official procgen wrapper: −1 per step
_PROTOCOL = ("actions", "get_state", "set_state", "step", "is_terminal")


@runtime_checkable
class PlanningEnv(Protocol):
    """A deterministic simulator with snapshot/restore: what every planner here searches with."""

    @property
    def actions(self) -> Sequence[int]:
        """The discrete action set (the same in every state), indices ``0..|A|-1`` of the value model's output."""

    def get_state(self) -> Any:
        """An opaque snapshot of the full simulator state."""

    def set_state(self, state: Any) -> None:
        """Restore a snapshot returned by :meth:`get_state`."""

    def step(self, action: int) -> tuple[float, bool]:
        """Apply ``action``; return ``(reward, terminal)``."""

    def is_terminal(self) -> bool:
        """Whether the current state is terminal."""


def check_env(owner: str, env: Any) -> None:
    """Raise ``TypeError`` naming the missing Protocol members of ``env``."""
    missing = [m for m in _PROTOCOL if not hasattr(env, m)]
    missing += [m for m in _PROTOCOL[1:] if m not in missing and not callable(getattr(env, m))]
    if missing:
        raise TypeError(f"{owner}: env of type {type(env).__name__} lacks the PlanningEnv members "
                        f"{', '.join(missing)} (needs {', '.join(_PROTOCOL)})")
    if len(env.actions) < 1:
        raise ValueError(f"{owner}: env.actions must hold at least one action, got {list(env.actions)!r}")


def _bfs_distances(succ: dict[Hashable, list[Hashable]], targets: list[Hashable]) -> dict[Hashable, int]:
    """Unit-cost shortest distances to any of ``targets`` over the reversed graph ``succ``."""
    pred: dict[Hashable, list[Hashable]] = {}
    for s, nxt in succ.items():
        for t in nxt:
            pred.setdefault(t, []).append(s)
    dist = {t: 0 for t in targets}
    queue = deque(targets)
    while queue:
        s = queue.popleft()
        for p in pred.get(s, ()):
            if p not in dist:
                dist[p] = dist[s] + 1
                queue.append(p)
    return dist


def fog_mask(*, shape: tuple[int, int], free: np.ndarray, frac: float, seed: int) -> np.ndarray:
    """A per-cell observable "fog" flag: each free cell is fogged with probability ``frac``, independently.

    The fog is part of what the agent (and a value network) observes, like a background texture: the simulated
    network of the experiment is less accurate in fogged cells (heteroscedastic error), and a σ̂(s) estimated
    from validation residuals per feature bin can learn that. Drawn from its own stream (``[seed, 0xF06]``), so
    a layout is the same with and without fog.
    """
    v.probability("fog_mask", "frac", frac)
    rng = np.random.default_rng([int(seed), 0xF06])
    return (rng.random(shape) < frac) & np.asarray(free, dtype=bool)


def _open_neighbours(free: np.ndarray, r: int, c: int) -> int:
    h, w = free.shape
    return sum(1 for dr, dc in ((-1, 0), (0, -1), (1, 0), (0, 1))
               if 0 <= r + dr < h and 0 <= c + dc < w and free[r + dr, c + dc])


# ----------------------------------------------------------------------------------------------------- GridMaze
class GridMaze:
    """A random perfect maze (randomised depth-first search) on ``size × size`` cells, numpy, O(1) get/set state.

    The grid is ``(2·size + 1)²`` with walls; the agent starts at ``(1, 1)``, the goal is the far corner
    ``(2·size − 1, 2·size − 1)``. Actions: 0 up, 1 left, 2 down, 3 right; bumping a wall stays put.
    Reward −1 per step, +10 on entering the goal (terminal). The state is the agent's ``(row, col)``.

    Observable features of a state (:meth:`features`): whether its cell is fogged (``fog``, a fraction of the free
    cells, :func:`fog_mask`) and its number of open neighbours.

    Args:
        size: cells per side (>= 2).
        seed: the maze layout's seed.
        fog: fraction of free cells that are fogged (0 = none; the layout does not depend on it).
    """

    DELTAS = ((-1, 0), (0, -1), (1, 0), (0, 1))

    def __init__(self, *, size: int, seed: int = 0, fog: float = 0.0) -> None:
        self.size = v.integer("GridMaze", "size", size, minimum=2)
        self.seed = v.integer("GridMaze", "seed", seed, minimum=0)
        self.fog = v.probability("GridMaze", "fog", fog)
        n = self.size
        rng = np.random.default_rng(self.seed)
        wall = np.ones((2 * n + 1, 2 * n + 1), dtype=bool)
        seen = np.zeros((n, n), dtype=bool)
        stack = [(0, 0)]
        seen[0, 0] = True
        wall[1, 1] = False
        while stack:
            r, c = stack[-1]
            nbrs = [(r + dr, c + dc) for dr, dc in self.DELTAS if 0 <= r + dr < n and 0 <= c + dc < n
                    and not seen[r + dr, c + dc]]
            if not nbrs:
                stack.pop()
                continue
            nr, nc = nbrs[int(rng.integers(len(nbrs)))]
            wall[2 * nr + 1, 2 * nc + 1] = False
            wall[r + nr + 1, c + nc + 1] = False  # the wall between the two cells
            seen[nr, nc] = True
            stack.append((nr, nc))
        self.wall = wall
        self.fog_mask = fog_mask(shape=wall.shape, free=~wall, frac=self.fog, seed=self.seed)
        self.start = (1, 1)
        self.goal = (2 * n - 1, 2 * n - 1)
        self.pos = self.start
        self._dist: np.ndarray | None = None

    @property
    def actions(self) -> tuple[int, ...]:
        return (0, 1, 2, 3)

    def reset(self) -> tuple[int, int]:
        self.pos = self.start
        return self.pos

    def get_state(self) -> tuple[int, int]:
        return self.pos

    def set_state(self, state: tuple[int, int]) -> None:
        self.pos = state

    def is_terminal(self) -> bool:
        return self.pos == self.goal

    def is_success(self, state: tuple[int, int]) -> bool:
        return state == self.goal

    def fogged(self, state: tuple[int, int]) -> bool:
        """Whether the state's cell is fogged (an observable feature)."""
        return bool(self.fog_mask[state])

    def features(self, state: tuple[int, int]) -> tuple[int, int]:
        """Observable features of a state: ``(fogged, open neighbours)``, the bins of an estimated σ̂(s)."""
        return int(self.fog_mask[state]), _open_neighbours(~self.wall, *state)

    def states(self) -> list[tuple[int, int]]:
        """Every non-terminal state (open cells but the goal)."""
        return [(int(r), int(c)) for r, c in zip(*np.nonzero(~self.wall), strict=True) if (r, c) != self.goal]

    def next_state(self, state: tuple[int, int], action: int) -> tuple[int, int]:
        dr, dc = self.DELTAS[action]
        nr, nc = state[0] + dr, state[1] + dc
        return state if self.wall[nr, nc] else (nr, nc)

    def step(self, action: int) -> tuple[float, bool]:
        self.pos = self.next_state(self.pos, action)
        done = self.pos == self.goal
        return (GOAL_REWARD - STEP_PENALTY) if done else -STEP_PENALTY, done

    def distances(self) -> np.ndarray:
        """Steps from every open cell to the goal (BFS; −1 on walls)."""
        if self._dist is None:
            d = -np.ones(self.wall.shape, dtype=int)
            d[self.goal] = 0
            queue = deque([self.goal])
            while queue:
                r, c = queue.popleft()
                for dr, dc in self.DELTAS:
                    nr, nc = r + dr, c + dc
                    if not self.wall[nr, nc] and d[nr, nc] < 0:
                        d[nr, nc] = d[r, c] + 1
                        queue.append((nr, nc))
            self._dist = d
        return self._dist

    def optimal_steps(self) -> int:
        return int(self.distances()[self.start])

    def q_star(self, state: tuple[int, int]) -> np.ndarray:
        """Exact ``Q*(s, ·) = −1 + (10 if s' is the goal else 10 − d(s'))`` (γ = 1)."""
        d = self.distances()
        out = np.empty(4)
        for a in range(4):
            s2 = self.next_state(state, a)
            out[a] = GOAL_REWARD - STEP_PENALTY - d[s2]
        return out


# ----------------------------------------------------------------------------------------------------- GridLeaper
class GridLeaper:
    """A frogger-like crossing (the analog of Procgen Leaper): road lanes of cars between a start and a goal row.

    Rows ``0`` (start, safe) to ``lanes + 1`` (goal); lane ``i`` holds a fixed random car pattern on a ring of
    ``width`` cells that shifts by one cell per step, alternating direction lane by lane. Actions: 0 up, 1 down,
    2 left, 3 right, 4 wait. After the agent moves the cars move; the agent dies (terminal, reward 0 beyond the
    step's cost) if its cell then holds a car. Rewards as the official Leaper wrapper: −0.1 for up, −0.2
    otherwise, +10 on reaching the goal row. The state ``(row, x, t mod width)`` is the full state (dynamics
    are periodic), so Q* is exact by value iteration over the ``(lanes + 2)·width²`` states.

    Args:
        lanes: number of road lanes (>= 1).
        width: cells per lane (>= 3).
        density: fraction of a lane occupied by cars.
        seed: the car patterns' seed.
    """

    GOAL = 10.0

    # NOTE(deviation): Procgen's Leaper (not installable here) has road and river lanes and sub-step collisions;
    # this analog keeps its reward constants and car lanes only, with collisions checked after the cars move.
    def __init__(self, *, lanes: int = 4, width: int = 9, density: float = 0.35, seed: int = 0) -> None:
        self.lanes = v.integer("GridLeaper", "lanes", lanes, minimum=1)
        self.width = v.integer("GridLeaper", "width", width, minimum=3)
        v.in_range("GridLeaper", "density", density, 0.0, 1.0, high_open=True)
        rng = np.random.default_rng(v.integer("GridLeaper", "seed", seed, minimum=0))
        n_cars = max(1, int(round(density * self.width)))
        self.cars = np.zeros((self.lanes, self.width), dtype=bool)  # pattern at t = 0
        for i in range(self.lanes):
            self.cars[i, rng.choice(self.width, size=n_cars, replace=False)] = True
        self.direction = np.array([1 if i % 2 == 0 else -1 for i in range(self.lanes)])
        self.start = (0, self.width // 2, 0)
        self.state = self.start
        self._q: dict[tuple[int, int, int], np.ndarray] | None = None

    @property
    def actions(self) -> tuple[int, ...]:
        return (0, 1, 2, 3, 4)

    def car_at(self, row: int, x: int, t: int) -> bool:
        if not 1 <= row <= self.lanes:
            return False
        i = row - 1
        return bool(self.cars[i, (x - self.direction[i] * t) % self.width])

    def get_state(self) -> tuple[int, int, int]:
        return self.state

    def set_state(self, state: tuple[int, int, int]) -> None:
        self.state = state

    def is_terminal(self) -> bool:
        row, x, t = self.state
        return row == self.lanes + 1 or self.car_at(row, x, t)

    def is_success(self, state: tuple[int, int, int]) -> bool:
        return state[0] == self.lanes + 1

    def step(self, action: int) -> tuple[float, bool]:
        row, x, t = self.state
        dr, dx = ((1, 0), (-1, 0), (0, -1), (0, 1), (0, 0))[action]
        row = min(max(row + dr, 0), self.lanes + 1)
        x = min(max(x + dx, 0), self.width - 1)
        t = (t + 1) % self.width
        self.state = (row, x, t)
        r = -0.1 if action == 0 else -0.2
        if row == self.lanes + 1:
            return r + self.GOAL, True
        return r, self.car_at(row, x, t)

    def q_star(self, state: tuple[int, int, int]) -> np.ndarray:
        """Exact ``Q*(s, ·)`` (value iteration over every state, γ = 1)."""
        if self._q is None:
            keep = self.state
            self._q = {}
            for row in range(self.lanes + 1):
                for x in range(self.width):
                    for t in range(self.width):
                        if (row, x, t) not in self._q and not self.car_at(row, x, t):
                            self.state = (row, x, t)
                            self._q.update(brute_force_q(self, max_states=10**6))
            self.state = keep
        return self._q[tuple(state)].copy()

    def optimal_steps(self) -> int:
        """Steps of a shortest successful path from the start (for the step limit)."""
        dist, frontier = {self.start: 0}, deque([self.start])
        while frontier:
            s = frontier.popleft()
            for a in self.actions:
                self.state = s
                _, term = self.step(a)
                s2 = self.state
                if self.is_success(s2):
                    self.state = self.start
                    return dist[s] + 1
                if not term and s2 not in dist:
                    dist[s2] = dist[s] + 1
                    frontier.append(s2)
        self.state = self.start
        raise ValueError("GridLeaper: the goal is unreachable from the start for this seed")


# ----------------------------------------------------------------------------------------------------- gymnasium
@dataclass(frozen=True)
class _Snapshot:
    key: tuple[int, ...]
    env: Any


class GymnasiumAdapter:
    """Wrap a gymnasium env as a :class:`PlanningEnv`: state = ``copy.deepcopy`` of the env (works for any env
    whose full state deep-copies, e.g. MiniGrid); ``step`` maps gymnasium's 5-tuple to ``(reward, terminated)``.

    Args:
        env: a reset gymnasium env.
        key_fn: required: maps the wrapped env to a hashable key that tells its states apart, stored on each
            snapshot (``state.key``); value models (e.g. :class:`SimulatedValueModel`) look states up by it.
            Example for MiniGrid: ``lambda e: (*e.unwrapped.agent_pos, e.unwrapped.agent_dir)``.
        actions: the discrete actions to plan over (default: ``range(env.action_space.n)``).
    """

    def __init__(self, env: Any, *, key_fn: Callable[[Any], Hashable] | None = None,
                 actions: Sequence[int] | None = None) -> None:
        if not hasattr(env, "step"):
            raise TypeError(f"GymnasiumAdapter: env must be a gymnasium env with step(), got {type(env).__name__}")
        # (before issue 30 the default key was (), which made every state one state to a value model)
        if key_fn is None:
            raise TypeError("GymnasiumAdapter: key_fn is required: a function env -> hashable key that tells the "
                            "env's states apart (e.g. lambda e: (*e.unwrapped.agent_pos, e.unwrapped.agent_dir) for "
                            "MiniGrid); value models look states up by it")
        if not callable(key_fn):
            raise TypeError(f"GymnasiumAdapter: key_fn must be callable env -> key, got {type(key_fn).__name__}")
        key = key_fn(env)
        try:
            hash(key)
        except TypeError as e:
            raise TypeError(f"GymnasiumAdapter: key_fn must return a hashable key, got {type(key).__name__} "
                            f"{key!r}") from e
        if key == ():
            raise ValueError("GymnasiumAdapter: key_fn returned the empty key (), the same for every state; "
                             "return something that tells states apart")
        self.env = env
        self._actions = tuple(int(a) for a in (actions if actions is not None else range(env.action_space.n)))
        self._key_fn = key_fn
        self._terminal = False

    @property
    def actions(self) -> tuple[int, ...]:
        return self._actions

    def get_state(self) -> _Snapshot:
        return _Snapshot(self._key_fn(self.env), copy.deepcopy((self.env, self._terminal)))

    def set_state(self, state: _Snapshot) -> None:
        self.env, self._terminal = copy.deepcopy(state.env)

    def _reward(self, reward: float, terminated: bool, info: dict) -> float:
        return float(reward)

    def step(self, action: int) -> tuple[float, bool]:
        _, r, terminated, _, info = self.env.step(action)
        self._terminal = bool(terminated)
        return self._reward(float(r), bool(terminated), info), self._terminal

    def is_terminal(self) -> bool:
        return self._terminal


class MiniGridAdapter(GymnasiumAdapter):
    """A MiniGrid navigation env (FourRooms, SimpleCrossing, LavaCrossing...) as a :class:`PlanningEnv`.

    Actions left / right / forward. Rewards as the Procgen maze wrapper: −1 per step, +10 on the goal, and
    ``−death_penalty`` on lava (terminal). ``fast_state=True`` snapshots only ``(x, y, dir)`` (the layouts used
    here have a static grid, so this is the full state up to the step counter); ``False`` deep-copies the env.

    Args:
        env: a reset MiniGrid env (``gym.make("MiniGrid-FourRooms-v0")`` after ``reset(seed=...)``).
        fast_state: O(1) snapshots of the agent pose instead of ``copy.deepcopy``.
        death_penalty: penalty for entering lava (default 100: never better than walking to the goal).
        fog: fraction of free cells that are fogged (an observable feature, :func:`fog_mask`; 0 = none).
        fog_seed: the fog's seed (``make_minigrid`` passes the instance seed).
    """

    SUPPORTED_CELLS = ("wall", "floor", "goal", "lava")  # a static grid: the pose (x, y, dir) is the state

    def __init__(self, env: Any, *, fast_state: bool = True, death_penalty: float = 100.0, fog: float = 0.0,
                 fog_seed: int = 0) -> None:
        u = env.unwrapped
        if not hasattr(u, "agent_pos") or not hasattr(u, "grid"):
            raise TypeError(f"MiniGridAdapter: env must be a MiniGrid env, got {type(u).__name__}")
        self._check_layout(env)
        super().__init__(env, actions=(0, 1, 2), key_fn=lambda e: (int(e.unwrapped.agent_pos[0]),
                                                                  int(e.unwrapped.agent_pos[1]),
                                                                  int(e.unwrapped.agent_dir)))
        self.fast_state = bool(fast_state)
        self.death_penalty = v.non_negative("MiniGridAdapter", "death_penalty", death_penalty)
        self.start = self._pose()
        self._q: dict[tuple[int, int, int], np.ndarray] | None = None
        self._dist: dict[tuple[int, int, int], int] | None = None
        self.fog = v.probability("MiniGridAdapter", "fog", fog)
        free = np.array([[self._cell_kind(x, y) not in ("wall",) for y in range(u.height)] for x in range(u.width)])
        self._free = free
        self.fog_mask = fog_mask(shape=free.shape, free=free, frac=self.fog,
                                 seed=v.integer("MiniGridAdapter", "fog_seed", fog_seed, minimum=0))

    def _xy(self, state: Any) -> tuple[int, int]:
        pose = state if self.fast_state else state.key
        return int(pose[0]), int(pose[1])

    def fogged(self, state: Any) -> bool:
        """Whether the state's cell is fogged (an observable feature)."""
        return bool(self.fog_mask[self._xy(state)])

    def features(self, state: Any) -> tuple[int, int]:
        """Observable features of a state: ``(fogged, open neighbour cells)``, the bins of an estimated σ̂(s)."""
        x, y = self._xy(state)
        return int(self.fog_mask[x, y]), _open_neighbours(self._free, x, y)

    def states(self) -> list[tuple[int, int, int]]:
        """Every non-terminal pose (``fast_state`` only: a pose is the state)."""
        if not self.fast_state:
            raise ValueError("MiniGridAdapter.states: needs fast_state=True (a pose is then the state)")
        if self._q is None:
            self._ground_truth()
        return sorted(self._q)

    @classmethod
    def _check_layout(cls, env: Any) -> None:
        """``ValueError`` for a layout the pose model cannot represent (doors, keys, boxes, balls: state beyond the
        agent's pose, and actions beyond left/right/forward)."""
        u = env.unwrapped
        found: dict[str, tuple[int, int]] = {}
        for x in range(u.width):
            for y in range(u.height):
                cell = u.grid.get(x, y)
                if cell is not None and cell.type not in cls.SUPPORTED_CELLS:
                    found.setdefault(cell.type, (x, y))
        if found:
            name = getattr(getattr(env, "spec", None), "id", None) or type(u).__name__
            cells = ", ".join(f"{t} at {xy}" for t, xy in sorted(found.items()))
            raise ValueError(f"MiniGridAdapter: unsupported layout {name}: it has {cells}; the pose model (left / "
                             f"right / forward, exact q_star) supports static grids of "
                             f"{', '.join(cls.SUPPORTED_CELLS)} only (e.g. FourRooms, SimpleCrossing, "
                             "LavaCrossing); wrap other envs with GymnasiumAdapter(env, key_fn=...) and a value "
                             "model of your own")

    def _pose(self) -> tuple[int, int, int]:
        u = self.env.unwrapped
        return int(u.agent_pos[0]), int(u.agent_pos[1]), int(u.agent_dir)

    def get_state(self) -> Any:
        if self.fast_state:
            return self._pose()
        return super().get_state()

    def set_state(self, state: Any) -> None:
        if not self.fast_state:
            super().set_state(state)
            return
        u = self.env.unwrapped
        u.agent_pos = (state[0], state[1])
        u.agent_dir = state[2]
        u.step_count = 0
        self._terminal = self._cell_kind(state[0], state[1]) in ("goal", "lava")

    def _cell_kind(self, x: int, y: int) -> str | None:
        cell = self.env.unwrapped.grid.get(x, y)
        return None if cell is None else cell.type

    def _reward(self, reward: float, terminated: bool, info: dict) -> float:
        if not terminated:
            return -STEP_PENALTY
        kind = self._cell_kind(*self._pose()[:2])
        return GOAL_REWARD - STEP_PENALTY if kind == "goal" else -STEP_PENALTY - self.death_penalty

    def is_success(self, state: Any) -> bool:
        pose = state if self.fast_state else state.key
        return self._cell_kind(pose[0], pose[1]) == "goal"

    # ---- exact ground truth over poses (the grid is static)
    def _model_step(self, pose: tuple[int, int, int], a: int) -> tuple[tuple[int, int, int], str | None]:
        from minigrid.core.constants import DIR_TO_VEC

        x, y, d = pose
        if a == 0:
            return (x, y, (d - 1) % 4), None
        if a == 1:
            return (x, y, (d + 1) % 4), None
        dx, dy = DIR_TO_VEC[d]
        u = self.env.unwrapped
        if not (0 <= x + dx < u.width and 0 <= y + dy < u.height):  # the edge of an open grid blocks like a wall
            return pose, None
        cell = u.grid.get(x + dx, y + dy)
        if cell is None:
            return (x + dx, y + dy, d), None
        if cell.can_overlap():
            return (x + dx, y + dy, d), cell.type if cell.type in ("goal", "lava") else None
        return pose, None

    def _ground_truth(self) -> None:
        u = self.env.unwrapped
        poses = [(x, y, d) for x in range(u.width) for y in range(u.height) for d in range(4)
                 if self._cell_kind(x, y) not in ("wall", "goal", "lava")]
        succ, goal_edges = {}, []
        for p in poses:
            nxt = []
            for a in range(3):
                q, kind = self._model_step(p, a)
                if kind == "goal":
                    goal_edges.append(p)
                elif kind is None:
                    nxt.append(q)
            succ[p] = nxt
        # d(p) = steps to the goal: 1 for poses with a goal edge, then BFS backwards
        succ["GOAL"] = []
        for p in goal_edges:
            succ[p] = succ[p] + ["GOAL"]
        dist = _bfs_distances(succ, ["GOAL"])
        self._dist = {p: dist[p] for p in poses if p in dist}
        self._q = {}
        for p in poses:
            q = np.empty(3)
            for a in range(3):
                p2, kind = self._model_step(p, a)
                if kind == "goal":
                    q[a] = GOAL_REWARD - STEP_PENALTY
                elif kind == "lava":
                    q[a] = -STEP_PENALTY - self.death_penalty
                else:
                    q[a] = -STEP_PENALTY + GOAL_REWARD - self._dist.get(p2, 10**6)
            self._q[p] = q

    def q_star(self, state: Any) -> np.ndarray:
        """Exact ``Q*(s, ·)`` for left / right / forward (BFS over poses of the static grid)."""
        if self._q is None:
            self._ground_truth()
        pose = state if self.fast_state else state.key
        return self._q[tuple(pose)].copy()

    def optimal_steps(self) -> int:
        if self._dist is None:
            self._ground_truth()
        if self.start not in self._dist:
            raise ValueError(f"MiniGridAdapter: unsupported layout: the goal cannot be reached from the start pose "
                             f"{self.start} with left / right / forward")
        return int(self._dist[self.start])


def make_minigrid(name: str = "MiniGrid-FourRooms-v0", *, seed: int, fast_state: bool = True,
                  fog: float = 0.0) -> MiniGridAdapter:
    """``gym.make(name)``, ``reset(seed=seed)`` and wrap in a :class:`MiniGridAdapter` (needs the ``rl`` extra)."""
    try:
        import gymnasium as gym
        import minigrid  # noqa: F401  (registers the MiniGrid envs)
    except ImportError as e:  # pragma: no cover
        raise ImportError("make_minigrid needs minigrid: pip install 'icml24[rl]'") from e
    env = gym.make(name, max_steps=10**6)
    env.reset(seed=seed)
    return MiniGridAdapter(env, fast_state=fast_state, fog=fog, fog_seed=seed)


# ----------------------------------------------------------------------------------------------------- reference
def brute_force_q(env: PlanningEnv, *, key_fn: Callable[[Any], Hashable] = lambda s: s,
                  max_states: int = 20_000, gamma: float = 1.0) -> dict[Hashable, np.ndarray]:
    """Exact Q over all states reachable from ``env``'s current state, using only the simulator (slow reference).

    Enumerates the reachable graph with ``get_state/set_state/step`` and runs value iteration to convergence.
    """
    check_env("brute_force_q", env)
    acts = list(env.actions)
    root = env.get_state()
    states, trans = {key_fn(root): root}, {}
    queue = deque([root])
    while queue:
        s = queue.popleft()
        k = key_fn(s)
        env.set_state(s)
        if env.is_terminal():
            trans[k] = None
            continue
        out = []
        for a in acts:
            env.set_state(s)
            r, term = env.step(a)
            s2 = env.get_state()
            k2 = key_fn(s2)
            out.append((r, term, k2))
            if k2 not in states:
                states[k2] = s2
                queue.append(s2)
                if len(states) > max_states:
                    raise ValueError(f"brute_force_q: more than max_states={max_states} reachable states")
        trans[k] = out
    env.set_state(root)
    val = {k: 0.0 for k in states}
    for _ in range(10 * len(states) + 10):
        q = {k: np.array([r + (0.0 if term else gamma * val[k2]) for r, term, k2 in out])
             for k, out in trans.items() if out is not None}
        new = {k: (float(q[k].max()) if k in q else 0.0) for k in states}
        if all(abs(new[k] - val[k]) < 1e-9 for k in states):
            return q
        val = new
    raise RuntimeError("brute_force_q: value iteration did not converge (a state with no path to a terminal?)")
