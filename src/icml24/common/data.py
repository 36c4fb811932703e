"""Data sets that need no network: scikit-learn's shipped sets with stratified seeded splits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from sklearn import datasets
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

_LOADERS = {
    "digits": datasets.load_digits,
    "breast_cancer": datasets.load_breast_cancer,
    "iris": datasets.load_iris,
    "wine": datasets.load_wine,
}


@dataclass(frozen=True)
class Split:
    """A train/test split as float32 feature tensors and int64 label tensors."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int

    def to(self, device: str | torch.device) -> Split:
        return Split(self.x_train.to(device), self.y_train.to(device), self.x_test.to(device),
                     self.y_test.to(device), self.n_classes)


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
    if not 0.0 < test_size < 1.0:
        raise ValueError(f"test_size must be in (0, 1), got {test_size}")
    x, y = _LOADERS[name](return_X_y=True)
    x = x.astype(np.float64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    if scale == "standard":
        sc = StandardScaler().fit(xtr)
        xtr, xte = sc.transform(xtr), sc.transform(xte)
    elif scale == "unit":
        m = np.abs(xtr).max()
        xtr, xte = xtr / m, xte / m
    elif scale != "none":
        raise ValueError(f"scale must be standard, unit or none, got {scale!r}")
    f = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    g = lambda a: torch.as_tensor(a, dtype=torch.long)  # noqa: E731
    return Split(f(xtr), g(ytr), f(xte), g(yte), int(len(np.unique(y))))


def digits_images(*, seed: int, test_size: float = 0.25) -> Split:
    """sklearn digits as 1×8×8 images in [0, 1] (for the tiny ViTs), stratified seeded split."""
    s = load_sklearn("digits", seed=seed, test_size=test_size, scale="none")
    img = lambda a: (a / 16.0).reshape(-1, 1, 8, 8)  # noqa: E731
    return Split(img(s.x_train), s.y_train, img(s.x_test), s.y_test, s.n_classes)
