"""Non-smooth non-convex test objective, the exponential-scaling identity, and a (c, ε)-stationarity bound.

For s ~ Exp(1) and any F differentiable along the ray (integration by parts of ∫₀^∞ e^{-s} dF(x + sΔ)):

    E_s[F(x + sΔ)] - F(x) = E_s[<∇F(x + sΔ), Δ>]

(c, ε)-stationarity (Zhang & Cutkosky 2024): ‖∇F(x)‖_c = inf_{P: E_P[y]=x} ‖E_P ∇F(y)‖ + c E_P‖y - x‖².
Any distribution P with mean x gives an upper bound; we use symmetric (hence exactly mean-x) Gaussian clouds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from icml24.common import validate as v

__all__ = ["NonsmoothObjective", "IdentityEstimate", "SCALINGS", "scaling_identity_gap", "stationarity_upper_bound"]

SCALINGS = ("exponential", "one", "uniform", "uniform2", "per_coordinate")


class NonsmoothObjective:
    r"""``F(x) = mean_i |a_iᵀx - b_i| + α Σ_j relu(c_jᵀx) sin(x_j)``: Lipschitz, non-smooth, non-convex.

    ``A ∈ R^{n×d}`` and ``b`` are standard normal, ``C ∈ R^{d×d}`` has rows ``N(0, I/d)``; all drawn from
    ``seed``. Evaluates batches: ``x`` of shape ``(..., d)`` gives ``(...)``.

    Args:
        dim: d, the dimension.
        num_rows: n, rows of the absolute-loss part.
        alpha: α, weight of the non-convex ReLU·sin part.
        seed: seed of A, b, C.
        device: device of the data.
        dtype: floating dtype of the data.
    """

    def __init__(self, *, dim: int = 20, num_rows: int = 40, alpha: float = 0.5, seed: int = 0,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> None:
        v.integer("exp_sgdm", "dim", dim, minimum=1)
        v.integer("exp_sgdm", "num_rows", num_rows, minimum=1)
        v.non_negative("exp_sgdm", "alpha", alpha)
        g = torch.Generator().manual_seed(seed)
        self.dim, self.alpha = dim, float(alpha)
        self.A = torch.randn(num_rows, dim, generator=g, dtype=dtype).to(device)
        self.b = torch.randn(num_rows, generator=g, dtype=dtype).to(device)
        self.C = (torch.randn(dim, dim, generator=g, dtype=dtype) / math.sqrt(dim)).to(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"exp_sgdm: x must end in dimension {self.dim}, got shape {tuple(x.shape)}")
        x = x.to(self.A.dtype)
        fit = (x @ self.A.T - self.b).abs().mean(-1)
        return fit + self.alpha * (torch.relu(x @ self.C.T) * torch.sin(x)).sum(-1)

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        """∇F at each row of ``x`` in closed form (the kinks have measure zero; there sign(0) = 0 and relu'(0) = 0).

        ``∇F(x) = Aᵀ sign(Ax - b) / n + α [Cᵀ(1[Cx > 0] ⊙ sin x) + relu(Cx) ⊙ cos x]``.
        """
        if x.shape[-1] != self.dim:
            raise ValueError(f"exp_sgdm: x must end in dimension {self.dim}, got shape {tuple(x.shape)}")
        x = x.detach().to(self.A.dtype)
        fit = torch.sign(x @ self.A.T - self.b) @ self.A / self.A.shape[0]
        cx = x @ self.C.T
        return fit + self.alpha * (((cx > 0).to(x.dtype) * torch.sin(x)) @ self.C + torch.relu(cx) * torch.cos(x))


@dataclass(frozen=True)
class IdentityEstimate:
    """Monte-Carlo check of ``E[F(x+sΔ)] - F(x) - E[<∇F(x+sΔ), Δ>] = 0``: paired mean and its standard error."""

    mean: float
    se: float
    lhs: float
    rhs: float
    num_samples: int

    @property
    def z(self) -> float:
        """mean / se: how many standard errors the paired estimate is from zero.

        With ``se == 0`` (all paired draws equal): ``±inf`` with the sign of ``mean``, or ``0.0`` if ``mean == 0``.
        """
        if self.se > 0:
            return self.mean / self.se
        return math.copysign(math.inf, self.mean) if self.mean else 0.0


def scaling_identity_gap(f: NonsmoothObjective, x: torch.Tensor, delta: torch.Tensor, *, num_samples: int,
                         generator: torch.Generator, scaling: str = "exponential") -> IdentityEstimate:
    """Paired estimate of ``E_s[F(x+sΔ) - F(x) - <∇F(x+sΔ), Δ>]`` (zero for s ~ Exp(1)).

    Args:
        f: the objective.
        x: base point, shape ``(d,)``.
        delta: direction Δ, shape ``(d,)``.
        num_samples: M, Monte-Carlo draws of s.
        generator: source of the draws.
        scaling: ``"exponential"`` (the identity) or a negative control, for which the expectation is not
            zero in general: ``"one"`` (s ≡ 1), ``"uniform"`` (s ~ U[0,1], original O2NC's draw),
            ``"uniform2"`` (s ~ U[0,2]: mean 1 like Exp(1), but not exponential) or ``"per_coordinate"``
            (an independent Exp(1) draw per coordinate, ``y = x + s ⊙ Δ``: no longer a move along one ray).
    """
    v.integer("exp_sgdm", "num_samples", num_samples, minimum=2)
    v.one_of("exp_sgdm", "scaling", scaling, SCALINGS)
    if x.shape != (f.dim,) or delta.shape != (f.dim,):
        raise ValueError(f"exp_sgdm: x and delta must have shape ({f.dim},), got {tuple(x.shape)}, "
                         f"{tuple(delta.shape)}")
    dt, dev = f.A.dtype, f.A.device
    gd = generator.device
    if scaling == "exponential":
        s = torch.empty(num_samples, 1, dtype=dt, device=gd).exponential_(1.0, generator=generator)
    elif scaling == "per_coordinate":
        s = torch.empty(num_samples, f.dim, dtype=dt, device=gd).exponential_(1.0, generator=generator)
    elif scaling == "uniform":
        s = torch.rand(num_samples, 1, dtype=dt, device=gd, generator=generator)
    elif scaling == "uniform2":
        s = 2.0 * torch.rand(num_samples, 1, dtype=dt, device=gd, generator=generator)
    else:  # "one"
        s = torch.ones(num_samples, 1, dtype=dt)
    x, delta, s = x.to(dev, dt), delta.to(dev, dt), s.to(dev)
    y = x + s * delta
    df = f(y) - f(x)
    inner = f.grad(y) @ delta
    paired = df - inner
    return IdentityEstimate(mean=float(paired.mean()), se=float(paired.std() / math.sqrt(num_samples)),
                            lhs=float(df.mean()), rhs=float(inner.mean()), num_samples=num_samples)


def stationarity_upper_bound(f: NonsmoothObjective, x: torch.Tensor, *, c: float = 1.0,
                             sigmas: Sequence[float] = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0),
                             num_samples: int = 2048, generator: torch.Generator) -> tuple[float, float]:
    """Upper bound on ‖∇F(x)‖_c: min over σ of ``‖mean ∇F(y_k)‖ + c mean‖y_k - x‖²`` with ``y = x ± σ z_k``.

    The cloud ``{x + σz_k, x - σz_k}`` has mean exactly x, so every σ gives a valid bound (no MC bias);
    σ = 0 gives ‖∇F(x)‖.

    Args:
        f: the objective.
        x: the point, shape ``(d,)``.
        c: the (c, ε)-stationarity constant.
        sigmas: radii tried (0 allowed).
        num_samples: K, pairs of points per radius.
        generator: source of z.

    Returns:
        ``(bound, best_sigma)``.

    Raises:
        ValueError: ``c`` not finite and > 0, a σ not finite and >= 0, ``num_samples < 1``, non-finite ``x``.
    """
    v.positive("exp_sgdm", "c", c)
    v.each("exp_sgdm", "sigmas", tuple(sigmas), v.non_negative)
    v.integer("exp_sgdm", "num_samples", num_samples, minimum=1)
    dt, dev = f.A.dtype, f.A.device
    x = x.detach().to(dev, dt).reshape(f.dim)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("exp_sgdm: x must be finite (NaN/inf would make every bound NaN)")
    z = torch.randn(num_samples, f.dim, dtype=dt, device=generator.device, generator=generator).to(dev)
    z = torch.cat([z, -z])
    best, best_sigma = math.inf, 0.0
    for sigma in sigmas:
        y = x + sigma * z
        val = float(f.grad(y).mean(0).norm()) + c * sigma**2 * float((z**2).sum(-1).mean())
        if val < best:
            best, best_sigma = val, float(sigma)
    return best, best_sigma
