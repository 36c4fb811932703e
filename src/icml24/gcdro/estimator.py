"""scikit-learn regressors for GCDRO and the conventional DRO baselines (ERM, KL, χ², CVaR), one interface.

Outer loop (full batch): per-sample squared losses ℓ_i(θ) → worst-case weights q (detached) → Adam step on
``Σ_i q_i ℓ_i(θ)``. :class:`GCDRORegressor` gets q from the geometric Wasserstein gradient flow of the free
energy (``core.gradient_flow``) on a kNN graph of the training inputs; :class:`DRORegressor` from a closed-form
best response. Models: linear (``d + 1`` parameters) or a one-hidden-layer MLP.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_array, check_is_fitted, check_X_y

from icml24.common import validate as v
from icml24.gcdro import core

__all__ = ["GCDRORegressor", "DRORegressor"]

_METHODS = ("erm", "kl", "chi2", "cvar")
_KL_MIN_TEMPERATURE = core.KL_MIN_TEMPERATURE  # smaller λ makes ℓ/λ overflow (NaN weights mid-training)


def _validate_xy(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Shape / NaN checks with messages naming the argument, then sklearn's check_X_y."""
    xa, ya = np.asarray(X), np.asarray(y)
    if xa.ndim >= 1 and ya.ndim >= 1 and xa.shape[0] != ya.shape[0]:
        raise ValueError(f"gcdro: X and y must have the same number of samples, got {xa.shape[0]} and {ya.shape[0]}")
    for name, a in (("X", xa), ("y", ya)):
        if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            raise ValueError(f"gcdro: {name} contains NaN or inf")
    return check_X_y(X, y, dtype=np.float64, y_numeric=True)


def _check_common(est: _BaseWeightedRegressor) -> None:
    v.one_of("gcdro", "model", est.model, ("linear", "mlp"))
    v.integer("gcdro", "hidden", est.hidden, minimum=1)
    v.positive("gcdro", "lr", est.lr)
    v.integer("gcdro", "max_iter", est.max_iter, minimum=1)


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

    def _prepare(self, X: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        X, y = _validate_xy(X, y)
        self.n_features_in_ = X.shape[1]
        self.x_mean_, self.x_scale_ = X.mean(0), X.std(0)
        self.x_scale_[self.x_scale_ == 0] = 1.0
        self.y_mean_, self.y_scale_ = float(y.mean()), float(y.std()) or 1.0
        xs = (X - self.x_mean_) / self.x_scale_
        ys = (y - self.y_mean_) / self.y_scale_
        return (torch.as_tensor(xs, dtype=torch.float64, device=self.device),
                torch.as_tensor(ys, dtype=torch.float64, device=self.device))

    def _weights(self, losses: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _scaled(self, losses: torch.Tensor) -> torch.Tensor:
        # NOTE(deviation): losses are divided by their mean before weighting, so λ, α, β are scale-free.
        return losses / losses.mean().clamp_min(1e-12) if self.normalize_loss else losses

    def _train(self, xt: torch.Tensor, yt: torch.Tensor) -> None:
        gen = torch.Generator().manual_seed(0 if self.random_state is None else int(self.random_state))
        self.model_ = self._make_model(xt.shape[1], gen)
        opt = torch.optim.Adam(self.model_.parameters(), lr=self.lr)
        for _ in range(self.max_iter):
            losses = (self.model_(xt).squeeze(-1) - yt) ** 2
            q = self._weights(self._scaled(losses.detach()))
            opt.zero_grad(set_to_none=True)
            (q * losses).sum().backward()
            opt.step()
        with torch.no_grad():
            losses = (self.model_(xt).squeeze(-1) - yt) ** 2
            self.weights_ = self._weights(self._scaled(losses)).cpu().numpy()
            self.train_losses_ = (losses * self.y_scale_ ** 2).cpu().numpy()

    def predict(self, X: Any) -> np.ndarray:
        """Predictions in the original y units."""
        check_is_fitted(self, "model_")
        xa = np.asarray(X)
        if xa.dtype.kind in "fc" and not np.all(np.isfinite(xa)):
            raise ValueError("gcdro: X contains NaN or inf")
        X = check_array(X, dtype=np.float64)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"gcdro: X has {X.shape[1]} features, the model was fitted with {self.n_features_in_}")
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
        n_neighbors: k of the kNN graph (1 <= k < n).
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
        random_state: seed of the model initialisation.
        device: torch device for the model and the flow.
    """

    def __init__(self, *, n_neighbors: int = 10, alpha: float = 1.0, beta: float = 0.1, n_inner: int = 10,
                 step_scale: float = 0.5, restart: bool = False, use_y: bool = False, sigma: float | None = None,
                 normalize_loss: bool = True, model: Literal["linear", "mlp"] = "linear", hidden: int = 64,
                 lr: float = 1e-2, max_iter: int = 500, random_state: int | None = None,
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
        self.random_state = random_state
        self.device = device

    def _check_params(self, n: int) -> None:
        _check_common(self)
        v.non_negative("gcdro", "alpha", self.alpha)
        v.non_negative("gcdro", "beta", self.beta)
        core.check_graph_params(n, n_neighbors=self.n_neighbors, sigma=self.sigma)
        v.integer("gcdro", "n_inner", self.n_inner, minimum=0)
        v.probability("gcdro", "step_scale", self.step_scale, open_low=True, open_high=True)

    def fit(self, X: Any, y: Any) -> GCDRORegressor:
        """Build the kNN graph of the training inputs and train the model on the GCDRO risk."""
        xt, yt = self._prepare(X, y)
        self._check_params(xt.shape[0])
        z = xt.cpu().numpy()
        if self.use_y:
            z = np.column_stack([z, yt.cpu().numpy()])
        self.graph_ = core.knn_graph(z, n_neighbors=int(self.n_neighbors), sigma=self.sigma)
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
    """Conventional DRO baselines with closed-form worst cases, same model/training loop as GCDRO.

    ``method``: ``"erm"`` (uniform), ``"kl"`` (``q ∝ exp(ℓ/λ)``, λ = ``radius`` >= 1e-6), ``"chi2"``
    (``q_i = (ℓ_i − η)_+/(λ n)``, λ = ``radius``), ``"cvar"`` (uniform on the top ``radius`` fraction).
    Losses are divided by their mean first (``normalize_loss``), so ``radius`` is scale-free.
    """

    def __init__(self, *, method: Literal["erm", "kl", "chi2", "cvar"] = "kl", radius: float = 1.0,
                 normalize_loss: bool = True, model: Literal["linear", "mlp"] = "linear", hidden: int = 64,
                 lr: float = 1e-2, max_iter: int = 500, random_state: int | None = None,
                 device: str = "cpu") -> None:
        self.method = method
        self.radius = radius
        self.normalize_loss = normalize_loss
        self.model = model
        self.hidden = hidden
        self.lr = lr
        self.max_iter = max_iter
        self.random_state = random_state
        self.device = device

    def fit(self, X: Any, y: Any) -> DRORegressor:
        """Train the model on the ERM / KL / χ² / CVaR risk."""
        _check_common(self)
        v.one_of("gcdro", "method", self.method, _METHODS)
        v.positive("gcdro", "radius", self.radius)
        if self.method == "kl":
            # softmax(ℓ/λ) with λ ~ 1e-310 overflows ℓ/λ to inf and the training turns NaN
            v.at_least("gcdro", "radius (KL temperature)", self.radius, _KL_MIN_TEMPERATURE)
        if self.method == "cvar":
            v.probability("gcdro", "radius (CVaR level)", self.radius, open_low=True)
        xt, yt = self._prepare(X, y)
        self._train(xt, yt)
        return self

    def _weights(self, losses: torch.Tensor) -> torch.Tensor:
        if self.method == "erm":
            return core.erm_weights(losses)
        if self.method == "kl":
            return core.kl_worst_case(losses, temperature=float(self.radius))
        if self.method == "chi2":
            return core.chi2_worst_case(losses, lam=float(self.radius))
        return core.cvar_worst_case(losses, alpha=float(self.radius))
