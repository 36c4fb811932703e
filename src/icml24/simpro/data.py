"""Long-tailed semi-supervised data: class-count lists, the five unlabeled orderings, splits, and the data tiers.

* :func:`make_imb_data` reproduces the official ``make_imb_data`` class counts
  ``n_i = int(N_max · γ^{-i/(K-1)})`` (last class ``int(N_max/γ)``), and :func:`unlabeled_counts` reorders them into
  the paper's five unlabeled distributions (consistent, uniform, reversed, middle, head-tail).
* :func:`split_labeled_unlabeled` draws the labeled / unlabeled index sets per class from a pool.
* :class:`GaussianMixtureTier`: K Gaussian classes with unit covariance, where the Bayes posterior is known.
* :func:`mnist1d_augment`: batched weak / strong views of MNIST-1D series (shift, scale, noise, cutout).
* :func:`digits_augment`: batched weak / strong views of 8×8 digit images (translation; affine, jitter, noise,
  cutout), tensor ops only (no PIL, no flips: digits are not flip-invariant).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from icml24.common import validate as v

__all__ = ["DISTRIBUTIONS", "make_imb_data", "unlabeled_counts", "split_labeled_unlabeled", "GaussianMixtureTier",
           "gaussian_augment", "mnist1d_augment", "digits_augment"]

DISTRIBUTIONS: tuple[str, ...] = ("consistent", "uniform", "reversed", "middle", "head-tail")
_OWNER = "simpro"


def make_imb_data(*, max_num: int, num_classes: int, gamma: float, descending: bool = True) -> list[int]:
    """Per-class counts of an exponentially long-tailed set (official ``make_imb_data``).

    ``n_i = int(N_max · γ^{-i/(K-1)})`` for ``i < K-1`` and ``n_{K-1} = int(N_max / γ)``.

    Args:
        max_num: N_max, the count of the largest class.
        num_classes: K (>= 2).
        gamma: γ, the imbalance ratio N_max / N_min (>= 1; 1 gives a uniform set).
        descending: head class first (``True``) or the reversed list.

    Returns:
        The K class counts.
    """
    max_num = v.integer(_OWNER, "max_num", max_num, minimum=1)
    num_classes = v.integer(_OWNER, "num_classes", num_classes, minimum=2)
    gamma = v.finite(_OWNER, "gamma (imbalance ratio)", gamma)
    if gamma < 1:
        raise ValueError(f"{_OWNER}: gamma (imbalance ratio) must be >= 1, got {gamma!r}")
    mu = (1.0 / gamma) ** (1.0 / (num_classes - 1))
    counts = [int(max_num * mu**i) for i in range(num_classes - 1)] + [int(max_num / gamma)]
    if min(counts) < 1:
        raise ValueError(f"{_OWNER}: max_num={max_num} with gamma={gamma} leaves a class with zero samples "
                         f"({counts}); raise max_num or lower gamma")
    return counts if descending else counts[::-1]


def _order(name: str, k: int) -> list[int]:
    """Positions of the descending counts for the middle / head-tail orderings (official idx for K=10)."""
    evens, odds = list(range(0, k, 2)), list(range(1, k, 2))
    if name == "middle":  # head in the middle: [8,6,4,2,0,1,3,5,7,9] for K=10
        return evens[::-1] + odds
    return odds + evens[::-1]  # head-tail: [1,3,5,7,9,8,6,4,2,0] for K=10


def unlabeled_counts(*, distribution: str, max_num: int, num_classes: int, gamma: float) -> list[int]:
    """Unlabeled class counts in one of the five orderings of the paper (notes §2.7).

    Args:
        distribution: ``consistent`` (same order as the labeled set), ``uniform`` (γ_u = 1), ``reversed``,
            ``middle`` (head classes in the middle of the label order) or ``head-tail`` (head classes at both ends).
        max_num: M_1, the largest unlabeled class count.
        num_classes: K.
        gamma: γ_u (ignored for ``uniform``).
    """
    v.one_of(_OWNER, "distribution", distribution, DISTRIBUTIONS)
    if distribution == "uniform":
        return make_imb_data(max_num=max_num, num_classes=num_classes, gamma=1.0)
    desc = make_imb_data(max_num=max_num, num_classes=num_classes, gamma=gamma)
    if distribution == "consistent":
        return desc
    if distribution == "reversed":
        return desc[::-1]
    return [desc[i] for i in _order(distribution, num_classes)]


def split_labeled_unlabeled(y: torch.Tensor | np.ndarray, *, labeled: Sequence[int], unlabeled: Sequence[int],
                            seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw disjoint per-class labeled / unlabeled index sets from a pool with labels ``y``.

    Class c gets ``labeled[c]`` labeled and ``unlabeled[c]`` unlabeled indices, drawn without replacement from a
    seeded permutation of the pool's class-c indices (the official split takes the first ``n_l`` and the next
    ``n_u`` of each class).

    Raises:
        ValueError: a labeled count < 1 (every class needs a labeled sample), or a class too small for its counts.
    """
    y = np.asarray(y)
    k = len(labeled)
    if len(unlabeled) != k:
        raise ValueError(f"{_OWNER}: labeled and unlabeled count lists differ in length ({k} vs {len(unlabeled)})")
    if any(int(n) < 1 for n in labeled):
        raise ValueError(f"{_OWNER}: every class needs >= 1 labeled sample, got labeled counts {list(labeled)}")
    if any(int(n) < 0 for n in unlabeled):
        raise ValueError(f"{_OWNER}: unlabeled counts must be >= 0, got {list(unlabeled)}")
    rng = np.random.default_rng(seed)
    lab, unl = [], []
    for c in range(k):
        idx = np.flatnonzero(y == c)
        if len(idx) < labeled[c] + unlabeled[c]:
            raise ValueError(f"{_OWNER}: class {c} has {len(idx)} samples, fewer than {labeled[c]} labeled + "
                             f"{unlabeled[c]} unlabeled")
        idx = rng.permutation(idx)
        lab.append(idx[: labeled[c]])
        unl.append(idx[labeled[c]: labeled[c] + unlabeled[c]])
    return np.concatenate(lab), np.concatenate(unl)


class GaussianMixtureTier:
    """K Gaussian classes ``x | y ~ N(μ_y, I_D)`` with means ``μ_y ~ N(0, s² I)`` fixed by ``data_seed``.

    The class-conditional log-likelihoods are known in closed form, so the Bayes posterior under any prior π is
    ``softmax(log p(x|y) + log π)`` and the Bayes-optimal balanced accuracy is computable.
    """

    def __init__(self, *, num_classes: int = 10, dim: int = 10, mean_scale: float = 1.2, data_seed: int = 0) -> None:
        self.num_classes = v.integer("GaussianMixtureTier", "num_classes", num_classes, minimum=2)
        self.dim = v.integer("GaussianMixtureTier", "dim", dim, minimum=1)
        v.positive("GaussianMixtureTier", "mean_scale", mean_scale)
        g = torch.Generator().manual_seed(int(data_seed))
        self.means = mean_scale * torch.randn(self.num_classes, self.dim, generator=g, dtype=torch.float64)

    def sample(self, counts: Sequence[int], *, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``counts[c]`` points of class c (float32 features, int64 labels)."""
        y = torch.repeat_interleave(torch.arange(self.num_classes), torch.as_tensor(list(counts), dtype=torch.long))
        x = self.means[y] + torch.randn(len(y), self.dim, generator=generator, dtype=torch.float64)
        return x.float(), y

    def log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(x | y)`` for every class, shape ``(N, K)`` (float64)."""
        d2 = torch.cdist(x.double(), self.means) ** 2
        return -0.5 * d2 - 0.5 * self.dim * math.log(2 * math.pi)


def gaussian_augment(x: torch.Tensor, *, strong: bool, generator: torch.Generator, weak_std: float = 0.1,
                     strong_std: float = 0.5, drop: float = 0.2) -> torch.Tensor:
    """Gaussian-tier views (notes §5.1): weak = x + N(0, 0.1²); strong = x + N(0, 0.5²) and 20% feature dropout."""
    std = strong_std if strong else weak_std
    out = x + std * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    if strong and drop > 0:
        keep = torch.rand(x.shape, generator=generator, device=x.device) >= drop
        out = out * keep
    return out


def _shift(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Shift each series by ``s`` samples with edge replication, batched (x: (N, L))."""
    n, length = x.shape
    idx = (torch.arange(length, device=x.device)[None] - s[:, None]).clamp(0, length - 1)
    return x.gather(1, idx)


def mnist1d_augment(x: torch.Tensor, *, strong: bool, generator: torch.Generator) -> torch.Tensor:
    """MNIST-1D views on the final length-40 series (batched torch analogues of the generator's transforms).

    weak: shift by ±2 samples and iid noise σ = 0.02 (the generator's ``iid_noise_scale``).
    strong: shift by ±6, amplitude scale U(0.6, 1.4), correlated noise (σ = 0.25, smoothed, the generator's
    ``corr_noise_scale``), iid noise σ = 0.1 and a cutout of 8 consecutive samples.

    Args:
        x: series ``(N, L)`` or ``(N, L, 1)``.
    """
    squeeze = x.dim() == 3
    z = x.squeeze(-1) if squeeze else x
    n, length = z.shape
    dev = z.device
    rnd = lambda *shape: torch.rand(*shape, generator=generator, device=dev)  # noqa: E731
    nrm = lambda *shape: torch.randn(*shape, generator=generator, device=dev)  # noqa: E731
    m = 6 if strong else 2
    s = torch.floor(rnd(n) * (2 * m + 1)).long() - m
    z = _shift(z, s)
    if strong:
        z = z * (0.6 + 0.8 * rnd(n, 1))
        cn = torch.nn.functional.avg_pool1d(nrm(n, 1, length + 4), kernel_size=5, stride=1).squeeze(1)
        z = z + 0.25 * cn + 0.1 * nrm(n, length)
        start = torch.floor(rnd(n) * (length - 8 + 1)).long()
        pos = torch.arange(length, device=dev)[None]
        z = z.masked_fill((pos >= start[:, None]) & (pos < start[:, None] + 8), 0.0)
    else:
        z = z + 0.02 * nrm(n, length)
    return z.unsqueeze(-1) if squeeze else z


def _translate2d(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Shift each image of ``x`` (N, C, H, W) by integer ``(dy, dx)`` pixels, zero fill (pad, then crop)."""
    n, c, h, w = x.shape
    m = int(max(dy.abs().max().item(), dx.abs().max().item(), 0)) if n else 0
    xp = torch.nn.functional.pad(x, (m, m, m, m))
    rows = torch.arange(h, device=x.device)[None] + m - dy[:, None]  # (N, H)
    cols = torch.arange(w, device=x.device)[None] + m - dx[:, None]  # (N, W)
    ni = torch.arange(n, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return xp[ni, ci, rows[:, None, :, None], cols[:, None, None, :]]


def digits_augment(x: torch.Tensor, *, strong: bool, generator: torch.Generator, max_shift: int | None = None,
                   rotation: float = 20.0, shear: float = 0.2, jitter: float = 0.3, noise: float = 0.1,
                   cutout: int = 3) -> torch.Tensor:
    """Views of 8×8 digit images in [0, 1] (notes §5.2), batched; every draw comes from ``generator``.

    weak: random translation by up to ±1 pixel in each axis with zero fill (the pad-and-crop of FixMatch's weak
    view, without its horizontal flip). strong: translation by up to ±2 pixels composed with a random affine map
    (rotation ±``rotation`` degrees, shear ±``shear``; bilinear ``grid_sample``, zero padding), brightness and
    contrast jitter ±``jitter``, Gaussian noise σ = ``noise``, clipping to [0, 1], then a ``cutout``×``cutout``
    zero patch (the analogue of RandAugment n = 2 + Cutout).

    Args:
        x: images ``(N, 1, 8, 8)`` (any ``(N, C, H, W)`` works).
        strong: the strong view (else the weak one).
        generator: the torch generator of every random draw (same state, same views).
        max_shift: translation range in pixels (default 1 weak, 2 strong).
        rotation, shear, jitter, noise, cutout: strong-view magnitudes (``cutout=0`` disables the patch).
    """
    if x.dim() != 4:
        raise ValueError(f"{_OWNER}: digits_augment needs images (N, C, H, W), got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    dev = x.device
    rnd = lambda *shape: torch.rand(*shape, generator=generator, device=dev)  # noqa: E731
    m = (2 if strong else 1) if max_shift is None else int(max_shift)
    dy = torch.floor(rnd(n) * (2 * m + 1)).long() - m
    dx = torch.floor(rnd(n) * (2 * m + 1)).long() - m
    z = _translate2d(x, dy, dx)
    if not strong:
        return z
    ang = (2 * rnd(n) - 1) * math.radians(rotation)
    sh = (2 * rnd(n) - 1) * shear
    cos, sin = torch.cos(ang), torch.sin(ang)
    theta = torch.zeros(n, 2, 3, device=dev, dtype=x.dtype)
    theta[:, 0, 0], theta[:, 0, 1] = cos, -sin + sh * cos  # rotation · [[1, sh], [0, 1]]
    theta[:, 1, 0], theta[:, 1, 1] = sin, cos + sh * sin
    grid = torch.nn.functional.affine_grid(theta, [n, c, h, w], align_corners=False)
    z = torch.nn.functional.grid_sample(z, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    bright = (2 * rnd(n, 1, 1, 1) - 1) * jitter
    contrast = 1 + (2 * rnd(n, 1, 1, 1) - 1) * jitter
    mean = z.mean(dim=(1, 2, 3), keepdim=True)
    z = (z - mean) * contrast + mean + bright
    z = (z + noise * torch.randn(z.shape, generator=generator, device=dev, dtype=z.dtype)).clamp(0.0, 1.0)
    if cutout > 0:
        top = torch.floor(rnd(n) * (h - cutout + 1)).long()
        left = torch.floor(rnd(n) * (w - cutout + 1)).long()
        r = torch.arange(h, device=dev)[None, :, None]
        q = torch.arange(w, device=dev)[None, None, :]
        patch = ((r >= top[:, None, None]) & (r < top[:, None, None] + cutout)
                 & (q >= left[:, None, None]) & (q < left[:, None, None] + cutout))
        z = z.masked_fill(patch[:, None], 0.0)
    return z
