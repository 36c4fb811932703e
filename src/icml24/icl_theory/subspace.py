"""Linear representation learning (rank r = 1): the meta parameter is a direction, the task a coefficient along it.

"An Information-Theoretic Analysis of In-Context Learning" (arXiv 2401.15530), linear-representation example:

    B ~ Uniform(S^{d−1}),  w_m ~ N(0, σ_w²),  θ_m = B w_m,  Z_{m,t} ~ N(0, I_d),  Y_{m,t} = θ_mᵀ Z_{m,t} + N(0, σ²).

Given Z: intra = Σ_m ½ ln(1 + σ_w² BᵀA_m B/σ²)/(MT) (exact; ≈ ln(1 + σ_w²T/σ²)/(2T), independent of d) and
meta = I(Y; B | Z)/(MT) = E[ln p(Y | B, Z) − ln p(Y | Z)]/(MT), with p(Y | Z) the average of p(Y | b, Z) over a
quadrature of the sphere (the exact uniform grid on the half circle for d = 2, a Fibonacci grid for d = 3, uniform
random points for d > 3). Each sequence's likelihood needs only A_m = Z_mᵀZ_m, c_m = Z_mᵀY_m and ‖Y_m‖²
(matrix-determinant lemma: Cov(Y_m | b) = σ² I + σ_w² u uᵀ with u = Z_m b).
Expected rate (ours, derived): meta·MT ≈ (r(d − r)/2) ln(MT) + const, the dimension of the Grassmannian over 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from icml24.common import validate as v

__all__ = ["SubspaceLinearModel", "SubspaceEstimate", "sphere_grid", "subspace_log_likelihood",
           "estimate_subspace_errors"]

_OWNER = "icl_theory"
_LOG2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class SubspaceLinearModel:
    """B uniform on the unit sphere S^{d−1} (r = 1), w_m ~ N(0, σ_w²), θ_m = B w_m, Y = θ_mᵀZ + N(0, σ²).

    Args:
        d: ambient input dimension (>= 2).
        sigma_w: σ_w, std of the task coefficient (> 0).
        sigma: σ, observation noise std (> 0).
    """

    # NOTE(deviation): only rank r = 1 (a direction); the paper treats general r (Stiefel manifold).
    d: int
    sigma_w: float = 1.0
    sigma: float = 0.5

    def __post_init__(self) -> None:
        v.integer(_OWNER, "d", self.d, minimum=2)
        v.positive(_OWNER, "sigma_w", self.sigma_w)
        v.positive(_OWNER, "sigma", self.sigma)

    def sample(self, *, M: int, T: int, reps: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(B (R, d), w (R, M), Z (R, M, T, d), Y (R, M, T))``."""
        M = v.integer(_OWNER, "M", M, minimum=1)
        T = v.integer(_OWNER, "T", T, minimum=1)
        reps = v.integer(_OWNER, "reps", reps, minimum=1)
        B = rng.standard_normal((reps, self.d))
        B /= np.linalg.norm(B, axis=1, keepdims=True)
        w = self.sigma_w * rng.standard_normal((reps, M))
        Z = rng.standard_normal((reps, M, T, self.d))
        Y = np.einsum("rmtd,rd,rm->rmt", Z, B, w) + self.sigma * rng.standard_normal((reps, M, T))
        return B, w, Z, Y


def sphere_grid(*, d: int, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``n`` unit vectors spread over the sphere S^{d−1} (one per antipodal pair is enough: p(Y|b) = p(Y|−b)).

    d = 2: angles (k + ½)π/n, k < n (exact equal-weight quadrature of the half circle); d = 3: a Fibonacci grid;
    d > 3: ``n`` uniform random directions from ``rng``.
    """
    d = v.integer(_OWNER, "d", d, minimum=2)
    n = v.integer(_OWNER, "n", n, minimum=1)
    if d == 2:
        a = (np.arange(n) + 0.5) * math.pi / n
        return np.stack([np.cos(a), np.sin(a)], 1)
    if d == 3:
        k = np.arange(n) + 0.5
        zc = 1.0 - 2.0 * k / n
        phi = math.pi * (3.0 - math.sqrt(5.0)) * k
        rho = np.sqrt(1.0 - zc ** 2)
        return np.stack([rho * np.cos(phi), rho * np.sin(phi), zc], 1)
    if rng is None:
        raise ValueError(f"{_OWNER}: sphere_grid needs rng for d > 3 (random directions), got d={d}")
    g = rng.standard_normal((n, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def subspace_log_likelihood(model: SubspaceLinearModel, b: np.ndarray, A: np.ndarray, c: np.ndarray,
                            yy: np.ndarray, T: int) -> np.ndarray:
    """ln p(Y_m | b, Z_m) summed over sequences m, for each direction in ``b`` (G, d): returns (G,).

    Args:
        b: (G, d) unit directions.  A: (M, d, d) Gram matrices Z_mᵀZ_m.  c: (M, d) Z_mᵀY_m.  yy: (M,) ‖Y_m‖².
        T: sequence length.
    """
    s2, w2 = model.sigma ** 2, model.sigma_w ** 2
    d = model.d
    G, M = b.shape[0], A.shape[0]
    outer = (b[:, :, None] * b[:, None, :]).reshape(G, d * d)
    q = outer @ A.reshape(M, d * d).T  # bᵀ A_m b, (G, M)
    p = b @ c.T  # bᵀ Z_mᵀ Y_m
    den = s2 + w2 * q
    ll = -0.5 * (T * (_LOG2PI + math.log(s2)) + np.log(den / s2) + (yy[None, :] - w2 * p * p / den) / s2)
    return ll.sum(1)


def _log_mean_exp(x: np.ndarray) -> float:
    m = float(x.max())
    return m + math.log(float(np.mean(np.exp(x - m))))


@dataclass(frozen=True)
class SubspaceEstimate:
    """Per-replicate ``meta`` and ``intra`` (nats per token) of the rank-1 subspace model at one (M, T)."""

    M: int
    T: int
    meta: np.ndarray
    intra: np.ndarray

    @staticmethod
    def _se(x: np.ndarray) -> float:
        return float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")

    @property
    def meta_se(self) -> float:
        return self._se(self.meta)

    @property
    def intra_se(self) -> float:
        return self._se(self.intra)


def estimate_subspace_errors(model: SubspaceLinearModel, *, M: int, T: int, reps: int, grid: np.ndarray,
                             rng: np.random.Generator, chunk: int = 50_000) -> SubspaceEstimate:
    """Monte Carlo over ``reps`` worlds: meta = [ln p(Y|B,Z) − ln p(Y|Z)]/(MT) by quadrature, intra exact.

    Args:
        grid: (G, d) quadrature directions from :func:`sphere_grid` (equal weights).
        chunk: grid points evaluated at once (memory ~ chunk·M·8 bytes per array).
    """
    M = v.integer(_OWNER, "M", M, minimum=1)
    T = v.integer(_OWNER, "T", T, minimum=1)
    reps = v.integer(_OWNER, "reps", reps, minimum=1)
    grid = np.asarray(grid, dtype=float)
    if grid.ndim != 2 or grid.shape[1] != model.d:
        raise ValueError(f"{_OWNER}: grid must have shape (G, d={model.d}), got {grid.shape}")
    B, _, Z, Y = model.sample(M=M, T=T, reps=reps, rng=rng)
    meta, intra = np.empty(reps), np.empty(reps)
    for r in range(reps):
        A = np.einsum("mti,mtj->mij", Z[r], Z[r])
        c = np.einsum("mti,mt->mi", Z[r], Y[r])
        yy = (Y[r] ** 2).sum(1)
        true = subspace_log_likelihood(model, B[r][None], A, c, yy, T)[0]
        lls = np.concatenate([subspace_log_likelihood(model, grid[i:i + chunk], A, c, yy, T)
                              for i in range(0, grid.shape[0], chunk)])
        meta[r] = (true - _log_mean_exp(lls)) / (M * T)
        q = np.einsum("i,mij,j->m", B[r], A, B[r])
        intra[r] = 0.5 * np.log1p(model.sigma_w ** 2 * q / model.sigma ** 2).sum() / (M * T)
    return SubspaceEstimate(M=M, T=T, meta=meta, intra=intra)
