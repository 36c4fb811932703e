"""Data sets that need no network: scikit-learn's shipped sets and MNIST-1D, with stratified seeded splits.

MNIST-1D (Greydanus & Kobak, 2020; the ``mnist1d`` package) is the below-ceiling classification benchmark
(published test accuracy: logistic 32%, MLP 68%, CNN 94%): 10 classes of length-40 series, generated offline.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from sklearn import datasets
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from icml24.common import validate as v

_LOADERS = {
    "digits": datasets.load_digits,
    "breast_cancer": datasets.load_breast_cancer,
    "iris": datasets.load_iris,
    "wine": datasets.load_wine,
}


@dataclass(frozen=True)
class Split:
    """A train/(validation/)test split as float32 feature tensors and int64 label tensors."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    def to(self, device: str | torch.device) -> Split:
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Split(self.x_train.to(device), self.y_train.to(device), self.x_test.to(device),
                     self.y_test.to(device), self.n_classes, mv(self.x_val), mv(self.y_val))


def load_sklearn(name: Literal["digits", "breast_cancer", "iris", "wine"], *, seed: int, test_size: float = 0.25,
                 scale: Literal["standard", "unit", "none"] = "standard") -> Split:
    """Load a scikit-learn classification set shipped with the package and split it (stratified, seeded).

    Args:
        name: one of ``digits``, ``breast_cancer``, ``iris``, ``wine``.
        seed: seed of the split.
        test_size: fraction of samples held out.
        scale: ``standard`` (z-score fitted on train), ``unit`` (divide by the max of train) or ``none``.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; valid: {', '.join(_LOADERS)}")
    v.probability("load_sklearn", "test_size", test_size, open_low=True, open_high=True)
    v.one_of("load_sklearn", "scale", scale, ("standard", "unit", "none"))
    x, y = _LOADERS[name](return_X_y=True)
    x = x.astype(np.float64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    if scale == "standard":
        sc = StandardScaler().fit(xtr)
        xtr, xte = sc.transform(xtr), sc.transform(xte)
    elif scale == "unit":
        m = np.abs(xtr).max()
        xtr, xte = xtr / m, xte / m
    f = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    g = lambda a: torch.as_tensor(a, dtype=torch.long)  # noqa: E731
    return Split(f(xtr), g(ytr), f(xte), g(yte), int(len(np.unique(y))))


def digits_images(*, seed: int, test_size: float = 0.25) -> Split:
    """sklearn digits as 1×8×8 images in [0, 1] (for the tiny ViTs), stratified seeded split."""
    s = load_sklearn("digits", seed=seed, test_size=test_size, scale="none")
    img = lambda a: (a / 16.0).reshape(-1, 1, 8, 8)  # noqa: E731
    return Split(img(s.x_train), s.y_train, img(s.x_test), s.y_test, s.n_classes)


@functools.lru_cache(maxsize=4)
def _mnist1d_arrays(data_seed: int, num_samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ImportError("MNIST-1D needs the mnist1d package: pip install 'mnist1d==0.0.2.post1'") from e
    args = get_dataset_args()
    args.seed, args.num_samples = data_seed, num_samples
    py_state, np_state = random.getstate(), np.random.get_state()
    try:  # make_dataset reseeds the global random / np.random: give the caller's state back
        d = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    out = (d["x"], d["y"], d["x_test"], d["y_test"])
    for a in out:
        a.setflags(write=False)
    return out


def load_mnist1d(*, seed: int, val_fraction: float = 0.2, data_seed: int = 42, num_samples: int = 5000,
                 as_sequence: bool = False) -> Split:
    """MNIST-1D, generated offline, with a seeded stratified validation split carved from its training set.

    Args:
        seed: seed of the train/validation split (the test set is the package's fixed one).
        val_fraction: fraction of the training series held out for tuning (0 keeps them all; no validation).
        data_seed: the generator's seed; 42 with 5000 samples is the published data set (4000 train, 1000 test).
        num_samples: series generated in all (80% train, 20% test, the package's split).
        as_sequence: shape ``(N, 40, 1)`` (for 1-D convolutions / sequence models) instead of ``(N, 40)``.

    Returns:
        A :class:`Split` (float32 features, int64 labels, 10 classes) with ``x_val``/``y_val`` when
        ``val_fraction > 0``. The global ``random``/``numpy`` RNG states are left as they were.
    """
    v.integer("load_mnist1d", "seed", seed, minimum=0)
    v.in_range("load_mnist1d", "val_fraction", val_fraction, 0.0, 1.0, high_open=True)
    v.integer("load_mnist1d", "num_samples", num_samples, minimum=50)
    xtr, ytr, xte, yte = _mnist1d_arrays(int(data_seed), int(num_samples))
    xva = yva = None
    if val_fraction > 0:
        xtr, xva, ytr, yva = train_test_split(xtr, ytr, test_size=val_fraction, random_state=seed, stratify=ytr)
    shape = (lambda a: a[..., None]) if as_sequence else (lambda a: a)
    f = lambda a: None if a is None else torch.tensor(shape(np.asarray(a)), dtype=torch.float32)  # noqa: E731
    g = lambda a: None if a is None else torch.tensor(np.asarray(a), dtype=torch.long)  # noqa: E731
    return Split(f(xtr), g(ytr), f(xte), g(yte), 10, f(xva), g(yva))
