"""Imbalanced binary tasks (MNIST-1D one-vs-rest, make_classification, breast_cancer) and a non-IID client split.

Positives of the training and validation sets are subsampled to a target ratio p (notes §5: ≤ 10%); the test set
keeps its natural ratio (AUC does not depend on the class ratio). Clients: positives are shared out by a
Dirichlet(α) draw (some clients nearly positive-free), negatives evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from icml24.common import validate as v
from icml24.common.data import load_mnist1d, load_sklearn

__all__ = ["BinaryTask", "TASKS", "load_task", "dirichlet_split"]

TASKS = ("mnist1d", "make_classification", "breast_cancer")
_OWNER = "fed_auc.data"


@dataclass(frozen=True)
class BinaryTask:
    """Standardised float32 features, int64 labels in {0, 1}; ``imratio`` is the training positive ratio p."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    name: str

    @property
    def imratio(self) -> float:
        return float(self.y_train.float().mean())


def _subsample_positives(x: np.ndarray, y: np.ndarray, ratio: float, rng: np.random.Generator):
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    keep = max(1, int(round(ratio / (1 - ratio) * len(neg))))
    if keep < len(pos):
        pos = rng.choice(pos, size=keep, replace=False)
    idx = np.sort(np.concatenate([pos, neg]))
    return x[idx], y[idx]


def load_task(name: str, *, seed: int, imratio: float = 0.05, positive_class: int | tuple[int, ...] = 0,
              val_fraction: float = 0.2, label_noise: float = 0.0) -> BinaryTask:
    """An imbalanced binary task with a validation split.

    Args:
        name: ``mnist1d`` (class ``positive_class`` vs the rest; the published 4000/1000 series), ``make_classification``
            (notes §5: 40 features, 8 informative, 3 clusters per class, 6000 samples) or ``breast_cancer``
            (benign = positive).
        seed: seeds the validation split and the positive subsampling.
        imratio: target positive ratio p ∈ (0, 0.5] of the training and validation sets.
        positive_class: the MNIST-1D class (or classes, a tuple, e.g. ``(3, 5, 8)``) taken as positive.
        val_fraction: fraction of the training set held out for tuning.
        label_noise: MNIST-1D only: this fraction of the training and validation series get a uniformly drawn
            class (of 10) in place of their own before the binary labels are formed (the test set stays clean).
    """
    v.one_of(_OWNER, "name", name, TASKS)
    v.integer(_OWNER, "seed", seed, minimum=0)
    v.in_range(_OWNER, "imratio", imratio, 0.0, 0.5, low_open=True)
    v.in_range(_OWNER, "val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    rng = np.random.default_rng([seed, 11])
    v.in_range(_OWNER, "label_noise", label_noise, 0.0, 1.0, high_open=True)
    if label_noise > 0 and name != "mnist1d":
        raise ValueError(f"{_OWNER}: label_noise is defined for mnist1d only (a class redrawn among 10), got {name!r}")
    if name == "mnist1d":
        pcs = tuple(positive_class) if isinstance(positive_class, (tuple, list)) else (positive_class,)
        if not pcs or len(set(pcs)) != len(pcs) or len(pcs) > 9:
            raise ValueError(f"{_OWNER}: positive_class must be 1-9 distinct MNIST-1D classes, got {positive_class!r}")
        for c in pcs:
            v.integer(_OWNER, "positive_class", c, minimum=0, maximum=9)
        s = load_mnist1d(seed=seed, val_fraction=0.0)
        ctr = s.y_train.numpy().astype(np.int64).copy()
        if label_noise > 0:
            noisy = np.random.default_rng([seed, 17]).random(len(ctr)) < label_noise
            ctr[noisy] = np.random.default_rng([seed, 19]).integers(0, 10, size=int(noisy.sum()))
        xtr, ytr = s.x_train.numpy().astype(np.float64), np.isin(ctr, pcs).astype(np.int64)
        xte, yte = s.x_test.numpy().astype(np.float64), np.isin(s.y_test.numpy(), pcs).astype(np.int64)
    elif name == "make_classification":
        x, y = make_classification(n_samples=6000, n_features=40, n_informative=8, n_redundant=8,
                                   n_clusters_per_class=3, class_sep=0.8, flip_y=0.02, weights=[0.85, 0.15],
                                   random_state=1234)
        xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=1234, stratify=y)
    else:
        s = load_sklearn("breast_cancer", seed=1234, test_size=0.25, scale="none")
        xtr, ytr = s.x_train.numpy().astype(np.float64), s.y_train.numpy().astype(np.int64)
        xte, yte = s.x_test.numpy().astype(np.float64), s.y_test.numpy().astype(np.int64)
    xtr, xva, ytr, yva = train_test_split(xtr, ytr, test_size=val_fraction, random_state=seed, stratify=ytr)
    xtr, ytr = _subsample_positives(xtr, ytr, imratio, rng)
    xva, yva = _subsample_positives(xva, yva, imratio, rng)
    sc = StandardScaler().fit(xtr)
    f = lambda a: torch.as_tensor(sc.transform(a), dtype=torch.float32)  # noqa: E731
    g = lambda a: torch.as_tensor(a, dtype=torch.long)  # noqa: E731
    return BinaryTask(f(xtr), g(ytr), f(xva), g(yva), f(xte), g(yte), name)


def dirichlet_split(y: torch.Tensor, *, num_clients: int, alpha: float, seed: int) -> list[torch.Tensor]:
    """Indices of K clients: positives by a Dirichlet(α) draw of each client's share, negatives evenly (shuffled).

    Raises before compute when K < 1 or when some client would be left with no sample.
    """
    K = v.integer(_OWNER, "num_clients (K)", num_clients, minimum=1)
    v.positive(_OWNER, "alpha", alpha)
    y = v.tensor(_OWNER, "y", y, ndim=1)
    if len(y) < K:
        raise ValueError(f"{_OWNER}: {len(y)} samples cannot feed {K} clients (a client would have no data)")
    rng = np.random.default_rng([seed, 13])
    yn = y.cpu().numpy()
    pos, neg = rng.permutation(np.flatnonzero(yn == 1)), rng.permutation(np.flatnonzero(yn == 0))
    share = rng.dirichlet(np.full(K, float(alpha)))
    cuts = np.floor(np.cumsum(share)[:-1] * len(pos)).astype(int)
    pos_parts = np.split(pos, cuts)
    neg_parts = np.array_split(neg, K)
    parts = [np.sort(np.concatenate([p, n])) for p, n in zip(pos_parts, neg_parts, strict=True)]
    if any(len(p) == 0 for p in parts):
        raise ValueError(f"{_OWNER}: the split leaves a client with no data (K={K}, {len(y)} samples)")
    return [torch.as_tensor(p, dtype=torch.long) for p in parts]
