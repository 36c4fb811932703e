"""The array-backed, depth-by-depth tree against the first object-per-node implementation
(``_tree_reference.py``): same tree (order of children, states, values, counts, steps), same plans, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from icml24.tat import tree as fast
from tests.tat import _tree_reference as ref


def _assert_same_tree(t_new: fast.TrajectoryAggregationTree, t_ref: ref.TrajectoryAggregationTree) -> None:
    stack = [(t_new.root, t_ref.root)]
    n = 0
    while stack:
        a, b = stack.pop()
        n += 1
        np.testing.assert_array_equal(a.state, b.state)
        assert a.value == b.value and a.count == b.count and a.steps == b.steps
        assert len(a.children) == len(b.children)
        stack.extend(zip(a.children, b.children, strict=False))
    assert n == t_new.n_nodes() == t_ref.n_nodes()


def _batch(rng: np.random.Generator, kind: str, B: int, L: int, D: int, spread: float) -> np.ndarray:
    if kind == "noise":
        return rng.uniform(-1, 1, (B, L, D))
    # a few modes (paths) + noise of the order of the merge threshold: merges, splits and late branching
    modes = np.cumsum(rng.normal(0, 0.3, (3, L, D)), axis=1) + rng.uniform(-1, 1, (3, 1, D))
    x = modes[rng.integers(0, 3, B)] + rng.normal(0, spread, (B, L, D)) * rng.uniform(0, 2, (B, 1, 1))
    x[:, 0] = x[0, 0]
    if kind == "duplicates":
        x[B // 2:] = x[:B - B // 2]
    return x


CASES = [(kind, dist, seed) for kind in ("noise", "modes", "duplicates") for dist in ("cosine", "euclidean")
         for seed in range(4)]


@pytest.mark.parametrize("kind, dist, seed", CASES)
def test_random_batches_match_reference(kind, dist, seed):
    rng = np.random.default_rng(100 * seed + len(kind))
    B, L, D = int(rng.integers(2, 70)), int(rng.integers(2, 30)), int(rng.integers(1, 6))
    thr = {"cosine": 10 ** rng.uniform(-4, -1.5), "euclidean": 10 ** rng.uniform(-2, -0.5)}[dist]
    kw = dict(lambda_=float(rng.uniform(0.5, 1.0)), merge_threshold=thr, distance=dist,
              history_length=int(rng.integers(0, 3)))
    x = _batch(rng, kind, B, L, D, spread=thr if dist == "euclidean" else np.sqrt(thr))
    t_new = fast.TrajectoryAggregationTree(state_dim=D, **kw)
    t_ref = ref.TrajectoryAggregationTree(state_dim=D, **kw)
    t_new.integrate(x)
    t_ref.integrate(x)
    _assert_same_tree(t_new, t_ref)
    if kind != "noise":  # the regime must contain merges and branches for the comparison to mean something
        assert any(c.count > 1 for c in t_ref.root.children) or t_ref.n_nodes() < B * (L - kw["history_length"])
    p_new, i_new = fast.aggregate_plan(x, return_tree=True, **kw)
    p_ref, i_ref = ref.aggregate_plan(x, return_tree=True, **kw)
    np.testing.assert_array_equal(p_new, p_ref)
    assert i_new == i_ref
    r_new = fast.aggregate_plan(x, rng=np.random.default_rng(seed), **kw)
    r_ref = ref.aggregate_plan(x, rng=np.random.default_rng(seed), **kw)
    np.testing.assert_array_equal(r_new, r_ref)


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("dist, thr", [("cosine", 5e-4), ("euclidean", 0.05)])
def test_replanning_and_pruning_match_reference(dist, thr, compact):
    """Closed-loop use: integrate, act + prune (best or a given child), integrate the next batch, ...; with
    ``compact`` the pruned nodes are freed after every step (the ids change, the tree does not)."""
    rng = np.random.default_rng(7)
    L, D = 12, 3
    t_new = fast.TrajectoryAggregationTree(state_dim=D, lambda_=0.9, merge_threshold=thr, distance=dist)
    t_ref = ref.TrajectoryAggregationTree(state_dim=D, lambda_=0.9, merge_threshold=thr, distance=dist)
    for step in range(8):
        x = _batch(rng, "modes" if step % 3 else "duplicates", int(rng.integers(2, 40)), L, D, spread=0.004)
        t_new.integrate(x)
        t_ref.integrate(x)
        _assert_same_tree(t_new, t_ref)
        np.testing.assert_array_equal(t_new.act(), t_ref.act())
        assert t_new.best_child() == t_ref.best_child()
        k = None if step % 2 else int(rng.integers(len(t_ref.root.children)))
        t_new.prune(k)
        t_ref.prune(k)
        if compact:
            t_new.compact()
            assert t_new.storage()["allocated"] == t_new.n_nodes()
        _assert_same_tree(t_new, t_ref)
    np.testing.assert_array_equal(t_new.rollout(20), t_ref.rollout(20))


def _umaze_batch(order_seed: int) -> np.ndarray:
    from tests.tat.test_tree import _path
    L = 40
    feas = _path([(1, 1), (1, 3), (3, 3), (3, 1)], L)
    wall = _path([(1, 1), (3, 1)], L)
    lo, hi = np.array([0.5, 0.5, -0.3, -0.3]), np.array([3.5, 3.5, 0.3, 0.3])
    rng = np.random.default_rng(0)
    batch = np.concatenate([feas[None] + rng.normal(0, 0.01, (100, L, 4)),
                            wall[None] + rng.normal(0, 0.01, (28, L, 4))])
    batch[:, 0] = feas[0]
    return (2 * (batch - lo) / (hi - lo) - 1)[np.random.default_rng(order_seed).permutation(128)]


@pytest.mark.parametrize("order_seed", [0, 1])
def test_issue_cases_match_reference(order_seed):
    """The issue's cases: 100 feasible + 28 through-wall copies (shuffled), identical and orthogonal
    trajectories."""
    x = _umaze_batch(order_seed)
    for kw in ({"merge_threshold": 5e-4}, {"distance": "euclidean", "merge_threshold": 0.1}):
        p_new, i_new = fast.aggregate_plan(x, return_tree=True, **kw)
        p_ref, i_ref = ref.aggregate_plan(x, return_tree=True, **kw)
        np.testing.assert_array_equal(p_new, p_ref)
        assert i_new == i_ref
        t_new = fast.TrajectoryAggregationTree(state_dim=4, **kw)
        t_ref = ref.TrajectoryAggregationTree(state_dim=4, **kw)
        t_new.integrate(x)
        t_ref.integrate(x)
        _assert_same_tree(t_new, t_ref)
    same = np.repeat((np.linspace(0.1, 1.0, 18).reshape(6, 3) + 0.5)[None], 5, axis=0)
    a = np.zeros((5, 2))
    a[:, 0] = 1.0
    b = np.zeros((5, 2))
    b[:, 1] = 1.0
    for x, D, thr in ((same, 3, 1e-6), (np.stack([a, b, a]), 2, 0.1), (np.zeros((4, 5, 2)), 2, 5e-4)):
        t_new = fast.TrajectoryAggregationTree(state_dim=D, lambda_=0.9, merge_threshold=thr)
        t_ref = ref.TrajectoryAggregationTree(state_dim=D, lambda_=0.9, merge_threshold=thr)
        t_new.integrate(x)
        t_ref.integrate(x)
        _assert_same_tree(t_new, t_ref)
