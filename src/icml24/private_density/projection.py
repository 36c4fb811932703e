"""Privately Learning Smooth Distributions on the Hypercube by Projections (Lalanne & Gadat, ICML 2024).

arXiv: 2409.10083 · official code: none published.

A density f on [0,1]^d is expanded on the real tensor trigonometric basis (phi_k), k in K_N = {|k|_inf <= N}:
    theta_hat_k = (1/n) sum_i phi_k(X_i),   theta_tilde_k = theta_hat_k + Z_k   (theta_0 = 1 is public),
    f_tilde_N = sum_{k in K_N} theta_tilde_k phi_k,
    E||f_tilde_N - f||^2 = sum_{k not in K_N} theta_k^2 + sum_{k in K_N} Var(phi_k(X))/n + (|K_N|-1) E Z^2,
with Z_k ~ N(0, Delta_2^2/(2 rho)) for rho-zCDP or Lap(Delta_1/epsilon) for pure epsilon-DP. The cutoff N is
chosen without knowing the smoothness by a Lepskii rule whose threshold has a privacy-aware penalty.

Everything here is NumPy (float64); samples are rows of an ``(n, d)`` array in [0,1]^d.

The implementation is split into :mod:`~icml24.private_density.privacy` (privacy specs and mechanisms),
:mod:`~icml24.private_density.basis` (index sets, basis, coefficients), :mod:`~icml24.private_density.densities`
(test densities, closed-form MISE) and :mod:`~icml24.private_density.estimators` (the estimators); this module
re-exports their public names, so ``from icml24.private_density.projection import ...`` keeps working.
"""

from __future__ import annotations

from icml24.private_density.basis import (
    MAX_BASIS_SIZE,
    basis_size,
    check_basis_size,
    clip_to_cube,
    cube_index_set,
    empirical_coefficients,
    trig_basis,
    trig_basis_1d,
)
from icml24.private_density.densities import (
    TrigDensity,
    expected_mise,
)
from icml24.private_density.estimators import (
    CALIBRATED_KAPPA_PRIV,
    DEFAULT_DENSITY_FLOOR,
    SKLEARN_CHECK_SKIPS,
    SKLEARN_CHECK_SKIPS_BASIS,
    PrivateLepskiiDensity,
    PrivateProjectionDensity,
    dyadic_cutoffs,
)
from icml24.private_density.privacy import (
    ZCDP,
    ApproxDP,
    Privacy,
    PureDP,
    ReproducibleNoiseWarning,
    l1_sensitivity,
    l2_sensitivity,
    noise_variance,
    privatize_coefficients,
)

__all__ = [
    "ZCDP",
    "PureDP",
    "ApproxDP",
    "Privacy",
    "cube_index_set",
    "trig_basis",
    "trig_basis_1d",
    "empirical_coefficients",
    "l2_sensitivity",
    "l1_sensitivity",
    "noise_variance",
    "privatize_coefficients",
    "TrigDensity",
    "expected_mise",
    "PrivateProjectionDensity",
    "PrivateLepskiiDensity",
    "dyadic_cutoffs",
    "clip_to_cube",
    "ReproducibleNoiseWarning",
    "CALIBRATED_KAPPA_PRIV",
    "DEFAULT_DENSITY_FLOOR",
    "MAX_BASIS_SIZE",
    "basis_size",
    "check_basis_size",
    "SKLEARN_CHECK_SKIPS",
    "SKLEARN_CHECK_SKIPS_BASIS",
]
