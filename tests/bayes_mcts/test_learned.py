"""The learned Gaussian Q-network / ensemble value model: it fits the labels, its std modes, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.bayes_mcts import TSTS, GridMaze
from icml24.bayes_mcts.learned import EnsembleValueModel, _open_cells, maze_features, train_value_ensemble


@pytest.fixture(scope="module")
def nets():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train_value_ensemble(mazes=[GridMaze(size=3, seed=i) for i in range(4)], n_members=2, epochs=100,
                                    hidden=(32, 32), batch_size=16, seed=0)
    finally:
        torch.set_num_threads(threads)


def test_features_and_fit(nets):
    maze = GridMaze(size=3, seed=1)
    x = maze_features(maze, [maze.start])
    assert x.shape == (1, 2 * 49 + 2) and x[0, -2:].tolist() == pytest.approx([1 / 6, 1 / 6])
    assert x[0, 49 + 1 * 7 + 1] == 1 and x[0, :49].sum() == maze.wall.sum()
    m = EnsembleValueModel(nets=nets, maze=maze, std_mode="gt")
    err = [m(s)[0] - maze.q_star(s) for s in _open_cells(maze)]
    # trained on this maze among four: clearly better than predicting the mean label (ratio 1)
    labels = np.stack([maze.q_star(s) for s in _open_cells(maze)])
    assert np.sqrt(np.mean(np.square(err))) < 0.75 * labels.std()
    np.testing.assert_allclose(m(maze.start)[1], np.maximum(np.abs(err[_open_cells(maze).index(maze.start)]), 0.01))


def test_std_modes(nets):
    maze = GridMaze(size=3, seed=2)
    ens = EnsembleValueModel(nets=nets, maze=maze, std_mode="ensemble")
    mle = EnsembleValueModel(nets=nets, maze=maze, std_mode="mle")
    const = EnsembleValueModel(nets=nets, maze=maze, std_mode="const", const_std=2.5)
    mu, sd = ens(maze.start)
    assert mu.shape == sd.shape == (4,) and np.all(sd >= 0.01)
    np.testing.assert_allclose(const(maze.start)[1], 2.5)
    np.testing.assert_allclose(const(maze.start)[0], mu)
    assert not np.allclose(mle(maze.start)[0], mu)  # one member vs the ensemble mean
    res = TSTS(env=maze, value_model=ens, budget=5).plan()  # plugs into a planner
    assert res.visits.sum() == 5


def test_bad_inputs(nets):
    with pytest.raises(ValueError, match="mazes"):
        train_value_ensemble(mazes=[])
    with pytest.raises(ValueError, match="n_members"):
        train_value_ensemble(mazes=[GridMaze(size=2)], n_members=0)
    with pytest.raises(ValueError, match="std_mode"):
        EnsembleValueModel(nets=nets, maze=GridMaze(size=3), std_mode="bayes")
