"""Bayesian online planners — Thompson-sampling tree search (TSTS) and Bayes-UCB tree search (BTS) — and the
AlphaZero-style N-MCTS baseline, on one tree-search core.

Greshler, Ben Eli, Rabinovitz, Guetta, Gispan, Zohar, Tamar, "A Bayesian Approach to Online Planning",
ICML 2024, arXiv 2406.02103; official code nirgreshler/bayesian-online-planning (planners/*.py).

Each iteration selects down the tree until an unexplored action is chosen, expands ONE child with the simulator
and backs up (no rollouts; leaves are valued by the network). The Bayesian planners keep, per edge, a "mean"
posterior and a "max" posterior of Q(s, a); after expanding a leaf L, for every node u on the path (u ≠ root)::

    V(u)     = Q_post(u, argmax_a E Q_post(u, a))        (the leaf's value prior N(μ(s, a*), σ(s, a*)²) before u
    V_max(u) = max-of-Gaussians over all a of Q_max(u, a)  has been selected from; N(0, 10⁻³) if terminal)
    Q_post(parent, a_u) = r + γ V(u),   Q_max(parent, a_u) = r + γ V_max(u)

TSTS selects ``argmax_a x_a, x_a ~ Q_max(u, a)`` at every level (the official per-level variant) or follows a
joint Thompson sample of every frontier leaf (``variant="frontier"``); BTS selects
``argmax_a E Q_max + z(p_n)·std Q_max`` with ``p_n = 1 − ½·exp(−(min(n, 150) − 1)/3)``. Both commit to
``argmax_a median Q_post(root, a)``. N-MCTS: PUCT with prior ``P = softmax(μ/2)``,
``argmax_a Q̂ + c·B_eff·P(a)·√(10⁻³ + N)/(1 + N_a)``, ``B_eff = exp(H(P))``, max-backup, commit ``argmax Q̂``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from icml24.bayes_mcts.distributions import _check_grid, _max1d, bts_percentile, gaussian_quantile
from icml24.bayes_mcts.envs import check_env
from icml24.bayes_mcts.value_models import STD_FLOOR, check_value_output
from icml24.common import validate as v

__all__ = ["Node", "SearchResult", "TreeSearchPlanner", "TSTS", "BTS", "NMCTS", "GreedyPlanner",
           "EpisodeResult", "run_episode", "make_planner", "PLANNERS"]

TERMINAL_STD = 1e-3  # official bts.py: value prior of a terminal node N(0, 1e-3)


class Node:
    """A search-tree node (one simulator state). Arrays are per action, indexed like ``env.actions``."""

    __slots__ = ("state", "parent", "action", "reward", "terminal", "depth", "children", "n", "mu", "sd",
                 "vprior", "selected", "post_m", "post_s", "pmax_m", "pmax_s", "q", "prior", "beff", "na")

    def __init__(self, state: Any, parent: Node | None, action: int | None, reward: float, terminal: bool) -> None:
        self.state, self.parent, self.action, self.reward, self.terminal = state, parent, action, reward, terminal
        self.depth = 0 if parent is None else parent.depth + 1
        self.children: dict[int, Node] = {}
        self.n = 0
        self.mu = self.sd = None
        self.vprior: tuple[float, float] = (0.0, TERMINAL_STD)
        self.selected = False

    def iter_tree(self):
        """All nodes of the subtree, depth first."""
        stack = [self]
        while stack:
            u = stack.pop()
            yield u
            stack.extend(u.children.values())


@dataclass
class SearchResult:
    """One decision: the committed action and the root statistics it was chosen from."""

    action: int
    values: np.ndarray
    stds: np.ndarray | None
    visits: np.ndarray
    n_nodes: int
    iterations: int
    root: Node = field(repr=False)


class TreeSearchPlanner:
    """The shared search core: select → expand one child → back up, ``budget`` times, then commit.

    Args:
        env: a :class:`~icml24.bayes_mcts.envs.PlanningEnv` (deterministic, with get/set state).
        value_model: ``model(state) -> (μ, σ)`` per action (see :mod:`icml24.bayes_mcts.value_models`).
        budget: T, search iterations per decision (official default 100).
        gamma: γ, discount (official code: 1).
        seed: seed of the planner's random number generator.
    """

    name = "tree_search"
    _root_visits = 0

    def __init__(self, *, env: Any, value_model: Callable[[Any], tuple[np.ndarray, np.ndarray]], budget: int,
                 gamma: float = 1.0, seed: int = 0) -> None:
        owner = type(self).__name__
        self.budget = v.integer(owner, "budget", budget, minimum=1)
        self.gamma = v.in_range(owner, "gamma", gamma, 0.0, 1.0, low_open=True)
        self.seed = v.integer(owner, "seed", seed, minimum=0)
        check_env(owner, env)
        if not callable(value_model):
            raise TypeError(f"{owner}: value_model must be callable state -> (means, stds), got "
                            f"{type(value_model).__name__}")
        self.env, self.value_model = env, value_model
        self.n_actions = len(env.actions)
        self.rng = np.random.default_rng(self.seed)

    # ------------------------------------------------------------------------------------------- core
    def _make_node(self, state: Any, parent: Node | None, action: int | None, reward: float,
                   terminal: bool) -> Node:
        node = Node(state, parent, action, reward, terminal)
        # NOTE(deviation): the network is queried once per node, at expansion (the official planners query it
        # again for the Q priors when the node is first selected from; same numbers).
        if not terminal:
            mu, sd = check_value_output(type(self).__name__, self.value_model(state), self.n_actions, state)
            node.mu, node.sd = mu, np.maximum(sd, STD_FLOOR)
            a = int(np.argmax(mu))
            node.vprior = (float(mu[a]), float(node.sd[a]))
        return node

    def _expand(self, node: Node, a: int) -> Node:
        self.env.set_state(node.state)
        r, term = self.env.step(self.env.actions[a])
        child = self._make_node(self.env.get_state(), node, a, float(r), bool(term))
        node.children[a] = child
        return child

    def plan(self, *, state: Any = None) -> SearchResult:
        """Search from ``state`` (default: the env's current state) and commit to one root action.

        The env is restored to the root state afterwards, so the caller steps the real env with the action.
        """
        root_state = self.env.get_state() if state is None else state
        self.env.set_state(root_state)
        if self.env.is_terminal():
            raise ValueError(f"{type(self).__name__}: cannot plan from a terminal state {root_state!r}")
        root = self._make_node(root_state, None, None, 0.0, False)
        root.n = self._root_visits
        self._begin_search()
        for _ in range(self.budget):
            self._begin_iteration(root)
            node, new = root, False
            while not node.terminal:
                if not node.selected:
                    self._init_node(node)
                a = self._select(node)
                child = node.children.get(a)
                if child is None:
                    node, new = self._expand(node, a), True
                    break
                node = child
            self._backup(node, new)
        self.env.set_state(root_state)
        values, stds = self._root_values(root)
        visits = np.array([root.children[a].n if a in root.children else 0 for a in range(self.n_actions)])
        return SearchResult(action=self.env.actions[int(np.argmax(values))], values=values, stds=stds,
                            visits=visits, n_nodes=sum(1 for _ in root.iter_tree()), iterations=self.budget,
                            root=root)

    def act(self) -> int:
        """``plan().action`` from the env's current state."""
        return self.plan().action

    # ------------------------------------------------------------------------------------------- hooks
    def _begin_search(self) -> None:
        pass

    def _begin_iteration(self, root: Node) -> None:
        pass

    def _init_node(self, node: Node) -> None:
        raise NotImplementedError

    def _select(self, node: Node) -> int:
        raise NotImplementedError

    def _backup(self, leaf: Node, new: bool) -> None:
        raise NotImplementedError

    def _root_values(self, root: Node) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError


class _BayesianTreeSearch(TreeSearchPlanner):
    """Gaussian mean/max posteriors per edge and the max-distribution backup (official ``BUCTNode`` + ``BTS``)."""

    _root_visits = 1  # official bts.py: root.num_visits = 1 before the first iteration

    def __init__(self, *, n_bins: int = 50, grid: Literal["adaptive", "official"] = "adaptive",
                 **kwargs: Any) -> None:
        _check_grid(type(self).__name__, n_bins, grid)
        self.n_bins, self.grid = int(n_bins), grid
        super().__init__(**kwargs)

    def _init_node(self, node: Node) -> None:
        node.post_m, node.post_s = node.mu.copy(), node.sd.copy()
        node.pmax_m, node.pmax_s = node.mu.copy(), node.sd.copy()
        node.selected = True

    def _backup(self, leaf: Node, new: bool) -> None:
        node, g = leaf, self.gamma
        while node.parent is not None:
            if new:  # only a newly expanded leaf brings information; a re-selected terminal only counts visits
                if not node.selected:
                    vm, vs = node.vprior
                    xm, xs = vm, vs
                else:
                    ex = int(np.argmax(node.post_m))  # median = mean for Gaussians
                    vm, vs = float(node.post_m[ex]), float(node.post_s[ex])
                    xm, xs = _max1d(node.pmax_m, node.pmax_s, self.n_bins, self.grid)
                p, a = node.parent, node.action
                p.post_m[a], p.post_s[a] = node.reward + g * vm, g * vs
                p.pmax_m[a], p.pmax_s[a] = node.reward + g * xm, g * xs
            node.n += 1
            node = node.parent
        node.n += 1

    def _root_values(self, root: Node) -> tuple[np.ndarray, np.ndarray | None]:
        if not root.selected:
            self._init_node(root)
        return root.post_m.copy(), root.post_s.copy()


class TSTS(_BayesianTreeSearch):
    """Thompson-sampling tree search.

    Args:
        variant: ``"per_level"`` (official: at each node sample ``x_a ~ Q_max(s, a)`` independently and take the
            argmax) or ``"frontier"`` (exact under the independent-Gaussian model: one joint sample of every
            frontier leaf value, maxima propagated up, the argmax path followed).
        deterministic: re-seed the sampler with ``seed`` at every decision (official ``TSTS_det``).
        exploration: scale on the posterior std when sampling (1 = official; a knob tuned on validation tasks).
        **kwargs: :class:`TreeSearchPlanner` arguments (env, value_model, budget, gamma, seed) and the max
            posterior's grid: ``n_bins`` (uniform points, official 50) and ``grid`` (``"adaptive"``, default, or
            ``"official"``; see :func:`~icml24.bayes_mcts.distributions.max_of_gaussians`).
    """

    name = "tsts"

    def __init__(self, *, variant: Literal["per_level", "frontier"] = "per_level", deterministic: bool = False,
                 exploration: float = 1.0, **kwargs: Any) -> None:
        # NOTE(deviation): ``exploration`` (std scale, 1 = official) and ``variant="frontier"`` are additions.
        self.variant = v.one_of("TSTS", "variant", variant, ("per_level", "frontier"))
        self.exploration = v.non_negative("TSTS", "exploration", exploration)
        self.deterministic = bool(deterministic)
        super().__init__(**kwargs)
        self._best: dict[int, int] = {}

    def _begin_search(self) -> None:
        if self.deterministic:
            self.rng = np.random.default_rng(self.seed)

    def _select(self, node: Node) -> int:
        if self.variant == "frontier":
            return self._best[id(node)]
        x = self.rng.normal(node.pmax_m, self.exploration * node.pmax_s)
        return int(np.argmax(x))

    def _begin_iteration(self, root: Node) -> None:
        if self.variant != "frontier":
            return
        self._best = {}
        self._sample(root)

    def _sample(self, node: Node) -> float:
        """One joint Thompson sample of the frontier below ``node``; records the argmax action per node."""
        if node.terminal:
            return 0.0
        x = self.rng.normal(node.mu, self.exploration * node.sd)
        for a, c in node.children.items():
            x[a] = c.reward + self.gamma * self._sample(c)
        a = int(np.argmax(x))
        self._best[id(node)] = a
        return float(x[a])


class BTS(_BayesianTreeSearch):
    """Bayes-UCB tree search: the p_n-quantile of the max posterior, p_n growing with the node's visits.

    Args:
        percentile_init: p at the first visit (official 0.5: greedy on the mean).
        percentile_scale: visits per e-fold of ``1 − p`` (official 3; a knob tuned on validation tasks).
        max_visits: cap on n in the schedule (official 150).
        **kwargs: :class:`TreeSearchPlanner` arguments, ``n_bins`` and ``grid`` (as :class:`TSTS`).
    """

    name = "bts"

    def __init__(self, *, percentile_init: float = 0.5, percentile_scale: float = 3.0, max_visits: int = 150,
                 **kwargs: Any) -> None:
        self.percentile_init = v.in_range("BTS", "percentile_init", percentile_init, 0.0, 1.0, high_open=True)
        self.percentile_scale = v.positive("BTS", "percentile_scale", percentile_scale)
        self.max_visits = v.integer("BTS", "max_visits", max_visits, minimum=1)
        super().__init__(**kwargs)

    def percentile(self, n: int) -> float:
        return bts_percentile(n, init=self.percentile_init, scale=self.percentile_scale, max_visits=self.max_visits)

    def _select(self, node: Node) -> int:
        z = gaussian_quantile(self.percentile(node.n))
        return int(np.argmax(node.pmax_m + z * node.pmax_s))


class NMCTS(TreeSearchPlanner):
    """AlphaZero-style PUCT search with a Q-network prior and max-backup (official ``planners/nmcts.py``).

    Args:
        c_puct: c, the exploration constant (official 1.414; tuned on validation tasks).
        temperature: τ of the prior policy ``softmax(μ/τ)`` (official 2).
        **kwargs: :class:`TreeSearchPlanner` arguments.
    """

    name = "nmcts"

    def __init__(self, *, c_puct: float = 1.414, temperature: float = 2.0, **kwargs: Any) -> None:
        self.c_puct = v.non_negative("NMCTS", "c_puct", c_puct)
        self.temperature = v.positive("NMCTS", "temperature", temperature)
        super().__init__(**kwargs)

    def _init_node(self, node: Node) -> None:
        node.q = node.mu.copy()
        z = node.mu / self.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        node.prior = p
        node.beff = math.exp(-float(np.sum(p * np.log(np.maximum(p, 1e-300)))))  # effective branching factor
        node.na = np.zeros(self.n_actions)
        node.selected = True

    def _select(self, node: Node) -> int:
        u = self.c_puct * node.beff * node.prior * math.sqrt(1e-3 + node.n) / (1.0 + node.na)
        return int(np.argmax(node.q + u))

    def _backup(self, leaf: Node, new: bool) -> None:
        if leaf.terminal:
            val = 0.0
        else:
            val = float(np.max(leaf.q)) if leaf.selected else float(np.max(leaf.mu))
        node = leaf
        while node.parent is not None:
            p, a = node.parent, node.action
            p.q[a] = node.reward + self.gamma * val  # max-backup: the target replaces Q̂ (official nmcts.py)
            p.na[a] += 1
            node.n += 1
            val = float(np.max(p.q))
            node = p
        node.n += 1

    def _root_values(self, root: Node) -> tuple[np.ndarray, np.ndarray | None]:
        if not root.selected:
            self._init_node(root)
        return root.q.copy(), None


class GreedyPlanner(TreeSearchPlanner):
    """No search: ``argmax_a μ(s, a)`` of the network (the regime check: the network alone is not enough)."""

    name = "greedy"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("budget", 1)
        super().__init__(**kwargs)

    def plan(self, *, state: Any = None) -> SearchResult:
        root_state = self.env.get_state() if state is None else state
        root = self._make_node(root_state, None, None, 0.0, False)
        return SearchResult(action=self.env.actions[int(np.argmax(root.mu))], values=root.mu.copy(),
                            stds=root.sd.copy(), visits=np.zeros(self.n_actions, int), n_nodes=1, iterations=0,
                            root=root)


PLANNERS: dict[str, type[TreeSearchPlanner]] = {"tsts": TSTS, "bts": BTS, "nmcts": NMCTS, "greedy": GreedyPlanner}


def make_planner(name: str, **kwargs: Any) -> TreeSearchPlanner:
    """A planner by name (``tsts``, ``bts``, ``nmcts``, ``greedy``) with its keyword arguments."""
    v.one_of("make_planner", "name", name, tuple(PLANNERS))
    return PLANNERS[name](**kwargs)


@dataclass
class EpisodeResult:
    """A closed-loop episode: plan, commit one action, step the real env, re-plan from scratch."""

    success: bool
    ret: float
    steps: int
    trajectory: list[Any]


def run_episode(*, env: Any, planner: TreeSearchPlanner, max_steps: int,
                success_fn: Callable[[Any], bool] | None = None) -> EpisodeResult:
    """Run ``planner`` closed-loop in ``env`` (which it must wrap) for at most ``max_steps`` decisions.

    Success: ``success_fn(final_state)``, else ``env.is_success`` if it exists, else a terminal positive reward.
    """
    v.integer("run_episode", "max_steps", max_steps, minimum=1)
    if planner.env is not env:
        raise ValueError("run_episode: planner.env must be the env the episode runs in")
    ret, last_r, traj = 0.0, 0.0, [env.get_state()]
    steps = 0
    while steps < max_steps and not env.is_terminal():
        a = planner.plan().action
        last_r, _ = env.step(a)
        ret += last_r
        steps += 1
        traj.append(env.get_state())
    final = env.get_state()
    if success_fn is not None:
        ok = bool(success_fn(final))
    elif hasattr(env, "is_success"):
        ok = bool(env.is_success(final))
    else:
        ok = bool(env.is_terminal() and last_r > 0)
    return EpisodeResult(success=ok, ret=ret, steps=steps, trajectory=traj)
