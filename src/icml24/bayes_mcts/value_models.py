"""Value models with uncertainty: the Protocol the planners query, and the simulated inaccurate network.

A value model maps a simulator state ``s`` to per-action Gaussian beliefs ``Q(s, a) ~ N(μ(s, a), σ(s, a)²)``.
The official code simulates "an inaccurate network with accurate uncertainty" by ``σ(s, a) = |μ(s, a) − Q*(s, a)|``
(``Config.use_gt_std``). Here the network is simulated as ``μ(s, a) = Q*(s, a) + σ_err·ξ(s, a)`` with
``ξ ~ N(0, 1)`` fixed per (instance, state, action), and σ from one of five modes:

- ``gt``: ``|μ − Q*|`` (accurate uncertainty, the official ``use_gt_std``);
- ``const``: ``σ_err`` everywhere (calibrated on average, uninformative about *which* estimate is wrong);
- ``sigma``: the simulator's own per-state error std ``σ_err(s)`` (a reference: what a perfect estimate of the
  error's *scale* would give);
- ``random``: ``σ_err(s)·|ξ'|`` with an independent ``ξ'`` (uninformative, same marginal as ``gt``);
- ``zero``: the floor only (no uncertainty).

The error may be heteroscedastic, ``μ = Q* + σ_err(s)·ξ`` with ``err_std_fn(s) = σ_err(s)``. A planner's σ̂(s) is
then *estimated* (:class:`BinnedResidualStd`): the RMS of validation residuals ``μ − Q*`` per bin of a state's
observable features, and served by :class:`EstimatedStdModel` beside the network's μ. The estimate sees only
features and residuals, never ``err_std_fn``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from icml24.common import validate as v

__all__ = ["ValueModel", "SimulatedValueModel", "check_value_output", "STD_MODES", "STD_FLOOR", "BinnedResidualStd",
           "EstimatedStdModel", "validation_residuals"]

STD_MODES = ("gt", "const", "sigma", "random", "zero")
STD_FLOOR = 0.01  # official planners: qsa_std = max(exp(log_std), 0.01)
StdMode = Literal["gt", "const", "sigma", "random", "zero"]


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
        sigma_err: σ_err, the std of the network's error ξ (0 = exact network); with ``err_std_fn``, only the
            ``const`` mode's σ.
        std_mode: ``gt`` (|μ − Q*|), ``const`` (σ_err), ``sigma`` (σ_err(s)), ``random`` (σ_err(s)·|ξ'|) or ``zero``.
        err_std_fn: ``state -> σ_err(s) >= 0``, a heteroscedastic error std (default: σ_err in every state).
        seed: the error pattern's seed (one per problem instance).
        key_fn: a state's key of non-negative ints (default: ``state.key`` if present, else the state).
        std_floor: lower bound on σ (official code: 0.01).
    """

    def __init__(self, *, q_star: Callable[[Any], np.ndarray], sigma_err: float, std_mode: StdMode = "gt",
                 seed: int = 0, key_fn: Callable[[Any], Hashable] | None = None,
                 std_floor: float = STD_FLOOR, err_std_fn: Callable[[Any], float] | None = None) -> None:
        if not callable(q_star):
            raise TypeError(f"SimulatedValueModel: q_star must be callable, got {type(q_star).__name__}")
        self.q_star = q_star
        self.sigma_err = v.non_negative("SimulatedValueModel", "sigma_err", sigma_err)
        self.std_mode = v.one_of("SimulatedValueModel", "std_mode", std_mode, STD_MODES)
        self.seed = v.integer("SimulatedValueModel", "seed", seed, minimum=0)
        self.std_floor = v.positive("SimulatedValueModel", "std_floor", std_floor)
        self.key_fn = key_fn or (lambda s: getattr(s, "key", s))
        if err_std_fn is not None and not callable(err_std_fn):
            raise TypeError(f"SimulatedValueModel: err_std_fn must be callable state -> σ_err(s), got "
                            f"{type(err_std_fn).__name__}")
        self.err_std_fn = err_std_fn
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
        s_err = self.sigma_err if self.err_std_fn is None else float(self.err_std_fn(state))
        if not (np.isfinite(s_err) and s_err >= 0):
            raise ValueError(f"SimulatedValueModel: err_std_fn returned {s_err!r} at state {state!r}, expected a "
                             "finite σ_err(s) >= 0")
        mu = q + s_err * xi
        if self.std_mode == "gt":
            sd = np.abs(mu - q)
        elif self.std_mode == "const":
            sd = np.full(q.size, self.sigma_err)
        elif self.std_mode == "sigma":
            sd = np.full(q.size, s_err)
        elif self.std_mode == "random":
            sd = s_err * np.abs(xi2)
        else:
            sd = np.zeros(q.size)
        sd = np.maximum(sd, self.std_floor)
        self._cache[key] = (mu, sd)
        return mu.copy(), sd.copy()


# ---------------------------------------------------------------------------------------------- estimated σ̂(s)
def validation_residuals(*, env: Any, net: Callable[[Any], tuple[np.ndarray, np.ndarray]],
                         features: Callable[[Any], Hashable] | None = None) -> list[tuple[Hashable, np.ndarray]]:
    """``(features(s), μ(s, ·) − Q*(s, ·))`` for every non-terminal state of a validation instance.

    ``env`` needs ``states()`` and ``q_star(s)``; ``features`` defaults to ``env.features``. Only the network's μ
    is read (its σ is ignored), so the residuals are what a held-out labelled set would give.
    """
    feat = env.features if features is None else features
    out = []
    for s in env.states():
        mu, _ = net(s)
        out.append((feat(s), np.asarray(mu, dtype=float) - np.asarray(env.q_star(s), dtype=float)))
    return out


class BinnedResidualStd:
    """σ̂ per feature bin: the root mean square of validation residuals ``μ − Q*`` of the states in the bin.

    The RMS about zero (not the sd about the bin's mean) is the std of a Gaussian belief centred on μ that covers
    both the error's spread and any bias. A bin with fewer than ``min_count`` residuals, or a bin never seen,
    gets the pooled RMS of all residuals. ``pooled=True`` ignores the features: one constant σ̂ (the RMS over all
    states), the constant-σ control estimated from the same residuals.

    Args:
        samples: ``(feature bin, residuals)`` pairs (:func:`validation_residuals` of each validation instance).
        min_count: fewest residuals for a bin of its own.
        pooled: one bin for every state.
    """

    def __init__(self, samples: Iterable[tuple[Hashable, Any]], *, min_count: int = 20, pooled: bool = False) -> None:
        self.min_count = v.integer("BinnedResidualStd", "min_count", min_count, minimum=1)
        self.pooled_only = bool(pooled)
        sq: dict[Hashable, list[float]] = {}
        for key, res in samples:
            r = np.asarray(res, dtype=float).reshape(-1)
            if not np.all(np.isfinite(r)):
                raise ValueError(f"BinnedResidualStd: non-finite residuals in bin {key!r}: {r}")
            sq.setdefault(() if pooled else key, []).extend((r * r).tolist())
        n_all = sum(len(x) for x in sq.values())
        if n_all == 0:
            raise ValueError("BinnedResidualStd: no residuals to estimate σ̂ from")
        self.pooled = float(np.sqrt(sum(sum(x) for x in sq.values()) / n_all))
        self.counts = {k: len(x) for k, x in sq.items()}
        self.table = {k: float(np.sqrt(np.mean(x))) for k, x in sq.items() if len(x) >= self.min_count}

    def __call__(self, key: Hashable) -> float:
        """σ̂ of a feature bin (the pooled RMS for a bin with too few residuals or never seen)."""
        return self.pooled if self.pooled_only else self.table.get(key, self.pooled)

    def as_dict(self) -> dict[str, Any]:
        return {"pooled": self.pooled, "min_count": self.min_count, "pooled_only": self.pooled_only,
                "table": {str(k): x for k, x in sorted(self.table.items(), key=lambda kv: str(kv[0]))},
                "counts": {str(k): n for k, n in sorted(self.counts.items(), key=lambda kv: str(kv[0]))}}


class EstimatedStdModel:
    """A value model serving the network's μ with an estimated σ̂(s) = ``std(features(s))`` for every action.

    Args:
        base: the network, ``state -> (μ, σ)`` (its σ is discarded).
        std: a fitted :class:`BinnedResidualStd` (or any ``feature bin -> σ̂``).
        features: ``state -> feature bin`` (e.g. ``env.features``).
        std_floor: lower bound on σ̂.
    """

    def __init__(self, *, base: Callable[[Any], tuple[np.ndarray, np.ndarray]], std: Callable[[Hashable], float],
                 features: Callable[[Any], Hashable], std_floor: float = STD_FLOOR) -> None:
        for name, f in (("base", base), ("std", std), ("features", features)):
            if not callable(f):
                raise TypeError(f"EstimatedStdModel: {name} must be callable, got {type(f).__name__}")
        self.base, self.std, self.features = base, std, features
        self.std_floor = v.positive("EstimatedStdModel", "std_floor", std_floor)

    def __call__(self, state: Any) -> tuple[np.ndarray, np.ndarray]:
        mu, _ = self.base(state)
        mu = np.asarray(mu, dtype=float)
        return mu, np.full(mu.shape, max(float(self.std(self.features(state))), self.std_floor))
