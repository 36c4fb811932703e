"""The hierarchical Bayesian linear model of meta-learning on sequences, solved in closed form.

"An Information-Theoretic Analysis of In-Context Learning" (Jeon, Lee, Lei & Van Roy, ICML 2024, arXiv 2401.15530;
official code: none, theory paper). The data-generating process and the decomposition (all in nats per token):

    ψ ~ N(0, σ_ψ² I_d),  θ_m | ψ ~ N(ψ, σ_θ² I_d)  (m = 1..M),  Z_{m,t} ~ N(0, I_d),  Y_{m,t} = θ_mᵀ Z_{m,t} + W,
    W ~ N(0, σ²);   L*_{M,T} − ½ln(2πeσ²) = I(H_{M,T}; ψ)/(MT)  +  I(H_{M,T}; θ_{1:M} | ψ)/(MT)
                                               [meta-learning error]   [intra-task error]

Given the inputs Z both terms are Gaussian log-determinants (A_m = Z_mᵀ Z_m):

    intra = Σ_m ½ ln det(I + σ_θ² A_m / σ²) / (MT),   meta = ½ ln det(I + σ_ψ² Σ_m (σ² I + σ_θ² A_m)⁻¹ A_m) / (MT).

The Bayes-optimal sequential predictor (a Kalman filter on θ_m inside a document and a precision-form update of the
ψ posterior between documents), the oracle-ψ predictor and the no-meta-learning predictor give each term a Monte Carlo
estimator: Bayes − oracle-ψ estimates the meta-learning error, oracle-ψ − (the true conditional) the intra-task error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from icml24.common import validate as v

__all__ = ["HierarchicalLinearModel", "LinearSample", "ErrorEstimate", "meta_learning_error", "intra_task_error",
           "no_meta_error", "dense_information", "asymptotic_meta_error", "asymptotic_intra_error",
           "kalman_nll", "psi_posterior", "bayes_nll", "oracle_psi_nll", "no_meta_nll", "true_nll", "estimate_errors",
           "irreducible_error"]

_OWNER = "icl_theory"
_LOG2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class LinearSample:
    """R independent draws of (ψ, θ_{1:M}, Z, Y): psi (R, d), theta (R, M, d), Z (R, M, T, d), Y (R, M, T)."""

    psi: np.ndarray
    theta: np.ndarray
    Z: np.ndarray
    Y: np.ndarray


@dataclass(frozen=True)
class HierarchicalLinearModel:
    """ψ ~ N(0, σ_ψ² I_d); θ_m | ψ ~ N(ψ, σ_θ² I_d); Z ~ N(0, I_d); Y = θ_mᵀZ + N(0, σ²).

    Args:
        d: input dimension d (>= 1).
        sigma_psi: σ_ψ, prior std of the meta parameter ψ (> 0).
        sigma_theta: σ_θ, std of the task parameters θ_m around ψ (> 0).
        sigma: σ, observation noise std (> 0).
    """

    d: int
    sigma_psi: float = 1.0
    sigma_theta: float = 0.5
    sigma: float = 1.0

    def __post_init__(self) -> None:
        v.integer(_OWNER, "d", self.d, minimum=1)
        for name in ("sigma_psi", "sigma_theta", "sigma"):
            v.positive(_OWNER, name, getattr(self, name))

    def sample(self, *, M: int, T: int, rng: np.random.Generator, reps: int = 1,
               psi: np.ndarray | None = None) -> LinearSample:
        """Draw ``reps`` independent data sets of M sequences of length T (ψ drawn per replicate unless given)."""
        M, T, reps = _check_mt(M, T, reps)
        d = self.d
        if psi is None:
            psi = self.sigma_psi * rng.standard_normal((reps, d))
        else:
            psi = np.broadcast_to(np.asarray(psi, dtype=float), (reps, d)).copy()
        theta = psi[:, None, :] + self.sigma_theta * rng.standard_normal((reps, M, d))
        Z = rng.standard_normal((reps, M, T, d))
        Y = np.einsum("rmtd,rmd->rmt", Z, theta) + self.sigma * rng.standard_normal((reps, M, T))
        return LinearSample(psi=psi, theta=theta, Z=Z, Y=Y)


def _check_mt(M: int, T: int, reps: int = 1) -> tuple[int, int, int]:
    return (v.integer(_OWNER, "M", M, minimum=1), v.integer(_OWNER, "T", T, minimum=1),
            v.integer(_OWNER, "reps", reps, minimum=1))


def _check_Z(Z: np.ndarray, d: int) -> np.ndarray:
    Z = np.asarray(Z, dtype=float)
    if Z.ndim < 2 or Z.shape[-1] != d:
        raise ValueError(f"{_OWNER}: Z must have shape (..., M, T, d={d}), got {Z.shape}")
    if Z.ndim == 2:  # a single sequence (T, d)
        Z = Z[None]
    return Z


def irreducible_error(model: HierarchicalLinearModel) -> float:
    """½ ln(2πe σ²): the per-token log-loss of the predictor that knows θ_m."""
    return 0.5 * (_LOG2PI + 1.0 + 2.0 * math.log(model.sigma))


def _gram(Z: np.ndarray) -> np.ndarray:
    return np.einsum("...ti,...tj->...ij", Z, Z)


def intra_task_error(model: HierarchicalLinearModel, Z: np.ndarray) -> np.ndarray:
    """Intra-task error given the inputs: I(Y; θ_{1:M} | ψ, Z)/(MT) = Σ_m ½ ln det(I + σ_θ² A_m/σ²)/(MT).

    Args:
        model: the world.
        Z: inputs of shape (..., M, T, d).

    Returns:
        An array of shape ``Z.shape[:-3]`` (a float array for a single (M, T, d) block).
    """
    Z = _check_Z(Z, model.d)
    M, T = Z.shape[-3], Z.shape[-2]
    A = _gram(Z)
    _, ld = np.linalg.slogdet(np.eye(model.d) + (model.sigma_theta / model.sigma) ** 2 * A)
    return 0.5 * ld.sum(-1) / (M * T)


def no_meta_error(model: HierarchicalLinearModel, Z: np.ndarray) -> np.ndarray:
    """Excess of the predictor that ignores other sequences: Σ_m ½ ln det(I + (σ_ψ²+σ_θ²) A_m/σ²)/(MT)."""
    Z = _check_Z(Z, model.d)
    M, T = Z.shape[-3], Z.shape[-2]
    A = _gram(Z)
    _, ld = np.linalg.slogdet(np.eye(model.d) + (model.sigma_psi ** 2 + model.sigma_theta ** 2)
                              / model.sigma ** 2 * A)
    return 0.5 * ld.sum(-1) / (M * T)


def meta_learning_error(model: HierarchicalLinearModel, Z: np.ndarray) -> np.ndarray:
    """Meta-learning error given the inputs: I(Y; ψ | Z)/(MT) = ½ ln det(I + σ_ψ² Σ_m Z_mᵀ C_m⁻¹ Z_m)/(MT).

    With C_m = σ_θ² Z_m Z_mᵀ + σ² I_T, Z_mᵀ C_m⁻¹ Z_m = (σ² I + σ_θ² A_m)⁻¹ A_m (push-through identity), so the cost
    is O(M d³) instead of O(M T³).
    """
    Z = _check_Z(Z, model.d)
    M, T = Z.shape[-3], Z.shape[-2]
    A = _gram(Z)
    eye = np.eye(model.d)
    F = np.linalg.solve(model.sigma ** 2 * eye + model.sigma_theta ** 2 * A, A).sum(-3)
    F = 0.5 * (F + np.swapaxes(F, -1, -2))
    _, ld = np.linalg.slogdet(eye + model.sigma_psi ** 2 * F)
    return 0.5 * ld / (M * T)


def dense_information(model: HierarchicalLinearModel, Z: np.ndarray) -> dict[str, float]:
    """Slow reference from the full MT×MT covariance of Y given Z (one data set, Z of shape (M, T, d)).

    Returns ``{"total", "meta", "intra"}`` per token: I(Y; ψ, θ | Z), I(Y; ψ | Z), I(Y; θ | ψ, Z), each / (MT),
    from ½ ln det of Cov(Y|Z) = σ_ψ² Z Zᵀ + σ_θ² blockdiag(Z_m Z_mᵀ) + σ² I and of its blocks.
    """
    Z = np.asarray(Z, dtype=float)
    if Z.ndim != 3 or Z.shape[-1] != model.d:
        raise ValueError(f"{_OWNER}: dense_information needs Z of shape (M, T, d={model.d}), got {Z.shape}")
    M, T, d = Z.shape
    X = Z.reshape(M * T, d)
    s2, st2, sp2 = model.sigma ** 2, model.sigma_theta ** 2, model.sigma_psi ** 2
    blocks = np.zeros((M * T, M * T))
    for m in range(M):
        sl = slice(m * T, (m + 1) * T)
        blocks[sl, sl] = st2 * Z[m] @ Z[m].T
    cond = blocks + s2 * np.eye(M * T)  # Cov(Y | ψ, Z)
    full = cond + sp2 * X @ X.T  # Cov(Y | Z)
    ld_full = np.linalg.slogdet(full)[1]
    ld_cond = np.linalg.slogdet(cond)[1]
    ld_noise = M * T * math.log(s2)
    n = M * T
    return {"total": 0.5 * (ld_full - ld_noise) / n, "meta": 0.5 * (ld_full - ld_cond) / n,
            "intra": 0.5 * (ld_cond - ld_noise) / n}


def asymptotic_meta_error(model: HierarchicalLinearModel, *, M: int, T: int) -> float:
    """(d/2) ln(1 + σ_ψ² M T / (σ² + σ_θ² T)) / (MT): the meta-learning error with A_m replaced by T·I."""
    M, T, _ = _check_mt(M, T)
    return 0.5 * model.d * math.log1p(model.sigma_psi ** 2 * M * T / (model.sigma ** 2 + model.sigma_theta ** 2 * T)) \
        / (M * T)


def asymptotic_intra_error(model: HierarchicalLinearModel, *, T: int) -> float:
    """(d/(2T)) ln(1 + σ_θ² T/σ²): the intra-task error with A_m = T·I; an upper bound on its mean (Jensen)."""
    T = v.integer(_OWNER, "T", T, minimum=1)
    return 0.5 * model.d * math.log1p(model.sigma_theta ** 2 * T / model.sigma ** 2) / T


# ------------------------------------------------------------------------------------------- sequential predictors
def kalman_nll(mu: np.ndarray, S: np.ndarray, Z: np.ndarray, Y: np.ndarray, sigma: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequential Gaussian predictive log-loss of a Bayesian linear regression, vectorised over a batch.

    Prior θ ~ N(mu, S); for t = 1..T the predictive is Y_t | past, Z_t ~ N(muᵀZ_t, Z_tᵀ S Z_t + σ²), then the
    posterior is updated (Kalman gain k = S Z_t / (Z_tᵀ S Z_t + σ²)).

    Args:
        mu: (B, d) prior means.  S: (B, d, d) prior covariances.  Z: (B, T, d) inputs.  Y: (B, T) targets.
        sigma: observation noise std σ.

    Returns:
        ``(nll, mu_T, S_T)``: per-step negative log predictive densities (B, T) in nats, and the posterior.
    """
    mu, S = mu.astype(float).copy(), S.astype(float).copy()
    B, T, _ = Z.shape
    nll = np.empty((B, T))
    s2 = sigma ** 2
    for t in range(T):
        z = Z[:, t]
        Sz = np.einsum("bij,bj->bi", S, z)
        var = np.einsum("bi,bi->b", z, Sz) + s2
        err = Y[:, t] - np.einsum("bi,bi->b", mu, z)
        nll[:, t] = 0.5 * (_LOG2PI + np.log(var) + err * err / var)
        k = Sz / var[:, None]
        mu += k * err[:, None]
        S -= k[:, :, None] * Sz[:, None, :]
    S = 0.5 * (S + np.swapaxes(S, 1, 2))
    return nll, mu, S


def true_nll(model: HierarchicalLinearModel, data: LinearSample) -> np.ndarray:
    """−ln p(Y_{m,t} | θ_m, Z_{m,t}) per token, (R, M, T): the realised irreducible loss."""
    err = data.Y - np.einsum("rmtd,rmd->rmt", data.Z, data.theta)
    return 0.5 * (_LOG2PI + 2.0 * math.log(model.sigma) + (err / model.sigma) ** 2)


def oracle_psi_nll(model: HierarchicalLinearModel, data: LinearSample) -> np.ndarray:
    """Per-token log-loss (R, M, T) of the predictor that knows ψ: θ_m ~ N(ψ, σ_θ² I) then BLR in the sequence."""
    R, M, T, d = data.Z.shape
    mu = np.repeat(data.psi, M, axis=0)
    S = np.broadcast_to(model.sigma_theta ** 2 * np.eye(d), (R * M, d, d))
    nll, _, _ = kalman_nll(mu, S, data.Z.reshape(R * M, T, d), data.Y.reshape(R * M, T), model.sigma)
    return nll.reshape(R, M, T)


def no_meta_nll(model: HierarchicalLinearModel, data: LinearSample) -> np.ndarray:
    """Per-token log-loss of the predictor that ignores every other sequence: θ_m ~ N(0, (σ_ψ²+σ_θ²) I)."""
    R, M, T, d = data.Z.shape
    mu = np.zeros((R * M, d))
    S = np.broadcast_to((model.sigma_psi ** 2 + model.sigma_theta ** 2) * np.eye(d), (R * M, d, d))
    nll, _, _ = kalman_nll(mu, S, data.Z.reshape(R * M, T, d), data.Y.reshape(R * M, T), model.sigma)
    return nll.reshape(R, M, T)


def psi_posterior(model: HierarchicalLinearModel, Z: np.ndarray, Y: np.ndarray,
                  prior: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Posterior N(mean, cov) of ψ after sequences Z (R, M, T, d), Y (R, M, T), in precision form.

    Each sequence adds Z_mᵀ C_m⁻¹ Z_m = (σ² I + σ_θ² A_m)⁻¹ A_m to the precision and (σ² I + σ_θ² A_m)⁻¹ Z_mᵀ Y_m to
    the precision-weighted mean. ``prior`` = (mean (R, d), cov (R, d, d)); N(0, σ_ψ² I) by default.
    """
    R, M, T, d = Z.shape
    eye = np.eye(d)
    if prior is None:
        P = np.broadcast_to(eye / model.sigma_psi ** 2, (R, d, d)).copy()
        h = np.zeros((R, d))
    else:
        P = np.linalg.inv(prior[1])
        h = np.einsum("rij,rj->ri", P, prior[0])
    A = _gram(Z)
    K = model.sigma ** 2 * eye + model.sigma_theta ** 2 * A
    P = P + np.linalg.solve(K, A).sum(1)
    h = h + np.linalg.solve(K, np.einsum("rmti,rmt->rmi", Z, Y)[..., None])[..., 0].sum(1)
    P = 0.5 * (P + np.swapaxes(P, 1, 2))
    cov = np.linalg.inv(P)
    return np.einsum("rij,rj->ri", cov, h), 0.5 * (cov + np.swapaxes(cov, 1, 2))


def bayes_nll(model: HierarchicalLinearModel, data: LinearSample) -> np.ndarray:
    """Per-token log-loss (R, M, T) of the Bayes-optimal predictor P(Y_{m,t} | D_{m−1}, H_t^{(m)}, Z_{m,t}).

    Sequence m starts from θ_m | D_{m−1} ~ N(μ_ψ, S_ψ + σ_θ² I) and runs a Kalman filter; the ψ posterior is then
    updated with the whole sequence (precision form, :func:`psi_posterior`).
    """
    R, M, T, d = data.Z.shape
    mean = np.zeros((R, d))
    cov = np.broadcast_to(model.sigma_psi ** 2 * np.eye(d), (R, d, d)).copy()
    out = np.empty((R, M, T))
    for m in range(M):
        out[:, m], _, _ = kalman_nll(mean, cov + model.sigma_theta ** 2 * np.eye(d), data.Z[:, m], data.Y[:, m],
                                     model.sigma)
        mean, cov = psi_posterior(model, data.Z[:, m:m + 1], data.Y[:, m:m + 1], prior=(mean, cov))
    return out


# ------------------------------------------------------------------------------------------- Monte Carlo estimator
@dataclass(frozen=True)
class ErrorEstimate:
    """Per-replicate values (nats per token) and their means / standard errors for one (M, T).

    ``excess_*``: cumulative log-loss of a predictor minus the realised irreducible loss, / (MT) (Monte Carlo);
    ``meta``, ``intra``, ``no_meta``: the closed forms given each replicate's Z.
    """

    M: int
    T: int
    values: dict[str, np.ndarray]

    def mean(self, key: str) -> float:
        return float(self.values[key].mean())

    def se(self, key: str) -> float:
        x = self.values[key]
        return float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")

    @property
    def n(self) -> int:
        return int(next(iter(self.values.values())).size)


def estimate_errors(model: HierarchicalLinearModel, *, M: int, T: int, reps: int, rng: np.random.Generator,
                    chunk: int = 64) -> ErrorEstimate:
    """Monte Carlo over ``reps`` independent worlds (ψ, θ, Z, Y): every predictor's excess and each closed form.

    Keys of ``values``: ``excess_bayes``, ``excess_oracle`` (MC intra-task error), ``excess_no_meta``,
    ``meta_mc`` (= excess_bayes − excess_oracle, the MC meta-learning error), ``meta``, ``intra``, ``no_meta``
    (closed forms given Z), ``decomp_gap`` (= excess_bayes − meta − intra, mean zero by the decomposition).
    """
    M, T, reps = _check_mt(M, T, reps)
    chunk = v.integer(_OWNER, "chunk", chunk, minimum=1)
    parts: dict[str, list[np.ndarray]] = {}
    n = M * T
    for start in range(0, reps, chunk):
        data = model.sample(M=M, T=T, rng=rng, reps=min(chunk, reps - start))
        irr = true_nll(model, data).sum((1, 2))
        vals = {
            "excess_bayes": (bayes_nll(model, data).sum((1, 2)) - irr) / n,
            "excess_oracle": (oracle_psi_nll(model, data).sum((1, 2)) - irr) / n,
            "excess_no_meta": (no_meta_nll(model, data).sum((1, 2)) - irr) / n,
            "meta": meta_learning_error(model, data.Z),
            "intra": intra_task_error(model, data.Z),
            "no_meta": no_meta_error(model, data.Z),
        }
        for k, x in vals.items():
            parts.setdefault(k, []).append(np.asarray(x, dtype=float))
    values = {k: np.concatenate(x) for k, x in parts.items()}
    values["meta_mc"] = values["excess_bayes"] - values["excess_oracle"]
    values["decomp_gap"] = values["excess_bayes"] - values["meta"] - values["intra"]
    return ErrorEstimate(M=M, T=T, values=values)
