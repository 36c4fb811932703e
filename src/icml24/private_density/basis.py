"""Index sets and the real tensor trigonometric basis of [0,1]^d (:mod:`icml24.private_density`).

phi_0 = 1, phi_j(t) = sqrt2 cos(2 pi j t), phi_{-j}(t) = sqrt2 sin(2 pi j t), products over coordinates;
K_N = {|k|_inf <= N}; empirical coefficients theta_hat_k = (1/n) sum_i phi_k(X_i). Private records go through
:func:`clip_to_cube` (never a value check).
"""

from __future__ import annotations

import math

import numpy as np

from icml24.common import validate as v

__all__ = ["cube_index_set", "trig_basis", "trig_basis_1d", "empirical_coefficients", "clip_to_cube"]

_P = "private_density"
_SQRT2 = math.sqrt(2.0)


# ----------------------------------------------------------------------------------------------------------
# index sets and the basis
# ----------------------------------------------------------------------------------------------------------
def cube_index_set(*, cutoff: int, dim: int) -> np.ndarray:
    """K_N = {k in Z^d : |k|_inf <= N} as an ``((2N+1)^d, d)`` int array in lexicographic order (first
    coordinate slowest), the order used by every cube computation in this module."""
    cutoff = v.integer(_P, "cutoff", cutoff, minimum=0)
    dim = v.integer(_P, "dim", dim, minimum=1)
    axes = [np.arange(-cutoff, cutoff + 1)] * dim
    grid = np.meshgrid(*axes, indexing="ij")
    return np.stack([g.reshape(-1) for g in grid], axis=1).astype(np.int64)


def _check_index_set(index_set: object, dim: int | None = None) -> np.ndarray:
    k = np.asarray(index_set)
    if k.ndim != 2 or k.shape[0] == 0:
        raise ValueError(f"{_P}: index_set must be a non-empty (|K|, d) integer array, got shape {k.shape}")
    if not np.issubdtype(k.dtype, np.integer):
        raise TypeError(f"{_P}: index_set must hold integers, got dtype {k.dtype}")
    if dim is not None and k.shape[1] != dim:
        raise ValueError(f"{_P}: index_set has d={k.shape[1]} columns but the data has d={dim}")
    if len({tuple(r) for r in k.tolist()}) != k.shape[0]:
        raise ValueError(f"{_P}: index_set has repeated multi-indices")
    return k.astype(np.int64)


def clip_to_cube(x: object) -> np.ndarray:
    """The fixed rule applied to every private record before any release: non-finite entries are set to the
    cube centre 1/2, then every coordinate is clipped to [0, 1]. The identity on points of [0,1]^d.

    It is applied to every record whatever its value (no exception, warning or branch on a private value,
    since an exception is itself a data-dependent release) and maps every record into [0,1]^d, where the
    sensitivities :func:`l2_sensitivity` / :func:`l1_sensitivity` are computed; so the privacy guarantees hold
    for arbitrary inputs. Only the array's shape (a public fact) is checked.

    Args:
        x: ``(n, d)`` array (or ``(n,)`` for d = 1).
    """
    a = np.array(_as_array(x), dtype=np.float64)
    a[~np.isfinite(a)] = 0.5
    return np.clip(a, 0.0, 1.0)


def _as_array(x: object) -> np.ndarray:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    return np.asarray(x, dtype=np.float64)


def _as_points(x: object, name: str, dim: int | None) -> np.ndarray:
    """``x`` as a non-empty (n, d) float64 array (a 1-D array is n points in d=1); shape checks only."""
    a = _as_array(x)
    if a.ndim == 1 and dim in (None, 1):
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] == 0:
        raise ValueError(f"{_P}: {name} must be a non-empty (n, d) array, got shape {np.shape(x)}")
    if dim is not None and a.shape[1] != dim:
        raise ValueError(f"{_P}: {name} has d={a.shape[1]} columns, expected d={dim}")
    return a


def _check_private_points(x: object, name: str = "X", dim: int | None = None) -> np.ndarray:
    """Shape checks (public) on private samples, then :func:`clip_to_cube` (never a check on a value)."""
    return clip_to_cube(_as_points(x, name, dim))


def _check_points(x: object, name: str = "x", dim: int | None = None) -> np.ndarray:
    """Checks on public points (evaluation points): shape and values in [0,1]^d."""
    a = _as_points(x, name, dim)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{_P}: {name} contains NaN or infinite values")
    if a.min() < 0.0 or a.max() > 1.0:
        raise ValueError(f"{_P}: {name} must lie in [0,1]^d, got values in [{a.min():.4g}, {a.max():.4g}]")
    return a


def trig_basis_1d(t: np.ndarray, cutoff: int) -> np.ndarray:
    """Table ``T[i, j + N] = phi_j(t_i)`` for j = -N..N: phi_0 = 1, phi_j = sqrt2 cos(2 pi j t) (j > 0),
    phi_{-j} = sqrt2 sin(2 pi j t) (j > 0). Shape ``(len(t), 2N+1)``."""
    t = np.asarray(t, dtype=np.float64).reshape(-1)
    j = np.arange(1, cutoff + 1, dtype=np.float64)
    ang = 2.0 * np.pi * t[:, None] * j[None, :]
    out = np.empty((t.shape[0], 2 * cutoff + 1))
    out[:, cutoff] = 1.0
    out[:, cutoff + 1:] = _SQRT2 * np.cos(ang)
    out[:, :cutoff] = (_SQRT2 * np.sin(ang))[:, ::-1]  # column N - j holds phi_{-j}
    return out


def trig_basis(x: object, *, cutoff: int | None = None, index_set: object | None = None) -> np.ndarray:
    """phi_k(x) for every k in K (the cube K_N when ``cutoff`` is given), shape ``(m, |K|)``.

    phi_k(x) = prod_c phi_{k_c}(x_c) with the 1-D basis of :func:`trig_basis_1d`; on a sign-symmetric K
    (e.g. K_N), sum_k phi_k(x)^2 = |K| for every x.

    Args:
        x: points, ``(m, d)`` (or ``(m,)`` for d = 1) in [0,1]^d.
        cutoff: N for K = K_N (exclusive with ``index_set``).
        index_set: an explicit ``(|K|, d)`` integer array of multi-indices.
    """
    if (cutoff is None) == (index_set is None):
        raise ValueError(f"{_P}: give exactly one of cutoff or index_set")
    pts = _check_points(x)
    if cutoff is not None:
        k = cube_index_set(cutoff=cutoff, dim=pts.shape[1])
    else:
        k = _check_index_set(index_set, pts.shape[1])
    nmax = int(np.abs(k).max())
    out = np.ones((pts.shape[0], k.shape[0]))
    for c in range(pts.shape[1]):
        out *= trig_basis_1d(pts[:, c], nmax)[:, k[:, c] + nmax]
    return out


def _cube_coefficients(pts: np.ndarray, cutoff: int, chunk_size: int) -> np.ndarray:
    """(1/n) sum_i phi_k(X_i) on K_N via per-coordinate tables, a row-wise Khatri-Rao product of the first
    d-1 tables and one matrix product with the last (lexicographic order of :func:`cube_index_set`)."""
    n, d = pts.shape
    w = 2 * cutoff + 1
    acc = np.zeros((w ** (d - 1), w))
    for s in range(0, n, chunk_size):
        blk = pts[s:s + chunk_size]
        left = np.ones((blk.shape[0], 1))
        for c in range(d - 1):
            t = trig_basis_1d(blk[:, c], cutoff)
            left = (left[:, :, None] * t[:, None, :]).reshape(blk.shape[0], -1)
        acc += left.T @ trig_basis_1d(blk[:, d - 1], cutoff)
    return acc.reshape(-1) / n


def empirical_coefficients(x: object, *, cutoff: int | None = None, index_set: object | None = None,
                           chunk_size: int = 65536) -> np.ndarray:
    """theta_hat_k = (1/n) sum_i phi_k(X_i) for k in K (exact, chunked over samples; no n x |K| matrix is
    built for the cube K_N). Not private by itself: see :func:`privatize_coefficients`.

    Args:
        x: private samples ``(n, d)``; every row goes through :func:`clip_to_cube` (non-finite -> 1/2, then
            clipped to [0,1]^d), never a value check.
        cutoff: N for K = K_N (exclusive with ``index_set``).
        index_set: explicit ``(|K|, d)`` multi-indices.
        chunk_size: samples processed per block (memory bound).
    """
    if (cutoff is None) == (index_set is None):
        raise ValueError(f"{_P}: give exactly one of cutoff or index_set")
    chunk_size = v.integer(_P, "chunk_size", chunk_size, minimum=1)
    pts = _check_private_points(x, "x")
    if cutoff is not None:
        cutoff = v.integer(_P, "cutoff", cutoff, minimum=0)
        return _cube_coefficients(pts, cutoff, chunk_size)
    k = _check_index_set(index_set, pts.shape[1])
    acc = np.zeros(k.shape[0])
    for s in range(0, pts.shape[0], chunk_size):
        acc += trig_basis(pts[s:s + chunk_size], index_set=k).sum(0)
    return acc / pts.shape[0]


def _nnz(k: np.ndarray) -> np.ndarray:
    return (k != 0).sum(1)


def _is_sign_symmetric(k: np.ndarray) -> bool:
    rows = {tuple(r) for r in k.tolist()}
    for c in range(k.shape[1]):
        flipped = k.copy()
        flipped[:, c] *= -1
        if any(tuple(r) not in rows for r in flipped.tolist()):
            return False
    return True
