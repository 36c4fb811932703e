"""Optimal Differentially Private Model Training with Public Data (Lowy, Li, Huang, Razaviyayn; ICML 2024).

arXiv: 2306.15056 · official code: optimization-for-data-driven-science/DP-with-public-data (training only;
the mean-estimation and local-DP parts are not released there).

Mean estimation with ``n_pub`` public and ``n_priv`` private samples in the unit ball of R^d. Only the private
samples are protected ("semi-DP"). Central model, Gaussian mechanism on the private mean (replace-one
sensitivity 2/n_priv) and inverse-variance weighting with the public mean:

    mu_hat(r) = r * mean(X_pub) + (1 - r) * (mean(X_priv) + N(0, sigma^2 I)),
    MSE(r)    = r^2 v / n_pub + (1 - r)^2 (v / n_priv + d sigma^2),      v = E||x - mu||^2,
    r*        = Var_priv / (Var_pub + Var_priv).

Local model: private users send PrivUnitG reports z_i (Asi, Feldman, Talwar 2022), public users send x_i,
and the server forms the per-sample inverse-variance weighted average. The baselines are "throw away the
private data" (r = 1) and "treat the public data as private" (the same mechanism on all n samples).

Neighbouring relation: replace-one (data sets of the same public size n_priv that differ in one record), for
every estimator here. Private records are never checked: every private row x is first mapped by the fixed
rule :func:`sanitize_private_rows` (non-finite entries -> 0, then projection onto the unit ball), applied to
every row whatever its value, so each released statistic sees rows of norm <= 1 and the sensitivity 2/n
holds for any input; no exception, warning or branch depends on a private value (an exception would itself
be a data-dependent release). Shapes, dtypes and devices (public facts) are still checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy import optimize, special

from icml24.common import validate as val

__all__ = [
    "gaussian_noise_std",
    "project_to_unit_ball",
    "sanitize_private_rows",
    "central_variances",
    "optimal_public_weight",
    "central_mse",
    "throw_away_mean",
    "treat_as_private_mean",
    "private_only_mean",
    "weighted_mean",
    "PrivUnitGParams",
    "privunitg_params",
    "privunitg",
    "privunitg_mse",
    "ldp_weighted_mean",
    "ldp_treat_as_private_mean",
    "ldp_mse",
]

Mechanism = Literal["analytic", "classic"]


# --------------------------------------------------------------------------------------------- validation
def _check_tensor(x: torch.Tensor, name: str, where: str, *, min_rows: int = 1, private: bool = False) -> None:
    """Shape/dtype checks; values (NaN/inf) are checked only for public tensors (``private=False``)."""
    val.tensor(where, name, x, floating=True)
    if x.dim() < 2:
        raise ValueError(f"{where}: {name} must have shape (..., n, d), got {tuple(x.shape)}")
    if x.shape[-2] < min_rows:
        raise ValueError(f"{where}: {name} needs at least {min_rows} samples, got {x.shape[-2]}")
    if not private and not torch.isfinite(x).all():
        raise ValueError(f"{where}: {name} contains NaN or inf")


def _check_pair(x_priv: torch.Tensor, x_pub: torch.Tensor, where: str) -> None:
    _check_tensor(x_priv, "x_priv", where, private=True)
    _check_tensor(x_pub, "x_pub", where)
    if x_pub.shape[-1] != x_priv.shape[-1]:
        raise ValueError(f"{where}: public data has dimension {x_pub.shape[-1]} but private data has "
                         f"dimension {x_priv.shape[-1]}")
    if x_pub.shape[:-2] != x_priv.shape[:-2]:
        raise ValueError(f"{where}: x_pub batch shape {tuple(x_pub.shape[:-2])} != x_priv batch shape "
                         f"{tuple(x_priv.shape[:-2])}")
    if x_pub.device != x_priv.device:
        raise ValueError(f"{where}: x_pub is on {x_pub.device} but x_priv is on {x_priv.device}")


def _check_v(v: float | None, where: str) -> None:
    if v is not None:
        val.non_negative(where, "v", v)


# ------------------------------------------------------------------------------------------ central model
def gaussian_noise_std(*, sensitivity: float, epsilon: float, delta: float,
                       mechanism: Mechanism = "analytic") -> float:
    """Noise std σ of the Gaussian mechanism with L2 sensitivity Δ2 at (ε, δ)-DP.

    Args:
        sensitivity: Δ2 > 0, the L2 sensitivity of the released statistic.
        epsilon: ε > 0.
        delta: δ in (0, 1).
        mechanism: ``"analytic"`` (Balle & Wang 2018, Thm. 8: the smallest σ with
            Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) <= δ; valid for every ε > 0) or ``"classic"``
            (σ = Δ √(2 ln(1.25/δ)) / ε, Dwork & Roth Thm. A.1; only valid for ε <= 1).

    Returns:
        σ such that adding N(0, σ² I) is (ε, δ)-DP.
    """
    where = "gaussian_noise_std"
    val.privacy_budget(where, epsilon, delta)
    val.positive(where, "sensitivity", sensitivity)
    val.one_of(where, "mechanism", mechanism, ("analytic", "classic"))
    if mechanism == "classic":
        if epsilon > 1.0:
            raise ValueError(f"{where}: the classic Gaussian mechanism is only (ε, δ)-DP for epsilon <= 1, got "
                             f"{epsilon}; use mechanism='analytic'")
        return float(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)

    def log_delta_gap(log_s: float) -> float:
        s = math.exp(log_s)  # σ / Δ
        a, b = 1.0 / (2.0 * s) - epsilon * s, -1.0 / (2.0 * s) - epsilon * s
        d = special.ndtr(a) - math.exp(epsilon + special.log_ndtr(b))
        return d - delta

    lo, hi = math.log(1e-6), math.log(1e6)
    s = math.exp(optimize.brentq(log_delta_gap, lo, hi, xtol=1e-14, rtol=1e-12))
    # brentq brackets the root; step up until the guarantee holds exactly (δ(σ) is decreasing in σ)
    while log_delta_gap(math.log(s)) > 0:
        s *= 1.0 + 1e-12
    return float(s * sensitivity)


def project_to_unit_ball(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (shape (..., d)) scaled to L2 norm <= 1 (identity inside the ball)."""
    val.tensor("project_to_unit_ball", "x", x)
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1.0)


def sanitize_private_rows(x: torch.Tensor) -> torch.Tensor:
    """The fixed rule every private row goes through before any release: s(x) = Π_B(x with its non-finite
    entries set to 0), Π_B the projection onto the unit L2 ball (identity inside it).

    The rule is applied to every row whatever its value (no branch, warning or exception depends on a
    private value) and ||s(x)|| <= 1 for every x, so the replace-one L2 sensitivity of the mean of s(x_i) is
    2/n for arbitrary inputs. A row whose norm overflows to inf (e.g. 1e30 in float32) maps to 0, which is
    still in the ball. On rows already in the ball with finite entries s is the identity.

    Args:
        x: (..., d) floating tensor.
    """
    val.tensor("sanitize_private_rows", "x", x, floating=True)
    x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # one fused pass: non-finite entries -> 0
    norm = x.norm(dim=-1, keepdim=True)
    scaled = x / norm.clamp(min=1.0)
    return torch.where(torch.isfinite(norm), scaled, torch.zeros((), dtype=x.dtype, device=x.device))


def central_variances(*, n_pub: int, n_priv: int, dim: int, v: float, epsilon: float, delta: float,
                      mechanism: Mechanism = "analytic") -> tuple[float, float]:
    """(Var_pub, Var_priv): the MSEs of the public mean and of the noisy private mean.

    Var_pub = v / n_pub, Var_priv = v / n_priv + d σ², σ = ``gaussian_noise_std`` with Δ2 = 2 / n_priv.
    """
    where = "central_variances"
    for name, n in (("n_pub", n_pub), ("n_priv", n_priv), ("dim", dim)):
        val.integer(where, name, n, minimum=1)
    _check_v(v, where)
    sigma = gaussian_noise_std(sensitivity=2.0 / n_priv, epsilon=epsilon, delta=delta, mechanism=mechanism)
    return v / n_pub, v / n_priv + dim * sigma**2


def optimal_public_weight(*, var_pub: float, var_priv: float) -> float:
    """r* = Var_priv / (Var_pub + Var_priv), the minimiser of r² Var_pub + (1 − r)² Var_priv."""
    val.non_negative("optimal_public_weight", "var_pub", var_pub)
    val.non_negative("optimal_public_weight", "var_priv", var_priv)
    if var_pub + var_priv == 0:
        return 0.5
    return float(var_priv / (var_pub + var_priv))


def central_mse(*, estimator: Literal["throw_away", "treat_as_private", "private_only", "weighted"],
                n_pub: int, n_priv: int, dim: int, v: float, epsilon: float, delta: float,
                mechanism: Mechanism = "analytic", r: float | None = None) -> float:
    """Closed-form MSE E||mu_hat − mu||² of a central estimator, for i.i.d. data with E||x − mu||² = v.

    Args:
        estimator: ``throw_away`` (public mean), ``treat_as_private`` (Gaussian mechanism on the mean of all
            n = n_pub + n_priv samples, Δ2 = 2/n), ``private_only`` (noisy private mean) or ``weighted``
            (``r`` if given, else r* from the true ``v``).
        n_pub, n_priv, dim, v, epsilon, delta, mechanism: as in :func:`central_variances`.
        r: public weight in [0, 1] for ``weighted``.
    """
    where = "central_mse"
    val.one_of(where, "estimator", estimator, ("throw_away", "treat_as_private", "private_only", "weighted"))
    var_pub, var_priv = central_variances(n_pub=n_pub, n_priv=n_priv, dim=dim, v=v, epsilon=epsilon,
                                          delta=delta, mechanism=mechanism)
    if estimator == "throw_away":
        return var_pub
    if estimator == "private_only":
        return var_priv
    if estimator == "treat_as_private":
        n = n_pub + n_priv
        s = gaussian_noise_std(sensitivity=2.0 / n, epsilon=epsilon, delta=delta, mechanism=mechanism)
        return v / n + dim * s**2
    if r is None:
        r = optimal_public_weight(var_pub=var_pub, var_priv=var_priv)
    val.probability(where, "r", r)
    return r**2 * var_pub + (1 - r) ** 2 * var_priv


def throw_away_mean(x_pub: torch.Tensor) -> torch.Tensor:
    """Baseline "throw away the private data": the public mean (no privacy cost: private data unused).

    Args:
        x_pub: (..., n_pub, d) public samples.
    """
    _check_tensor(x_pub, "x_pub", "throw_away_mean")
    return x_pub.mean(dim=-2)


def _noisy_mean(x: torch.Tensor, sigma: float, generator: torch.Generator | None) -> torch.Tensor:
    m = x.mean(dim=-2)
    noise = torch.randn(m.shape, generator=generator, dtype=m.dtype, device=m.device)
    return m + sigma * noise


def treat_as_private_mean(x_priv: torch.Tensor, x_pub: torch.Tensor, *, epsilon: float, delta: float,
                          mechanism: Mechanism = "analytic",
                          generator: torch.Generator | None = None) -> torch.Tensor:
    """Baseline "treat the public data as private": Gaussian mechanism on the mean of all n samples.

    Privacy: (ε, δ)-DP w.r.t. every sample (hence w.r.t. X_priv) under replace-one adjacency, for any input:
    every row of x_priv and x_pub (all treated as private) goes through :func:`sanitize_private_rows`
    (non-finite entries -> 0, projection onto the unit ball), so Δ2 = 2/n; the noise must be fresh.

    Args:
        x_priv: (..., n_priv, d) private samples (rows outside the unit ball are projected onto it).
        x_pub: (..., n_pub, d) public samples, treated as private (same rule).
        epsilon, delta, mechanism: see :func:`gaussian_noise_std`.
        generator: torch generator for the noise (on the device of the inputs).
    """
    where = "treat_as_private_mean"
    val.privacy_budget(where, epsilon, delta)
    _check_pair(x_priv, x_pub, where)
    x = torch.cat([sanitize_private_rows(x_pub), sanitize_private_rows(x_priv)], dim=-2)
    sigma = gaussian_noise_std(sensitivity=2.0 / x.shape[-2], epsilon=epsilon, delta=delta, mechanism=mechanism)
    return _noisy_mean(x, sigma, generator)


def private_only_mean(x_priv: torch.Tensor, *, epsilon: float, delta: float, mechanism: Mechanism = "analytic",
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """Noisy private mean mean(X_priv) + N(0, σ² I), Δ2 = 2/n_priv.

    Privacy: (ε, δ)-DP w.r.t. X_priv (replace-one) for any input: the rows go through
    :func:`sanitize_private_rows` first (non-finite entries -> 0, projection onto the unit ball).
    """
    where = "private_only_mean"
    val.privacy_budget(where, epsilon, delta)
    _check_tensor(x_priv, "x_priv", where, private=True)
    x_priv = sanitize_private_rows(x_priv)
    sigma = gaussian_noise_std(sensitivity=2.0 / x_priv.shape[-2], epsilon=epsilon, delta=delta,
                               mechanism=mechanism)
    return _noisy_mean(x_priv, sigma, generator)


def _public_variance(x_pub: torch.Tensor, where: str) -> torch.Tensor:
    if x_pub.shape[-2] < 2:
        raise ValueError(f"{where}: estimating v from public data needs n_pub >= 2, got {x_pub.shape[-2]}; "
                         "pass v explicitly (v <= 1 holds for unit-ball data)")
    return x_pub.var(dim=-2, unbiased=True).sum(dim=-1)


def weighted_mean(x_priv: torch.Tensor, x_pub: torch.Tensor, *, epsilon: float, delta: float,
                  v: float | None = None, r: float | None = None, mechanism: Mechanism = "analytic",
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The semi-DP weighted estimator mu_hat = r mean(X_pub) + (1 − r)(mean(X_priv) + N(0, σ² I)).

    Privacy: (ε, δ)-DP w.r.t. X_priv for every fixed X_pub (semi-DP, replace-one adjacency) for any private
    input: every private row goes through :func:`sanitize_private_rows` (non-finite entries -> 0, projection
    onto the unit ball) before the mean, so Δ2 = 2/n_priv. The weight r depends on the public data and on
    (n, d, ε, δ) only, never on X_priv, so it is post-processing.

    Args:
        x_priv: (..., n_priv, d) private samples (the rule above is applied to every row).
        x_pub: (..., n_pub, d) public samples (same d).
        epsilon: ε > 0.
        delta: δ in (0, 1).
        v: E||x − mu||² used for the weight; ``None`` estimates it from x_pub (sum of coordinate sample
            variances, needs n_pub >= 2). Never estimated from private data.
        r: public weight in [0, 1]; ``None`` uses r* = Var_priv / (Var_pub + Var_priv).
        mechanism: Gaussian mechanism calibration, see :func:`gaussian_noise_std`.
        generator: torch generator for the noise.

    Returns:
        (mu_hat of shape (..., d), r of shape (...)).
    """
    where = "weighted_mean"
    val.privacy_budget(where, epsilon, delta)
    _check_pair(x_priv, x_pub, where)
    _check_v(v, where)
    if r is not None:
        val.probability(where, "r", r)
    x_priv = sanitize_private_rows(x_priv)
    n_pub, n_priv, d = x_pub.shape[-2], x_priv.shape[-2], x_pub.shape[-1]
    sigma = gaussian_noise_std(sensitivity=2.0 / n_priv, epsilon=epsilon, delta=delta, mechanism=mechanism)
    batch = x_pub.shape[:-2]
    if r is not None:
        rr = torch.full(batch, float(r), dtype=x_pub.dtype, device=x_pub.device)
    else:
        vv = (_public_variance(x_pub, where) if v is None
              else torch.full(batch, float(v), dtype=x_pub.dtype, device=x_pub.device))
        var_pub = vv / n_pub
        var_priv = vv / n_priv + d * sigma**2
        rr = var_priv / (var_pub + var_priv)
    mu_priv = _noisy_mean(x_priv, sigma, generator)
    mu_pub = x_pub.mean(dim=-2)
    return rr.unsqueeze(-1) * mu_pub + (1 - rr.unsqueeze(-1)) * mu_priv, rr


# -------------------------------------------------------------------------------------- local model (LDP)
@dataclass(frozen=True)
class PrivUnitGParams:
    """PrivUnitG parameters for one ε: p (prob. of the cap), q = P(N(0,1) >= γ), threshold γ, scale σ_G = 1/m."""

    epsilon: float
    p: float
    q: float
    gamma: float
    scale: float

    @property
    def second_moment_t(self) -> float:
        """E[t²] of the conditioned 1-D component t (mixture of two truncated normals)."""
        g = self.gamma
        phi = math.exp(-g * g / 2) / math.sqrt(2 * math.pi)
        cdf, sf = float(special.ndtr(g)), float(special.ndtr(-g))
        upper = 1.0 + g * phi / sf
        lower = 1.0 - g * phi / cdf
        return self.p * upper + (1.0 - self.p) * lower


def _privunitg_scale(p: float, epsilon: float) -> tuple[float, float, float]:
    # q = 1 / (1 + e^ε (1 − p)/p) = expit(logit(p) − ε), in log space: no overflow of e^ε for large ε
    log_q = float(special.log_expit(math.log(p / (1.0 - p)) - epsilon))
    q = math.exp(log_q)
    gamma = float(-special.ndtri_exp(log_q))  # γ = Φ^{-1}(1 − q), computed in the upper tail for precision
    log_phi = -gamma * gamma / 2 - 0.5 * math.log(2 * math.pi)
    # φ(γ)/(1 − Φ(γ)) and φ(γ)/Φ(γ) in log space (1 − Φ(γ) = q underflows for ε > ~700)
    m = (p * math.exp(log_phi - float(special.log_ndtr(-gamma)))
         - (1.0 - p) * math.exp(log_phi - float(special.log_ndtr(gamma))))
    return q, gamma, (1.0 / m if m > 0 else math.inf)


def privunitg_params(*, epsilon: float, p_grid: tuple[float, ...] | None = None) -> PrivUnitGParams:
    """Solve PrivUnitG's parameters for ε (Asi, Feldman, Talwar 2022, "Optimal algorithms for mean estimation
    under local differential privacy", Alg. PrivUnitG).

    For each p in ``p_grid`` (default 0.01, 0.02, ..., 0.99): q = 1 / (1 + e^ε (1 − p)/p), γ = Φ^{-1}(1 − q),
    m = φ(γ) (p / (1 − Φ(γ)) − (1 − p) / Φ(γ)), σ_G = 1/m; returns the p minimising σ_G. By construction
    p (1 − q) / (q (1 − p)) = e^ε, the density-ratio bound that makes the randomizer ε-LDP.
    """
    where = "privunitg_params"
    val.positive(where, "epsilon", epsilon)
    grid = p_grid if p_grid is not None else tuple(np.round(np.arange(1, 100) / 100.0, 2))
    best: PrivUnitGParams | None = None
    for p in grid:
        if not 0.0 < p < 1.0:
            raise ValueError(f"{where}: every p in p_grid must be in (0, 1), got {p}")
        q, gamma, scale = _privunitg_scale(float(p), float(epsilon))
        # q == 0 (ε > ~745) would make the sampler's cap unreachable: such a p is not usable
        if q > 0 and scale > 0 and math.isfinite(scale) and (best is None or scale < best.scale):
            best = PrivUnitGParams(float(epsilon), float(p), q, gamma, scale)
    if best is None:
        raise ValueError(f"{where}: no p in p_grid gives a positive scale for epsilon={epsilon}")
    return best


def privunitg(x: torch.Tensor, *, epsilon: float, generator: torch.Generator | None = None,
              params: PrivUnitGParams | None = None) -> torch.Tensor:
    """PrivUnitG ε-LDP randomizer applied to every row of ``x`` (shape (..., d), ||x|| <= 1); unbiased: E z = x.

    Rows with ||x|| < 1 are first rounded to ±x/||x|| with P(+) = (1 + ||x||)/2 (unbiased); a unit vector u is
    then mapped to z = σ_G (g − <g,u> u + t u) with g ~ N(0, I_d) and t ~ N(0,1) conditioned on t >= γ with
    probability p, on t < γ otherwise.

    Privacy: each output row is ε-LDP w.r.t. its input row (for any two inputs in the unit ball the output
    densities differ by at most e^ε = p(1 − q)/(q(1 − p))) for any input, given fresh randomness per report:
    every row first goes through :func:`sanitize_private_rows` (non-finite entries -> 0, projection onto the
    unit ball); nothing is raised on a row's value.

    Args:
        x: (..., d) private inputs, d >= 2.
        epsilon: ε > 0.
        generator: torch generator (on the device of ``x``).
        params: precomputed :func:`privunitg_params` for this ε (optional).
    """
    where = "privunitg"
    val.positive(where, "epsilon", epsilon)
    val.tensor(where, "x", x, floating=True)
    if x.dim() < 1 or x.shape[-1] < 2:
        raise ValueError(f"{where}: x must have shape (..., d) with d >= 2, got {tuple(x.shape)}")
    if params is None:
        params = privunitg_params(epsilon=epsilon)
    elif abs(params.epsilon - epsilon) > 1e-12:
        raise ValueError(f"{where}: params were solved for epsilon={params.epsilon}, not {epsilon}")
    x = sanitize_private_rows(x)
    kw = {"generator": generator, "dtype": x.dtype, "device": x.device}
    norm = x.norm(dim=-1, keepdim=True)
    u = x / norm.clamp(min=torch.finfo(x.dtype).tiny)
    # zero rows: any unit direction keeps E z = 0 once the sign is a fair coin
    e1 = torch.zeros_like(x)
    e1[..., 0] = 1.0
    u = torch.where(norm > 0, u, e1)
    sign = torch.where(torch.rand(norm.shape, **kw) < (1.0 + norm) / 2.0, 1.0, -1.0).to(x.dtype)
    u = sign * u
    g = torch.randn(x.shape, **kw)
    g_perp = g - (g * u).sum(-1, keepdim=True) * u
    uni = torch.rand(norm.shape, **kw).clamp(min=torch.finfo(x.dtype).tiny)
    in_cap = torch.rand(norm.shape, **kw) < params.p
    q = params.q
    t_up = -torch.special.ndtri(uni * q)  # t >= γ: −t ~ N(0,1) truncated to (−inf, −γ]
    t_low = torch.special.ndtri(uni * (1.0 - q))  # t < γ
    t = torch.where(in_cap, t_up, t_low)
    return params.scale * (g_perp + t * u)


def privunitg_mse(*, dim: int, epsilon: float, input_norm: float = 1.0) -> float:
    """E||z − x||² of :func:`privunitg` for an input of norm ``input_norm``: σ_G² (d − 1 + E t²) − ||x||²."""
    val.integer("privunitg_mse", "dim", dim, minimum=2)
    val.probability("privunitg_mse", "input_norm", input_norm)
    prm = privunitg_params(epsilon=epsilon)
    return prm.scale**2 * (dim - 1 + prm.second_moment_t) - input_norm**2


def ldp_treat_as_private_mean(reports: torch.Tensor) -> torch.Tensor:
    """Baseline "treat the public users as private": the mean of PrivUnitG reports of all n users.

    Privacy: ε-LDP for every user if every row of ``reports`` is a fresh :func:`privunitg` output.
    """
    _check_tensor(reports, "reports", "ldp_treat_as_private_mean")
    return reports.mean(dim=-2)


def ldp_weighted_mean(*, reports: torch.Tensor, x_pub: torch.Tensor, epsilon: float, v: float | None = None,
                      input_norm: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Semi-LDP server: per-sample inverse-variance weighting of public samples and private PrivUnitG reports,

        mu_hat = (Σ_pub x_i / v_pub + Σ_priv z_i / v_priv) / (n_pub / v_pub + n_priv / v_priv),
        v_pub = v, v_priv = v + E||z − x||² (:func:`privunitg_mse`).

    Privacy: ε-LDP for every private user (post-processing of the reports; the weights depend on public data
    and (d, ε) only), provided ``reports`` are fresh :func:`privunitg` outputs at this ε.

    Args:
        reports: (..., n_priv, d) PrivUnitG reports of the private users.
        x_pub: (..., n_pub, d) raw public samples.
        epsilon: ε the reports were produced with.
        v: E||x − mu||²; ``None`` estimates it from x_pub (needs n_pub >= 2).
        input_norm: ||x|| of the private inputs assumed by the variance of the reports (1 for unit data).

    Returns:
        (mu_hat (..., d), public weight r = (n_pub/v_pub) / (n_pub/v_pub + n_priv/v_priv) of shape (...)).
    """
    where = "ldp_weighted_mean"
    val.positive(where, "epsilon", epsilon)
    _check_pair(reports, x_pub, where)
    _check_v(v, where)
    n_pub, n_priv, d = x_pub.shape[-2], reports.shape[-2], x_pub.shape[-1]
    batch = x_pub.shape[:-2]
    vv = (_public_variance(x_pub, where) if v is None
          else torch.full(batch, float(v), dtype=x_pub.dtype, device=x_pub.device))
    vv = vv.clamp(min=1e-12)
    v_priv = vv + privunitg_mse(dim=d, epsilon=epsilon, input_norm=input_norm)
    w_pub, w_priv = n_pub / vv, n_priv / v_priv
    r = w_pub / (w_pub + w_priv)
    mu = r.unsqueeze(-1) * x_pub.mean(dim=-2) + (1 - r.unsqueeze(-1)) * reports.mean(dim=-2)
    return mu, r


def ldp_mse(*, estimator: Literal["throw_away", "treat_as_private", "weighted"], n_pub: int, n_priv: int,
            dim: int, v: float, epsilon: float, input_norm: float = 1.0) -> float:
    """Closed-form MSE of a semi-LDP estimator (data with E||x − mu||² = v, private inputs of norm ``input_norm``).

    throw_away: v / n_pub; treat_as_private: (v + V_R) / n with V_R = E||z − x||²;
    weighted: 1 / (n_pub / v + n_priv / (v + V_R)).
    """
    where = "ldp_mse"
    val.one_of(where, "estimator", estimator, ("throw_away", "treat_as_private", "weighted"))
    val.integer(where, "n_pub", n_pub, minimum=1)
    val.integer(where, "n_priv", n_priv, minimum=1)
    _check_v(v, where)
    vr = privunitg_mse(dim=dim, epsilon=epsilon, input_norm=input_norm)
    if estimator == "throw_away":
        return v / n_pub
    if estimator == "treat_as_private":
        return (v + vr) / (n_pub + n_priv)
    if v == 0:
        return 0.0
    return 1.0 / (n_pub / v + n_priv / (v + vr))
