"""MNIST-1D loader: offline, RNG-neutral, seeded splits, and the published accuracies reproduced."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icml24.common.data import load_mnist1d
from icml24.common.nets import MLP, ConvNet1D


def test_mnist1d_is_the_published_set_with_seeded_validation_splits():
    state_np, state_py = np.random.get_state(), random.getstate()
    a = load_mnist1d(seed=0)
    assert np.array_equal(np.random.get_state()[1], state_np[1]) and random.getstate() == state_py
    assert a.x_train.shape == (3200, 40) and a.x_val.shape == (800, 40) and a.x_test.shape == (1000, 40)
    assert a.n_classes == 10 and set(a.y_test.tolist()) == set(range(10))
    b, c = load_mnist1d(seed=0), load_mnist1d(seed=1)
    assert torch.equal(a.x_val, b.x_val) and not torch.equal(a.x_val, c.x_val)
    assert torch.equal(a.x_test, c.x_test)  # the test set is the package's fixed one
    full = load_mnist1d(seed=0, val_fraction=0.0)
    assert full.x_val is None and full.x_train.shape == (4000, 40)
    assert np.bincount(a.y_val.numpy()).min() >= 75  # stratified
    assert load_mnist1d(seed=0, as_sequence=True).x_train.shape == (3200, 40, 1)


@pytest.mark.parametrize("kwargs, match", [({"seed": -1}, "seed"), ({"seed": 0, "val_fraction": 1.0}, "val_fraction"),
                                           ({"seed": 0, "num_samples": 10}, "num_samples")])
def test_mnist1d_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_mnist1d(**kwargs)


def _test_accuracy(model: torch.nn.Module, steps: int, seed: int) -> float:
    """The published recipe: Adam, lr 1e-2, batch 100, random minibatches of the 4000 training series."""
    d = load_mnist1d(seed=0, val_fraction=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(d.y_train), (100,), generator=g)
        loss = F.cross_entropy(model(d.x_train[idx]), d.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return (model(d.x_test).argmax(1) == d.y_test).float().mean().item()


def test_logistic_mlp_and_cnn_reach_the_published_mnist1d_accuracies():
    # One training run's accuracy depends on the kernels' reduction order (thread count, CPU). Single runs measured
    # here, seeds 0-5 on one thread and 0-4 on two: logistic 30.5-31.5% (sd 0.3 pts), MLP 63.8-67.1% (sd 1.3;
    # identical on both thread counts), CNN 88.6-95.3% (sd 1.9; seed 1 gave 90.4% on one thread, 88.6% on two), so
    # one CNN run at 90.6% is an ordinary draw. The test averages four seeds and allows, around the published
    # numbers, the measured offset of our mean plus three standard errors of a four-seed mean: logistic ±2 points
    # (mean 31.0 vs 32), MLP ±4.5 (65.5 vs 68), CNN ±4 (92.9 vs 94). A loader or network that moves a model by more
    # than that, or closes the gaps between the three, fails.
    runs = {"logistic": [], "mlp": [], "cnn": []}
    for seed in range(4):
        for name, make, steps in [("logistic", lambda: torch.nn.Linear(40, 10), 3000),
                                  ("mlp", lambda: MLP(in_features=40, hidden=(100, 100), out_features=10), 6000),
                                  ("cnn", ConvNet1D, 3000)]:
            torch.manual_seed(seed)
            runs[name].append(_test_accuracy(make(), steps=steps, seed=seed))
    lin, mlp, cnn = (float(np.mean(runs[k])) for k in ("logistic", "mlp", "cnn"))
    assert abs(lin - 0.32) <= 0.02, runs  # published: logistic 32%
    assert abs(mlp - 0.68) <= 0.045, runs  # published: MLP 68%
    assert abs(cnn - 0.94) <= 0.04, runs  # published: CNN 94%
    assert cnn - mlp >= 0.2 and mlp - lin >= 0.25, runs  # the benchmark separates the models
