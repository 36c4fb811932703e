"""Private projection density estimators (scikit-learn style) of :mod:`icml24.private_density`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from sklearn.base import BaseEstimator

from icml24.common import validate as v
from icml24.private_density.basis import (
    _BLOCK,
    _P,
    MAX_BASIS_SIZE,
    _as_array,
    _as_points,
    _basis_matrix,
    _check_index_set,
    _check_points,
    _nnz,
    check_basis_size,
    clip_to_cube,
    cube_index_set,
    empirical_coefficients,
    grid_values,
)
from icml24.private_density.densities import _coef_dict
from icml24.private_density.privacy import (
    Privacy,
    PureDP,
    _check_privacy,
    _compose,
    _fit_rng,
    _rng,
    l1_sensitivity,
    l2_sensitivity,
    privatize_coefficients,
)

__all__ = ["CALIBRATED_KAPPA_PRIV", "DEFAULT_DENSITY_FLOOR", "SKLEARN_CHECK_SKIPS", "SKLEARN_CHECK_SKIPS_BASIS",
           "PrivateProjectionDensity", "PrivateLepskiiDensity", "dyadic_cutoffs"]

DEFAULT_DENSITY_FLOOR = 1e-3
"""Default ``density_floor`` eta: the renormalised projection is max(f_tilde - c, eta), so a held-out point's
log-density is at least log(1e-3) = -6.9 (uniform density: 0) instead of -inf."""

SKLEARN_CHECK_SKIPS = {
    "check_estimators_nan_inf":
        "X holds private records: NaN / inf entries are mapped by clip_to_cube (non-finite -> 1/2, then clipped "
        "to [0,1]^d) instead of raising, since an exception would itself release a property of a record "
        "(DESIGN, private data)",
    "check_fit1d":
        "a 1-D X is documented as n points in d = 1 (the paper's one-dimensional case), not refused",
}
"""``expected_failed_checks`` for ``sklearn.utils.estimator_checks.check_estimator`` on both estimators
(with a basis that fits the 10-feature data of some checks, e.g. ``cutoff=1``; see
:data:`SKLEARN_CHECK_SKIPS_BASIS`)."""

SKLEARN_CHECK_SKIPS_BASIS = {
    "check_n_features_in_after_fitting": "4 features: K_16 in d = 4 has 33^4 = 1185921 coefficients > max_basis_size",
    "check_positive_only_tag_during_fit": "4 features: K_16 in d = 4 is refused by max_basis_size",
    "check_estimators_dtypes": "5 features: K_16 in d = 5 has 33^5 = 39135393 coefficients > max_basis_size",
    "check_dtype_object": "10 features: K_16 in d = 10 has 33^10 coefficients > max_basis_size",
    "check_fit2d_1sample": "10 features: K_16 in d = 10 has 33^10 coefficients > max_basis_size",
}
"""The further skips of ``PrivateLepskiiDensity()`` at its default ``max_cutoff=16``: those checks fit data with
4 to 10 features, and K_16 in d >= 4 is refused before any compute (a ``ValueError`` naming the size and the
limit). With ``max_cutoff=1`` (K_1, 3^d coefficients) only :data:`SKLEARN_CHECK_SKIPS` remain."""

CALIBRATED_KAPPA_PRIV = 2.0
"""Default kappa_2 of :class:`PrivateLepskiiDensity`: chosen once by ``experiment.calibrate_kappa_priv`` on a
held-out density (beta = 1, seed 1000) and frozen; the experiment uses it."""


# ----------------------------------------------------------------------------------------------------------
# estimators
# ----------------------------------------------------------------------------------------------------------
def _check_device(device: str) -> None:
    if device != "cpu":
        raise ValueError(f"{_P}: device must be 'cpu' (NumPy implementation), got {device!r}")


class _ProjectionBase(BaseEstimator):
    coefficients_: np.ndarray
    index_set_: np.ndarray
    density_floor: float
    max_basis_size: int

    def _check_fitted(self) -> None:
        if not hasattr(self, "coefficients_"):
            raise RuntimeError(f"{_P}: call fit(X) first")

    def _validate_common(self) -> None:
        v.in_range(_P, "density_floor", self.density_floor, 0.0, 1.0, high_open=True)
        v.integer(_P, "max_basis_size", self.max_basis_size, minimum=1)

    def _floor(self) -> float:
        return float(v.in_range(_P, "density_floor", self.density_floor, 0.0, 1.0, high_open=True))

    def pdf(self, x: object, *, clip: bool = False) -> np.ndarray:
        """f_tilde(x) = sum_k theta_tilde_k phi_k(x) at points ``(m, d)`` in [0,1]^d (the raw projection; it can
        be negative and its integral is exactly 1). For a proper density use :meth:`density`.

        Args:
            clip: return max(f_tilde, 0) (post-processing: no privacy cost; not renormalised).
        """
        self._check_fitted()
        pts = _check_points(x, dim=self.index_set_.shape[1])
        out = np.empty(pts.shape[0])
        rows = max(1, min(16384, _BLOCK // self.index_set_.shape[0]))  # a block of the basis <= _BLOCK floats
        for s in range(0, pts.shape[0], rows):
            out[s:s + rows] = _basis_matrix(pts[s:s + rows], self.index_set_) @ self.coefficients_
        return np.maximum(out, 0.0) if clip else out

    def _grid_size(self) -> int:
        d = self.index_set_.shape[1]
        nmax = int(np.abs(self.index_set_).max())
        m = max(4 * nmax + 4, 32)
        return max(min(m, int(2 ** (20 / d))), 2 * nmax + 2)  # <= ~2^20 points unless the basis needs more

    def _grid(self) -> np.ndarray:
        d = self.index_set_.shape[1]
        m = self._grid_size()
        g = (np.arange(m) + 0.5) / m
        mesh = np.meshgrid(*([g] * d), indexing="ij")
        return np.stack([t.reshape(-1) for t in mesh], axis=1)

    def _grid_values(self) -> np.ndarray:
        """f_tilde on :meth:`_grid` (same order), by one FFT (:func:`~icml24.private_density.basis.grid_values`)."""
        return grid_values(self.index_set_, self.coefficients_, self._grid_size())

    def density_shift(self) -> float:
        """c of the renormalised projection with a floor, f_eta = max(f_tilde - c, eta) (see :meth:`density`)."""
        self._check_fitted()
        eta = self._floor()
        key = getattr(self, "_shift_for", None)
        if key is None or key[0] is not self.coefficients_ or key[1] != eta:
            # mean_grid max(f - c, eta) = 1 (midpoint rule), i.e. sum_j max(u_j - c, 0) = M (1 - eta) with
            # u = f - eta (as max(f - c, eta) = eta + max(u - c, 0)): the simplex-projection threshold, exact
            # from the sorted grid values
            u = np.sort(self._grid_values())[::-1] - eta
            m = u.shape[0]
            thr = (np.cumsum(u) - m * (1.0 - eta)) / np.arange(1, m + 1)
            j = int(np.flatnonzero(u - thr > 0)[-1])
            self._shift, self._shift_for = float(thr[j]), (self.coefficients_, eta)
        return self._shift

    def density(self, x: object) -> np.ndarray:
        """The renormalised non-negative projection with a floor, f_eta(x) = max(f_tilde(x) - c, eta), with
        eta = ``density_floor`` and c such that int f_eta = 1: the L2 projection of f_tilde onto the densities
        on [0,1]^d bounded below by eta (a convex set), so ||f_eta - f||_2 <= ||f_tilde - f||_2 for every
        density f >= eta. eta = 0 gives the plain non-negative projection f_plus = max(f_tilde - c, 0), which is
        0 on a region of positive measure as soon as f_tilde dips below c (so a held-out point there has
        log-density -inf); eta > 0 keeps the log-density >= log(eta) on the whole cube. c is found by
        bisection, with the integral by the midpoint rule on a regular grid of m > 2N points per axis (exact
        for f_tilde itself, approximate for the clipped function; f_tilde is evaluated there by one FFT).
        Post-processing: no privacy cost. Points outside [0,1]^d get density 0 (the support is the cube).

        Args:
            x: points ``(m, d)``; public (NaN raises).
        """
        self._check_fitted()
        d = self.index_set_.shape[1]
        a = _as_array(x)
        if a.ndim == 1 and d == 1:
            a = a[:, None]
        if a.ndim != 2:
            raise ValueError(f"{_P}: x must be an (m, {d}) array, got shape {np.shape(x)}")
        if a.shape[1] != d:
            raise ValueError(f"{_P}: X has {a.shape[1]} features, but {type(self).__name__} is expecting {d} "
                             f"features as input")
        if np.isnan(a).any():
            raise ValueError(f"{_P}: x contains NaN")
        inside = np.all((a >= 0.0) & (a <= 1.0), axis=1)
        out = np.zeros(a.shape[0])
        if inside.any():
            out[inside] = np.maximum(self.pdf(a[inside]) - self.density_shift(), self._floor())
        return out

    def score_samples(self, X: object) -> np.ndarray:
        """log f_eta(x) of the renormalised projection with a floor (:meth:`density`), as
        ``sklearn.neighbors.KernelDensity.score_samples``: finite (>= log ``density_floor``) at every point of
        [0,1]^d when ``density_floor > 0`` (the default), so ``GridSearchCV`` / ``cross_val_score`` can compare
        cutoffs; -inf outside [0,1]^d (and where f_plus = 0 if ``density_floor=0``). Scoring held-out private
        records reads them: a cutoff chosen by cross-validation is not covered by the privacy guarantee."""
        with np.errstate(divide="ignore"):
            return np.log(self.density(X))

    def score(self, X: object, y: object = None) -> float:
        """Total log-likelihood sum_i log f_eta(x_i) (sklearn convention; -inf if a point is outside [0,1]^d)."""
        return float(np.sum(self.score_samples(X)))

    def sample(self, n_samples: int = 1, random_state: object = None) -> np.ndarray:
        """Draws from f_eta (:meth:`density`) by rejection from the uniform proposal, with the certified envelope
        sup f_eta <= max(sum_k |theta_tilde_k| sup|phi_k| - c, eta). Post-processing: no privacy cost.

        Args:
            n_samples: number of draws >= 1.
            random_state: seed or numpy Generator of the sampler (not of the privacy noise).

        Returns:
            ``(n_samples, d)`` array in [0,1]^d.
        """
        self._check_fitted()
        n = v.integer(_P, "n_samples", n_samples, minimum=1)
        rng = _rng(random_state)
        k = self.index_set_
        d = k.shape[1]
        c = self.density_shift()
        eta = self._floor()
        bound = max(float(np.sum(np.abs(self.coefficients_) * 2.0 ** (_nnz(k) / 2.0))) - c, eta)
        out = [np.empty((0, d))]
        have = 0
        while have < n:
            m = int(min(max(1.2 * bound * (n - have), 256), 1 << 20))
            prop = rng.random((m, d))
            fp = np.maximum(self.pdf(prop) - c, eta)
            keep = prop[rng.random(m) * bound <= fp]
            out.append(keep)
            have += keep.shape[0]
        return np.concatenate(out, axis=0)[:n]

    def ise(self, true_coefs: object) -> float:
        """||f_tilde - f||_2^2 by Parseval: sum_{k in K} (theta_tilde_k - theta_k)^2 + sum_{k not in K} theta_k^2.

        Args:
            true_coefs: the true density's coefficients: a :class:`TrigDensity`, a ``{multi-index: theta}``
                mapping, or an ``(index_set, values)`` pair (coefficients absent from it are 0).
        """
        self._check_fitted()
        true = _coef_dict(true_coefs)
        est_keys = [tuple(r) for r in self.index_set_.tolist()]
        diff = self.coefficients_ - np.array([true.get(key, 0.0) for key in est_keys])
        inside = set(est_keys)
        tail = math.fsum(v * v for key, v in true.items() if key not in inside)
        return float(np.sum(diff ** 2)) + tail


class PrivateProjectionDensity(_ProjectionBase):
    """Private projection estimator f_tilde_N on the tensor trigonometric basis of [0,1]^d.

    Privacy guarantee: with ``privacy=ZCDP(rho)`` the fitted ``coefficients_`` (hence ``pdf``, ``ise``) are
    rho-zCDP; with ``PureDP(epsilon)`` epsilon-DP (Laplace); with ``ApproxDP(epsilon, delta)``
    (epsilon, delta)-DP; all w.r.t. replace-one neighbouring data sets of a public size n, provided the data
    are mapped into [0,1]^d by :func:`clip_to_cube` (applied to every record, never a value check), the cutoff /
    index set does not depend on the data, and only the released
    coefficients are published. ``privacy=None`` gives the non-private estimator.

    Args:
        cutoff: N >= 0, K = K_N = {|k|_inf <= N} (exclusive with ``index_set``).
        index_set: explicit ``(|K|, d)`` multi-indices (data-independent).
        privacy: ZCDP / PureDP / ApproxDP or None.
        random_state: ``None`` (fresh OS entropy: the choice for a real release), a numpy Generator (consumed,
            so successive fits draw new noise) or an int seed (every fit draws the same noise:
            :class:`ReproducibleNoiseWarning`, for experiments only).
        device: "cpu" only (NumPy).
        density_floor: eta in [0, 1), the floor of the renormalised projection max(f_tilde - c, eta) behind
            :meth:`density`, ``score_samples``, ``score`` and ``sample`` (default
            :data:`DEFAULT_DENSITY_FLOOR` = 1e-3: log-densities stay finite on the cube). Post-processing only.
        max_basis_size: the largest (2N + 1)^d (N = max |k| for an ``index_set``: its bounding cube) that
            :meth:`fit` accepts; a larger basis raises a ``ValueError`` naming both numbers before any compute
            (default :data:`~icml24.private_density.basis.MAX_BASIS_SIZE` = 2^20; README, "Cost").

    A scikit-learn estimator (``get_params``, ``set_params``, ``clone``); the arguments are validated in
    :meth:`fit`. Besides ``pdf`` (the raw projection) it offers the renormalised non-negative projection
    :meth:`density`, ``score_samples`` (its log, as ``KernelDensity``), ``score`` and ``sample``.

    Attributes:
        coefficients_: theta_tilde on ``index_set_`` (theta_0 = 1).
        index_set_: the multi-indices K.
        sensitivity_l2_, sensitivity_l1_: Delta_2, Delta_1 of the coefficient vector (k != 0).
        noise_variance_: E Z_k^2; noise_scale_: sigma (Gaussian) or b (Laplace).
        privacy_spent_: the privacy object spent (equals ``privacy``).
    """

    def __init__(self, *, cutoff: int | None = None, index_set: object | None = None,
                 privacy: Privacy | None = None, random_state: object = None, device: str = "cpu",
                 density_floor: float = DEFAULT_DENSITY_FLOOR, max_basis_size: int = MAX_BASIS_SIZE) -> None:
        # scikit-learn convention: store the arguments unchanged, validate them in fit (get_params / clone)
        self.cutoff = cutoff
        self.index_set = index_set
        self.privacy = privacy
        self.random_state = random_state
        self.device = device
        self.density_floor = density_floor
        self.max_basis_size = max_basis_size

    def _validate_params(self) -> None:
        if (self.cutoff is None) == (self.index_set is None):
            raise ValueError(f"{_P}: give exactly one of cutoff or index_set")
        if self.cutoff is not None:
            v.integer(_P, "cutoff", self.cutoff, minimum=0)
        else:
            _check_index_set(self.index_set)
        _check_privacy(self.privacy, allow_none=True)
        _check_device(self.device)
        _rng(self.random_state)
        self._validate_common()

    def fit(self, X: object, y: object = None) -> PrivateProjectionDensity:
        """Fit on private samples ``X`` of shape ``(n, d)``; rows go through :func:`clip_to_cube` (non-finite
        entries -> 1/2, then clipped to [0,1]^d), so no exception depends on a private value. The parameters
        and the basis size (from the public cutoff and d) are validated first (before any computation). ``y``
        is ignored (scikit-learn API).

        Raises:
            ValueError: (2N + 1)^d > ``max_basis_size`` (a public-parameter check, before any compute).

        Warns:
            ReproducibleNoiseWarning: ``privacy`` is set and ``random_state`` is a fixed int.
        """
        self._validate_params()
        pts = _as_points(X, "X", None)  # shape only (public)
        n, d = pts.shape
        if self.cutoff is not None:
            check_basis_size(cutoff=self.cutoff, dim=d, max_basis_size=self.max_basis_size)
        else:
            k = _check_index_set(self.index_set, d)
            check_basis_size(cutoff=int(np.abs(k).max()), dim=d, max_basis_size=self.max_basis_size)
        pts = clip_to_cube(pts)
        rng = _fit_rng("PrivateProjectionDensity", self.random_state, self.privacy)
        if self.cutoff is not None:
            k = cube_index_set(cutoff=self.cutoff, dim=d)
            theta_hat = empirical_coefficients(pts, cutoff=self.cutoff)
        else:
            theta_hat = empirical_coefficients(pts, index_set=k)
        self.index_set_ = k
        self.n_samples_ = n
        self.empirical_coefficients_ = theta_hat
        self.sensitivity_l2_ = l2_sensitivity(k, n=n)
        self.sensitivity_l1_ = l1_sensitivity(k, n=n)
        self.coefficients_, self.noise_variance_ = privatize_coefficients(theta_hat, index_set=k, n=n,
                                                                          privacy=self.privacy, rng=rng)
        if isinstance(self.privacy, PureDP):
            self.noise_scale_ = self.sensitivity_l1_ / self.privacy.epsilon
        else:
            self.noise_scale_ = math.sqrt(self.noise_variance_)
        self.privacy_spent_ = self.privacy
        self.n_features_in_ = d
        del self.empirical_coefficients_  # non-private; never kept on the fitted object
        return self


def dyadic_cutoffs(max_cutoff: int) -> tuple[int, ...]:
    """(0, 1, 2, 4, ..., max_cutoff) (max_cutoff appended if it is not a power of two)."""
    max_cutoff = v.integer(_P, "max_cutoff", max_cutoff, minimum=1)
    out = [0]
    c = 1
    while c < max_cutoff:
        out.append(c)
        c *= 2
    out.append(max_cutoff)
    return tuple(out)


class PrivateLepskiiDensity(_ProjectionBase):
    """Adaptive private projection estimator: a private Lepskii choice of the cutoff N (needs no smoothness).

    A family N_1 < ... < N_M of projection estimators is released privately and the cutoff
        N_hat = min{ N : ||f_tilde_N - f_tilde_N'||^2 <= V_stat(N') + V_priv(N') for all N' > N in the family },
        V_stat(N') = kappa_stat (|K_N'| - 1) log(n) / n,   V_priv(N') = kappa_priv sum_{k in K_N' \\ 0} E Z_k^2,
    is chosen from the released coefficients only (post-processing). ``kappa_priv = 0`` gives the
    privacy-naive (classical) Lepskii rule on the same private estimates.

    Budget split. ``scheme="shell"``: the disjoint shells S_j = K_{N_j} \\ K_{N_{j-1}} are released with
    budget w_j * total (sum w_j = 1) and f_tilde_{N_j} sums the shells (nested, consistent); ``"independent"``:
    each f_tilde_{N_j} (N_j > 0) is released on its own with w_j * total. The cutoff 0 (theta_0 = 1) is free.

    Privacy guarantee: with ``privacy=ZCDP(rho)`` the released family, the selected cutoff ``cutoff_`` and
    ``coefficients_`` are rho-zCDP (zCDP composes additively over the releases: sum_j w_j rho = rho); with
    ``PureDP(epsilon)`` epsilon-DP; with ``ApproxDP(epsilon, delta)`` (epsilon, delta)-DP by basic composition;
    for replace-one neighbours of public size n, records mapped into [0,1]^d by :func:`clip_to_cube`, a
    data-independent family and
    weights. ``budget_spent_`` lists the per-release budgets and ``privacy_spent_`` their composition.

    Args:
        privacy: ZCDP / PureDP / ApproxDP (required).
        cutoffs: the family (strictly increasing ints >= 0); default :func:`dyadic_cutoffs` (max_cutoff).
        max_cutoff: N_max for the default dyadic family.
        scheme: "shell" (default) or "independent".
        kappa_stat: kappa_1 >= 0.
        kappa_priv: kappa_2 >= 0 (absorbs the log(M/eta) factor of the notes); default
            :data:`CALIBRATED_KAPPA_PRIV` = 2, the value calibrated once on a held-out density and used by the
            experiment (kappa_2 = 1 fails badly, see the README).
        budget_weights: w_j for each N_j > 0 (positive; normalised); default uniform.
        random_state: ``None`` (fresh OS entropy: the choice for a real release), a numpy Generator, or an int
            seed (every fit draws the same noise: :class:`ReproducibleNoiseWarning`, for experiments only).
        device: "cpu" only.
        density_floor: eta of :meth:`density` as in :class:`PrivateProjectionDensity` (default 1e-3).
        max_basis_size: the largest (2 N_max + 1)^d that :meth:`fit` accepts (default 2^20; the default
            ``max_cutoff=16`` allows d <= 3); a larger family raises a ``ValueError`` before any compute.

    A scikit-learn estimator (``get_params``, ``set_params``, ``clone``); arguments are validated in
    :meth:`fit`. Fitted: ``cutoffs_`` (the family), ``budget_weights_`` (normalised), ``cutoff_``,
    ``coefficients_``, ``index_set_``, ``budget_spent_``, ``privacy_spent_``; plus :meth:`density`,
    ``score_samples``, ``score`` and ``sample`` as :class:`PrivateProjectionDensity`.
    """

    def __init__(self, *, privacy: Privacy, cutoffs: Sequence[int] | None = None, max_cutoff: int = 16,
                 scheme: Literal["shell", "independent"] = "shell", kappa_stat: float = 1.0,
                 kappa_priv: float = CALIBRATED_KAPPA_PRIV, budget_weights: Sequence[float] | None = None,
                 random_state: object = None, device: str = "cpu", density_floor: float = DEFAULT_DENSITY_FLOOR,
                 max_basis_size: int = MAX_BASIS_SIZE) -> None:
        # scikit-learn convention: store the arguments unchanged, validate them in fit (get_params / clone)
        self.privacy = privacy
        self.cutoffs = cutoffs
        self.max_cutoff = max_cutoff
        self.scheme = scheme
        self.kappa_stat = kappa_stat
        self.kappa_priv = kappa_priv
        self.budget_weights = budget_weights
        self.random_state = random_state
        self.device = device
        self.density_floor = density_floor
        self.max_basis_size = max_basis_size

    def _validate_params(self) -> None:
        """Check every argument; sets ``cutoffs_`` (the family) and ``budget_weights_`` (normalised)."""
        _check_privacy(self.privacy, allow_none=False)
        cutoffs = dyadic_cutoffs(self.max_cutoff) if self.cutoffs is None else self.cutoffs
        if isinstance(cutoffs, (str, bytes)) or not isinstance(cutoffs, (Sequence, np.ndarray)):
            raise TypeError(f"{_P}: cutoffs must be a sequence of ints, got {cutoffs!r}")
        cut = tuple(v.integer(_P, "cutoffs[i]", c, minimum=0) for c in cutoffs)
        if len(cut) < 2 or any(b <= a for a, b in zip(cut, cut[1:], strict=False)):
            raise ValueError(f"{_P}: cutoffs must be >= 2 strictly increasing ints, got {tuple(cutoffs)}")
        v.one_of(_P, "scheme", self.scheme, ("shell", "independent"))
        v.non_negative(_P, "kappa_stat", self.kappa_stat)
        v.non_negative(_P, "kappa_priv", self.kappa_priv)
        n_rel = sum(c > 0 for c in cut)
        bw = self.budget_weights
        if bw is None:
            w = np.full(n_rel, 1.0 / n_rel)
        else:
            if isinstance(bw, (str, bytes)):
                raise TypeError(f"{_P}: budget_weights must be a sequence of numbers, got {bw!r}")
            w = np.asarray(v.each(_P, "budget_weights", list(np.asarray(bw, dtype=object).reshape(-1)),
                                  v.positive), dtype=np.float64)
            if w.shape[0] != n_rel:
                raise ValueError(f"{_P}: budget_weights must be {n_rel} positive numbers (one per cutoff > 0), "
                                 f"got {bw}")
            w = w / w.sum()
        _check_device(self.device)
        _rng(self.random_state)
        self._validate_common()
        self.cutoffs_ = cut
        self.budget_weights_ = w

    def fit(self, X: object, y: object = None) -> PrivateLepskiiDensity:
        """Release the family privately from private samples ``(n, d)`` (rows through :func:`clip_to_cube`)
        and select the cutoff. Parameters and the basis size (2 N_max + 1)^d are validated first; ``y`` is
        ignored (scikit-learn API).

        Raises:
            ValueError: (2 N_max + 1)^d > ``max_basis_size`` (a public-parameter check, before any compute).

        Warns:
            ReproducibleNoiseWarning: ``random_state`` is a fixed int.
        """
        self._validate_params()
        pts = _as_points(X, "X", None)  # shape only (public)
        check_basis_size(cutoff=self.cutoffs_[-1], dim=pts.shape[1], max_basis_size=self.max_basis_size)
        pts = clip_to_cube(pts)
        return self._fit_coefficients(empirical_coefficients(pts, cutoff=self.cutoffs_[-1]), n=pts.shape[0],
                                      dim=pts.shape[1])

    def fit_from_coefficients(self, theta_hat: object, *, n: int, dim: int) -> PrivateLepskiiDensity:
        """Same as :meth:`fit`, from the non-private empirical coefficients theta_hat on K_{N_max}
        (lexicographic order of :func:`cube_index_set`) of n samples; lets one data set feed several
        estimators without recomputing them. The privacy guarantee holds only if ``theta_hat`` really are
        the empirical coefficients of n records in [0,1]^d. No value of ``theta_hat`` raises: non-finite
        entries are set to 0 and each entry is clipped to [-2^{nnz(k)/2}, 2^{nnz(k)/2}] (the identity on real
        empirical coefficients); only its length (a public fact) is checked."""
        self._validate_params()
        return self._fit_coefficients(theta_hat, n=n, dim=dim)

    def _fit_coefficients(self, theta_hat: object, *, n: int, dim: int) -> PrivateLepskiiDensity:
        n = v.integer(_P, "n", n, minimum=1)
        d = v.integer(_P, "dim", dim, minimum=1)
        nmax = self.cutoffs_[-1]
        check_basis_size(cutoff=nmax, dim=d, max_basis_size=self.max_basis_size)
        kmax = cube_index_set(cutoff=nmax, dim=d)
        theta_hat = np.asarray(theta_hat, dtype=np.float64).reshape(-1)
        if theta_hat.shape[0] != kmax.shape[0]:
            raise ValueError(f"{_P}: theta_hat has {theta_hat.shape[0]} entries, K_{nmax} in d={d} has "
                             f"{kmax.shape[0]}")
        # theta_hat is a statistic of private data: a fixed rule instead of a value check (non-finite -> 0, then
        # each entry clipped to the range |theta_k| <= 2^{nnz(k)/2} of real empirical coefficients; identity on them)
        bound = 2.0 ** (_nnz(kmax) / 2.0)
        theta_hat = np.clip(np.where(np.isfinite(theta_hat), theta_hat, 0.0), -bound, bound)
        rng = _fit_rng("PrivateLepskiiDensity", self.random_state, self.privacy)
        linf = np.abs(kmax).max(1)
        parts = [self.privacy.scaled(float(wj)) for wj in self.budget_weights_]
        spent: list[Privacy] = []
        cand: dict[int, np.ndarray] = {}
        noise_energy: dict[int, float] = {}
        if self.scheme == "shell":
            released = np.zeros_like(theta_hat)
            released[linf == 0] = 1.0
            energy = 0.0
            j = 0
            prev = -1
            for c in self.cutoffs_:
                shell = (linf > prev) & (linf <= c) & (linf > 0)
                if c > 0:
                    out, var = privatize_coefficients(theta_hat[shell], index_set=kmax[shell], n=n,
                                                      privacy=parts[j], rng=rng)
                    released[shell] = out
                    energy += var * int(shell.sum())
                    spent.append(parts[j])
                    j += 1
                cand[c] = released[linf <= c].copy()
                noise_energy[c] = energy
                prev = c
        else:
            j = 0
            for c in self.cutoffs_:
                sel = linf <= c
                if c == 0:
                    cand[c] = np.ones(1)
                    noise_energy[c] = 0.0
                    continue
                out, var = privatize_coefficients(theta_hat[sel], index_set=kmax[sel], n=n,
                                                  privacy=parts[j], rng=rng)
                cand[c] = out
                noise_energy[c] = var * (int(sel.sum()) - 1)
                spent.append(parts[j])
                j += 1
        self.n_samples_ = n
        self.dim_ = d
        self.n_features_in_ = d
        self.candidate_coefficients_ = cand
        self.candidate_noise_energy_ = noise_energy
        self.budget_spent_ = spent
        self.privacy_spent_ = _compose(spent)
        self.cutoff_ = self.select_cutoff()
        self.index_set_ = cube_index_set(cutoff=self.cutoff_, dim=d)
        self.coefficients_ = cand[self.cutoff_]
        return self

    def _sq_dist(self, a: int, b: int) -> float:
        """||f_tilde_a - f_tilde_b||^2 for cutoffs a < b (K_a is a sub-cube of K_b)."""
        kb = cube_index_set(cutoff=b, dim=self.dim_)
        inner = np.abs(kb).max(1) <= a
        big = self.candidate_coefficients_[b].copy()
        big[inner] -= self.candidate_coefficients_[a]
        return float(np.sum(big ** 2))

    def select_cutoff(self, *, kappa_stat: float | None = None, kappa_priv: float | None = None) -> int:
        """The Lepskii cutoff on the released family with other constants (post-processing: no privacy cost;
        ``kappa_priv=0`` is the privacy-naive rule)."""
        if not hasattr(self, "candidate_coefficients_"):
            raise RuntimeError(f"{_P}: call fit(X) first")
        k1 = float(self.kappa_stat) if kappa_stat is None else v.non_negative(_P, "kappa_stat", kappa_stat)
        k2 = float(self.kappa_priv) if kappa_priv is None else v.non_negative(_P, "kappa_priv", kappa_priv)
        n = self.n_samples_
        size = {c: (2 * c + 1) ** self.dim_ for c in self.cutoffs_}
        thr = {c: k1 * (size[c] - 1) * math.log(n) / n + k2 * self.candidate_noise_energy_[c]
               for c in self.cutoffs_}
        for i, a in enumerate(self.cutoffs_):
            if all(self._sq_dist(a, b) <= thr[b] for b in self.cutoffs_[i + 1:]):
                return a
        return self.cutoffs_[-1]  # unreachable: the largest cutoff has no competitor
