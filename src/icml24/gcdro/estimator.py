"""scikit-learn regressors for GCDRO and the conventional DRO baselines, one interface.

Baselines: ERM, penalised KL / χ², constrained KL / χ² (radius ρ, dual form), CVaR, Wasserstein DRO.
Outer loop (full batch): per-sample squared losses ℓ_i(θ) → worst-case weights q (detached) → Adam step on
``Σ_i q_i ℓ_i(θ)`` (the gradient of the worst-case risk by Danskin's theorem), with a cosine learning-rate decay
to 0 over ``max_iter`` steps (``lr_decay``) so that every arm ends at a fixed point of its own objective. :class:`GCDRORegressor` gets q from the geometric Wasserstein gradient flow of the free
energy (``core.gradient_flow``) on a kNN graph of the training inputs; :class:`DRORegressor` from a closed-form
best response. Models: linear (``d + 1`` parameters) or a one-hidden-layer MLP.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def _validate_data(est, X, y="no_validation", **kw):
        return est._validate_data(X, y, **kw)

from icml24.common import validate as v
from icml24.gcdro import core

__all__ = ["GCDRORegressor", "DRORegressor", "GCDROREGRESSOR_SKIPS"]

GCDROREGRESSOR_SKIPS = {
    "check_sample_weight_equivalence_on_dense_data":
        "the kNN graph and the flow's entropy are built on the unweighted sample (a repeated row is a new "
        "node); sample_weight only tilts the worst case, so weights are not equivalent to repeated rows",
}
"""``expected_failed_checks`` for ``sklearn.utils.estimator_checks.check_estimator(GCDRORegressor(...))``."""

_METHODS = ("erm", "kl", "chi2", "cvar", "kl_constrained", "chi2_constrained", "wasserstein")
_PENALISED = ("kl", "chi2")
_CONSTRAINED = ("kl_constrained", "chi2_constrained", "wasserstein")
_KL_MIN_TEMPERATURE = core.KL_MIN_TEMPERATURE  # smaller λ makes ℓ/λ overflow (NaN weights mid-training)


def _validate_xy(est: BaseEstimator, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Shape / NaN checks with messages naming the argument, then sklearn's validate_data (sets n_features_in_)."""
    xa, ya = np.asarray(X), np.asarray(y)
    if xa.ndim >= 1 and ya.ndim >= 1 and xa.shape[0] != ya.shape[0]:
        raise ValueError(f"gcdro: X and y must have the same number of samples, got {xa.shape[0]} and {ya.shape[0]}")
    for name, a in (("X", xa), ("y", ya)):
        if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            raise ValueError(f"gcdro: {name} contains NaN or inf")
    return _validate_data(est, X, y, dtype=np.float64, y_numeric=True, reset=True)


def _check_common(est: _BaseWeightedRegressor) -> None:
    v.one_of("gcdro", "model", est.model, ("linear", "mlp"))
    v.integer("gcdro", "hidden", est.hidden, minimum=1)
    v.positive("gcdro", "lr", est.lr)
    v.integer("gcdro", "max_iter", est.max_iter, minimum=1)
    if not isinstance(est.lr_decay, (bool, np.bool_)):
        raise TypeError(f"gcdro: lr_decay must be a bool, got {type(est.lr_decay).__name__}")


class _BaseWeightedRegressor(RegressorMixin, BaseEstimator):
    """Shared training loop: standardise X and y, then full-batch Adam on the q-weighted squared loss."""

    def _make_model(self, d: int, gen: torch.Generator) -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            if self.model == "linear":
                m = torch.nn.Linear(d, 1)
            else:
                m = torch.nn.Sequential(torch.nn.Linear(d, self.hidden), torch.nn.ReLU(), torch.nn.Linear(self.hidden, 1))
        return m.to(device=self.device, dtype=torch.float64)

    def _prepare(self, X: Any, y: Any, sample_weight: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        X, y = _validate_xy(self, X, y)
        if X.shape[0] < 2:
            raise ValueError(f"gcdro: fitting needs n_samples >= 2, got n_samples={X.shape[0]}")
        if sample_weight is not None:
            sw = np.asarray(sample_weight)
            if sw.dtype.kind in "fc" and not np.all(np.isfinite(sw)):
                raise ValueError("gcdro: sample_weight contains NaN or inf")
        sw = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        if sw.sum() <= 0:
            raise ValueError("gcdro: sample_weight must have a positive sum")
        p = sw / sw.sum()  # the weighted empirical distribution p̂
        self._uniform_p = bool(np.all(sw == sw[0]))
        if self._uniform_p:  # the unweighted formulas (bit-identical to fits without sample_weight)
            self.x_mean_, self.x_scale_ = X.mean(0), X.std(0)
            self.y_mean_, self.y_scale_ = float(y.mean()), float(y.std()) or 1.0
        else:
            self.x_mean_ = p @ X
            self.x_scale_ = np.sqrt(p @ (X - self.x_mean_) ** 2)
            self.y_mean_ = float(p @ y)
            self.y_scale_ = float(np.sqrt(p @ (y - self.y_mean_) ** 2)) or 1.0
        self.x_scale_[self.x_scale_ == 0] = 1.0
        self._p = torch.as_tensor(p, dtype=torch.float64, device=self.device)
        xs = (X - self.x_mean_) / self.x_scale_
        ys = (y - self.y_mean_) / self.y_scale_
        return (torch.as_tensor(xs, dtype=torch.float64, device=self.device),
                torch.as_tensor(ys, dtype=torch.float64, device=self.device))

    def _weights(self, losses: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _scaled(self, losses: torch.Tensor) -> torch.Tensor:
        # NOTE(deviation): losses are divided by their (p̂-weighted) mean before weighting, so λ, α, β are
        # scale-free.
        if not self.normalize_loss:
            return losses
        mean = losses.mean() if self._uniform_p else self._p @ losses
        return losses / mean.clamp_min(1e-12)

    def _reweighted(self, losses: torch.Tensor) -> torch.Tensor:
        """Worst-case weights q of the method, tilted by the sample weights: q_i ∝ p̂_i n q_i (identity for
        uniform sample weights)."""
        if self._uniform_p:
            return self._weights(self._scaled(losses))
        losses = torch.where(self._p > 0, losses, torch.zeros_like(losses))  # rows without mass play no part
        q = self._weights(self._scaled(losses)) * self._p
        return q / q.sum()

    def _objective(self, q: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """The training objective at the worst case q (detached): ``Σ_i q_i ℓ_i(θ)``."""
        return (q * losses).sum()

    def _train(self, xt: torch.Tensor, yt: torch.Tensor) -> None:
        gen = torch.Generator().manual_seed(0 if self.random_state is None else int(self.random_state))
        self.model_ = self._make_model(xt.shape[1], gen)
        opt = torch.optim.Adam(self.model_.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=int(self.max_iter)) if self.lr_decay else None
        for _ in range(self.max_iter):
            losses = (self.model_(xt).squeeze(-1) - yt) ** 2
            q = self._reweighted(losses.detach())
            opt.zero_grad(set_to_none=True)
            self._objective(q, losses).backward()
            opt.step()
            if sched is not None:
                sched.step()
        self.n_iter_ = int(self.max_iter)
        # stationarity of the final iterate: ‖∇θ objective(θ; q(θ))‖ (Danskin: the gradient of the worst-case risk)
        losses = (self.model_(xt).squeeze(-1) - yt) ** 2
        q = self._reweighted(losses.detach())
        grads = torch.autograd.grad(self._objective(q, losses), list(self.model_.parameters()))
        self.final_grad_norm_ = float(torch.sqrt(sum((g ** 2).sum() for g in grads)))
        with torch.no_grad():
            losses = (self.model_(xt).squeeze(-1) - yt) ** 2
            self.weights_ = self._reweighted(losses).cpu().numpy()
            self.train_losses_ = (losses * self.y_scale_ ** 2).cpu().numpy()

    def predict(self, X: Any) -> np.ndarray:
        """Predictions in the original y units."""
        check_is_fitted(self, "model_")
        xa = np.asarray(X)
        if xa.dtype.kind in "fc" and not np.all(np.isfinite(xa)):
            raise ValueError("gcdro: X contains NaN or inf")
        X = _validate_data(self, X, dtype=np.float64, reset=False)  # "X has k features, but ... is expecting d"
        xt = torch.as_tensor((X - self.x_mean_) / self.x_scale_, dtype=torch.float64, device=self.device)
        with torch.no_grad():
            out = self.model_(xt).squeeze(-1).cpu().numpy()
        return out * self.y_scale_ + self.y_mean_

    @property
    def coef_(self) -> np.ndarray:
        """Linear model only: coefficients θ in the original X/y units."""
        check_is_fitted(self, "model_")
        if self.model != "linear":
            raise AttributeError("gcdro: coef_ is only defined for model='linear'")
        w = self.model_.weight.detach().cpu().numpy().ravel()
        return w * self.y_scale_ / self.x_scale_

    @property
    def intercept_(self) -> float:
        """Linear model only: the intercept in the original X/y units, so predict(X) = X @ coef_ + intercept_."""
        check_is_fitted(self, "model_")
        if self.model != "linear":
            raise AttributeError("gcdro: intercept_ is only defined for model='linear'")
        b = float(self.model_.bias.detach().cpu().numpy()[0])
        return float(self.y_mean_ + self.y_scale_ * b - self.coef_ @ self.x_mean_)


class GCDRORegressor(_BaseWeightedRegressor):
    """Geometry-Calibrated DRO regression (Liu et al., ICML 2024), squared loss.

    Each outer step replaces the empirical distribution p̂ by the approximate worst case q of

        sup_{q: GW_G(q, p̂) <= ρ}  Σ_i q_i ℓ_i(θ) − α·n·qᵀLq + β·H(q),

    obtained by ``n_inner`` steps of the upwind Wasserstein gradient flow on a kNN graph G of the training
    inputs (radius ρ ↔ flow time), then takes one Adam step on ``Σ_i q_i ℓ_i(θ)``. ``alpha = beta = 0``
    is GDRO (Liu et al., NeurIPS 2022).

    Assumptions: (i) the kNN graph of the standardised inputs (optionally with y) reflects the data
    manifold, so genuine sub-populations are regions of neighbouring points while gross label noise is
    isolated; the graph is made connected (k is doubled if needed); (ii) losses are per-sample squared
    errors, non-negative and finite; (iii) n is small enough for a full pass per outer step (O(n·k) per flow
    step); (iv) ``n_neighbors`` is much smaller than n, the noise fraction is small.

    Args:
        n_neighbors: k >= 1 of the kNN graph, clipped to n − 1 on data sets of n <= k samples (as
            :class:`~icml24.gcdro.GCDROWeighter` does per batch); the k used is ``n_neighbors_``.
        alpha: α >= 0, Dirichlet calibration weight (in units of u = n·q).
        beta: β >= 0, entropy weight / temperature.
        n_inner: T_in, gradient-flow steps per outer step.
        step_scale: c in (0, 1) of the adaptive step τ = c / max_i Σ_j w_ij|Φ_j − Φ_i|.
        restart: restart the flow from p̂ at every outer step (GDRO); else warm-start from the last q.
        use_y: build the graph on (x, y) instead of x only.
        sigma: Gaussian bandwidth of the graph weights (None = median kNN distance).
        normalize_loss: divide losses by their mean before the flow.
        model: ``"linear"`` or ``"mlp"`` (one hidden ReLU layer of ``hidden`` units).
        hidden: MLP width.
        lr: Adam learning rate η.
        max_iter: number of outer (full-batch) steps.
        lr_decay: cosine decay of the learning rate to 0 over ``max_iter`` steps.
        random_state: seed of the model initialisation.
        device: torch device for the model and the flow.
    """

    def __init__(self, *, n_neighbors: int = 10, alpha: float = 1.0, beta: float = 0.1, n_inner: int = 10,
                 step_scale: float = 0.5, restart: bool = False, use_y: bool = False, sigma: float | None = None,
                 normalize_loss: bool = True, model: Literal["linear", "mlp"] = "linear", hidden: int = 64,
                 lr: float = 1e-2, max_iter: int = 500, lr_decay: bool = True, random_state: int | None = None,
                 device: str = "cpu") -> None:
        self.n_neighbors = n_neighbors
        self.alpha = alpha
        self.beta = beta
        self.n_inner = n_inner
        self.step_scale = step_scale
        self.restart = restart
        self.use_y = use_y
        self.sigma = sigma
        self.normalize_loss = normalize_loss
        self.model = model
        self.hidden = hidden
        self.lr = lr
        self.max_iter = max_iter
        self.lr_decay = lr_decay
        self.random_state = random_state
        self.device = device

    def _check_params(self, n: int) -> None:
        _check_common(self)
        v.non_negative("gcdro", "alpha", self.alpha)
        v.non_negative("gcdro", "beta", self.beta)
        v.integer("gcdro", "n_neighbors", self.n_neighbors, minimum=1)
        # clip k to n − 1 (the default k = 10 on fewer than 11 samples, e.g. scikit-learn's 10-sample checks)
        self.n_neighbors_ = min(int(self.n_neighbors), n - 1)
        core.check_graph_params(n, n_neighbors=self.n_neighbors_, sigma=self.sigma)
        v.integer("gcdro", "n_inner", self.n_inner, minimum=0)
        v.probability("gcdro", "step_scale", self.step_scale, open_low=True, open_high=True)

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> GCDRORegressor:
        """Build the kNN graph of the training inputs and train the model on the GCDRO risk.

        Args:
            X: (n, d) inputs; y: (n,) targets.
            sample_weight: optional non-negative weights s_i of the empirical distribution p̂_i = s_i / Σ s_j.
                The standardisation and the loss normalisation use p̂, and the flow's worst case q is tilted by
                it: q_i ← p̂_i q_i / Σ_j p̂_j q_j. NOTE(deviation): this is exact for uniform weights only; the
                flow itself (graph, entropy) is still built on the unweighted sample.
        """
        xt, yt = self._prepare(X, y, sample_weight)
        self._check_params(xt.shape[0])
        z = xt.cpu().numpy()
        if self.use_y:
            z = np.column_stack([z, yt.cpu().numpy()])
        self.graph_ = core.knn_graph(z, n_neighbors=self.n_neighbors_, sigma=self.sigma)
        self.edges_ = core.EdgeList.from_adjacency(self.graph_, device=self.device)
        self._q_last: torch.Tensor | None = None
        self._train(xt, yt)
        return self

    def _weights(self, losses: torch.Tensor) -> torch.Tensor:
        q0 = None if (self.restart or self._q_last is None) else self._q_last
        q = core.gradient_flow(losses, self.edges_, alpha=float(self.alpha), beta=float(self.beta),
                               n_steps=self.n_inner, step_scale=self.step_scale, q0=q0)
        if not self.restart:
            self._q_last = q
        return q.to(losses.dtype)


class DRORegressor(_BaseWeightedRegressor):
    """Conventional DRO baselines, same model and training loop as GCDRO.

    ``method`` and its knob (losses are divided by their mean first when ``normalize_loss``, so the knobs are
    scale-free):

    * ``"erm"``: uniform weights, no knob.
    * ``"kl"``: KL-penalised, ``q ∝ exp(ℓ/λ)``, λ = ``penalty`` >= 1e-6 (larger = *less* robust).
    * ``"chi2"``: χ²-penalised, ``q_i = (ℓ_i − η)_+/(λ n)``, λ = ``penalty`` (larger = *less* robust).
    * ``"cvar"``: CVaR at level α = ``level`` in (0, 1], uniform on the top α fraction (larger = *less* robust).
    * ``"kl_constrained"``: ``sup {E_q ℓ : KL(q ‖ p̂) <= ρ}``, ρ = ``radius`` (dual form, Hu & Hong 2013).
    * ``"chi2_constrained"``: ``sup {E_q ℓ : D_χ²(q ‖ p̂) <= ρ}``, ρ = ``radius`` (dual form, Duchi & Namkoong 2021).
    * ``"wasserstein"``: Wasserstein DRO with transport cost ``‖x − x'‖₂²`` on the (standardised) features and
      y fixed, radius δ = ``radius``; for the squared loss of a linear model the worst-case risk is
      ``(sqrt(E_p̂ ℓ) + sqrt(δ) ‖θ‖₂)²`` (Blanchet, Kang & Murthy 2019, "Robust Wasserstein profile inference
      and applications to machine learning", J. Appl. Probab., Thm. 1 with q = 2), so the model minimises
      ``sqrt(E_p̂ ℓ) + sqrt(δ) ‖θ‖₂`` (the intercept is not transported, hence not penalised). Linear model only.
      It moves points instead of reweighting them, so ``weights_`` is p̂.

    ``radius`` (larger = *more* robust) is only used by the constrained methods. Previously ``radius``
    was the knob of ``kl``/``chi2``/``cvar`` (where larger meant less robust); passing it to those methods
    raises a ``ValueError`` that names the new argument.
    """

    def __init__(self, *, method: Literal["erm", "kl", "chi2", "cvar", "kl_constrained", "chi2_constrained",
                                          "wasserstein"] = "kl",
                 penalty: float = 1.0, level: float = 0.2, radius: float | None = None,
                 normalize_loss: bool = True, model: Literal["linear", "mlp"] = "linear", hidden: int = 64,
                 lr: float = 1e-2, max_iter: int = 500, lr_decay: bool = True, random_state: int | None = None,
                 device: str = "cpu") -> None:
        self.method = method
        self.penalty = penalty
        self.level = level
        self.radius = radius
        self.normalize_loss = normalize_loss
        self.model = model
        self.hidden = hidden
        self.lr = lr
        self.max_iter = max_iter
        self.lr_decay = lr_decay
        self.random_state = random_state
        self.device = device

    def _check_params(self) -> None:
        _check_common(self)
        v.one_of("gcdro", "method", self.method, _METHODS)
        if self.radius is not None and self.method not in _CONSTRAINED:
            new = {"kl": "penalty (KL temperature λ)", "chi2": "penalty (χ² penalty λ)",
                   "cvar": "level (CVaR level α)", "erm": "nothing (ERM has no knob)"}[self.method]
            raise ValueError(f"gcdro: DRORegressor(method={self.method!r}) takes {new}, not radius: radius is the "
                             "radius ρ of a constrained set (larger = more robust) and is only used by "
                             f"{', '.join(_CONSTRAINED)} (renamed; the old radius of kl/chi2/cvar meant the opposite)")
        if self.method in _CONSTRAINED:
            if self.radius is None:
                raise ValueError(f"gcdro: DRORegressor(method={self.method!r}) needs radius (ρ > 0)")
            v.positive("gcdro", "radius", self.radius)
        if self.method in _PENALISED:
            v.positive("gcdro", "penalty", self.penalty)
        if self.method == "kl":
            # softmax(ℓ/λ) with λ ~ 1e-310 overflows ℓ/λ to inf and the training turns NaN
            v.at_least("gcdro", "penalty (KL temperature)", self.penalty, _KL_MIN_TEMPERATURE)
        if self.method == "cvar":
            v.probability("gcdro", "level (CVaR level)", self.level, open_low=True)
        if self.method == "wasserstein" and self.model != "linear":
            raise ValueError("gcdro: method='wasserstein' (closed-form worst case of a linear model) needs "
                             f"model='linear', got {self.model!r}")

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> DRORegressor:
        """Train the model on the method's worst-case risk.

        Args:
            X: (n, d) inputs; y: (n,) targets.
            sample_weight: optional non-negative weights s_i of the empirical distribution p̂_i = s_i / Σ s_j.
                The worst case q of the method is tilted by p̂: q_i ← p̂_i q_i / Σ_j p̂_j q_j. Exact for ERM
                (weighted least squares), KL (the KL worst case around p̂ is ∝ p̂_i exp(ℓ_i/λ)) and Wasserstein
                (E_p̂ ℓ); for χ², CVaR and the constrained forms a documented approximation (NOTE(deviation)).
                Integer weights equal repeated rows for ERM and KL up to the optimiser's arithmetic.
        """
        self._check_params()
        xt, yt = self._prepare(X, y, sample_weight)
        self._train(xt, yt)
        return self

    def _weights(self, losses: torch.Tensor) -> torch.Tensor:
        m = self.method
        if m in ("erm", "wasserstein"):
            return core.erm_weights(losses)
        if m == "kl":
            return core.kl_worst_case(losses, temperature=float(self.penalty))
        if m == "chi2":
            return core.chi2_worst_case(losses, lam=float(self.penalty))
        if m == "cvar":
            return core.cvar_worst_case(losses, alpha=float(self.level))
        if m == "kl_constrained":
            return core.kl_constrained_worst_case(losses, radius=float(self.radius), iters=60)
        return core.chi2_constrained_worst_case(losses, radius=float(self.radius), iters=60)

    def _objective(self, q: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        if self.method != "wasserstein":
            return (q * losses).sum()
        risk = (q * losses).sum().clamp_min(1e-30)
        return torch.sqrt(risk) + float(np.sqrt(self.radius)) * torch.linalg.vector_norm(self.model_.weight)
