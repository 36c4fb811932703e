"""Issue 29's harder tasks: several MNIST-1D classes as the positive class, and label noise on train/val only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml24.common.data import load_mnist1d
from icml24.fed_auc import load_task


def test_positive_class_set_takes_every_listed_class_as_positive():
    raw = load_mnist1d(seed=0, val_fraction=0.0)
    t = load_task("mnist1d", seed=0, imratio=0.05, positive_class=(3, 5, 8))
    expect = np.isin(raw.y_test.numpy(), (3, 5, 8))
    np.testing.assert_array_equal(t.y_test.numpy(), expect.astype(np.int64))  # the clean test set, all 3 classes
    assert 0.25 < t.y_test.float().mean() < 0.35
    assert abs(t.imratio - 0.05) < 0.005  # train positives subsampled to p


def test_label_noise_redraws_train_and_val_classes_and_leaves_test_clean():
    clean = load_task("mnist1d", seed=1, imratio=0.05, positive_class=0)
    noisy = load_task("mnist1d", seed=1, imratio=0.05, positive_class=0, label_noise=0.1)
    assert torch.equal(noisy.y_test, clean.y_test)  # the test labels stay clean (x is rescaled by the train fit)
    same_train = noisy.x_train.shape == clean.x_train.shape and torch.equal(noisy.x_train, clean.x_train) and \
        torch.equal(noisy.y_train, clean.y_train)
    assert not same_train


@pytest.mark.parametrize("kw, match", [
    ({"positive_class": (3, 3)}, "positive_class"),
    ({"positive_class": (3, 11)}, "positive_class"),
    ({"positive_class": ()}, "positive_class"),
    ({"label_noise": 1.0}, "label_noise"),
])
def test_bad_task_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        load_task("mnist1d", seed=0, **kw)


def test_label_noise_is_refused_off_mnist1d():
    with pytest.raises(ValueError, match="label_noise"):
        load_task("breast_cancer", seed=0, label_noise=0.1)
