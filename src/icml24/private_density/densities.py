"""Test densities with known coefficients and the closed-form MISE (:mod:`icml24.private_density`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np

from icml24.common import validate as v
from icml24.private_density.basis import (
    _P,
    _SQRT2,
    _check_index_set,
    _check_points,
    _nnz,
    cube_index_set,
    trig_basis,
    trig_basis_1d,
)
from icml24.private_density.privacy import Privacy, noise_variance

__all__ = ["TrigDensity", "expected_mise"]


# ----------------------------------------------------------------------------------------------------------
# densities with known coefficients
# ----------------------------------------------------------------------------------------------------------
def _coef_dict(true_coefs: object) -> dict[tuple[int, ...], float]:
    if isinstance(true_coefs, TrigDensity):
        return true_coefs.coefficient_dict()
    if isinstance(true_coefs, Mapping):
        return {tuple(int(v) for v in key): float(val) for key, val in true_coefs.items()}
    if isinstance(true_coefs, tuple) and len(true_coefs) == 2:
        k = _check_index_set(true_coefs[0])
        th = np.asarray(true_coefs[1], dtype=np.float64).reshape(-1)
        if th.shape[0] != k.shape[0]:
            raise ValueError(f"{_P}: true_coefs has {k.shape[0]} indices but {th.shape[0]} values")
        return {tuple(r): float(v) for r, v in zip(k.tolist(), th, strict=True)}
    raise TypeError(f"{_P}: true_coefs must be a TrigDensity, a {{multi-index: value}} mapping or an "
                    f"(index_set, values) pair, got {type(true_coefs).__name__}")


class TrigDensity:
    """A density on [0,1]^d that is a finite trigonometric series f = sum_{k in K} theta_k phi_k (theta_0 = 1).

    Args:
        index_set: ``(|K|, d)`` multi-indices, must contain 0.
        coefficients: theta_k, with theta_0 == 1 (unit mass).
    """

    def __init__(self, *, index_set: object, coefficients: object) -> None:
        k = _check_index_set(index_set)
        th = np.asarray(coefficients, dtype=np.float64).reshape(-1)
        if th.shape[0] != k.shape[0]:
            raise ValueError(f"{_P}: coefficients has {th.shape[0]} entries but index_set has {k.shape[0]}")
        if not np.all(np.isfinite(th)):
            raise ValueError(f"{_P}: coefficients contain NaN or infinite values")
        zero = np.flatnonzero(_nnz(k) == 0)
        if zero.size != 1 or abs(th[zero[0]] - 1.0) > 1e-12:
            raise ValueError(f"{_P}: a density needs theta_0 = 1 in its coefficients")
        self.index_set = k
        self.coefficients = th
        self.dim = k.shape[1]
        self.degree = int(np.abs(k).max())
        # sup_x |f(x) - 1| <= sum_{k != 0} |theta_k| sup|phi_k|
        nz = _nnz(k) > 0
        self.deviation_bound = float(np.sum(np.abs(th[nz]) * 2.0 ** (_nnz(k[nz]) / 2.0)))
        self.envelope = 1.0 + self.deviation_bound  # sup f <= envelope (certified unless set by sobolev("grid"))

    @classmethod
    def sobolev(cls, *, beta: float, dim: int, degree: int, seed: int, decay_excess: float = 0.0,
                floor: float = 0.2, scaling: Literal["bound", "grid"] = "bound") -> TrigDensity:
        """A random density of Sobolev smoothness "just" beta: theta_k = c s_k (1+|k|^2)^{-(beta/2 + d/4 +
        decay_excess)} on K_M with random signs s_k, so that sum_{|k|_inf > N} theta_k^2 ~ N^{-2 beta - 4
        decay_excess}.

        The scale c keeps f >= ``floor``: ``scaling="bound"`` uses the certified bound sum_{k != 0}
        |theta_k| sup|phi_k| = 1 - floor; ``"grid"`` sets min f = floor on a grid of 8M + 1 points per axis
        (a larger, uncertified signal; :meth:`sample` then checks f against its envelope at every proposal).

        Args:
            beta: smoothness beta > 0 (non-integer allowed).
            dim: d.
            degree: M, the truncation |k|_inf <= M.
            seed: seed of the random signs.
            decay_excess: extra decay exponent (0 gives bias exactly of order N^{-2 beta}).
            floor: lower bound of f, in (0, 1).
            scaling: "bound" or "grid".
        """
        beta = v.positive(_P, "beta", beta)
        degree = v.integer(_P, "degree", degree, minimum=1)
        floor = v.probability(_P, "floor", floor, open_low=True, open_high=True)
        v.non_negative(_P, "decay_excess", decay_excess)
        v.one_of(_P, "scaling", scaling, ("bound", "grid"))
        k = cube_index_set(cutoff=degree, dim=dim)
        rng = np.random.default_rng(seed)
        sq = (k.astype(np.float64) ** 2).sum(1)
        mag = (1.0 + sq) ** (-(beta / 2.0 + dim / 4.0 + decay_excess))
        th = mag * rng.choice([-1.0, 1.0], size=k.shape[0])
        nz = _nnz(k) > 0
        th[~nz] = 0.0
        if scaling == "bound":
            c = (1.0 - floor) / float(np.sum(np.abs(th[nz]) * 2.0 ** (_nnz(k[nz]) / 2.0)))
            envelope = None
        else:
            g = np.linspace(0.0, 1.0, 8 * degree + 1)
            mesh = np.meshgrid(*([g] * dim), indexing="ij")
            pts = np.stack([m.reshape(-1) for m in mesh], axis=1)
            vals = np.concatenate([trig_basis(pts[s:s + 16384], index_set=k) @ th
                                   for s in range(0, pts.shape[0], 16384)])
            c = (1.0 - floor) / float(-vals.min())
            envelope = 1.0 + 1.25 * c * float(np.abs(vals).max())
        th = th * c
        th[~nz] = 1.0
        out = cls(index_set=k, coefficients=th)
        if envelope is not None:
            out.envelope = envelope
        return out

    def coefficient_dict(self) -> dict[tuple[int, ...], float]:
        return {tuple(r): float(v) for r, v in zip(self.index_set.tolist(), self.coefficients, strict=True)}

    def coefficients_on(self, index_set: object) -> np.ndarray:
        """theta_k for each row of ``index_set`` (0 outside the support of the series)."""
        k = _check_index_set(index_set, self.dim)
        d = self.coefficient_dict()
        return np.array([d.get(tuple(r), 0.0) for r in k.tolist()])

    def pdf(self, x: object) -> np.ndarray:
        """f(x) for points ``(m, d)`` in [0,1]^d."""
        pts = _check_points(x, dim=self.dim)
        out = np.zeros(pts.shape[0])
        for s in range(0, pts.shape[0], 65536):
            out[s:s + 65536] = trig_basis(pts[s:s + 65536], index_set=self.index_set) @ self.coefficients
        return out

    def sample(self, n: int, *, rng: np.random.Generator) -> np.ndarray:
        """n iid draws by rejection from the uniform proposal with the envelope ``self.envelope`` >= sup f.

        Raises:
            RuntimeError: a proposal with f < 0 or f > envelope (the draw would not be exact).
        """
        n = v.integer(_P, "n", n, minimum=1)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"{_P}: rng must be a numpy Generator, got {type(rng).__name__}")
        bound = self.envelope
        out = np.empty((0, self.dim))
        while out.shape[0] < n:
            m = int(1.2 * bound * (n - out.shape[0])) + 64
            prop = rng.random((m, self.dim))
            fp = self._pdf_fast(prop)
            if fp.min() < 0.0 or fp.max() > bound:
                raise RuntimeError(f"{_P}: density value {fp.min():.4g}..{fp.max():.4g} outside [0, envelope="
                                   f"{bound:.4g}]; rejection sampling would be inexact")
            keep = rng.random(m) * bound <= fp
            out = np.concatenate([out, prop[keep]], axis=0)
        return out[:n]

    def _pdf_fast(self, pts: np.ndarray) -> np.ndarray:
        # cube support: sum_k theta_k prod_c T_c[:, k_c] via a matrix product on the last coordinate
        if self.index_set.shape[0] != (2 * self.degree + 1) ** self.dim:
            return self.pdf(pts)
        w = 2 * self.degree + 1
        theta = self.coefficients.reshape(w ** (self.dim - 1), w)
        out = np.empty(pts.shape[0])
        if self.dim == 1:
            # f = theta_0 + Re sum_{j>=1} sqrt2 (theta_j - i theta_{-j}) z^j, z = exp(2 i pi x), by Horner
            m = self.degree
            cj = _SQRT2 * (theta[0, m + 1:] - 1j * theta[0, :m][::-1])
            z = np.exp(2j * np.pi * pts[:, 0])
            acc = np.zeros(pts.shape[0], dtype=np.complex128)
            for j in range(m, 0, -1):
                acc += cj[j - 1]
                acc *= z
            return theta[0, m] + acc.real
        for s in range(0, pts.shape[0], 65536):
            blk = pts[s:s + 65536]
            left = np.ones((blk.shape[0], 1))
            for c in range(self.dim - 1):
                t = trig_basis_1d(blk[:, c], self.degree)
                left = (left[:, :, None] * t[:, None, :]).reshape(blk.shape[0], -1)
            out[s:s + 65536] = np.einsum("ij,ij->i", left @ theta, trig_basis_1d(blk[:, -1], self.degree))
        return out

    def second_moments(self, *, cutoff: int) -> np.ndarray:
        """E_f[phi_k(X)^2] for k in K_N (lexicographic order), exact: f phi_k^2 is a trigonometric polynomial
        of degree <= M + 2N per coordinate, so the rectangle rule on P = M + 2N + 1 points per axis is exact."""
        cutoff = v.integer(_P, "cutoff", cutoff, minimum=0)
        p = self.degree + 2 * cutoff + 1
        g = (np.arange(p) + 0.5) / p
        mesh = np.meshgrid(*([g] * self.dim), indexing="ij")
        f = self.pdf(np.stack([m.reshape(-1) for m in mesh], axis=1)).reshape((p,) * self.dim)
        sq = trig_basis_1d(g, cutoff) ** 2  # (P, 2N+1)
        out = f
        for _ in range(self.dim):
            out = np.tensordot(out, sq, axes=([0], [0]))  # contracts the leading grid axis, appends k axis
        return out.reshape(-1) / p ** self.dim

    def bias2(self, *, cutoff: int) -> float:
        """sum_{k not in K_N} theta_k^2 (the squared L2 bias of the projection on K_N)."""
        cutoff = v.integer(_P, "cutoff", cutoff, minimum=0)
        out = np.abs(self.index_set).max(1) > cutoff
        return float(np.sum(self.coefficients[out] ** 2))


def expected_mise(density: TrigDensity, *, cutoff: int, n: int, privacy: Privacy | None) -> dict[str, float]:
    """Closed form E||f_tilde_N - f||^2 = bias^2 + sum_{k in K_N, k != 0} Var(phi_k(X))/n + (|K_N|-1) E Z^2.

    Returns:
        ``{"mise", "bias2", "stat", "priv"}``.
    """
    if not isinstance(density, TrigDensity):
        raise TypeError(f"{_P}: density must be a TrigDensity, got {type(density).__name__}")
    n = v.integer(_P, "n", n, minimum=1)
    k = cube_index_set(cutoff=cutoff, dim=density.dim)
    nz = _nnz(k) > 0
    theta = density.coefficients_on(k)
    var = density.second_moments(cutoff=cutoff) - theta ** 2
    bias2 = density.bias2(cutoff=cutoff)
    stat = float(np.sum(var[nz])) / n
    priv = float(nz.sum()) * noise_variance(k, n=n, privacy=privacy)
    return {"mise": bias2 + stat + priv, "bias2": bias2, "stat": stat, "priv": priv}
