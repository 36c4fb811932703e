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

__all__ = ["TreeNode", "TrajectoryAggregationTree", "aggregate_plan", "medoid_index", "forward_state",
           "reverse_state"]

_OWNER = "TrajectoryAggregationTree"
_SEQUENTIAL_GROUP = 8  # groups up to this size are merged trajectory by trajectory, larger ones all at once
_CHUNK = 32            # ... in chunks of at most this many trajectories (fewer fixed-point passes, smaller arrays)
_MIN_CAPACITY = 64     # node arrays never shrink below this
_MIN_STEPS = 4096      # merge steps kept (pruned nodes' included) before a compaction drops the pruned ones


class TreeNode:
    """A view of one node of a :class:`TrajectoryAggregationTree` (the tree keeps its nodes in arrays): the
    weighted mean of its merged states, the summed weight (its "value"), the merge count, the children.

    A view is valid until the tree next compacts its storage (:meth:`TrajectoryAggregationTree.compact`, also run
    by :meth:`~TrajectoryAggregationTree.integrate` when the arrays are full); a stale view raises
    ``RuntimeError`` instead of reading another node.
    """

    __slots__ = ("_tree", "_idx", "_gen")

    def __init__(self, tree: TrajectoryAggregationTree, index: int) -> None:
        self._tree, self._idx, self._gen = tree, int(index), tree._gen

    @property
    def _i(self) -> int:
        if self._gen != self._tree._gen:
            raise RuntimeError("TreeNode: the tree compacted its storage since this view was taken; take a new one "
                               "from tree.root")
        return self._idx

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TreeNode) and other._tree is self._tree and other._gen == self._gen
                and other._idx == self._idx)

    def __hash__(self) -> int:
        return hash((id(self._tree), self._gen, self._idx))

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
        i = self._i
        return [int(t._step0[i])] + t._merged_steps().get(i, [])

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
        cap = _MIN_CAPACITY
        self._wsum = np.zeros(cap)                       # Σ w per node
        self._wstate = np.zeros((cap, self.state_dim))   # Σ w s per node
        self._count = np.zeros(cap, dtype=np.int64)
        self._parent = np.full(cap, -1, dtype=np.int64)
        self._step0 = np.zeros(cap, dtype=np.int64)      # index of the node's first state in its trajectory
        # children: the first one in an array (a chain node has only that one), any later ones in a dict
        self._first = np.full(cap, -1, dtype=np.int64)
        self._more: dict[int, list[int]] = {}
        # merge steps: logged during one integrate call (nodes merged into, in order; the state index), folded
        # into per-node lists at its end; the lists of pruned nodes are dropped by compact()
        self._merge_log: list[tuple[Any, int]] = []
        self._steps: dict[int, list[int]] = {}
        self._n_steps = 0
        self._steps_limit = _MIN_STEPS
        self._gen = 0                                         # storage generation (bumped by compact())
        self._auto_compact = True                             # off only to measure the cost of keeping garbage
        self._wsum[0], self._wstate[0], self._count[0] = 1.0, root * 1.0, 1
        self._n, self._root = 1, 0

    # ------------------------------------------------------------------ storage
    _ARRAYS = ("_wsum", "_wstate", "_count", "_parent", "_step0", "_first")

    def _resize(self, cap: int) -> None:
        for name in self._ARRAYS:
            old = getattr(self, name)
            new = np.zeros((cap,) + old.shape[1:], dtype=old.dtype)
            new[:self._n] = old[:self._n]
            setattr(self, name, new)

    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` more nodes: the unreachable (pruned) nodes are dropped first when the arrays are full
        or the merge steps kept have doubled, so storage follows the live tree, not the episode length."""
        need = self._n + extra
        if self._auto_compact and (need > len(self._wsum) or self._n_steps > self._steps_limit):
            self.compact(reserve=extra)
            need = self._n + extra
        if need > len(self._wsum):
            self._resize(max(need, 2 * len(self._wsum)))

    def _merged_steps(self) -> dict[int, list[int]]:
        """``{node: [index of each state merged into it, in order]}``: the merge log folded into per-node lists."""
        if self._merge_log:
            out, n = self._steps, 0
            for nodes, step in self._merge_log:
                cs = nodes.tolist() if isinstance(nodes, np.ndarray) else nodes
                n += len(cs)
                for c in cs:
                    out.setdefault(c, []).append(step)
            self._merge_log.clear()
            self._n_steps += n
        return self._steps

    def _live(self) -> np.ndarray:
        """Ids of the nodes reachable from the root, increasing (a child's id is always above its parent's)."""
        n, r = self._n, self._root
        if r == 0:
            return np.arange(n)
        alive = np.zeros(n, dtype=bool)
        alive[r] = True
        par = self._parent[:n]
        cand = np.arange(r + 1, n)
        cand = cand[par[cand] >= r]
        while cand.size:  # one pass per depth: a node is alive iff its parent is
            hit = alive[par[cand]]
            if not hit.any():
                break
            alive[cand[hit]] = True
            cand = cand[~hit]
        return np.flatnonzero(alive)

    def compact(self, *, reserve: int = 0) -> None:
        """Free the pruned (unreachable) nodes and their merge-log entries: keep only the tree below the root, in
        the same order (children, states, values, counts and steps unchanged), in arrays sized to it (plus room for
        ``reserve`` more nodes). :meth:`integrate` calls it when its arrays are full or the merge log is long, so a
        closed-loop episode (integrate, act, prune, ...) runs in memory bounded by the live tree; call it directly
        to free memory at once. When it frees nodes, the :class:`TreeNode` views taken before become invalid."""
        steps = self._merged_steps()
        live = self._live()
        m = len(live)
        cut = m < self._n
        if cut:  # the arrays are cut to the live rows
            remap = np.full(self._n, -1, dtype=np.int64)
            remap[live] = np.arange(m)
            for name in self._ARRAYS:
                setattr(self, name, getattr(self, name)[live])
            self._parent = np.where(self._parent >= 0, remap[self._parent], -1)
            self._parent[0] = -1
            self._first = np.where(self._first >= 0, remap[self._first], -1)
            rl = remap.tolist()
            self._more = {rl[p]: [rl[c] for c in cs] for p, cs in self._more.items() if p < self._n and rl[p] >= 0}
            self._steps = {rl[c]: st for c, st in steps.items() if c < self._n and rl[c] >= 0}
            self._n, self._root = m, 0
            self._gen += 1
        cap = max(_MIN_CAPACITY, 2 * (m + reserve))   # room to grow before the next compaction
        if cut or len(self._wsum) < m + reserve or len(self._wsum) > 2 * cap:
            self._resize(cap)
        self._n_steps = sum(len(st) for st in self._steps.values())
        self._steps_limit = max(_MIN_STEPS, 2 * self._n_steps)

    def storage(self) -> dict[str, int]:
        """Memory bookkeeping: ``live`` (nodes below the root), ``allocated`` (node ids in use, pruned ones
        included), ``capacity`` (rows of the node arrays), ``merge_log`` (log entries not yet folded: 0 between
        calls) and ``steps_kept`` (per-node merge steps held, pruned nodes' included until the next compaction)."""
        self._merged_steps()
        return {"live": self.n_nodes(), "allocated": self._n, "capacity": len(self._wsum),
                "merge_log": len(self._merge_log), "steps_kept": self._n_steps}

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
                                self._merge_log.append(([c], i))
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
        self._merged_steps()  # fold this call's merge log (bounded by one batch)

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
        # the dropped nodes stay in the arrays (unreachable) until the next compaction (see compact())

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


def _shift_actions(name: str, trajectories: Any, action_dim: int, pad: Any, *, forward: bool) -> Any:
    """Shared body of :func:`forward_state` / :func:`reverse_state` (numpy or torch in, the same out)."""
    A = v.integer(name, "action_dim", action_dim, minimum=0)
    is_torch = hasattr(trajectories, "detach")
    x = trajectories if is_torch else np.asarray(trajectories)
    if x.ndim != 3:
        raise ValueError(f"{name}: trajectories must have shape [B, L, D], got {tuple(x.shape)}")
    B, L, D = x.shape
    if A == 0:
        return x
    if A > D or L < 1:
        raise ValueError(f"{name}: action_dim {A} does not fit trajectories of shape {tuple(x.shape)}")
    acts, obs = x[:, :, :A], x[:, :, A:]
    if pad is None:
        pad = (acts[:, :1] * 0) if forward else acts[:, -1:]  # zeros / the current last action (official)
    if is_torch:
        import torch
        pad = torch.as_tensor(pad, dtype=x.dtype, device=x.device)
        pad = pad.reshape(-1, 1, A).expand(B, 1, A) if pad.numel() in (A, B * A) else pad
        cat = torch.cat
    else:
        pad = np.asarray(pad, dtype=np.result_type(x, np.asarray(pad)))
        pad = np.broadcast_to(pad.reshape(-1, 1, A), (B, 1, A)) if pad.size in (A, B * A) else pad
        cat = np.concatenate
    if tuple(pad.shape) != (B, 1, A):
        side = "first_action" if forward else "last_action"
        raise ValueError(f"{name}: {side} must have shape [{B}, 1, {A}], [{B}, {A}] or [{A}], got {tuple(pad.shape)}")
    acts = cat([pad, acts[:, :-1]], 1) if forward else cat([acts[:, 1:], pad], 1)
    return cat([acts, obs], -1)


def forward_state(trajectories: Any, *, action_dim: int, first_action: Any = None) -> Any:
    """Align a planner's ``(a_i, s_i)`` rows to the tree's ``(a_{i−1}, s_i)`` (the official ``forward_state``).

    Diffuser's plans put the action taken *at* s_i beside s_i; a tree node should hold the action that *led to* its
    state, so that the root child (index 1) carries ``(a_0, s_1)`` and acting returns a_0. The actions move one row
    down, the last one is dropped and row 0 gets ``first_action`` (zeros by default); the states stay.

    Args:
        trajectories: ``[B, L, A + S]`` plans, actions first (numpy or torch; the result has the same type).
        action_dim: A (0: returned unchanged).
        first_action: the action of row 0, ``[B, 1, A]``, ``[B, A]`` or ``[A]``; zeros by default.
    """
    return _shift_actions("forward_state", trajectories, action_dim, first_action, forward=True)


def reverse_state(trajectories: Any, *, action_dim: int, last_action: Any = None) -> Any:
    """The inverse alignment (the official ``reverse_state``): ``(a_{i−1}, s_i)`` rows back to ``(a_i, s_i)``, e.g.
    to turn a tree rollout into a planner-layout trajectory (a warm start). The actions move one row up, row 0's is
    dropped and the last row gets ``last_action`` (by default the current last action, repeated).

    ``reverse_state(forward_state(x, action_dim=A), action_dim=A, last_action=x[:, -1:, :A])`` equals ``x``.
    """
    return _shift_actions("reverse_state", trajectories, action_dim, last_action, forward=False)


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
