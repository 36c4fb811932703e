"""TAT without a diffusion model: synthetic batches with known structure (notes §5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.tat.maze import Maze, plan_infeasible
from icml24.tat.tree import TrajectoryAggregationTree, aggregate_plan, medoid_index


def _path(points: list[tuple[float, float]], n: int) -> np.ndarray:
    """Piecewise-linear (x, y) path through ``points`` resampled to ``n`` states, velocity appended."""
    pts = np.array(points, float)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    s = np.concatenate([[0], np.cumsum(seg)])
    u = np.linspace(0, s[-1], n)
    xy = np.stack([np.interp(u, s, pts[:, 0]), np.interp(u, s, pts[:, 1])], 1)
    vel = np.gradient(xy, axis=0)
    return np.concatenate([xy, vel], 1)


def test_feasible_majority_beats_through_wall_paths():
    """100 noisy copies of the feasible U-maze path + 28 of the through-the-wall shortcut: TAT follows the
    feasible one, whatever the order of the batch, and its plan is feasible."""
    m = Maze("umaze")
    L = 40
    feas = _path([(1, 1), (1, 3), (3, 3), (3, 1)], L)
    wall = _path([(1, 1), (3, 1)], L)
    lo, hi = np.array([0.5, 0.5, -0.3, -0.3]), np.array([3.5, 3.5, 0.3, 0.3])
    norm = lambda x: 2 * (x - lo) / (hi - lo) - 1  # noqa: E731
    unnorm = lambda x: (x + 1) / 2 * (hi - lo) + lo  # noqa: E731
    rng = np.random.default_rng(0)
    batch = np.concatenate([feas[None] + rng.normal(0, 0.01, (100, L, 4)),
                            wall[None] + rng.normal(0, 0.01, (28, L, 4))])
    batch[:, 0] = feas[0]  # the conditioned start
    assert plan_infeasible(m, batch[100:]).all() and not plan_infeasible(m, batch[:100]).any()
    for order in (np.arange(128), rng.permutation(128), np.arange(128)[::-1]):
        plan = unnorm(aggregate_plan(norm(batch[order]), merge_threshold=5e-4))
        assert plan.shape == (L, 4)
        assert not plan_infeasible(m, plan)
        np.testing.assert_allclose(plan[:, :2], feas[:, :2], atol=0.05)
    # Euclidean distance as well
    plan = unnorm(aggregate_plan(norm(batch[::-1]), distance="euclidean", merge_threshold=0.1))
    assert not plan_infeasible(m, plan)


def test_identical_trajectories_collapse_into_one_chain_with_summed_weights():
    L, lam = 6, 0.9
    traj = np.linspace(0.1, 1.0, L * 3).reshape(L, 3) + 0.5
    tree = TrajectoryAggregationTree(state_dim=3, lambda_=lam, merge_threshold=1e-6)
    tree.integrate(np.repeat(traj[None], 5, axis=0))
    node, depth = tree.root, 0
    while node.children:
        assert len(node.children) == 1
        node = node.children[0]
        depth += 1
        assert node.count == 5
        assert node.value == pytest.approx(5 * lam ** (depth - 1))  # w_i = λ^(i−1), i = depth
        np.testing.assert_allclose(node.state, traj[depth])
    assert depth == L - 1  # index 0 (history) is not integrated
    assert tree.n_nodes() == L


def test_orthogonal_trajectories_branch_at_depth_one():
    L = 5
    a = np.zeros((L, 2))
    a[:, 0] = 1.0
    b = np.zeros((L, 2))
    b[:, 1] = 1.0
    tree = TrajectoryAggregationTree(state_dim=2, merge_threshold=0.1)
    tree.integrate(np.stack([a, b, a]))
    assert len(tree.root.children) == 2
    assert [c.count for c in tree.root.children] == [2, 1]
    assert tree.best_child() == 0
    np.testing.assert_allclose(tree.act(), [1.0, 0.0])
    for c in tree.root.children:  # each branch is a chain to the end
        assert c.depth() == L - 2


def test_weighted_mean_and_weights_follow_lambda_power():
    lam = 0.5
    x = np.array([[[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]],
                  [[1.0, 1.0], [1.1, 1.1], [4.0, 4.0]]])  # parallel states: cosine distance 0 -> merge
    tree = TrajectoryAggregationTree(state_dim=2, lambda_=lam, merge_threshold=1e-3)
    tree.integrate(x)
    c1 = tree.root.children[0]
    c2 = c1.children[0]
    assert c1.value == pytest.approx(2 * lam ** 0) and c2.value == pytest.approx(2 * lam ** 1)
    np.testing.assert_allclose(c1.state, [1.05, 1.05])
    np.testing.assert_allclose(c2.state, [3.0, 3.0])
    assert tree.weight(1) == 1.0 and tree.weight(3) == pytest.approx(lam ** 2)


def test_replanning_down_weights_the_older_plan_and_pruning_keeps_depth_in_sync():
    """Plan A integrated, one step taken (prune), then plan B from the new state: A's states now carry λ^k less
    weight than B's at the same depth (B's index i sits at depth i), so equal numbers of fresh votes win."""
    lam, L = 0.5, 6
    up = np.tile([0.0, 1.0], (L, 1))
    right = np.tile([1.0, 0.0], (L, 1))
    tree = TrajectoryAggregationTree(state_dim=2, lambda_=lam, merge_threshold=1e-3)
    tree.integrate(np.stack([up, up]))            # old plan: 2 votes for "up" at every depth
    tree.prune()                                  # execute one step
    assert tree.root.depth() == L - 2             # one level consumed
    # the old states now at depth 1 below the new root were sampled at index 2: weight 2 * λ^1 = 1
    assert tree.root.children[0].value == pytest.approx(2 * lam)
    tree.integrate(np.stack([right]))             # new plan, 1 vote, fresh weight λ^0 = 1 at depth 1
    vals = sorted(c.value for c in tree.root.children)
    assert vals == pytest.approx([1.0, 1.0])      # 2 old votes decayed by λ = 1 fresh vote
    tree2 = TrajectoryAggregationTree(state_dim=2, lambda_=lam, merge_threshold=1e-3)
    tree2.integrate(np.stack([up, up]))
    tree2.prune()
    tree2.integrate(np.stack([right, right]))     # 2 fresh votes beat 2 old ones
    np.testing.assert_allclose(tree2.act(), [1.0, 0.0])
    # with λ = 1 (no decay) the tie goes to the older branch (inserted first)
    tree3 = TrajectoryAggregationTree(state_dim=2, lambda_=1.0, merge_threshold=1e-3)
    tree3.integrate(np.stack([up, up]))
    tree3.prune()
    tree3.integrate(np.stack([right, right]))
    np.testing.assert_allclose(tree3.act(), [0.0, 1.0])


def test_short_histories_and_rollout_end():
    tree = TrajectoryAggregationTree(state_dim=2)
    tree.integrate(np.ones((3, 1, 2)))            # L <= history_length: nothing to integrate, no error
    assert tree.n_nodes() == 1 and tree.rollout(5).shape == (0, 2)
    with pytest.raises(RuntimeError, match="no children"):
        tree.act()
    tree.integrate(np.ones((2, 2, 2)))            # L = 2: one state each, merged
    assert len(tree.root.children) == 1 and tree.root.children[0].count == 2
    plan = aggregate_plan(np.ones((4, 1, 2)))     # a plan of the start state only
    assert plan.shape == (1, 2)
    plan, info = aggregate_plan(np.ones((4, 3, 2)), return_tree=True)
    assert info == {"root_children": 1, "n_nodes": 3, "root_max_count": 4}
    t0 = TrajectoryAggregationTree(state_dim=2, history_length=0)
    t0.integrate(np.ones((1, 3, 2)))
    assert t0.root.depth() == 3


def test_torch_input_and_medoid():
    x = torch.randn(5, 4, 3)
    tree = TrajectoryAggregationTree(state_dim=3)
    tree.integrate(x)
    assert len(tree.root.children) >= 1
    batch = np.zeros((5, 3, 2))
    batch[4] += 10.0  # an outlier
    batch[2] += 0.1
    assert medoid_index(batch) in (0, 1, 3)


@pytest.mark.parametrize("kw, match", [
    ({"lambda_": 0.0}, r"lambda_ must be in \(0, 1\]"),
    ({"lambda_": 1.5}, r"lambda_ must be in \(0, 1\]"),
    ({"merge_threshold": -0.1}, "merge_threshold must be a finite number >= 0"),
    ({"distance": "l1"}, "distance must be one of"),
    ({"state_dim": 0}, "state_dim must be an int >= 1"),
    ({"history_length": -1}, "history_length"),
])
def test_bad_tree_arguments(kw, match):
    args = {"state_dim": 4, **kw}
    with pytest.raises(ValueError, match=match):
        TrajectoryAggregationTree(**args)


def test_wrong_state_dimension_is_rejected_before_any_change():
    tree = TrajectoryAggregationTree(state_dim=4)
    with pytest.raises(ValueError, match="state dimension 3, the tree's state_dim is 4"):
        tree.integrate(np.zeros((2, 5, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        tree.integrate(np.full((2, 5, 4), np.nan))
    assert tree.n_nodes() == 1
    with pytest.raises(ValueError, match=r"lambda_ must be in \(0, 1\]"):
        aggregate_plan(np.zeros((2, 3, 4)), lambda_=2.0)
