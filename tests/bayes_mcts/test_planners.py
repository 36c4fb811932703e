"""Planner invariants: optimality with an exact network, the posterior backup's closed form, Thompson-sampling
selection probabilities, visit counts, determinism, commitment; ground-truth Q against brute force; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr

from icml24.bayes_mcts import (
    BTS,
    NMCTS,
    TSTS,
    GridMaze,
    SimulatedValueModel,
    brute_force_q,
    gaussian_quantile,
    make_minigrid,
    make_planner,
    max_of_gaussians,
    run_episode,
)
from icml24.bayes_mcts.planners import TERMINAL_STD


class TreeEnv:
    """A binary tree of depth ``depth`` (states 1, 2, 3, ... in heap order); reward ``r(s, a) = table``."""

    def __init__(self, depth: int = 3) -> None:
        self.depth, self.s = depth, 1

    @property
    def actions(self):
        return (0, 1)

    def get_state(self):
        return self.s

    def set_state(self, s):
        self.s = s

    def is_terminal(self):
        return self.s >= 2 ** self.depth

    def step(self, a):
        r = 0.1 * self.s - 0.5 * a
        self.s = 2 * self.s + a
        return r, self.is_terminal()


def tree_model(s):
    rng = np.random.default_rng(s)
    return rng.normal(0, 1, 2), rng.uniform(0.2, 1.0, 2)


def _maze(size=4, seed=0, sigma=0.0, mode="gt"):
    env = GridMaze(size=size, seed=seed)
    return env, SimulatedValueModel(q_star=env.q_star, sigma_err=sigma, std_mode=mode, seed=seed)


# ----------------------------------------------------------------------------------------------- optimality
@pytest.mark.parametrize("name,kw", [("nmcts", {}), ("bts", {}), ("tsts", {}), ("tsts", {"variant": "frontier"})])
def test_exact_network_solves_every_maze_optimally(name, kw):
    for seed in range(4):
        env, net = _maze(size=4, seed=seed, sigma=0.0)
        d = env.optimal_steps()
        ep = run_episode(env=env, planner=make_planner(name, env=env, value_model=net, budget=10, seed=seed, **kw),
                         max_steps=2 * d + 10)
        assert ep.success and ep.steps == d and ep.ret == pytest.approx(10.0 - d)


def test_exact_network_solves_minigrid_optimally():
    for name in ("nmcts", "bts", "tsts"):
        env = make_minigrid("MiniGrid-SimpleCrossingS9N1-v0", seed=3)
        net = SimulatedValueModel(q_star=env.q_star, sigma_err=0.0, seed=3)
        d = env.optimal_steps()
        ep = run_episode(env=env, planner=make_planner(name, env=env, value_model=net, budget=8), max_steps=2 * d)
        assert ep.success and ep.steps == d


# ----------------------------------------------------------------------------------------------- posteriors
def test_bayesian_backup_matches_closed_form():
    env = TreeEnv()
    root_mu, root_sd = tree_model(1)
    # iteration 1: root has n = 1 -> p = 0.5 -> argmax of the prior mean; the new child's value prior backs up
    res = BTS(env=env, value_model=tree_model, budget=1).plan()
    a = int(np.argmax(root_mu))
    c = 2 + a
    cmu, csd = tree_model(c)
    r = 0.1 * 1 - 0.5 * a
    assert res.visits.tolist() == [int(a == 0), int(a == 1)]
    np.testing.assert_allclose(res.values[a], r + cmu.max())
    np.testing.assert_allclose(res.stds[a], csd[np.argmax(cmu)])
    np.testing.assert_allclose(res.values[1 - a], root_mu[1 - a])  # unexplored: the prior
    root = res.root
    np.testing.assert_allclose(root.pmax_m[a], r + cmu.max())

    # iteration 2: quantile p_2 at the root, then p_1 = 0.5 inside the child; the child's max posterior is the
    # max-of-Gaussians of its (updated) Q_max, its mean posterior the exploit action's Q_post
    res2 = BTS(env=env, value_model=tree_model, budget=2).plan()
    z = gaussian_quantile(1 - 0.5 * math.exp(-1 / 3))
    pm, ps = root_mu.copy(), root_sd.copy()
    pm[a], ps[a] = r + cmu.max(), csd[np.argmax(cmu)]
    a2 = int(np.argmax(pm + z * ps))
    root2 = res2.root
    if a2 == a:  # descend into c, expand its argmax-mean action
        b = int(np.argmax(cmu))
        g = 2 * c + b
        gmu, gsd = tree_model(g)
        rc = 0.1 * c - 0.5 * b
        qm, qs = cmu.copy(), np.maximum(csd, 0.01)
        qm[b], qs[b] = rc + gmu.max(), gsd[np.argmax(gmu)]
        ex = int(np.argmax(qm))
        np.testing.assert_allclose(root2.post_m[a], r + qm[ex])
        np.testing.assert_allclose(root2.post_s[a], qs[ex])
        xm, xs = max_of_gaussians(qm, qs)
        np.testing.assert_allclose(root2.pmax_m[a], r + float(xm), rtol=1e-9)
        np.testing.assert_allclose(root2.pmax_s[a], float(xs), rtol=1e-9)
    else:
        cmu2, csd2 = tree_model(2 + a2)
        np.testing.assert_allclose(root2.post_m[a2], 0.1 - 0.5 * a2 + cmu2.max())
    assert root2.n == 3  # root starts at 1 (official) + one per iteration


def test_terminal_leaf_value_prior_and_discount():
    env = TreeEnv(depth=1)
    res = TSTS(env=env, value_model=tree_model, budget=2, gamma=0.5, seed=1).plan()
    for a in range(2):
        if res.visits[a]:
            np.testing.assert_allclose(res.values[a], 0.1 - 0.5 * a + 0.0)
            np.testing.assert_allclose(res.stds[a], 0.5 * TERMINAL_STD)


@pytest.mark.parametrize("variant", ["per_level", "frontier"])
def test_thompson_selection_probability(variant):
    # one iteration from the root: P(select a0) = P(x0 > x1) = Φ((μ0 − μ1)/√(σ0² + σ1²))
    env = TreeEnv()
    mu, sd = tree_model(1)
    planner = TSTS(env=env, value_model=tree_model, budget=1, seed=7, variant=variant)
    n = 4000
    hits = sum(planner.plan().visits[0] for _ in range(n))
    p = float(ndtr((mu[0] - mu[1]) / math.hypot(sd[0], sd[1])))
    assert abs(hits / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-3


# ----------------------------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("name", ["nmcts", "bts", "tsts"])
def test_visit_counts_and_one_expansion_per_iteration(name):
    env, net = _maze(size=5, seed=2, sigma=1.0)
    T = 30
    res = make_planner(name, env=env, value_model=net, budget=T, seed=0).plan()
    assert res.visits.sum() == T  # every iteration passes through exactly one root child
    assert res.n_nodes <= T + 1
    for u in res.root.iter_tree():
        if u.children and not u.terminal:
            assert u.n >= sum(c.n for c in u.children.values())
    assert res.root.n == T + (1 if name != "nmcts" else 0)
    assert env.get_state() == env.start  # the env is restored to the root state


def test_commitment_is_argmax_of_mean_posterior():
    env, net = _maze(size=5, seed=1, sigma=1.0)
    for planner in (TSTS(env=env, value_model=net, budget=25, seed=3), BTS(env=env, value_model=net, budget=25)):
        res = planner.plan()
        assert res.action == int(np.argmax(res.root.post_m))
        np.testing.assert_array_equal(res.values, res.root.post_m)
    res = NMCTS(env=env, value_model=net, budget=25).plan()
    assert res.action == int(np.argmax(res.root.q))


def test_determinism():
    env, net = _maze(size=5, seed=4, sigma=1.0)
    det = TSTS(env=env, value_model=net, budget=20, seed=5, deterministic=True)
    a, b = det.plan(), det.plan()
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.visits, b.visits)
    runs = []
    for _ in range(2):
        env, net = _maze(size=5, seed=4, sigma=1.0)
        ep = run_episode(env=env, planner=TSTS(env=env, value_model=net, budget=20, seed=9), max_steps=60)
        runs.append((ep.steps, ep.ret, ep.trajectory))
    assert runs[0] == runs[1]
    # the non-deterministic sampler draws fresh samples at every decision
    env, net = _maze(size=5, seed=4, sigma=1.0)
    sto = TSTS(env=env, value_model=net, budget=20, seed=5)
    assert any(not np.array_equal(sto.plan().visits, sto.plan().visits) for _ in range(5))


def test_uncertainty_modes():
    env = GridMaze(size=4, seed=0)
    q = env.q_star(env.start)
    for mode in ("gt", "const", "random", "zero"):
        mu, sd = SimulatedValueModel(q_star=env.q_star, sigma_err=1.0, std_mode=mode, seed=3)(env.start)
        mu2, _ = SimulatedValueModel(q_star=env.q_star, sigma_err=1.0, std_mode="gt", seed=3)(env.start)
        np.testing.assert_array_equal(mu, mu2)  # the same network error in every mode
        if mode == "gt":
            np.testing.assert_allclose(sd, np.maximum(np.abs(mu - q), 0.01))
        elif mode == "const":
            np.testing.assert_allclose(sd, 1.0)
        elif mode == "zero":
            np.testing.assert_allclose(sd, 0.01)


# ----------------------------------------------------------------------------------------------- ground truth
def test_gridmaze_q_star_matches_brute_force():
    for seed in range(3):
        env = GridMaze(size=3, seed=seed)
        cells = [(r, c) for r, c in zip(*np.nonzero(~env.wall), strict=True) if (r, c) != env.goal]
        assert len(cells) == 2 * 3 * 3 - 2  # 9 cells + 8 passages of a perfect maze, minus the goal
        for s0 in cells:  # from every open cell (some lie beyond the goal, unreachable from the start)
            env.set_state((int(s0[0]), int(s0[1])))
            bf = brute_force_q(env)
            for s, q in bf.items():
                np.testing.assert_allclose(env.q_star(s), q)


def test_minigrid_q_star_matches_brute_force_and_deepcopy_mode():
    fast = make_minigrid("MiniGrid-SimpleCrossingS9N1-v0", seed=0)
    bf = brute_force_q(fast)
    assert len(bf) > 50
    for s, q in bf.items():
        np.testing.assert_allclose(fast.q_star(s), q)
    slow = make_minigrid("MiniGrid-SimpleCrossingS9N1-v0", seed=0, fast_state=False)
    bf2 = brute_force_q(slow, key_fn=lambda st: st.key, max_states=400)
    assert set(bf2) == set(bf)
    for k in bf:
        np.testing.assert_allclose(bf2[k], bf[k])


# ----------------------------------------------------------------------------------------------- bad input
def test_bad_inputs():
    env, net = _maze()
    with pytest.raises(ValueError, match="budget"):
        TSTS(env=env, value_model=net, budget=0)
    with pytest.raises(TypeError, match="budget"):
        BTS(env=env, value_model=net, budget=2.5)
    with pytest.raises(ValueError, match="size"):
        GridMaze(size=1)

    class NoSetState:
        actions = (0, 1)

        def get_state(self):
            return 0

        def step(self, a):
            return 0.0, False

    with pytest.raises(TypeError, match="set_state, is_terminal"):
        NMCTS(env=NoSetState(), value_model=net, budget=5)
    with pytest.raises(TypeError, match="value_model"):
        TSTS(env=env, value_model=3, budget=5)
    with pytest.raises(ValueError, match=r"3 means .* state \(1, 1\)"):
        TSTS(env=env, value_model=lambda s: (np.zeros(3), np.ones(3)), budget=5).plan()
    with pytest.raises(ValueError, match=r"negative standard deviations at state \(1, 1\)"):
        BTS(env=env, value_model=lambda s: (np.zeros(4), -np.ones(4)), budget=5).plan()
    with pytest.raises(ValueError, match="non-finite"):
        NMCTS(env=env, value_model=lambda s: (np.full(4, np.nan), np.ones(4)), budget=5).plan()
    with pytest.raises(TypeError, match="pair"):
        NMCTS(env=env, value_model=lambda s: np.zeros(4), budget=5).plan()
    with pytest.raises(ValueError, match="variant"):
        TSTS(env=env, value_model=net, budget=5, variant="exact")
    with pytest.raises(ValueError, match="std_mode"):
        SimulatedValueModel(q_star=env.q_star, sigma_err=1.0, std_mode="learned")
    with pytest.raises(ValueError, match="sigma_err"):
        SimulatedValueModel(q_star=env.q_star, sigma_err=-1.0)
    env.set_state(env.goal)
    with pytest.raises(ValueError, match="terminal"):
        TSTS(env=env, value_model=net, budget=5).plan()


# ----------------------------------------------------------------------------------------------- GridLeaper
def test_gridleaper_bellman_and_exact_planning():
    from icml24.bayes_mcts import GridLeaper

    env = GridLeaper(lanes=3, width=7, seed=2)
    q0 = env.q_star(env.start)
    # Bellman consistency of the exact Q through the simulator
    for s in [env.start, (1, 2, 3), (2, 5, 1)]:
        if env.car_at(*s):
            continue
        for a in env.actions:
            env.set_state(s)
            r, term = env.step(a)
            nxt = 0.0 if term else env.q_star(env.get_state()).max()
            assert env.q_star(s)[a] == pytest.approx(r + nxt)
    env.set_state(env.start)
    net = SimulatedValueModel(q_star=env.q_star, sigma_err=0.0, seed=2)
    ep = run_episode(env=env, planner=TSTS(env=env, value_model=net, budget=10), max_steps=25)
    assert ep.success and ep.ret == pytest.approx(q0.max()) and ep.steps == GridLeaper(lanes=3, width=7,
                                                                                       seed=2).optimal_steps()
    with pytest.raises(ValueError, match="lanes"):
        GridLeaper(lanes=0)


# ----------------------------------------------------------------------------------------------- issue 30
def test_bts_first_visit_is_greedy_on_the_mean():
    # the root starts at n = 1: p_1 = 0.5, z = 0, so the first expansion is the highest mean, not the optimistic
    # wide action (at p_2, z = 0.36: 0.9 + 0.36 > 1.0)
    def model(s):
        return np.array([1.0, 0.9]), np.array([0.01, 1.0])

    res = BTS(env=TreeEnv(), value_model=model, budget=1).plan()
    assert res.visits.tolist() == [1, 0]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 20])
def test_bts_selection_uses_the_quantile_of_the_nodes_visit_count(n):
    from icml24.bayes_mcts import Node, bts_percentile

    planner = BTS(env=TreeEnv(), value_model=tree_model, budget=1)
    z = {k: gaussian_quantile(bts_percentile(k)) for k in (n - 1, n, n + 1) if k >= 1}
    node = Node(1, None, None, 0.0, False)
    node.n = n
    # action 0: a sure 0; action 1: mean −c, std 1, so it wins exactly when z(p_n) > c
    for c, expect in [((z[n] + z[n + 1]) / 2, 0), ((z[n - 1] + z[n]) / 2 if n > 1 else z[n] - 0.05, 1)]:
        node.pmax_m, node.pmax_s = np.array([0.0, -c]), np.array([1e-6, 1.0])
        assert planner._select(node) == expect, (n, c)


def test_planners_expose_the_max_posterior_grid():
    env = TreeEnv()
    for n_bins, grid in [(7, "official"), (7, "adaptive"), (50, "official"), (50, "adaptive")]:
        res = TSTS(env=env, value_model=tree_model, budget=12, seed=0, n_bins=n_bins, grid=grid).plan()
        # every internal node's max posterior on the root's edge is the grid's max-of-Gaussians of the child
        root = res.root
        for a, c in root.children.items():
            if c.selected:
                xm, xs = max_of_gaussians(c.pmax_m, np.maximum(c.pmax_s, 1e-9), n_bins=n_bins, grid=grid)
                np.testing.assert_allclose(root.pmax_m[a], c.reward + float(xm), rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(root.pmax_s[a], float(xs), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="n_bins"):
        BTS(env=env, value_model=tree_model, budget=1, n_bins=2)
    with pytest.raises(ValueError, match="grid must be one of"):
        TSTS(env=env, value_model=tree_model, budget=1, grid="uniform")


def test_gymnasium_adapter_needs_a_key_that_tells_states_apart():
    import gymnasium as gym
    import minigrid  # noqa: F401

    from icml24.bayes_mcts import GymnasiumAdapter

    env = gym.make("MiniGrid-SimpleCrossingS9N1-v0")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="key_fn is required"):
        GymnasiumAdapter(env)
    with pytest.raises(ValueError, match=r"empty key \(\)"):
        GymnasiumAdapter(env, key_fn=lambda e: ())
    with pytest.raises(TypeError, match="hashable"):
        GymnasiumAdapter(env, key_fn=lambda e: [1, 2])
    ad = GymnasiumAdapter(env, key_fn=lambda e: (*map(int, e.unwrapped.agent_pos), int(e.unwrapped.agent_dir)),
                          actions=(0, 1, 2))
    s0 = ad.get_state()
    ad.step(2)
    ad.step(1)
    s1 = ad.get_state()
    assert s0.key != s1.key  # two poses, two keys (the old default gave () for both)
    ad.set_state(s0)
    assert ad.get_state().key == s0.key


@pytest.mark.parametrize("name", ["MiniGrid-DoorKey-5x5-v0", "MiniGrid-MultiRoom-N2-S4-v0"])
@pytest.mark.parametrize("fast", [True, False])
def test_minigrid_layouts_beyond_the_pose_model_are_refused(name, fast):
    with pytest.raises(ValueError, match=f"unsupported layout {name}: it has door at"):
        make_minigrid(name, seed=0, fast_state=fast)


def test_minigrid_edge_of_an_open_grid_blocks_and_unreachable_goal_is_named():
    import gymnasium as gym
    from minigrid.core.world_object import Wall

    from icml24.bayes_mcts import MiniGridAdapter

    def empty():
        env = gym.make("MiniGrid-Empty-5x5-v0", max_steps=10**6)
        env.reset(seed=0)
        return env

    d = MiniGridAdapter(empty()).optimal_steps()
    env = empty()
    u = env.unwrapped
    for x in range(u.width):  # open the top row: the pose model must not step off the grid (no shortcut there)
        u.grid.set(x, 0, None)
    assert MiniGridAdapter(env).optimal_steps() == d
    env = empty()
    u = env.unwrapped
    for y in range(1, u.height - 1):  # wall off the goal's column
        u.grid.set(2, y, Wall())
    with pytest.raises(ValueError, match="goal cannot be reached from the start pose"):
        MiniGridAdapter(env).optimal_steps()
