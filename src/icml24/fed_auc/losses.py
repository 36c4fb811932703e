"""AUC-margin (AUC-M) min-max square loss and the (multi-level) compositional AUC objective, written from the formulas.

AUC-M (Yuan et al., ICCV 2021; LibAUC ``AUCMLoss``), scores h ∈ [0, 1], positive ratio p, margin m:

    v1: F(w,a,b,α; z) = (1−p)(h−a)² 1[y=1] + p(h−b)² 1[y=0] + 2α(p(1−p)m + p·h·1[y=0] − (1−p)·h·1[y=1]) − p(1−p)α²
    v2: f = E_+[(h−a)²] + E_−[(h−b)²] + 2α(m + E_−[h] − E_+[h]) − α²

min over (w, a, b), max over α ≥ 0. At the optimum a = E_+[h], b = E_−[h] and α* = max(0, m + b − a).

Compositional AUC (Yuan et al., ICLR 2022; notes §2.2), L levels: u_1(w) = w − η0∇L_CE(w),
u_l = u_{l−1} − η0∇L_CE(u_{l−1}), objective f(u_{L−1}(w), a, b, α) (L = 2 is the two-level LocalSCGDAM objective).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from icml24.common import validate as v

__all__ = ["aucm_loss", "aucm_optimal_ab", "aucm_optimal_alpha", "inner_ce_map", "compositional_auc_objective"]

_OWNER = "fed_auc"


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # E over the masked class; an absent class contributes 0 (no division by zero; notes §8 last bullet)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def aucm_loss(scores: torch.Tensor, labels: torch.Tensor, *, a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor,
              margin: float = 1.0, imratio: float | None = None, version: str = "v1") -> torch.Tensor:
    """AUC-M min-max square loss f(w, a, b, α) on a batch.

    Args:
        scores: h_w(x) ∈ [0, 1], shape ``(N,)`` or ``(N, 1)``.
        labels: y ∈ {0, 1}, same length.
        a, b: class-mean proxies (primal variables, scalar tensors).
        alpha: dual variable α ≥ 0 (scalar tensor).
        margin: m > 0.
        imratio: p, the positive ratio, required for ``v1`` (a fixed public number, e.g. the federation's);
            ignored by ``v2``.
        version: ``"v1"`` (with the prior p, an expectation over all samples) or ``"v2"`` (class-conditional means;
            a class absent from the batch contributes 0).

    Returns:
        The scalar loss. ``v2`` uses the corrected cross term E_−[h] − E_+[h] (LibAUC issue #74 divides by N).
    """
    v.one_of(_OWNER, "version", version, ("v1", "v2"))
    v.positive(_OWNER, "margin", margin)
    h = scores.reshape(-1)
    y = labels.reshape(-1).to(h.dtype)
    v.same_length(_OWNER, ("scores", "labels"), h.shape[0], y.shape[0])
    pos, neg = y, 1.0 - y
    if version == "v1":
        if imratio is None:
            raise ValueError(f"{_OWNER}: imratio (p) is required for version 'v1'")
        p = v.in_range(_OWNER, "imratio", imratio, 0.0, 1.0, low_open=True, high_open=True)
        return ((1 - p) * ((h - a) ** 2 * pos).mean() + p * ((h - b) ** 2 * neg).mean()
                + 2 * alpha * (p * (1 - p) * margin + (p * h * neg - (1 - p) * h * pos).mean())
                - p * (1 - p) * alpha ** 2)
    return (_masked_mean((h - a) ** 2, pos) + _masked_mean((h - b) ** 2, neg)
            + 2 * alpha * (margin + _masked_mean(h, neg) - _masked_mean(h, pos)) - alpha ** 2)


def aucm_optimal_ab(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form minimisers of f over (a, b) for fixed scores: the class means (E_+[h], E_−[h])."""
    h, y = scores.reshape(-1), labels.reshape(-1).to(scores.dtype)
    return _masked_mean(h, y), _masked_mean(h, 1.0 - y)


def aucm_optimal_alpha(*, a: torch.Tensor | float, b: torch.Tensor | float, margin: float = 1.0) -> torch.Tensor:
    """Closed-form maximiser of f over α ≥ 0 at a = E_+[h], b = E_−[h]: α* = max(0, m + b − a)."""
    v.positive(_OWNER, "margin", margin)
    return torch.clamp(torch.as_tensor(margin + b - a), min=0.0)


def inner_ce_map(w: torch.Tensor, ce: Callable[[torch.Tensor], torch.Tensor], *, eta0: float,
                 create_graph: bool = False) -> torch.Tensor:
    """One inner level u(w) = w − η0 ∇L_CE(w) for flat weights ``w`` and a CE function of them."""
    v.non_negative(_OWNER, "eta0", eta0)
    w = w if w.requires_grad else w.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(ce(w), w, create_graph=create_graph)
    return w - eta0 * g


def compositional_auc_objective(w: torch.Tensor, *, ce: Callable[[torch.Tensor], torch.Tensor],
                                auc: Callable[[torch.Tensor], torch.Tensor], levels: int, eta0: float,
                                create_graph: bool = True) -> torch.Tensor:
    """f(u_{L−1}(w)) with L−1 stacked CE steps (L = ``levels`` ≥ 1; L = 1 is the plain AUC-M loss at w).

    ``ce(w)`` is the (full-data) CE of flat weights, ``auc(u)`` the AUC-M loss at flat weights u (with a, b, α
    closed over). Differentiable in w when ``create_graph`` (the exact chain rule, for tests of the estimator-based
    gradient).
    """
    v.integer(_OWNER, "levels", levels, minimum=1)
    u = w
    for _ in range(levels - 1):
        u = inner_ce_map(u, ce, eta0=eta0, create_graph=create_graph)
    return auc(u)


def bce_on_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of logits (equal to LibAUC's ``F.binary_cross_entropy`` on sigmoid probabilities)."""
    return F.binary_cross_entropy_with_logits(logits.reshape(-1), labels.reshape(-1).to(logits.dtype))
