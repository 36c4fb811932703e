"""Closed-loop TAT around any planner: sample a batch of plans, integrate them into the persistent tree, act on the
heaviest root child, prune to it, and repeat at the next observation (the official locomotion loop,
``TATGuidedPolicy.tat_call`` in ``langfengQ/tree-diffusion-planner``, with the planner left to the user)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from icml24.common import validate as v
from icml24.tat.tree import TrajectoryAggregationTree, forward_state

__all__ = ["TATPlanner"]

_OWNER = "TATPlanner"


class TATPlanner:
    """Wrap any batch planner with a Trajectory Aggregation Tree that persists over an episode.

    Each :meth:`act` call runs ``plan_fn(observation, **kwargs)`` for a batch ``[B, L, D]`` of plans (numpy or torch,
    on any device), where row 0 of every plan is the current (conditioned) step and ``D = action_dim + state_dim``
    with the actions first (Diffuser's layout; ``action_dim=0`` for state-only plans, whose "action" is then the next
    state, e.g. a waypoint for a controller or an inverse-dynamics model). It then

    1. aligns the rows with :func:`~icml24.tat.tree.forward_state` (row i holds ``(a_{i−1}, s_i)``, so the root child
       carries ``(a_0, s_1)``) unless ``align_actions=False``;
    2. integrates the first ``tree_batch_size`` plans (all by default; the official locomotion code samples 64,
       sorts them by value and integrates 32) into the tree, whose root is the current step;
    3. acts: the heaviest root child's mean, whose first ``action_dim`` entries are the action (passed through
       ``action_fn``, e.g. the normaliser's inverse, when given);
    4. prunes the tree to that child, which becomes the root for the next call: states sampled k steps ago keep
       their weight λ^(i−1), i.e. λ^k less than fresh ones at the same depth.

    Storage follows the live tree: pruned nodes are freed and the merge log folded whenever the tree's arrays fill
    (:meth:`TrajectoryAggregationTree.compact`), so memory stays flat over long episodes.

    Example::

        planner = TATPlanner(lambda obs: sample_plans(obs, n=64), transition_dim=A + S, action_dim=A,
                             lambda_=0.98, merge_threshold=5e-3, tree_batch_size=32)
        obs = env.reset(); planner.reset()
        for t in range(T):
            obs, r, done, *_ = env.step(planner.act(obs))
    """

    def __init__(self, plan_fn: Callable[..., Any], *, transition_dim: int, action_dim: int = 0,
                 lambda_: float = 0.98, merge_threshold: float = 5e-4,
                 distance: Literal["cosine", "euclidean"] = "cosine", history_length: int = 1,
                 tree_batch_size: int | None = None, align_actions: bool = True,
                 action_fn: Callable[[np.ndarray], Any] | None = None) -> None:
        """Args:
            plan_fn: ``plan_fn(observation, **kwargs) -> [B, L, D]`` plans (numpy array or torch tensor), in the
                space the tree should compare (normalised states, as the official code does).
            transition_dim: D, the width of a plan row (actions + states).
            action_dim: A, the leading action entries of a row (0: state-only plans).
            lambda_, merge_threshold, distance, history_length: the tree's (see
                :class:`~icml24.tat.tree.TrajectoryAggregationTree`); official λ = 0.98, 1 − α = 5e-4 (Maze2D) or
                5e-3 (locomotion), cosine distance, one history row.
            tree_batch_size: integrate only the first this many plans of each batch (None: all).
            align_actions: shift the actions with ``forward_state`` before integrating (official; needs
                ``action_dim > 0`` to have an effect).
            action_fn: maps the chosen node's action (or state, when ``action_dim=0``) to what :meth:`act` returns.
        """
        if not callable(plan_fn):
            raise TypeError(f"{_OWNER}: plan_fn must be callable, got {type(plan_fn).__name__}")
        self.plan_fn = plan_fn
        self.transition_dim = v.integer(_OWNER, "transition_dim", transition_dim, minimum=1)
        self.action_dim = v.integer(_OWNER, "action_dim", action_dim, minimum=0, maximum=self.transition_dim)
        self.tree_batch_size = (None if tree_batch_size is None
                                else v.integer(_OWNER, "tree_batch_size", tree_batch_size, minimum=1))
        self.align_actions = bool(align_actions)
        self.action_fn = action_fn
        self._tree_kw = dict(state_dim=self.transition_dim, lambda_=lambda_, merge_threshold=merge_threshold,
                             distance=distance, history_length=history_length)
        self.tree = TrajectoryAggregationTree(**self._tree_kw)  # validates the tree's arguments
        self.steps = 0
        self.last_info: dict[str, Any] = {}

    def reset(self) -> None:
        """Start a new episode: a fresh, empty tree (the official code builds one tree per episode)."""
        self.tree = TrajectoryAggregationTree(**self._tree_kw)
        self.steps = 0
        self.last_info = {}

    def integrate(self, plans: Any) -> np.ndarray:
        """Align (``forward_state``) and integrate one batch of plans; returns the array integrated."""
        x = self.tree.check_trajectories(plans)
        if self.action_dim and self.align_actions:
            x = forward_state(x, action_dim=self.action_dim)
        if self.tree_batch_size is not None:
            x = x[:self.tree_batch_size]
        self.tree.integrate(x)
        return x

    def act(self, observation: Any, **plan_kwargs: Any) -> Any:
        """One closed-loop step: plan from ``observation``, integrate, act, prune; returns the action.

        ``last_info`` then holds ``node_state`` (the chosen child's mean row), ``count`` (plans merged into it),
        ``value`` (its summed weight), ``root_children`` and ``batch_size`` (the plans integrated).
        """
        plans = self.plan_fn(observation, **plan_kwargs)
        x = self.integrate(plans)
        t = self.tree
        k = t.best_child()
        c = t._kids(t._root)[k]
        state = t._wstate[c] / t._wsum[c]
        self.last_info = {"node_state": state, "count": int(t._count[c]), "value": float(t._wsum[c]),
                          "root_children": len(t._kids(t._root)), "batch_size": len(x)}
        t.prune(k)
        self.steps += 1
        out = state[:self.action_dim] if self.action_dim else state
        return self.action_fn(out) if self.action_fn is not None else out

    __call__ = act
