"""Index sets and the real tensor trigonometric basis of [0,1]^d (:mod:`icml24.private_density`).

phi_0 = 1, phi_j(t) = sqrt2 cos(2 pi j t), phi_{-j}(t) = sqrt2 sin(2 pi j t), products over coordinates;
K_N = {|k|_inf <= N}; empirical coefficients theta_hat_k = (1/n) sum_i phi_k(X_i). Private records go through
:func:`clip_to_cube` (never a value check).
"""

from __future__ import annotations

import math

import numpy as np

from icml24.common import validate as v

__all__ = ["cube_index_set", "trig_basis", "trig_basis_1d", "empirical_coefficients", "clip_to_cube",
           "basis_size", "check_basis_size", "MAX_BASIS_SIZE", "grid_values"]

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
    keys = np.sort(_row_keys(k))
    if np.any(keys[1:] == keys[:-1]):
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
    """``x`` as a float64 array; refuses sparse and complex input (type / dtype checks, never a value check)."""
    try:
        import torch

        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(x, "tocsr") or type(x).__module__.startswith("scipy.sparse"):
        raise TypeError(f"{_P}: sparse input ({type(x).__name__}) is not supported; pass a dense array")
    a = np.asarray(x)
    if np.iscomplexobj(a):
        raise ValueError(f"{_P}: Complex data not supported (dtype {a.dtype}); pass real numbers")
    return np.asarray(a, dtype=np.float64)


def _as_points(x: object, name: str, dim: int | None) -> np.ndarray:
    """``x`` as a non-empty (n, d) float64 array (a 1-D array is n points in d=1); shape checks only (with
    scikit-learn's wording for empty data)."""
    a = _as_array(x)
    if a.ndim == 1 and dim in (None, 1):
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"{_P}: {name} must be a non-empty (n, d) array, got shape {np.shape(x)}")
    if a.shape[0] == 0:
        raise ValueError(f"{_P}: {name} has 0 sample(s) (shape={a.shape}) while a minimum of 1 is required.")
    if a.shape[1] == 0:
        raise ValueError(f"{_P}: {name} has 0 feature(s) (shape={a.shape}) while a minimum of 1 is required.")
    if dim is not None and a.shape[1] != dim:
        raise ValueError(f"{_P}: {name} has d={a.shape[1]} columns, expected d={dim}")
    return a


MAX_BASIS_SIZE = 2 ** 20
"""Default ``max_basis_size`` of the estimators: the largest bounding cube K_N, (2N + 1)^d coefficients, that
they accept (about 1e6; see :func:`check_basis_size`)."""

_BLOCK = 2 ** 22  # floats per work array (32 MiB): chunk sizes shrink as the basis grows


def basis_size(*, cutoff: int, dim: int) -> int:
    """|K_N| = (2N + 1)^d, the number of coefficients of the cube K_N in d dimensions (exact Python int)."""
    cutoff = v.integer(_P, "cutoff", cutoff, minimum=0)
    dim = v.integer(_P, "dim", dim, minimum=1)
    return (2 * cutoff + 1) ** dim


def check_basis_size(*, cutoff: int, dim: int, max_basis_size: int = MAX_BASIS_SIZE) -> int:
    """Refuse, before any computation, a cube K_N in d dimensions with more than ``max_basis_size``
    coefficients; returns |K_N| = (2N + 1)^d.

    A public-parameter check (N and d are public; the data's values play no part). The cost grows with
    |K_N|: the coefficients take n |K_N| multiply-adds, and the renormalised density (``density``,
    ``score_samples``, ``sample``) needs f_tilde on a grid of at least (2N + 2)^d points (one FFT); at
    (2N + 1)^d = 2^20 the grid alone holds 2^20 to 2^24 complex numbers. Raise ``max_basis_size`` to go further.

    Raises:
        ValueError: (2N + 1)^d > max_basis_size, naming both numbers.
    """
    limit = v.integer(_P, "max_basis_size", max_basis_size, minimum=1)
    size = basis_size(cutoff=cutoff, dim=dim)
    if size > limit:
        raise ValueError(f"{_P}: the basis K_{cutoff} in d={dim} has (2*{cutoff}+1)^{dim} = {size} coefficients, "
                         f"more than max_basis_size={limit}; use a smaller cutoff (or fewer dimensions), or raise "
                         f"max_basis_size if the memory and time allow (README, 'Cost')")
    return size


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
    return _basis_matrix(pts, k)


def _basis_matrix(pts: np.ndarray, k: np.ndarray) -> np.ndarray:
    """phi_k(x) for checked points ``(m, d)`` and a checked index set (no validation: internal)."""
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
    chunk_size = max(1, min(chunk_size, _BLOCK // w ** (d - 1)))  # the block's left table <= _BLOCK floats
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
        chunk_size: at most this many samples per block (fewer when the basis is large, so that a block
            holds at most 2^22 floats).
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
    chunk_size = max(1, min(chunk_size, _BLOCK // k.shape[0]))
    for s in range(0, pts.shape[0], chunk_size):
        acc += _basis_matrix(pts[s:s + chunk_size], k).sum(0)
    return acc / pts.shape[0]


def _nnz(k: np.ndarray) -> np.ndarray:
    return (k != 0).sum(1)


def _row_keys(k: np.ndarray) -> np.ndarray:
    """One sortable key per multi-index (an int64 when the bounding cube fits, else the rows as bytes)."""
    nmax = int(np.abs(k).max())
    w = 2 * nmax + 1
    if w ** k.shape[1] < 2 ** 62:
        return (k + nmax) @ (w ** np.arange(k.shape[1], dtype=np.int64))
    return np.ascontiguousarray(k, dtype=np.int64).view(np.dtype((np.void, 8 * k.shape[1]))).reshape(-1)


def _is_sign_symmetric(k: np.ndarray) -> bool:
    """Whether flipping the sign of any one coordinate maps the (repeat-free) index set onto itself."""
    rows = np.sort(_row_keys(k))
    for c in range(k.shape[1]):
        flipped = k.copy()
        flipped[:, c] *= -1
        if not np.array_equal(np.sort(_row_keys(flipped)), rows):
            return False
    return True


def grid_values(index_set: np.ndarray, coefficients: np.ndarray, m: int) -> np.ndarray:
    """f(t) = sum_k theta_k phi_k(t) on the midpoint grid t_j = (j + 1/2)/m of [0,1]^d (m^d points, first
    coordinate slowest, as ``meshgrid(indexing="ij")``), by one inverse FFT: needs m > 2 max|k|.

    Per axis the real basis goes to exponentials (sqrt2 cos 2 pi j t = (e^{2 pi i j t} + e^{-2 pi i j t})/sqrt2,
    sqrt2 sin 2 pi j t = (e^{2 pi i j t} - e^{-2 pi i j t})/(i sqrt2)), the half-cell shift is a phase
    e^{i pi f / m}, and f on the grid is m^d ifftn of the coefficients placed at the frequencies f mod m. Cost
    O(m^d log m^d) time and m^d complex numbers, against m^d |K| for evaluating the basis point by point.
    """
    k = np.asarray(index_set, dtype=np.int64)
    d = k.shape[1]
    nmax = int(np.abs(k).max())
    w = 2 * nmax + 1
    if m <= 2 * nmax:
        raise ValueError(f"{_P}: the grid needs m > 2 max|k| = {2 * nmax} points per axis, got m={m}")
    cube = np.zeros((w,) * d, dtype=np.complex128)
    cube[tuple((k + nmax).T)] = coefficients
    f = np.arange(-nmax, nmax + 1)
    cos_col, sin_col = np.abs(f) + nmax, -np.abs(f) + nmax  # columns of phi_{|f|} and phi_{-|f|}
    a = np.where(f == 0, 1.0, 1.0 / _SQRT2).astype(np.complex128)  # weight of the cos column
    b = np.where(f == 0, 0.0, -1j * np.sign(f) / _SQRT2)  # weight of the sin column
    phase = np.exp(1j * np.pi * f / m)
    for c in range(d):
        shape = [1] * d
        shape[c] = w
        cube = (np.take(cube, cos_col, axis=c) * (a * phase).reshape(shape)
                + np.take(cube, sin_col, axis=c) * (b * phase).reshape(shape))
    big = np.zeros((m,) * d, dtype=np.complex128)
    big[np.ix_(*([f % m] * d))] = cube
    return (np.fft.ifftn(big) * float(m) ** d).real.reshape(-1)
