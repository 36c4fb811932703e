"""Trajectory Aggregation Tree (TAT): a training-free aggregation of a batch of sampled plans.

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

import math
from typing import Any, Literal

import numpy as np

from icml24.common import validate as v

__all__ = ["TreeNode", "TrajectoryAggregationTree", "aggregate_plan", "medoid_index"]

_OWNER = "TrajectoryAggregationTree"
_SEQUENTIAL_GROUP = 8  # groups up to this size are merged trajectory by trajectory, larger ones all at once
_CHUNK = 32            # ... in chunks of at most this many trajectories (fewer fixed-point passes, smaller arrays)


class TreeNode:
    """A view of one node of a :class:`TrajectoryAggregationTree` (the tree keeps its nodes in arrays): the
    weighted mean of its merged states, the summed weight (its "value"), the merge count, the children."""

    __slots__ = ("_tree", "_i")

    def __init__(self, tree: TrajectoryAggregationTree, index: int) -> None:
        self._tree, self._i = tree, int(index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeNode) and other._tree is self._tree and other._i == self._i

    def __hash__(self) -> int:
        return hash((id(self._tree), self._i))

    def __repr__(self) -> str:
        return f"TreeNode(id={self._i}, value={self.value:.4g}, count={self.count}, children={len(self.children)})"

    @property
    def state(self) -> np.ndarray:
        """Weighted mean of the merged states, Σ w s / Σ w."""
        t = self._tree
        return t._wstate[self._i] / t._wsum[self._i]

    @property
    def value(self) -> float:
        """Summed weight Σ w of the merged states (the selection criterion)."""
        return float(self._tree._wsum[self._i])

    @property
    def count(self) -> int:
        """Number of states merged into this node."""
        return int(self._tree._count[self._i])

    @property
    def steps(self) -> list[int]:
        """Index of each merged state inside its trajectory, in merge order."""
        t = self._tree
        return [int(t._step0[self._i])] + t._merged_steps().get(self._i, [])

    @property
    def children(self) -> list[TreeNode]:
        return [TreeNode(self._tree, c) for c in self._tree._kids(self._i)]

    @property
    def parent(self) -> TreeNode | None:
        t = self._tree
        return None if self._i == t._root else TreeNode(t, int(t._parent[self._i]))

    @property
    def index(self) -> int:
        """Position among the parent's children (0 for the root)."""
        t = self._tree
        return 0 if self._i == t._root else t._kids(int(t._parent[self._i])).index(self._i)

    def child_states(self) -> np.ndarray:
        """``[n_children, D]`` array of the children's states."""
        t = self._tree
        ch = t._kids(self._i)
        return t._wstate[ch] / t._wsum[ch, None]

    def depth(self) -> int:
        """Length of the longest chain below this node."""
        return self._tree._depth_below(self._i)


class TrajectoryAggregationTree:
    """TAT over any planner that returns a batch of state trajectories ``[B, L, D]``.

    The nodes live in arrays (summed weight Σ w, weighted state sum Σ w s, merge count, parent, children lists):
    an unmatched suffix of a trajectory is appended as one block, and only the prefix matching walks node by node.
    The result is exactly that of inserting the trajectories one by one into an object-per-node tree (the tests
    compare it with such a reference, ``tests/tat/_tree_reference.py``).

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
        cap = 64
        self._wsum = np.zeros(cap)                       # Σ w per node
        self._wstate = np.zeros((cap, self.state_dim))   # Σ w s per node
        self._count = np.zeros(cap, dtype=np.int64)
        self._parent = np.full(cap, -1, dtype=np.int64)
        self._step0 = np.zeros(cap, dtype=np.int64)      # index of the node's first state in its trajectory
        # children: the first one in an array (a chain node has only that one), any later ones in a dict
        self._first = np.full(cap, -1, dtype=np.int64)
        self._more: dict[int, list[int]] = {}
        self._merge_log: list[tuple[np.ndarray, int]] = []   # (nodes merged into, in order; the state index)
        self._steps_cache: tuple[int, dict[int, list[int]]] = (0, {})
        self._wsum[0], self._wstate[0], self._count[0] = 1.0, root * 1.0, 1
        self._n, self._root = 1, 0

    # ------------------------------------------------------------------ storage
    def _reserve(self, extra: int) -> None:
        need = self._n + extra
        cap = len(self._wsum)
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        for name in ("_wsum", "_wstate", "_count", "_parent", "_step0", "_first"):
            old = getattr(self, name)
            new = np.zeros((cap,) + old.shape[1:], dtype=old.dtype)
            new[:self._n] = old[:self._n]
            setattr(self, name, new)

    def _merged_steps(self) -> dict[int, list[int]]:
        """``{node: [index of each state merged into it, in order]}`` from the merge log (cached)."""
        if self._steps_cache[0] != len(self._merge_log):
            out: dict[int, list[int]] = {}
            for nodes, step in self._merge_log:
                for c in nodes.tolist():
                    out.setdefault(c, []).append(step)
            self._steps_cache = (len(self._merge_log), out)
        return self._steps_cache[1]

    def _kids(self, i: int) -> list[int]:
        """Ids of node ``i``'s children, in creation order."""
        f = int(self._first[i])
        return [] if f < 0 else [f] + self._more.get(i, [])

    def _add_child(self, parent: int, c: int) -> None:
        if self._first[parent] < 0:
            self._first[parent] = c
        else:
            self._more.setdefault(parent, []).append(c)

    def _depth_below(self, i: int) -> int:
        depth, level = 0, self._kids(i)
        while level:
            depth += 1
            level = [c for n in level for c in self._kids(n)]
        return depth

    @property
    def root(self) -> TreeNode:
        """The current root (the state the environment is in)."""
        return TreeNode(self, self._root)

    # ------------------------------------------------------------------ distances
    def _dist(self, s: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """Distance of state ``s`` to each row of ``cs``."""
        # the operations of np.linalg.norm, without its overhead (this runs once per merge step)
        if self.distance == "euclidean":
            diff = cs - s
            return np.sqrt(np.add.reduce(diff * diff, axis=1))
        den = np.sqrt(np.add.reduce(cs * cs, axis=1)) * math.sqrt(s.dot(s))
        cos = np.divide(cs @ s, den, out=np.zeros(len(cs)), where=den > 0)
        return 1.0 - cos

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

    def _dist_many(self, s: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """``[G, K]`` distances of each state ``s[g]`` to each row of ``cs[g]`` (``[G, D]``, ``[G, K, D]``)."""
        if self.distance == "euclidean":
            return np.linalg.norm(cs - s[:, None], axis=-1)
        den = np.linalg.norm(cs, axis=-1) * np.linalg.norm(s, axis=-1)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = np.einsum("gkd,gd->gk", cs, s) / den
        return 1.0 - np.where(den > 0, cos, 0.0)

    def _append_chains(self, parent: int, first_wsum: Any, first_wstate: np.ndarray, first_count: Any,
                       w: np.ndarray, wx_rows: np.ndarray, i: int) -> np.ndarray:
        """Append, in order, one chain per row of ``wx_rows`` (``[E, L, D]``, the trajectories' ``w s``) for the
        indices ``i..L−1`` under ``parent``; a chain's first node may already hold merged states (``first_*``,
        ``[E]`` / ``[E, D]``). Returns the first nodes' ids."""
        E, m, n0 = len(wx_rows), len(w) - i, self._n
        ids = np.arange(n0, n0 + E * m).reshape(E, m)
        sl = slice(n0, n0 + E * m)
        ws = self._wsum[sl].reshape(E, m)
        ws[:, 0], ws[:, 1:] = first_wsum, w[i + 1:]
        wst = self._wstate[sl].reshape(E, m, self.state_dim)
        wst[:, 0], wst[:, 1:] = first_wstate, wx_rows[:, i + 1:]
        cnt = self._count[sl].reshape(E, m)
        cnt[:, 0], cnt[:, 1:] = first_count, 1
        self._step0[sl].reshape(E, m)[:] = np.arange(i, len(w))
        par = self._parent[sl].reshape(E, m)
        par[:, 0], par[:, 1:] = parent, ids[:, :-1]
        fst = self._first[sl].reshape(E, m)
        fst[:, :-1], fst[:, -1] = ids[:, 1:], -1
        for c in ids[:, 0].tolist():
            self._add_child(parent, c)
        self._n = n0 + E * m
        return ids[:, 0]

    def _resolve_group(self, ch: list[int], s: np.ndarray, w_i: float, wx: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequential merge rule for the G ≥ 2 trajectories at one node at one depth, computed for all at once.

        Candidate children: the node's ``C0`` existing children and one potential new child per member g (real for
        the later members iff g expands). ``a[g]`` is member g's target: ``k < C0`` (merge into existing child k)
        or ``C0 + e`` (merge into member e's new child; ``a[g] = C0 + g``: g expands). Given a guess of ``a``, each
        member's view of every child (weighted sums accumulated in batch order by ``cumsum``, i.e. the sequential
        additions) gives its distances and a new ``a``. The rule's assignment is the unique fixed point (member g's
        view depends only on the members before it), and each pass fixes at least one more member, so the loop
        ends after at most G + 1 passes (2–3 in practice).

        Returns ``a`` and the final ``Σ w s`` ``[K, D]`` and ``Σ w`` ``[K]`` of the columns (existing children,
        then the new children in batch order) with ``K = C0 + #expanding members``.
        """
        G, C0, D = len(s), len(ch), self.state_dim
        g_idx = np.arange(G)
        ws0, wsum0 = self._wstate[ch], self._wsum[ch]
        if C0:                                                         # first guess: existing children only
            d = self._dist_many(s, np.broadcast_to(ws0 / wsum0[:, None], (G, C0, D)))
            k = np.argmin(d, axis=1)
            a = np.where(d[g_idx, k] < self.merge_threshold, k, C0 + g_idx)
        else:
            a = C0 + g_idx
        while True:
            exp = np.flatnonzero(a == C0 + g_idx)                      # expanding members, in batch order
            K = C0 + len(exp)
            col = np.empty(C0 + G, dtype=np.int64)                    # target -> column
            col[:C0] = np.arange(C0)
            col[C0 + exp] = C0 + np.arange(len(exp))
            valid_target = np.ones(C0 + G, dtype=bool)
            valid_target[C0:] = False
            valid_target[C0 + exp] = True
            if not valid_target[a].all():                              # a merge into a branch that is not there
                a = np.where(valid_target[a], a, C0 + g_idx)
                continue
            z = np.zeros((G + 1, K, D))
            zw = np.zeros((G + 1, K))
            z[0, :C0], zw[0, :C0] = ws0, wsum0
            z[1 + g_idx, col[a]] = wx
            zw[1 + g_idx, col[a]] = w_i
            cz, czw = np.cumsum(z, axis=0), np.cumsum(zw, axis=0)
            valid = np.ones((G, K), dtype=bool)
            valid[:, C0:] = exp[None, :] < g_idx[:, None]             # e's branch exists for members after e
            with np.errstate(invalid="ignore", divide="ignore"):
                d = self._dist_many(s, cz[:-1] / czw[:-1, :, None])
            d = np.where(valid, d, np.inf)
            k = np.argmin(d, axis=1)
            target = np.where(k < C0, k, C0 + exp[np.maximum(k - C0, 0)] if len(exp) else k)
            new = np.where(d[g_idx, k] < self.merge_threshold, target, C0 + g_idx)
            if np.array_equal(new, a):
                return a, cz[-1], czw[-1]
            a = new

    def integrate(self, trajectories: Any) -> None:
        """Merge (prefix matching under the threshold) then expand every trajectory of the batch, in order.

        Computed depth by depth: at depth i only trajectories at the same node interact (a node's children are
        changed only by the trajectories that reach that node, in batch order), so each node's group is resolved
        at once (:meth:`_resolve_group`) and an unmatched suffix is appended as one block. The result equals
        inserting the trajectories one by one (the object-per-node reference in the tests).

        Args:
            trajectories: ``[B, L, D]`` (numpy or torch); index ``i`` of each is at depth ``i`` below the root.
        """
        x = self.check_trajectories(trajectories)
        B, L, _ = x.shape
        h = self.history_length
        if L <= h:  # nothing beyond the history (the official code raises NameError here)
            return
        w = np.array([self.weight(i) for i in range(L)])
        wx = x * w[None, :, None]                       # w_i s_i, as a node stores it
        self._reserve(B * (L - h))
        thr = self.merge_threshold
        # NOTE(deviation): the official code skips the expansion when only the last state is unmatched
        # (``if i < length - 1``); here every unmatched state becomes a node.
        active, cur = np.arange(B), np.full(B, self._root)
        for i in range(h, L):
            if active.size == 0:
                break
            nodes = cur[active]
            order = np.argsort(nodes, kind="stable")   # grouped by node, batch order inside a group
            srt = nodes[order]
            cuts = np.flatnonzero(np.diff(srt)) + 1
            keep = []
            for grp in np.split(active[order], cuts):
                node = int(cur[grp[0]])
                if len(grp) <= _SEQUENTIAL_GROUP:      # small group: the plain sequential steps are cheaper
                    for bb in grp.tolist():
                        ch = self._kids(node)
                        if ch:
                            d = self._dist(x[bb, i], self._wstate[ch] / self._wsum[ch, None])
                            k = int(np.argmin(d))
                            if d[k] < thr:
                                c = ch[k]
                                self._wsum[c] += w[i]
                                self._wstate[c] += wx[bb, i]
                                self._count[c] += 1
                                self._merge_log.append((np.array([c]), i))
                                cur[bb] = c
                                keep.append(bb)
                                continue
                        self._append_chains(node, w[i], wx[bb, i], 1, w, wx[bb:bb + 1], i)
                    continue
                for part in np.array_split(grp, -(-len(grp) // _CHUNK)):   # chunks in batch order
                    ch = self._kids(node)
                    C0 = len(ch)
                    a, fin, finw = self._resolve_group(ch, x[part, i], w[i], wx[part, i])
                    cnt = np.bincount(a, minlength=C0 + len(part))
                    for k in np.flatnonzero(cnt[:C0]):      # merges into existing children
                        c = ch[k]
                        self._wsum[c], self._wstate[c] = finw[k], fin[k]
                        self._count[c] += cnt[k]
                    g_idx = np.arange(len(part))
                    target_node = np.zeros(C0 + len(part), dtype=np.int64)
                    target_node[:C0] = ch
                    exp = np.flatnonzero(a == C0 + g_idx)    # new branches, in batch order
                    if exp.size:
                        target_node[C0 + exp] = self._append_chains(node, finw[C0:], fin[C0:], cnt[C0 + exp], w,
                                                                    wx[part[exp]], i)
                    merged = np.flatnonzero(a != C0 + g_idx)
                    if merged.size:
                        mn = target_node[a[merged]]
                        cur[part[merged]] = mn
                        self._merge_log.append((mn, i))
                        keep.extend(part[merged].tolist())
            active = np.array(sorted(keep), dtype=np.int64)

    def best_child(self) -> int:
        """Index of the root child with the largest summed weight (first one on ties)."""
        ch = self._kids(self._root)
        if not ch:
            raise RuntimeError(f"{_OWNER}: the root has no children; integrate trajectories first")
        return int(np.argmax(self._wsum[ch]))

    def act(self) -> np.ndarray:
        """The next state: the weighted mean state of the best root child."""
        c = self._kids(self._root)[self.best_child()]
        return self._wstate[c] / self._wsum[c]

    def prune(self, index: int | None = None) -> None:
        """Make root child ``index`` (default: the best one) the root and drop the rest."""
        ch = self._kids(self._root)
        k = self.best_child() if index is None else v.integer(_OWNER, "index", index, minimum=0,
                                                               maximum=len(ch) - 1)
        self._root = ch[k]
        # NOTE: the dropped nodes stay in the arrays (unreachable) until the tree is discarded

    def rollout(self, n: int, *, rng: np.random.Generator | None = None) -> np.ndarray:
        """Act and prune ``n`` times (open-loop plan), returning ``[n', D]`` states (``n' < n`` if the tree ends).

        Args:
            n: number of steps.
            rng: if given, the child is chosen uniformly at random instead of by weight (a negative control
                that ignores the aggregation).
        """
        v.integer(_OWNER, "n", n, minimum=0)
        out = []
        wsum, wstate = self._wsum, self._wstate
        for _ in range(n):
            ch = self._kids(self._root)
            if not ch:
                break
            k = int(np.argmax(wsum[ch])) if rng is None else int(rng.integers(len(ch)))
            c = ch[k]
            out.append(wstate[c] / wsum[c])
            self._root = c
        return np.array(out).reshape(len(out), self.state_dim)

    def n_nodes(self) -> int:
        """Number of nodes reachable from the root (the root included)."""
        if self._root == 0:  # never pruned: every node is below the root
            return self._n
        stack, n = [self._root], 0
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(self._kids(node))
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
    info = {}
    if return_tree:
        ch = tree._kids(tree._root)
        info = {"root_children": len(ch), "n_nodes": tree.n_nodes(),
                "root_max_count": int(tree._count[ch].max()) if ch else 0}
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
