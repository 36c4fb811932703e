"""Privacy specifications and mechanisms of :mod:`icml24.private_density` (Lalanne & Gadat, ICML 2024).

``ZCDP`` / ``PureDP`` / ``ApproxDP`` budgets, the replace-one sensitivities of the trigonometric coefficient
vector, the per-coefficient noise variance and the release theta_tilde_k = theta_hat_k + Z_k.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from icml24.common import validate as v
from icml24.private_density.basis import _P, _check_index_set, _is_sign_symmetric, _nnz

__all__ = ["ZCDP", "PureDP", "ApproxDP", "Privacy", "l2_sensitivity", "l1_sensitivity", "noise_variance",
           "privatize_coefficients", "ReproducibleNoiseWarning"]


# ----------------------------------------------------------------------------------------------------------
# privacy definitions
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZCDP:
    """rho-zero-concentrated DP (Bun & Steinke 2016), released with the Gaussian mechanism.

    Guarantee: Gaussian noise of variance Delta_2^2 / (2 rho) on a query of l2-sensitivity Delta_2 is
    rho-zCDP; releases compose by adding their rho's. Converts to (rho + 2 sqrt(rho log(1/delta)), delta)-DP.

    Args:
        rho: the zCDP budget, a finite number > 0.
    """

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", v.positive(_P, "rho", self.rho))

    @property
    def budget(self) -> float:
        return self.rho

    def scaled(self, fraction: float) -> ZCDP:
        return ZCDP(self.rho * fraction)

    def to_approx_dp(self, *, delta: float) -> tuple[float, float]:
        """``(epsilon, delta)`` with epsilon = rho + 2 sqrt(rho log(1/delta)) (Bun & Steinke, Prop. 1.3)."""
        delta = v.probability(_P, "delta", delta, open_low=True, open_high=True)
        return self.rho + 2.0 * math.sqrt(self.rho * math.log(1.0 / delta)), delta


@dataclass(frozen=True)
class PureDP:
    """Pure epsilon-DP, released with the Laplace mechanism (scale Delta_1 / epsilon); epsilons add up.

    Args:
        epsilon: the privacy budget, a finite number > 0.
    """

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", v.positive(_P, "epsilon", self.epsilon))

    @property
    def budget(self) -> float:
        return self.epsilon

    def scaled(self, fraction: float) -> PureDP:
        return PureDP(self.epsilon * fraction)


@dataclass(frozen=True)
class ApproxDP:
    """(epsilon, delta)-DP with the classical Gaussian mechanism, sigma = Delta_2 sqrt(2 ln(1.25/delta)) / epsilon.

    The classical calibration is valid only for 0 < epsilon < 1 (Dwork & Roth 2014, Thm A.1), hence the range
    check; basic composition adds epsilons and deltas.

    Args:
        epsilon: in (0, 1).
        delta: in (0, 1).
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        eps = v.probability(_P, "epsilon", self.epsilon, open_low=True, open_high=True)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", v.probability(_P, "delta", self.delta, open_low=True, open_high=True))

    @property
    def budget(self) -> float:
        return self.epsilon

    def scaled(self, fraction: float) -> ApproxDP:
        return ApproxDP(self.epsilon * fraction, self.delta * fraction)


Privacy = ZCDP | PureDP | ApproxDP


def _check_privacy(privacy: object, *, allow_none: bool) -> None:
    if privacy is None and allow_none:
        return
    if not isinstance(privacy, (ZCDP, PureDP, ApproxDP)):
        raise TypeError(f"{_P}: privacy must be ZCDP, PureDP or ApproxDP"
                        f"{' or None' if allow_none else ''}, got {type(privacy).__name__}")


def _compose(parts: Sequence[Privacy]) -> Privacy:
    """Sequential composition of releases of one kind (zCDP: rhos add; pure/approx DP: basic composition)."""
    first = parts[0]
    if isinstance(first, ZCDP):
        return ZCDP(math.fsum(p.rho for p in parts))
    if isinstance(first, PureDP):
        return PureDP(math.fsum(p.epsilon for p in parts))
    return ApproxDP(math.fsum(p.epsilon for p in parts), math.fsum(p.delta for p in parts))


def l2_sensitivity(index_set: object, *, n: int) -> float:
    """Delta_2 = sup_{x,x'} ||phi(x) - phi(x')||_2 / n over k in K \\ {0}, replace-one neighbours.

    Bounded by 2 sqrt(sup_x sum_{k != 0} phi_k(x)^2) / n, where the sup is exactly |K \\ {0}| on a
    sign-symmetric K (cos^2 + sin^2 = 1 per frequency) and at most sum_{k != 0} 2^{nnz(k)} otherwise.
    """
    k = _check_index_set(index_set)
    n = v.integer(_P, "n", n, minimum=1)
    nz = k[_nnz(k) > 0]
    s = float(nz.shape[0]) if _is_sign_symmetric(k) else float(np.sum(2.0 ** _nnz(nz)))
    return 2.0 * math.sqrt(s) / n


def l1_sensitivity(index_set: object, *, n: int) -> float:
    """Delta_1 = 2 sum_{k != 0} sup|phi_k| / n = 2 sum_{k != 0} 2^{nnz(k)/2} / n (replace-one neighbours)."""
    k = _check_index_set(index_set)
    n = v.integer(_P, "n", n, minimum=1)
    nz = k[_nnz(k) > 0]
    return 2.0 * float(np.sum(2.0 ** (_nnz(nz) / 2.0))) / n


def noise_variance(index_set: object, *, n: int, privacy: Privacy | None) -> float:
    """Per-coefficient variance of the privacy noise Z_k (0 without privacy):
    zCDP: Delta_2^2 / (2 rho) (= 2|K \\ {0}|/(n^2 rho) on K_N); pure DP: 2 (Delta_1/epsilon)^2 (Laplace);
    approx DP: Delta_2^2 2 ln(1.25/delta) / epsilon^2."""
    _check_privacy(privacy, allow_none=True)
    if privacy is None:
        return 0.0
    try:
        if isinstance(privacy, ZCDP):
            var = l2_sensitivity(index_set, n=n) ** 2 / (2.0 * privacy.rho)
        elif isinstance(privacy, PureDP):
            var = 2.0 * (l1_sensitivity(index_set, n=n) / privacy.epsilon) ** 2
        else:
            var = (l2_sensitivity(index_set, n=n) / privacy.epsilon) ** 2 * 2.0 * math.log(1.25 / privacy.delta)
    except (ZeroDivisionError, OverflowError):  # a parameter so small that it underflows / the noise overflows
        var = math.inf
    if not math.isfinite(var):
        raise ValueError(f"noise_variance: the privacy noise variance is not finite ({var}) for privacy={privacy!r} "
                         f"and n={n}; the privacy parameter is too small to represent the noise")
    return var


def _rng(random_state: object) -> np.random.Generator:
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or (isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool)
                                and random_state >= 0):
        return np.random.default_rng(random_state)
    raise TypeError(f"{_P}: random_state must be None, a non-negative int or a numpy Generator, "
                    f"got {random_state!r}")


def privatize_coefficients(theta_hat: object, *, index_set: object, n: int, privacy: Privacy | None,
                           rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Release theta_tilde_k = theta_hat_k + Z_k for k != 0 (theta_0 is public and set to exactly 1).

    Privacy guarantee: if ``theta_hat`` are the empirical coefficients of ``n`` records in [0,1]^d on
    ``index_set`` (and nothing else about the records is released), the output is ``privacy``-private
    (rho-zCDP / epsilon-DP / (epsilon, delta)-DP) for replace-one neighbouring data sets of size n.

    Returns:
        ``(theta_tilde, noise variance per coefficient)``.
    """
    k = _check_index_set(index_set)
    th = np.asarray(theta_hat, dtype=np.float64).reshape(-1)
    if th.shape[0] != k.shape[0]:
        raise ValueError(f"{_P}: theta_hat has {th.shape[0]} entries but index_set has {k.shape[0]}")
    var = noise_variance(k, n=n, privacy=privacy)
    out = th.copy()
    zero = _nnz(k) == 0
    out[zero] = 1.0
    m = int((~zero).sum())
    if privacy is not None and m:
        if isinstance(privacy, PureDP):
            out[~zero] += rng.laplace(0.0, l1_sensitivity(k, n=n) / privacy.epsilon, size=m)
        else:
            out[~zero] += rng.normal(0.0, math.sqrt(var), size=m)
    return out, var


class ReproducibleNoiseWarning(UserWarning):
    """A private estimator was fitted with a fixed integer ``random_state``: its privacy noise can be recomputed
    by anyone who knows the seed, so the release is not private. Use ``random_state=None`` (or a secret
    Generator) for a real release; a fixed seed is for experiments and tests only. A Generator built from a
    known seed is just as reproducible but cannot be told apart from a secret one, so it does not warn."""


def _fit_rng(owner: str, random_state: object, privacy: object) -> np.random.Generator:
    rng = _rng(random_state)
    if privacy is not None and isinstance(random_state, (int, np.integer)):
        warnings.warn(f"{owner}: random_state={random_state!r} is a fixed seed, so the privacy noise is "
                      "reproducible by anyone who knows it and the release is not private; use random_state=None "
                      "for a real release", ReproducibleNoiseWarning, stacklevel=3)
    return rng
