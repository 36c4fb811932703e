"""The maze: layouts, collision geometry on hand-made cases, the exact infeasibility check, the env, the data."""

from __future__ import annotations

import numpy as np
import pytest

from icml24.tat.maze import (
    LAYOUTS,
    Maze,
    PointMaze2D,
    collect_dataset,
    expert_return,
    plan_infeasible,
    segments_cross_walls,
)


def test_layouts_are_d4rl_sizes():
    assert Maze("umaze").shape == (5, 5) and Maze("medium").shape == (8, 8) and Maze("large").shape == (9, 12)
    u = Maze("umaze")
    # U-maze: row 2 is wall except column 3 (the bend)
    assert u.walls[2].tolist() == [True, True, True, False, True]
    assert len(u.free_cells) == 7
    assert set(LAYOUTS) == {"umaze", "medium", "large"}


def test_bfs_distances_and_path():
    u = Maze("umaze")
    assert u.distances_from((1, 1))[3, 1] == 6  # around the bend: (1,1)->(1,3)->(3,3)->(3,1)
    p = u.shortest_path((1, 1), (3, 1))
    assert p[0] == (1, 1) and p[-1] == (3, 1) and len(p) == 7
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(p[:-1], p[1:], strict=False))


def test_segment_check_hand_made_cases():
    u = Maze("umaze")
    # straight through the wall row 2 (cells (2,1), (2,2) are walls): infeasible
    assert plan_infeasible(u, np.array([[1.0, 1.0], [3.0, 1.0]]))
    # along the free corridor row 1: feasible
    assert not plan_infeasible(u, np.array([[1.0, 1.0], [1.0, 3.0]]))
    # down the bend column 3: feasible
    assert not plan_infeasible(u, np.array([[1.0, 3.0], [3.0, 3.0]]))
    # a diagonal through the corner (1.5, 2.5) of wall cell (2, 2), free cells on both sides: a touch is allowed
    assert not plan_infeasible(u, np.array([[1.0, 2.0], [2.0, 3.0]]))
    # shifted by 0.1 it cuts the corner through the interior of wall (2, 2)
    assert plan_infeasible(u, np.array([[1.0, 1.9], [2.0, 2.9]]))
    # both ends free but the short segment crosses the thin wall corner (2,2)-(2,1) boundary region
    assert plan_infeasible(u, np.array([[1.45, 2.0], [2.55, 3.0]]))
    # a waypoint inside a wall / outside the map
    assert plan_infeasible(u, np.array([[1.0, 1.0], [2.0, 1.0]]))
    assert plan_infeasible(u, np.array([[1.0, 1.0], [-1.0, 1.0]]))
    # radius inflates walls: hugging the wall at 0.05 from its face is fine for a point, not for r = 0.1
    seg = np.array([[1.0, 1.0], [1.0, 2.0]]) + np.array([0.45, 0.0])
    assert not plan_infeasible(u, seg) and plan_infeasible(u, seg, radius=0.1)


def test_segment_check_matches_dense_sampling():
    """Exact slab test == dense point sampling along random segments (up to boundary-grazing cases)."""
    m = Maze("medium")
    rng = np.random.default_rng(0)
    p = rng.uniform(0.5, 6.5, (400, 2))
    q = p + rng.normal(0, 0.6, (400, 2))
    q = np.clip(q, 0.5, 6.49)
    exact = segments_cross_walls(m, p, q)
    ts = np.linspace(0, 1, 2001)[:, None, None]
    pts = p[None] + ts * (q - p)[None]
    cells = np.floor(pts + 0.5).astype(int)
    dense = m.walls[cells[..., 0], cells[..., 1]].any(0)
    assert (exact == dense).mean() > 0.99 and exact.sum() > 50


def test_batch_shapes_and_errors():
    u = Maze("umaze")
    b = np.zeros((3, 5, 4)) + np.array([1.0, 1.0, 0, 0])
    assert plan_infeasible(u, b).tolist() == [False] * 3
    with pytest.raises(ValueError, match="plan_infeasible"):
        plan_infeasible(u, np.zeros(4))
    with pytest.raises(ValueError, match="name must be one of"):
        Maze("tiny")


def test_start_or_goal_in_wall_or_outside_names_the_cell():
    env = PointMaze2D("umaze")
    with pytest.raises(ValueError, match=r"start .* wall cell \(2, 1\)"):
        env.reset(options={"start": (2.0, 1.0), "goal": (1.0, 1.0)})
    with pytest.raises(ValueError, match="goal .* outside"):
        env.reset(options={"start": (1.0, 1.0), "goal": (9.0, 1.0)})


def test_env_walls_stop_the_agent_and_gymnasium_api():
    env = PointMaze2D("umaze", agent_radius=0.1)
    obs, info = env.reset(seed=0, options={"start": (1.0, 1.0), "goal": (3.0, 1.0)})
    assert obs.shape == (4,) and env.observation_space.contains(obs.astype(np.float32))
    for _ in range(30):  # push down (+x) into the wall row 2
        obs, r, term, trunc, _ = env.step(np.array([1.0, 0.0]))
    assert obs[0] == pytest.approx(1.5 - 0.1, abs=1e-6) and obs[2] == 0.0 and r == 0.0
    for _ in range(40):  # slide right along the corridor, then down the bend
        obs, *_ = env.step(np.array([0.0, 1.0]))
    assert obs[1] == pytest.approx(3.5 - 0.1, abs=1e-6)
    obs, *_ = env.step(env.action_space.sample())
    assert np.all(np.isfinite(obs))


def test_dataset_is_feasible_and_segmented():
    d = collect_dataset("umaze", n_steps=3000, seed=1)
    assert d.observations.shape == (3000, 4) and d.actions.shape == (3000, 2)
    assert np.abs(d.actions).max() <= 1.0
    assert not plan_infeasible(Maze("umaze"), d.observations)  # the agent never passes through a wall
    eps = d.episodes()
    assert len(eps) > 20 and eps[0][0] == 0 and eps[-1][1] == 3000
    # the goal is constant within an episode and reached at its end
    a, b = eps[1]
    assert np.all(d.goals[a:b] == d.goals[a]) and np.linalg.norm(d.observations[b - 1, :2] - d.goals[a]) < 0.9
    e2 = collect_dataset("umaze", n_steps=3000, seed=1)
    assert np.array_equal(d.observations, e2.observations)


def test_expert_reaches_the_goal():
    env = PointMaze2D("medium", max_episode_steps=100)
    r = expert_return(env, start=np.array([1.0, 1.0]), goal=np.array([6.0, 6.0]), steps=100)
    assert 10 < r < 100


def test_wall_contact_is_reported_and_ends_the_episode_only_when_asked():
    for terminate in (False, True):
        env = PointMaze2D("umaze", terminate_on_contact=terminate)
        env.reset(options={"start": (1.0, 1.0), "goal": (3.0, 1.0)})
        infos = [env.step(np.array([1.0, 0.0])) for _ in range(6)]  # +x into the wall row 2
        contacts = [i[4]["contact"] for i in infos]
        first = contacts.index(True)
        assert not any(contacts[:first]) and infos[first][0][0] == pytest.approx(1.4, abs=1e-6)
        assert [i[2] for i in infos] == [terminate and c for c in contacts]  # terminated iff contact and asked
    env = PointMaze2D("umaze", terminate_on_contact=True)
    env.reset(options={"start": (1.0, 1.0), "goal": (1.0, 3.0)})
    assert not any(env.step(np.array([0.0, 0.3]))[4]["contact"] for _ in range(5))  # along the free corridor


def test_batched_dynamics_treat_every_agent_alone_and_match_the_scalar_geometry():
    rng = np.random.default_rng(0)
    env = PointMaze2D("medium")
    m = env.maze
    cells = np.array(m.free_cells, float)
    states = np.concatenate([cells[rng.integers(len(cells), size=200)] + rng.uniform(-0.4, 0.4, (200, 2)),
                             rng.uniform(-3, 3, (200, 2))], 1)
    states = states[[not m.box_hits_wall(x, y, env.r) for x, y in states[:, :2]]]
    actions = rng.uniform(-1.5, 1.5, (len(states), 2))
    nxt, hit = env.step_batch(states, actions)
    assert hit.any() and not hit.all()
    assert not any(m.box_hits_wall(x, y, env.r) for x, y in nxt[:, :2])  # nobody ends inside a wall
    assert np.all(np.any(nxt[hit][:, 2:] == 0.0, axis=1))  # a stopped agent lost a velocity component
    for k in range(len(states)):  # one at a time = in a batch; the env's step is the same dynamics
        one, h1 = env.step_batch(states[k:k + 1], actions[k:k + 1])
        assert np.array_equal(one[0], nxt[k]) and h1[0] == hit[k]
        env.set_state(states[k])
        obs, _, _, _, info = env.step(actions[k])
        assert np.array_equal(obs, nxt[k]) and info["contact"] == hit[k]
    xy = rng.uniform(-1, 9, (500, 2))
    assert m.boxes_hit_walls(xy[:, 0], xy[:, 1], 0.1).tolist() == [m.box_hits_wall(x, y, 0.1) for x, y in xy]


def test_expert_never_touches_a_wall_so_contact_termination_keeps_its_return():
    rng = np.random.default_rng(1)
    for name in ("umaze", "medium"):
        plain, ends = PointMaze2D(name), PointMaze2D(name, terminate_on_contact=True)
        cells = plain.maze.free_cells
        for _ in range(10):
            s = np.array(cells[rng.integers(len(cells))], float) + rng.uniform(-0.1, 0.1, 2)
            g = np.array(cells[rng.integers(len(cells))], float)
            assert expert_return(ends, start=s, goal=g, steps=150) == expert_return(plain, start=s, goal=g, steps=150)
