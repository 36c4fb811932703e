"""Environments for ALH: the paper's 1-D ``MultiNormEnv`` (pure NumPy) and MuJoCo tasks through gymnasium.

``MultiNormEnv`` (official ``code/online/toy_env.py``): S = [0, 600], A = [−6, 6], s' = s + a, 100 steps,
episode over when s' leaves [0, 600] or at the time limit. Reward r(s') = Σ_k c_k 𝒩(s'; μ_k, σ) with
μ = 0, 120, …, 600, σ = 20, c = (−81, −27, 3, −9, 27, −81). The *biased* ("hard") scheme resets uniformly in
[200, 260] and makes the random warm-up action 0, so all early data sits in one small region; evaluation always
uses the unbiased reset (uniform in [0, 600]).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from icml24.common import validate as v

__all__ = ["Box", "MultiNormEnv", "make_env", "action_bounds", "box_bounds"]


@dataclass(frozen=True)
class Box:
    """A continuous space ``[low, high]`` of a given shape (the part of ``gymnasium.spaces.Box`` TD3 needs)."""

    low: np.ndarray
    high: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.low))


class MultiNormEnv:
    """The paper's 1-D analysis environment with an optional biased early-data scheme.

    Gymnasium-style API: ``reset(seed=None) -> (obs, info)``, ``step(a) -> (obs, r, terminated, truncated,
    info)``. ``random_action(rng)`` is the warm-up action: 0 under the biased scheme (official
    ``BiasActionSpace``), uniform in A otherwise.

    Args:
        biased: reset in [200, 260] and random warm-up action 0 (the paper's "hard" scheme).
        max_steps: episode length (official: 100).
        gap: distance between neighbouring reward modes / 2 (official ``dis_gap=60``: modes every 120, σ = 20).
        seed: seed of the environment's own generator (start states).
    """

    centers_scale = np.array([-81.0, -27.0, 3.0, -9.0, 27.0, -81.0])

    def __init__(self, *, biased: bool = False, max_steps: int = 100, gap: float = 60.0, seed: int = 0) -> None:
        v.integer("MultiNormEnv", "max_steps", max_steps, minimum=1)
        v.positive("MultiNormEnv", "gap", gap)
        v.integer("MultiNormEnv", "seed", seed, minimum=0)
        self.biased = bool(biased)
        self.max_steps = int(max_steps)
        self.mu = np.arange(6, dtype=np.float64) * 2.0 * gap
        self.sigma = gap / 3.0
        hi = float(self.mu[-1])
        step = hi / max_steps
        self.observation_space = Box(np.array([0.0], np.float32), np.array([hi], np.float32))
        self.action_space = Box(np.array([-step], np.float32), np.array([step], np.float32))
        self.bias_range = (200.0, 260.0)
        self.rng = np.random.default_rng(seed)
        self._pos = 0.0
        self._t = 0

    def reward(self, s: np.ndarray | float) -> np.ndarray:
        """r(s) = Σ_k c_k 𝒩(s; μ_k, σ), vectorised over ``s``."""
        s = np.asarray(s, dtype=np.float64)[..., None]
        pdf = np.exp(-0.5 * ((s - self.mu) / self.sigma) ** 2) / (self.sigma * np.sqrt(2 * np.pi))
        return (pdf * self.centers_scale).sum(-1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        lo, hi = self.bias_range if self.biased else (0.0, float(self.observation_space.high[0]))
        self._pos = float(self.rng.uniform(lo, hi))
        self._t = 0
        return np.array([self._pos], np.float32), {}

    def step(self, action: np.ndarray | float) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
        self._t += 1
        self._pos += a
        r = float(self.reward(self._pos))
        out = not (0.0 <= self._pos <= float(self.observation_space.high[0]))
        return np.array([self._pos], np.float32), r, out, self._t >= self.max_steps and not out, {}

    def random_action(self, rng: np.random.Generator) -> np.ndarray:
        """Warm-up action: 0 under the biased scheme, else uniform in A (drawn from ``rng``)."""
        if self.biased:
            return np.zeros(self.action_space.shape, np.float32)
        return rng.uniform(self.action_space.low, self.action_space.high).astype(np.float32)

    def get_state(self) -> dict[str, Any]:
        return {"pos": self._pos, "t": self._t, "rng": copy.deepcopy(self.rng.bit_generator.state)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._pos, self._t = float(state["pos"]), int(state["t"])
        self.rng.bit_generator.state = state["rng"]


def action_bounds(owner: str, env: Any) -> tuple[int, int, np.ndarray, np.ndarray]:
    """``(state_dim, action_dim, low, high)`` of an env with a flat continuous observation and a Box action space
    with finite bounds ``low < high`` (float64 arrays, one entry per action dimension; any box, e.g.
    ``gymnasium.wrappers.RescaleAction(env, 0, 1)``); ``TypeError`` for anything else (TD3 needs a Box)."""
    act = getattr(env, "action_space", None)
    obs = getattr(env, "observation_space", None)
    if act is None or not hasattr(act, "low") or not hasattr(act, "high") or not hasattr(act, "shape"):
        raise v.ArgumentTypeError(f"{owner}: TD3/ALH need a continuous (Box) action space, got "
                                  f"{type(act).__name__}")
    if not np.issubdtype(np.asarray(act.low).dtype, np.floating):
        raise v.ArgumentTypeError(f"{owner}: TD3/ALH need a continuous (Box) action space with float bounds, got "
                                  f"dtype {np.asarray(act.low).dtype}")
    if obs is None or not hasattr(obs, "shape") or len(obs.shape) != 1:
        raise ValueError(f"{owner}: the observation space must be a flat vector (1-D Box), got "
                         f"shape {getattr(obs, 'shape', None)}")
    if len(act.shape) != 1:
        raise ValueError(f"{owner}: the action space must be 1-D, got shape {act.shape}")
    low, high = np.asarray(act.low, np.float64).reshape(-1), np.asarray(act.high, np.float64).reshape(-1)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
        raise ValueError(f"{owner}: the action space must be bounded with low < high in every dimension, got "
                         f"low={low}, high={high}")
    return int(obs.shape[0]), int(act.shape[0]), low, high


def box_bounds(owner: str, env: Any) -> tuple[int, int, float]:
    """``(state_dim, action_dim, max_action)`` of an env whose action space is ``[-max_action, max_action]^d``;
    ``ValueError`` for any other box (use :func:`action_bounds`, which TD3/ALH train with)."""
    state_dim, action_dim, low, high = action_bounds(owner, env)
    if not (np.allclose(low, -high) and np.allclose(high, high.flat[0])):
        raise ValueError(f"{owner}: the action space is not symmetric and equal in every dimension "
                         f"([-max_action, max_action]^d), got low={low}, high={high}; use action_bounds")
    return state_dim, action_dim, float(high.flat[0])


def make_env(name: str, *, biased: bool = False, seed: int = 0) -> Any:
    """``"MultiNormEnv"`` (pure NumPy) or a gymnasium id such as ``"InvertedPendulum-v5"`` (extra ``rl``)."""
    if name == "MultiNormEnv":
        return MultiNormEnv(biased=biased, seed=seed)
    try:
        import gymnasium as gym
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("alh: MuJoCo tasks need gymnasium[mujoco]; install the extra: pip install "
                          "'icml24[rl]'") from e
    env = gym.make(name)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env
