"""Value models with uncertainty: the Protocol the planners query, and the simulated inaccurate network.

A value model maps a simulator state ``s`` to per-action Gaussian beliefs ``Q(s, a) ~ N(μ(s, a), σ(s, a)²)``.
The official code simulates "an inaccurate network with accurate uncertainty" by ``σ(s, a) = |μ(s, a) − Q*(s, a)|``
(``Config.use_gt_std``). Here the network is simulated as ``μ(s, a) = Q*(s, a) + σ_err·ξ(s, a)`` with
``ξ ~ N(0, 1)`` fixed per (instance, state, action), and σ from one of four modes:

- ``gt``: ``|μ − Q*|`` (accurate uncertainty, the official ``use_gt_std``);
- ``const``: ``σ_err`` everywhere (calibrated on average, uninformative about *which* estimate is wrong);
- ``random``: ``σ_err·|ξ'|`` with an independent ``ξ'`` (uninformative, same marginal as ``gt``);
- ``zero``: the floor only (no uncertainty).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from icml24.common import validate as v

__all__ = ["ValueModel", "SimulatedValueModel", "check_value_output", "STD_MODES", "STD_FLOOR"]

STD_MODES = ("gt", "const", "random", "zero")
STD_FLOOR = 0.01  # official planners: qsa_std = max(exp(log_std), 0.01)
StdMode = Literal["gt", "const", "random", "zero"]


@runtime_checkable
class ValueModel(Protocol):
    """``model(state) -> (μ, σ)``: per-action means and standard deviations, each of shape ``(|A|,)``."""

    def __call__(self, state: Any) -> tuple[np.ndarray, np.ndarray]: ...


def check_value_output(owner: str, out: Any, n_actions: int, state: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a value model's output at ``state``; returns float arrays ``(μ, σ)``."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"{owner}: value model must return a (means, stds) pair, got {type(out).__name__} "
                        f"at state {state!r}")
    mu = np.asarray(out[0], dtype=float).reshape(-1)
    sd = np.asarray(out[1], dtype=float).reshape(-1)
    if mu.size != n_actions or sd.size != n_actions:
        raise ValueError(f"{owner}: value model returned {mu.size} means and {sd.size} stds at state {state!r}, "
                         f"expected one per action ({n_actions})")
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(sd))):
        raise ValueError(f"{owner}: value model returned non-finite values at state {state!r}: μ={mu}, σ={sd}")
    if np.any(sd < 0):
        raise ValueError(f"{owner}: value model returned negative standard deviations at state {state!r}: σ={sd}")
    return mu, sd


class SimulatedValueModel:
    """A simulated inaccurate Q-network with a chosen kind of uncertainty (official code's ``use_gt_std`` setup).

    Args:
        q_star: exact ``Q*(s, ·)`` of a state (e.g. ``GridMaze.q_star``).
        sigma_err: σ_err, the std of the network's error ξ (0 = exact network).
        std_mode: ``gt`` (|μ − Q*|), ``const`` (σ_err), ``random`` (σ_err·|ξ'|) or ``zero``.
        seed: the error pattern's seed (one per problem instance).
        key_fn: a state's key of non-negative ints (default: ``state.key`` if present, else the state).
        std_floor: lower bound on σ (official code: 0.01).
    """

    def __init__(self, *, q_star: Callable[[Any], np.ndarray], sigma_err: float, std_mode: StdMode = "gt",
                 seed: int = 0, key_fn: Callable[[Any], Hashable] | None = None,
                 std_floor: float = STD_FLOOR) -> None:
        if not callable(q_star):
            raise TypeError(f"SimulatedValueModel: q_star must be callable, got {type(q_star).__name__}")
        self.q_star = q_star
        self.sigma_err = v.non_negative("SimulatedValueModel", "sigma_err", sigma_err)
        self.std_mode = v.one_of("SimulatedValueModel", "std_mode", std_mode, STD_MODES)
        self.seed = v.integer("SimulatedValueModel", "seed", seed, minimum=0)
        self.std_floor = v.positive("SimulatedValueModel", "std_floor", std_floor)
        self.key_fn = key_fn or (lambda s: getattr(s, "key", s))
        self._cache: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}
        self.calls = 0

    def __call__(self, state: Any) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        key = self.key_fn(state)
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0].copy(), hit[1].copy()
        q = np.asarray(self.q_star(state), dtype=float)
        flat = key if isinstance(key, tuple) else (key,)
        rng = np.random.default_rng([self.seed, *(int(k) for k in flat)])
        xi, xi2 = rng.standard_normal(q.size), rng.standard_normal(q.size)
        mu = q + self.sigma_err * xi
        if self.std_mode == "gt":
            sd = np.abs(mu - q)
        elif self.std_mode == "const":
            sd = np.full(q.size, self.sigma_err)
        elif self.std_mode == "random":
            sd = self.sigma_err * np.abs(xi2)
        else:
            sd = np.zeros(q.size)
        sd = np.maximum(sd, self.std_floor)
        self._cache[key] = (mu, sd)
        return mu.copy(), sd.copy()
