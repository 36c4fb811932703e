"""The paper's toy model (LoRA+ §3): why η_B/η_A must grow with width n.

``f(x) = (w*ᵀ + b aᵀ) x`` with ``x, a ∈ R^n``, ``b ∈ R``, ``b₀ = 0``, ``a₀ ~ N(0, I/n)``; GD on ``½(f(x) − y)²``.
One step changes f by ``Δf = −η_b (aᵀx)² U − η_a b² ‖x‖² U + O(η_a η_b)`` with ``U = f − y``. Since ``aᵀx = Θ(1)``
and ``‖x‖² = Θ(n)``, both feature-learning terms

    δ_B = |Δb · aᵀx|,    δ_A = |b · Δaᵀx|

are Θ(1) iff ``η_a = Θ(1/n)`` and ``η_b = Θ(1)``: with one shared η, either δ_A explodes (η = Θ(1)) or δ_B vanishes
(η = Θ(1/n)).
"""

from __future__ import annotations

import numpy as np

from icml24.common import validate as v

__all__ = ["toy_feature_updates"]


def toy_feature_updates(*, n: int, eta_a: float, eta_b: float, steps: int = 2, draws: int = 64,
                        seed: int = 0) -> dict[str, float]:
    """Median over ``draws`` random problems of the two feature-update terms at GD step ``steps``.

    Args:
        n: width (input dimension).
        eta_a: learning rate of ``a`` (the A side).
        eta_b: learning rate of ``b`` (the B side).
        steps: number of GD steps; the terms are measured on the last one (≥ 2: step 1 never moves ``a``
            since ``b₀ = 0``).
        draws: independent draws of ``(x, a₀, w*)``; the medians make the measurement robust to ``aᵀx ≈ 0``.
        seed: seed of the draws.

    Returns:
        ``{"delta_A": median δ_A, "delta_B": median δ_B}``.
    """
    w = "toy_feature_updates"
    v.integer(w, "n", n, minimum=1)
    v.integer(w, "steps", steps, minimum=2)
    v.positive(w, "eta_a", eta_a)
    v.positive(w, "eta_b", eta_b)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((draws, n))
    a = rng.standard_normal((draws, n)) / np.sqrt(n)
    w = rng.standard_normal((draws, n)) / np.sqrt(n)
    y = np.ones(draws)
    b = np.zeros(draws)
    d_a = d_b = np.zeros(draws)
    for _ in range(steps):
        u = ((w + b[:, None] * a) * x).sum(1) - y  # U = f(x) − y
        grad_b = u * (a * x).sum(1)
        grad_a = (u * b)[:, None] * x
        da, db = -eta_a * grad_a, -eta_b * grad_b
        a_new, b_new = a + da, b + db
        d_b = np.abs(db * (a_new * x).sum(1))  # δ_B = |Δb · a_tᵀ x|
        d_a = np.abs(b_new * (da * x).sum(1))  # δ_A = |b_t · Δa_tᵀ x|
        a, b = a_new, b_new
    return {"delta_A": float(np.median(d_a)), "delta_B": float(np.median(d_b))}
