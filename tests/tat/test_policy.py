"""The closed-loop planner wrapper, the action/state alignment helpers and the tree's bounded storage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.tat import TATPlanner, TrajectoryAggregationTree, forward_state, reverse_state

A, S = 2, 3


def _policy(s: np.ndarray) -> np.ndarray:
    """A deterministic, state-dependent controller of the toy system s' = s + [a, 0.1·a_0]."""
    return np.array([np.sin(s[0] + s[2]), np.cos(s[1])]) * 0.1


def _step(s: np.ndarray, a: np.ndarray) -> np.ndarray:
    return s + np.array([a[0], a[1], 0.1 * a[0]])


def _rollout(s: np.ndarray, L: int) -> np.ndarray:
    """One plan ``[L, A + S]`` in Diffuser's layout: row i = (a_i, s_i), from s_0 = s."""
    rows = []
    for _ in range(L):
        a = _policy(s)
        rows.append(np.concatenate([a, s]))
        s = _step(s, a)
    return np.array(rows)


class _NoisyPlanner:
    """B noisy rollouts from the observation: a few modes (action offsets) + small noise, seeded per call."""

    def __init__(self, B: int = 24, L: int = 10, spread: float = 0.02, seed: int = 0, kind: str = "numpy",
                 dtype: type = np.float64) -> None:
        self.B, self.L, self.spread, self.kind, self.dtype = B, L, spread, kind, dtype
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: np.ndarray) -> object:
        base = _rollout(np.asarray(obs, float), self.L)
        mode = self.rng.integers(0, 3, self.B)
        x = base[None] + (mode[:, None, None] - 1) * 0.05 + self.rng.normal(0, self.spread, (self.B, self.L, A + S))
        x[:, 0, A:] = obs  # the conditioned current state
        x = x.astype(self.dtype)
        return torch.from_numpy(x) if self.kind == "torch" else x


def _episode(planner: TATPlanner, steps: int, s0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([0.3, -0.2, 0.5]) if s0 is None else s0
    planner.reset()
    acts, states = [], [s]
    for _ in range(steps):
        a = np.asarray(planner.act(s), float)
        s = _step(s, a)
        acts.append(a)
        states.append(s)
    return np.array(acts), np.array(states)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_and_torch_planners_give_the_same_actions(dtype):
    kw = dict(transition_dim=A + S, action_dim=A, lambda_=0.98, merge_threshold=1e-3, tree_batch_size=16)
    a_np, s_np = _episode(TATPlanner(_NoisyPlanner(seed=3, dtype=dtype), **kw), 40)
    a_pt, s_pt = _episode(TATPlanner(_NoisyPlanner(seed=3, dtype=dtype, kind="torch"), **kw), 40)
    np.testing.assert_array_equal(a_np, a_pt)
    np.testing.assert_array_equal(s_np, s_pt)
    # the aggregation is doing something here: merges and branches at the root
    p = TATPlanner(_NoisyPlanner(seed=3, dtype=dtype), **kw)
    _episode(p, 5)
    assert 1 < p.last_info["count"] < 16 * 5 and p.last_info["root_children"] > 1


def test_agreeing_plans_give_the_plans_own_action():
    """All B plans identical (a consistent deterministic planner): every step's action is the plan's a_0, the
    tree then holds one chain (old plans merge with the new ones) and the episode follows the planner's own."""
    L, B = 8, 16
    planner = TATPlanner(lambda obs: np.repeat(_rollout(obs, L)[None], B, axis=0), transition_dim=A + S, action_dim=A)
    s = np.array([0.3, -0.2, 0.5])
    for t in range(30):
        a = planner.act(s)
        np.testing.assert_allclose(a, _policy(s), rtol=0, atol=1e-12)
        assert planner.last_info["root_children"] == 1
        assert planner.last_info["count"] == B * min(t + 1, L - 1)  # merged with every earlier plan still reaching
        assert planner.tree.n_nodes() == L - 1
        s = _step(s, a)


def test_majority_of_plans_wins_and_action_fn_and_state_only_plans():
    base = _rollout(np.array([0.0, 0.0, 1.0]), 6)
    other = base.copy()
    other[:, :A] *= -3.0  # a minority with a very different action
    batch = np.concatenate([np.repeat(base[None], 20, 0), np.repeat(other[None], 12, 0)])[np.random.default_rng(0)
                                                                                           .permutation(32)]
    p = TATPlanner(lambda obs: batch, transition_dim=A + S, action_dim=A, action_fn=lambda a: 10 * a)
    np.testing.assert_allclose(p.act(None), 10 * base[0, :A], atol=1e-12)
    assert p.last_info["count"] == 20 and p.steps == 1
    # state-only plans: the "action" is the next state (a waypoint)
    q = TATPlanner(lambda obs: batch[:, :, A:], transition_dim=S)
    np.testing.assert_allclose(q.act(None), base[1, A:], atol=1e-12)


def test_forward_and_reverse_state_follow_the_official_alignment():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 7, A + S))
    f = forward_state(x, action_dim=A)
    np.testing.assert_array_equal(f[:, 0, :A], 0)                  # first action padded with zeros
    np.testing.assert_array_equal(f[:, 1:, :A], x[:, :-1, :A])     # row i holds a_{i-1} ...
    np.testing.assert_array_equal(f[:, :, A:], x[:, :, A:])        # ... beside s_i
    np.testing.assert_array_equal(reverse_state(f, action_dim=A, last_action=x[:, -1:, :A]), x)
    r = reverse_state(f, action_dim=A)                                  # default: repeat the current last action
    np.testing.assert_array_equal(r[:, -1, :A], f[:, -1, :A])
    np.testing.assert_array_equal(r[:, :-1], x[:, :-1])
    first = rng.normal(size=A)
    np.testing.assert_array_equal(forward_state(x, action_dim=A, first_action=first)[:, 0, :A],
                                  np.broadcast_to(first, (4, A)))
    np.testing.assert_array_equal(forward_state(reverse_state(f, action_dim=A), action_dim=A,
                                                first_action=f[:, :1, :A]), f)
    assert forward_state(x, action_dim=0) is x
    xt = torch.as_tensor(x)
    ft = forward_state(xt, action_dim=A)
    assert isinstance(ft, torch.Tensor)
    np.testing.assert_array_equal(ft.numpy(), f)
    np.testing.assert_array_equal(reverse_state(ft, action_dim=A, last_action=xt[:, -1:, :A]).numpy(), x)
    with pytest.raises(ValueError, match="first_action"):
        forward_state(x, action_dim=A, first_action=np.zeros(3))
    with pytest.raises(ValueError, match="does not fit"):
        forward_state(x, action_dim=9)
    with pytest.raises(ValueError, match=r"\[B, L, D\]"):
        reverse_state(x[0], action_dim=A)


def test_memory_stays_bounded_over_a_long_episode():
    """600 closed-loop steps with merging and branching plans: the live tree, the node arrays and the merge
    bookkeeping stay bounded (pruned nodes are freed), and compaction does not change the actions."""
    kw = dict(transition_dim=A + S, action_dim=A, lambda_=0.98, merge_threshold=5e-4)
    B, L = 24, 10
    p = TATPlanner(_NoisyPlanner(B=B, L=L, seed=1), **kw)
    keep = TATPlanner(_NoisyPlanner(B=B, L=L, seed=1), **kw)
    s = np.array([0.3, -0.2, 0.5])
    p.reset()
    keep.reset()
    keep.tree._auto_compact = False  # the old behaviour: pruned nodes kept
    stats, max_live = [], 0
    for t in range(600):
        max_live = max(max_live, p.tree.n_nodes())  # the live tree before this step's integration
        a = p.act(s)
        np.testing.assert_array_equal(a, keep.act(s))
        s = _step(s, np.asarray(a))
        if t % 50 == 49:
            stats.append(p.tree.storage())
    assert max_live <= B * (L - 1) * L
    for st in stats:  # the arrays hold at most twice (the live tree + one batch), the merge log is folded
        assert st["allocated"] <= st["capacity"] <= max(64, 2 * (max_live + B * (L - 1)))
        assert st["merge_log"] == 0 and st["steps_kept"] <= max(4096, 2 * B * L * L) + B * L
    old, new = keep.tree.storage(), stats[-1]
    assert old["live"] == new["live"]
    assert old["allocated"] > 10 * new["allocated"]                                     # pruned nodes kept
    assert old["steps_kept"] > 20 * new["steps_kept"]  # every merge step since the start


def test_compaction_keeps_the_tree_and_invalidates_old_views():
    rng = np.random.default_rng(0)
    t = TrajectoryAggregationTree(state_dim=3, lambda_=0.9, merge_threshold=0.05, distance="euclidean")
    for _ in range(5):
        t.integrate(np.cumsum(rng.normal(0, 0.05, (20, 8, 3)), axis=1) + 1.0)
        t.prune()
    snap = lambda tr: [(n.state.tolist(), n.value, n.count, n.steps, len(n.children))  # noqa: E731
                       for n in _walk(tr.root)]
    before = snap(t)
    view = t.root.children[0]
    n_before = t.storage()
    t.compact()
    assert snap(t) == before
    after = t.storage()
    assert after["allocated"] == after["live"] == n_before["live"] < n_before["allocated"]
    with pytest.raises(RuntimeError, match="compacted"):
        _ = view.state
    t.integrate(np.cumsum(rng.normal(0, 0.05, (20, 8, 3)), axis=1) + 1.0)  # still usable
    assert t.act().shape == (3,)


def _walk(node):
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(n.children))
    return out


def test_bad_planner_arguments():
    with pytest.raises(TypeError, match="callable"):
        TATPlanner(None, transition_dim=3)
    with pytest.raises(ValueError, match="action_dim"):
        TATPlanner(lambda o: o, transition_dim=3, action_dim=4)
    with pytest.raises(ValueError, match="lambda_"):
        TATPlanner(lambda o: o, transition_dim=3, lambda_=0.0)
    p = TATPlanner(lambda o: np.zeros((4, 5, 2)), transition_dim=3)
    with pytest.raises(ValueError, match="state dimension"):
        p.act(None)
