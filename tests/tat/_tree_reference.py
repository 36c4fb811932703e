"""Slow reference for the tests: the first, object-per-node TAT implementation (commit 1af2976), kept verbatim
except for this line; ``icml24.tat.tree`` must reproduce its outputs exactly.

Trajectory Aggregation Tree (TAT): a training-free aggregation of a batch of sampled plans.

Feng, Gu, An, Pan, "Resisting Stochastic Risks in Diffusion Planners with the Trajectory Aggregation Tree",
ICML 2024, arXiv 2405.17879; official code langfengQ/tree-diffusion-planner (``diffusion/tree/tree.py``).

Every sampled trajectory τ = (s_0, …, s_{L−1}) is one branch. Walking down from the root, state s_i merges
into the closest child c of the current node if d(s_i, c) < 1 − α, where d is 1 − cos(s_i, c.state) on the
normalised states (official default) or the Euclidean distance; a merged node's state is the weighted mean
of its states, and each state carries the weight

    w_i = λ^(i−1)        (i = index of the state inside its freshly sampled trajectory).

At the first mismatch the rest of τ becomes a new branch. Acting takes the root child with the largest summed
weight; pruning makes it the new root, so the tree stays in sync with the environment and states kept from
older plans (sampled k steps ago) carry λ^k less weight than fresh ones at the same depth.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from icml24.common import validate as v

__all__ = ["TreeNode", "TrajectoryAggregationTree", "aggregate_plan", "medoid_index"]

_OWNER = "TrajectoryAggregationTree"


class TreeNode:
    """A node: weighted mean of its merged states, the summed weight (its "value"), children."""

    __slots__ = ("parent", "children", "_wsum", "_wstate", "count", "steps", "_child_states", "index")

    def __init__(self, state: np.ndarray, weight: float, step: int, parent: TreeNode | None = None) -> None:
        self.parent = parent
        self.children: list[TreeNode] = []
        self._wsum = float(weight)
        self._wstate = np.asarray(state, dtype=float) * float(weight)
        self.count = 1
        self.steps = [int(step)]
        self.index = 0  # position among the parent's children
        self._child_states = np.zeros((0, self._wstate.shape[0]))

    @property
    def state(self) -> np.ndarray:
        """Weighted mean of the merged states, Σ w s / Σ w."""
        return self._wstate / self._wsum

    @property
    def value(self) -> float:
        """Summed weight Σ w of the merged states (the selection criterion)."""
        return self._wsum

    def merge(self, state: np.ndarray, weight: float, step: int) -> None:
        self._wsum += float(weight)
        self._wstate = self._wstate + float(weight) * np.asarray(state, dtype=float)
        self.count += 1
        self.steps.append(int(step))
        if self.parent is not None:
            self.parent._child_states[self.index] = self.state

    def expand(self, state: np.ndarray, weight: float, step: int) -> TreeNode:
        child = TreeNode(state, weight, step, parent=self)
        child.index = len(self.children)
        self.children.append(child)
        n = len(self.children)
        if n > len(self._child_states):  # grow the cache geometrically
            grown = np.zeros((max(4, 2 * n), self._wstate.shape[0]))
            grown[:n - 1] = self._child_states[:n - 1]
            self._child_states = grown
        self._child_states[n - 1] = child.state
        return child

    def child_states(self) -> np.ndarray:
        """``[n_children, D]`` array of the children's states (kept in sync for a vectorised scan)."""
        return self._child_states[:len(self.children)]

    def depth(self) -> int:
        """Length of the longest chain below this node."""
        return 0 if not self.children else 1 + max(c.depth() for c in self.children)


class TrajectoryAggregationTree:
    """TAT over any planner that returns a batch of state trajectories ``[B, L, D]``.

    Example::

        tree = TrajectoryAggregationTree(state_dim=4, lambda_=0.98, merge_threshold=5e-4)
        tree.integrate(trajs)          # normalised states, index 0 = current (conditioned) state
        plan = tree.rollout(L - 1)     # greedy: act + prune, L - 1 times
    """

    def __init__(self, *, state_dim: int, lambda_: float = 0.98, merge_threshold: float = 5e-4,
                 distance: Literal["cosine", "euclidean"] = "cosine", history_length: int = 1,
                 start_state: np.ndarray | None = None) -> None:
        """Args:
            state_dim: D, dimension of each state.
            lambda_: λ ∈ (0, 1], weight decay along the trajectory, w_i = λ^(i−1) (official 0.98).
            merge_threshold: 1 − α ≥ 0; a state merges into a child at distance < 1 − α (official maze2d 5e-4).
            distance: ``"cosine"`` (1 − cosine similarity, official) or ``"euclidean"``.
            history_length: leading states of each trajectory that are history (the conditioned current state)
                and are not integrated (official 1).
            start_state: the root's state (only for inspection; the root never acts). Zeros by default.
        """
        self.state_dim = v.integer(_OWNER, "state_dim", state_dim, minimum=1)
        self.lambda_ = v.in_range(_OWNER, "lambda_", lambda_, 0.0, 1.0, low_open=True)
        self.merge_threshold = v.non_negative(_OWNER, "merge_threshold", merge_threshold)
        self.distance = v.one_of(_OWNER, "distance", distance, ("cosine", "euclidean"))
        self.history_length = v.integer(_OWNER, "history_length", history_length, minimum=0)
        root = np.zeros(self.state_dim) if start_state is None else np.asarray(start_state, dtype=float)
        if root.shape != (self.state_dim,):
            raise ValueError(f"{_OWNER}: start_state must have shape ({self.state_dim},), got {root.shape}")
        self.root = TreeNode(root, 1.0, 0)

    # ------------------------------------------------------------------ distances
    def _dist(self, s: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """Distance of state ``s`` to each row of ``cs``."""
        if self.distance == "euclidean":
            return np.linalg.norm(cs - s, axis=1)
        den = np.linalg.norm(cs, axis=1) * np.linalg.norm(s)
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = (cs @ s) / den
        return 1.0 - np.where(den > 0, cos, 0.0)

    def weight(self, i: int) -> float:
        """w_i = λ^(i−1)."""
        return float(self.lambda_ ** (i - 1))

    # ------------------------------------------------------------------ operations
    def check_trajectories(self, trajectories: Any) -> np.ndarray:
        """``trajectories`` as a float array ``[B, L, D]`` (a single ``[L, D]`` is accepted); raises on a wrong
        state dimension or a non-finite value."""
        if hasattr(trajectories, "detach"):
            trajectories = trajectories.detach().cpu().numpy()
        x = np.asarray(trajectories, dtype=float)
        if x.ndim == 2:
            x = x[None]
        if x.ndim != 3:
            raise ValueError(f"{_OWNER}: trajectories must have shape [B, L, D], got {x.shape}")
        if x.shape[-1] != self.state_dim:
            raise ValueError(f"{_OWNER}: trajectories have state dimension {x.shape[-1]}, the tree's state_dim is "
                             f"{self.state_dim}")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{_OWNER}: trajectories contain non-finite values")
        return x

    def integrate(self, trajectories: Any) -> None:
        """Merge (prefix matching under the threshold) then expand every trajectory of the batch, in order.

        Args:
            trajectories: ``[B, L, D]`` (numpy or torch); index ``i`` of each is at depth ``i`` below the root.
        """
        x = self.check_trajectories(trajectories)
        L, h = x.shape[1], self.history_length
        if L <= h:  # nothing beyond the history (the official code raises NameError here)
            return
        for traj in x:
            node, i = self.root, h
            while i < L and node.children:
                d = self._dist(traj[i], node.child_states())
                k = int(np.argmin(d))
                if not d[k] < self.merge_threshold:
                    break
                child = node.children[k]
                child.merge(traj[i], self.weight(i), i)
                node, i = child, i + 1
            # NOTE(deviation): the official code skips the expansion when only the last state is unmatched
            # (``if i < length - 1``); here every unmatched state becomes a node.
            for j in range(i, L):
                node = node.expand(traj[j], self.weight(j), j)

    def best_child(self) -> int:
        """Index of the root child with the largest summed weight (first one on ties)."""
        if not self.root.children:
            raise RuntimeError(f"{_OWNER}: the root has no children; integrate trajectories first")
        return int(np.argmax([c.value for c in self.root.children]))

    def act(self) -> np.ndarray:
        """The next state: the weighted mean state of the best root child."""
        return self.root.children[self.best_child()].state

    def prune(self, index: int | None = None) -> None:
        """Make root child ``index`` (default: the best one) the root and drop the rest."""
        k = self.best_child() if index is None else v.integer(_OWNER, "index", index, minimum=0,
                                                               maximum=len(self.root.children) - 1)
        self.root = self.root.children[k]
        self.root.parent = None
        self.root.index = 0

    def rollout(self, n: int, *, rng: np.random.Generator | None = None) -> np.ndarray:
        """Act and prune ``n`` times (open-loop plan), returning ``[n', D]`` states (``n' < n`` if the tree ends).

        Args:
            n: number of steps.
            rng: if given, the child is chosen uniformly at random instead of by weight (a negative control
                that ignores the aggregation).
        """
        v.integer(_OWNER, "n", n, minimum=0)
        out = []
        for _ in range(n):
            if not self.root.children:
                break
            k = self.best_child() if rng is None else int(rng.integers(len(self.root.children)))
            out.append(self.root.children[k].state)
            self.prune(k)
        return np.array(out).reshape(len(out), self.state_dim)

    def n_nodes(self) -> int:
        stack, n = [self.root], 0
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.children)
        return n


def aggregate_plan(trajectories: Any, *, lambda_: float = 0.98, merge_threshold: float = 5e-4,
                   distance: Literal["cosine", "euclidean"] = "cosine", history_length: int = 1,
                   rng: np.random.Generator | None = None, return_tree: bool = False
                   ) -> np.ndarray | tuple[np.ndarray, dict[str, int]]:
    """TAT plan from one batch of sampled trajectories (Maze2D protocol of the official ``TATPolicy``): build a
    tree, integrate the batch, roll it out for ``L − 1`` steps; returns ``[L, D]`` = [τ_0[0], tree states...]
    (padded with the last state if the tree ends early). With ``return_tree`` also ``{"root_children",
    "n_nodes", "root_max_count"}`` (the most trajectories merged into one depth-1 node) before the rollout."""
    x = np.asarray(trajectories.detach().cpu().numpy() if hasattr(trajectories, "detach") else trajectories,
                   dtype=float)
    if x.ndim != 3:
        raise ValueError(f"aggregate_plan: trajectories must have shape [B, L, D], got {x.shape}")
    tree = TrajectoryAggregationTree(state_dim=x.shape[-1], lambda_=lambda_, merge_threshold=merge_threshold,
                                     distance=distance, history_length=history_length)
    tree.integrate(x)
    info = {"root_children": len(tree.root.children), "n_nodes": tree.n_nodes(),
            "root_max_count": max((c.count for c in tree.root.children), default=0)} if return_tree else {}
    L = x.shape[1]
    steps = tree.rollout(L - 1, rng=rng)
    plan = np.concatenate([x[0, :1], steps], axis=0)
    if len(plan) < L:
        plan = np.concatenate([plan, np.repeat(plan[-1:], L - len(plan), axis=0)], axis=0)
    return (plan, info) if return_tree else plan


def medoid_index(trajectories: Any) -> int:
    """Index of the medoid trajectory: the sample with the smallest summed Euclidean distance (over flattened
    trajectories) to all the others: the equal-sample baseline that uses the batch without a tree."""
    x = np.asarray(trajectories, dtype=float)
    if x.ndim != 3:
        raise ValueError(f"medoid_index: trajectories must have shape [B, L, D], got {x.shape}")
    f = x.reshape(len(x), -1)
    sq = (f * f).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * f @ f.T, 0.0)
    return int(np.argmin(np.sqrt(d2).sum(1)))
