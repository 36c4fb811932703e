"""Reproduction of "Optimal Differentially Private Model Training with Public Data" (Lowy et al., ICML 2024).

Four experiments (paper notes §5), every arm on identical data and seeds:

- E1 central mean estimation: throw-away (public mean), treat-as-private (Gaussian mechanism on all n),
  private-only, weighted (r* with v estimated from public data), weighted with the true v; Monte Carlo MSE
  against the closed forms over a grid of n_pub and ε.
- E2 local mean estimation with PrivUnitG: throw-away, treat-as-private (all users randomise), weighted.
- E3 semi-DP linear regression (scaled-down official config): throw-away least squares on public data,
  DP-GD on all data (public treated as private), semi-DP GD; hyper-parameters selected on validation data.
- E4 semi-DP logistic regression on sklearn digits: public-only SGD, DP-SGD on all data, semi-DP SGD.

Tuning (issue 26): every learning rate η is tuned per cell with ``common.tuning.tune_grid`` on the public
validation split (a geometric grid that extends itself by its ratio, up to ``grid_extra`` points, past an edge that
keeps winning); semi-DP's (β, η) product grid is tuned as β outside (on the public weight 1 − β, a geometric
scale) with η tuned inside at every β. No knob here has a natural bound: no edge of any grid equals another arm.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml24.common import validate as val
from icml24.common.config import ExperimentConfig
from icml24.common.config import help_text as _h
from icml24.common.data import load_sklearn
from icml24.common.plotting import new_figure, save_figure
from icml24.common.progress import progress
from icml24.common.results import ClaimCheck, RunRecorder, RunResult
from icml24.common.seeding import seed_everything, torch_generator
from icml24.common.tuning import Tuned, tune_grid, tuning_check
from icml24.dp_public.mean_estimation import (
    central_mse,
    ldp_mse,
    ldp_treat_as_private_mean,
    ldp_weighted_mean,
    private_only_mean,
    privunitg,
    privunitg_params,
    throw_away_mean,
    treat_as_private_mean,
    weighted_mean,
)
from icml24.dp_public.semi_dp import ReproducibleNoiseWarning, train_semi_dp

SLUG = "dp_public"

ME_ARMS = ("throw_away", "treat_as_private", "private_only", "weighted", "weighted_oracle")
LDP_ARMS = ("throw_away", "treat_as_private", "weighted", "weighted_oracle")


@dataclass(frozen=True)
class Config(ExperimentConfig):
    seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata=_h("random seeds (notes §5: 5 seeds)"))
    # ---- E1 central mean estimation (notes §5 E1)
    me_dim: int = field(default=50, metadata=_h("d, dimension (notes §5 E1)"))
    me_n: int = field(default=2000, metadata=_h("n = n_pub + n_priv (notes §5 E1)"))
    me_n_pub: tuple[int, ...] = field(default=(5, 10, 20, 50, 100, 200, 500),
                                      metadata=_h("grid of n_pub (notes §5 E1)"))
    me_epsilons: tuple[float, ...] = field(default=(0.5, 1.0, 2.0), metadata=_h("grid of ε (notes §5 E1)"))
    me_trials: int = field(default=100, metadata=_h("Monte Carlo trials per seed and grid point (notes: 1000; "
                                                     "5 seeds x 100 on this CPU budget)"))
    me_mean_norm: float = field(default=0.5, metadata=_h("||mu|| (notes §5 E1)"))
    me_radius: float = field(default=0.5, metadata=_h("ρ: x = mu + ρ ξ, ξ uniform on the sphere, so "
                                                        "||x|| <= 1 and v = ρ² [R: our data model]"))
    mechanism: str = field(default="analytic", metadata=_h("Gaussian mechanism calibration: analytic (Balle & "
                                                             "Wang 2018) or classic (ε <= 1 only)"))
    crossover_ratio: float = field(default=2.0, metadata=_h("crossover band: grid points where the two "
                                                              "baselines' analytic MSEs differ by <= this factor "
                                                              "(issue 10: 2)"))
    # ---- E2 local mean estimation with PrivUnitG (notes §5 E2)
    ldp_dim: int = field(default=32, metadata=_h("d (notes §5 E2)"))
    ldp_n: int = field(default=5000, metadata=_h("n (notes §5 E2)"))
    ldp_n_pub: tuple[int, ...] = field(default=(10, 50, 200), metadata=_h("grid of n_pub (notes §5 E2)"))
    ldp_epsilons: tuple[float, ...] = field(default=(1.0, 2.0, 4.0), metadata=_h("grid of ε (notes §5 E2)"))
    ldp_trials: int = field(default=50, metadata=_h("Monte Carlo trials per seed (notes §5 E2: 200; 5 seeds x "
                                                     "50 on this CPU budget)"))
    ldp_cos: float = field(default=0.5, metadata=_h("a: unit-norm data x = (a, sqrt(1-a²) u), mu = a e_1, "
                                                     "v = 1 - a² [R: our data model]"))
    # ---- shared privacy parameters
    delta: float = field(default=1e-5, metadata=_h("δ (notes §5 E1-E4; official linear script)"))
    clip_norm: float = field(default=1.0, metadata=_h("C, per-sample clipping norm (official scripts)"))
    # ---- E3 semi-DP linear regression (notes §5 E3, official run_linear_experiment.sh scaled down)
    lin_dim: int = field(default=50, metadata=_h("p (notes §5 E3; official 2000)"))
    lin_n_pub: int = field(default=75, metadata=_h("n_pub = 1.5 p (official script)"))
    lin_ratios: tuple[float, ...] = field(default=(0.01, 0.03, 0.1),
                                          metadata=_h("public fraction n_pub / n (notes §5 E3: also 0.02, 0.05)"))
    lin_epsilon: float = field(default=1.0, metadata=_h("ε (official script)"))
    lin_steps: int = field(default=60, metadata=_h("full-batch DP-GD steps (official private_epochs=59)"))
    lin_noise: float = field(default=0.5, metadata=_h("label noise std (official data generator)"))
    lin_n_val: int = field(default=25, metadata=_h("validation split taken from the public pool (pool = "
                                                    "lin_n_pub + lin_n_val); every arm is tuned on it"))
    lin_n_test: int = field(default=10000, metadata=_h("test samples (official: 10 000)"))
    lin_betas: tuple[float, ...] = field(default=(0.8, 0.95, 0.99, 0.995),
                                         metadata=_h("β grid for semi-DP besides β = n_priv/n (always added, a "
                                                     "duplicate dropped), every β in (0, 1); β = 1 is DP-GD on the "
                                                     "private data alone (official tuned β=0.943)"))
    lin_lrs: tuple[float, ...] = field(default=(0.2, 0.6, 1.8),
                                       metadata=_h("η grid of semi-DP (x the β grid); each one-knob arm gets as "
                                                   "many η, log-spaced over the same range (official η=2.645)"))
    # ---- E4 semi-DP logistic regression on digits (notes §5 E4)
    dig_public_frac: float = field(default=0.04, metadata=_h("public pool: fraction of the training split "
                                                              "(notes §5 E4: 2-5%)"))
    dig_val_frac: float = field(default=0.4, metadata=_h("validation split: fraction of the public pool; every arm "
                                                          "is tuned on it"))
    dig_epsilons: tuple[float, ...] = field(default=(0.5, 1.0, 2.0), metadata=_h("ε grid (notes §5 E4)"))
    dig_steps: int = field(default=500, metadata=_h("iterations T (notes §5 E4)"))
    dig_batch: int = field(default=64, metadata=_h("expected private (Poisson) batch and public batch "
                                                    "(notes §5 E4)"))
    dig_betas: tuple[float, ...] = field(default=(0.5,), metadata=_h(
        "β grid for semi-DP (official CIFAR β=0.4); with more than one value, each in [0, 1) (tuned on the public "
        "weight 1 − β, a geometric scale)"))
    dig_lrs: tuple[float, ...] = field(default=(0.1, 0.3, 1.0, 3.0), metadata=_h(
        "η grid of semi-DP (x the β grid); each one-knob arm gets as many η, log-spaced over the same range"))
    # ---- sanity thresholds (fixed before the first full run with them)
    regime_mse_ratio: float = field(default=1.05, metadata=_h(
        "E3 regime: DP-GD on all data and public least squares must each have test MSE >= this x the non-private "
        "GD on all data (paired 95% CI of the log-ratio above log of it)"))
    regime_acc_gap: float = field(default=1.0, metadata=_h(
        "E4 regime: non-private SGD on all data must beat DP-SGD on all data (per ε) and public-only SGD by >= "
        "this many accuracy points (paired 95% CI above it)"))
    interior_min_fraction: float = field(default=0.5, metadata=_h(
        "sanity (tuning): per arm and tuned knob, the least fraction of (seed, cell) picks strictly inside the "
        "evaluated grid, after its extensions (as kd_ranking)"))
    grid_extra: int = field(default=2, metadata=_h(
        "extra grid points tune_grid may add past an edge that keeps winning (issue 26); every arm gets the same "
        "budget"))

    def __post_init__(self) -> None:
        super().__post_init__()
        w = "Config"
        for name in ("me_dim", "me_n", "me_trials", "ldp_n", "ldp_trials", "lin_dim", "lin_n_pub", "lin_steps",
                     "lin_n_val", "lin_n_test", "dig_steps", "dig_batch"):
            val.integer(w, name, getattr(self, name), minimum=1)
        val.integer(w, "ldp_dim", self.ldp_dim, minimum=2)
        val.each(w, "me_n_pub", self.me_n_pub, val.integer, minimum=2, maximum=self.me_n - 1)
        val.each(w, "ldp_n_pub", self.ldp_n_pub, val.integer, minimum=2, maximum=self.ldp_n - 1)
        for name in ("me_epsilons", "ldp_epsilons", "dig_epsilons"):
            val.each(w, name, getattr(self, name), val.positive)
        val.privacy_budget(w, self.lin_epsilon, self.delta, epsilon_name="lin_epsilon")
        val.positive(w, "clip_norm", self.clip_norm)
        val.one_of(w, "mechanism", self.mechanism, ("analytic", "classic"))
        if self.mechanism == "classic":
            val.each(w, "me_epsilons (mechanism=classic)", self.me_epsilons, val.in_range, 0.0, 1.0, low_open=True)
        val.non_negative(w, "me_mean_norm", self.me_mean_norm)
        val.in_range(w, "me_radius", self.me_radius, 0.0, 1.0 - self.me_mean_norm, low_open=True)
        val.in_range(w, "ldp_cos", self.ldp_cos, 0.0, 1.0, high_open=True)
        val.in_range(w, "crossover_ratio", self.crossover_ratio, 1.0, math.inf)
        val.each(w, "lin_ratios", self.lin_ratios, val.probability, open_low=True, open_high=True)
        if self.lin_n_pub <= self.lin_dim:
            raise ValueError(f"{w}: lin_n_pub ({self.lin_n_pub}) must be > lin_dim ({self.lin_dim}) for least "
                             "squares")
        # β = 1 is private-only DP-GD, β = 0 public-only: the grid must mix both
        val.each(w, "lin_betas", self.lin_betas, val.probability, open_low=True, open_high=True)
        val.each(w, "dig_betas", self.dig_betas, val.probability)
        if len(set(self.dig_betas)) > 1:  # tuned on 1 − β, a geometric scale: β = 1 has no log
            val.each(w, "dig_betas (more than one: tuned on 1 − β)", self.dig_betas, val.probability,
                     open_high=True)
        val.integer(w, "grid_extra", self.grid_extra, minimum=0)
        for name in ("lin_lrs", "dig_lrs"):  # tune_grid needs two values to tune
            if len(set(getattr(self, name))) < 2:
                raise ValueError(f"{w}: {name} needs >= 2 distinct values (tune_grid), got {getattr(self, name)}")
        val.each(w, "lin_lrs", self.lin_lrs, val.positive)
        val.each(w, "dig_lrs", self.dig_lrs, val.positive)
        val.probability(w, "dig_public_frac", self.dig_public_frac, open_low=True, open_high=True)
        val.probability(w, "dig_val_frac", self.dig_val_frac, open_low=True, open_high=True)
        val.in_range(w, "regime_mse_ratio", self.regime_mse_ratio, 1.0, math.inf)
        val.non_negative(w, "regime_acc_gap", self.regime_acc_gap)
        val.probability(w, "interior_min_fraction", self.interior_min_fraction)

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=(0, 1), me_n_pub=(10, 50, 200), me_epsilons=(0.5, 2.0), me_trials=30,
                   ldp_n_pub=(10, 200), ldp_epsilons=(1.0, 4.0), ldp_trials=30, ldp_n=2000,
                   lin_ratios=(0.05,), lin_betas=(0.99,), lin_lrs=(0.3, 0.9), lin_n_test=4000,
                   dig_epsilons=(1.0,), dig_steps=150, dig_betas=(0.5,), dig_lrs=(0.3, 1.0), grid_extra=1)


# ------------------------------------------------------------------------------------------------- E1
def _sphere(shape: tuple[int, ...], g: torch.Generator, device: str,
            dtype: torch.dtype = torch.float64) -> torch.Tensor:
    z = torch.randn(shape, generator=g, dtype=dtype, device=device)
    return z / z.norm(dim=-1, keepdim=True)


def run_central(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """E1: Monte Carlo MSE[arm] of shape (len(ε), len(n_pub)) for one seed.

    Every trial draws n points once; for each n_pub the first n_pub points are public and the rest private.
    Each arm is the library estimator itself (``throw_away_mean``, ``treat_as_private_mean``,
    ``private_only_mean``, ``weighted_mean`` with v estimated from the public points, ``weighted_mean`` with the
    true v), called on a batch of trials (leading dimension) with its own fresh noise. Float32 (half the
    memory traffic of float64; the squared errors are summed in float64).
    """
    g = torch_generator(seed, cfg.device)
    d, n = cfg.me_dim, cfg.me_n
    mu = _sphere((d,), g, cfg.device, torch.float32) * cfg.me_mean_norm
    sq = {a: np.zeros((len(cfg.me_epsilons), len(cfg.me_n_pub))) for a in ME_ARMS}
    chunk = max(1, min(cfg.me_trials, 10))
    done = 0
    v_true = cfg.me_radius**2
    kw = {"delta": cfg.delta, "mechanism": cfg.mechanism, "generator": g}

    def err(m: torch.Tensor) -> float:
        return float(((m - mu).double() ** 2).sum(-1).sum())

    while done < cfg.me_trials:
        c = min(chunk, cfg.me_trials - done)
        x = mu + cfg.me_radius * _sphere((c, n, d), g, cfg.device, torch.float32)
        for j, k in enumerate(cfg.me_n_pub):
            x_pub, x_priv = x[:, :k].contiguous(), x[:, k:].contiguous()
            e_pub = err(throw_away_mean(x_pub))
            for i, eps in enumerate(cfg.me_epsilons):
                sq["throw_away"][i, j] += e_pub
                sq["treat_as_private"][i, j] += err(treat_as_private_mean(x_priv, x_pub, epsilon=eps, **kw))
                sq["private_only"][i, j] += err(private_only_mean(x_priv, epsilon=eps, **kw))
                sq["weighted"][i, j] += err(weighted_mean(x_priv, x_pub, epsilon=eps, **kw)[0])
                sq["weighted_oracle"][i, j] += err(weighted_mean(x_priv, x_pub, epsilon=eps, v=v_true, **kw)[0])
        done += c
    return {a: v / cfg.me_trials for a, v in sq.items()}


def central_analytic(cfg: Config) -> dict[str, np.ndarray]:
    out = {a: np.zeros((len(cfg.me_epsilons), len(cfg.me_n_pub))) for a in ME_ARMS if a != "weighted"}
    for i, eps in enumerate(cfg.me_epsilons):
        for j, k in enumerate(cfg.me_n_pub):
            for a in out:
                est = "weighted" if a == "weighted_oracle" else a
                out[a][i, j] = central_mse(estimator=est, n_pub=k, n_priv=cfg.me_n - k, dim=cfg.me_dim,
                                           v=cfg.me_radius**2, epsilon=eps, delta=cfg.delta,
                                           mechanism=cfg.mechanism)  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------------------------- E2
def run_local(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """E2: Monte Carlo MSE[arm] of shape (len(ε), len(n_pub)) for one seed (PrivUnitG reports).

    Every user's report comes from :func:`privunitg`; the server estimators are the library ones
    (``throw_away_mean``, ``ldp_treat_as_private_mean``, ``ldp_weighted_mean`` with v estimated from the public
    users or the true v), called on a batch of trials. All n users randomise once per trial; for each n_pub the
    first n_pub users are public (their raw data are used) and the reports of the others are the private part.
    """
    g = torch_generator(seed + 10_000, cfg.device)
    d, n, a = cfg.ldp_dim, cfg.ldp_n, cfg.ldp_cos
    v_true = 1 - a * a
    mu = torch.zeros(d, dtype=torch.float64, device=cfg.device)
    mu[0] = a
    sq = {k: np.zeros((len(cfg.ldp_epsilons), len(cfg.ldp_n_pub))) for k in LDP_ARMS}
    params = {eps: privunitg_params(epsilon=eps) for eps in cfg.ldp_epsilons}
    chunk = max(1, min(cfg.ldp_trials, 20))
    done = 0

    def err(m: torch.Tensor) -> float:
        return float(((m - mu) ** 2).sum(-1).sum())

    while done < cfg.ldp_trials:
        c = min(chunk, cfg.ldp_trials - done)
        u = _sphere((c, n, d - 1), g, cfg.device)
        x = torch.cat([torch.full((c, n, 1), a, dtype=torch.float64, device=cfg.device),
                       math.sqrt(1 - a * a) * u], dim=-1)
        for i, eps in enumerate(cfg.ldp_epsilons):
            z = privunitg(x, epsilon=eps, generator=g, params=params[eps])
            e_all = err(ldp_treat_as_private_mean(z))
            for j, k in enumerate(cfg.ldp_n_pub):
                x_pub, reports = x[:, :k], z[:, k:]
                sq["throw_away"][i, j] += err(throw_away_mean(x_pub))
                sq["treat_as_private"][i, j] += e_all
                sq["weighted"][i, j] += err(ldp_weighted_mean(reports=reports, x_pub=x_pub, epsilon=eps)[0])
                sq["weighted_oracle"][i, j] += err(ldp_weighted_mean(reports=reports, x_pub=x_pub, epsilon=eps,
                                                                     v=v_true)[0])
        done += c
    return {k: v / cfg.ldp_trials for k, v in sq.items()}


def local_analytic(cfg: Config) -> dict[str, np.ndarray]:
    v = 1 - cfg.ldp_cos**2
    out = {a: np.zeros((len(cfg.ldp_epsilons), len(cfg.ldp_n_pub))) for a in LDP_ARMS if a != "weighted"}
    for i, eps in enumerate(cfg.ldp_epsilons):
        for j, k in enumerate(cfg.ldp_n_pub):
            for a in out:
                est = "weighted" if a == "weighted_oracle" else a
                out[a][i, j] = ldp_mse(estimator=est, n_pub=k, n_priv=cfg.ldp_n - k, dim=cfg.ldp_dim, v=v,
                                       epsilon=eps)  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------------------------- E3
def _sq_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out.reshape(-1) - y.reshape(-1)) ** 2).mean()


def _lin_mse(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return float(((x @ w - y) ** 2).mean())


_DIVERGED = 1e30  # a validation MSE that is not finite (a diverged run) scores as this, the worst


def tune_lr(fit: Any, lrs: list[float], *, maximize: bool, max_extra: int) -> Tuned:
    """η tuned with :func:`tune_grid` on a geometric grid: ``fit(lr)`` returns ``(validation score, test metric)``
    of the arm trained at ``lr``; one replicate unit per cell (the validation split's score)."""
    def evaluate(values: list[float]) -> list[dict[str, list[float]]]:
        out = []
        for lr in values:
            v, t = fit(lr)
            out.append({"val": [v if math.isfinite(v) else (-_DIVERGED if maximize else _DIVERGED)], "test": [t]})
        return out
    return tune_grid(evaluate, lrs, score="val", maximize=maximize, log=True, max_extra=max_extra)


def tune_beta_lr(fit: Any, betas: tuple[float, ...], lrs: list[float], *, maximize: bool, max_extra: int
                 ) -> tuple[Tuned | None, Tuned, float]:
    """Semi-DP's (β, η): β tuned with :func:`tune_grid` on the public weight 1 − β (a geometric scale; an extension
    stops at 1 − β = 1, public only), η tuned inside at every β. ``fit(beta, lr)`` as in :func:`tune_lr`.

    Returns ``(outer, inner, beta)``: the Tuned of 1 − β (None when one β is given), the η Tuned at the picked β,
    and the picked β.
    """
    if len(set(betas)) == 1:
        b = float(betas[0])
        return None, tune_lr(lambda lr: fit(b, lr), lrs, maximize=maximize, max_extra=max_extra), b
    inner: dict[float, Tuned] = {}

    def evaluate(weights: list[float]) -> list[dict[str, list[float]]]:
        out = []
        for w in weights:
            b = _beta(w)
            t = inner[w] = tune_lr(lambda lr, b=b: fit(b, lr), lrs, maximize=maximize, max_extra=max_extra)
            out.append({"val": t.at("val"), "test": t.at("test"), "lr": [t.value]})
        return out
    outer = tune_grid(evaluate, [1.0 - b for b in betas], score="val", maximize=maximize, log=True,
                      max_extra=max_extra, limits=(None, 1.0))
    return outer, inner[outer.value], _beta(outer.value)


def _beta(public_weight: float) -> float:
    return round(1.0 - public_weight, 12)


def _tuned_summary(t: Tuned, *, beta_scale: bool = False) -> dict[str, Any]:
    """A Tuned as JSON: pick, evaluated grid and extensions (as β when ``beta_scale``: t tunes 1 − β)."""
    f = _beta if beta_scale else float
    return {"picked": f(t.value), "grid": sorted(f(v) for v in t.grid), "extensions": [f(v) for v in t.extensions],
            "ok": t.ok}


def tuning_grids(betas: tuple[float, ...], lrs: tuple[float, ...]) -> tuple[list[tuple[float, float]], list[float]]:
    """Equal tuning budgets: the (β, η) product grid of semi-DP, and a log-spaced η grid with as many points,
    over the same range, for each one-knob arm (same number of configurations evaluated on validation)."""
    grid = [(b, lr) for b in betas for lr in lrs]
    lo, hi = min(lrs), max(lrs)
    one = [float(v) for v in np.geomspace(lo, hi, len(grid))] if hi > lo else [lo] * len(grid)
    return grid, one


def linear_betas(cfg: Config, ratio: float) -> tuple[float, ...]:
    """E3's β grid: β = n_priv / n (semi-DP = DP-GD on all data, in distribution) followed by ``lin_betas``
    (a value equal to n_priv / n is dropped, so that every configuration is evaluated once)."""
    n_pub = cfg.lin_n_pub
    n = int(round(n_pub / ratio))
    eq = (n - n_pub) / n
    return (eq, *(b for b in cfg.lin_betas if not math.isclose(b, eq, rel_tol=1e-9)))


def run_linear(cfg: Config, seed: int, ratio: float) -> dict[str, Any]:
    """E3 for one seed and public fraction: test MSE of throw-away LS, DP-GD on all data, semi-DP GD at
    β = n_priv / n, semi-DP GD with β tuned, and the non-private reference (the same clipped GD on all data
    without noise, for the regime sanity check).

    The public pool holds ``lin_n_pub + lin_n_val`` points: ``lin_n_val`` of them are the validation split on
    which every arm is tuned with the same number of configurations, the other ``lin_n_pub`` are the public
    training data. n = lin_n_pub / ratio.
    """
    g = torch_generator(seed * 1000 + int(round(ratio * 1e4)), cfg.device)
    p, n_pub = cfg.lin_dim, cfg.lin_n_pub
    n_priv = int(round(n_pub / ratio)) - n_pub
    theta = torch.randn(p, generator=g, device=cfg.device)

    def draw(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(m, p, generator=g, device=cfg.device)
        return x, x @ theta + cfg.lin_noise * torch.randn(m, generator=g, device=cfg.device)

    x_pool, y_pool = draw(n_pub + cfg.lin_n_val)  # the public pool: validation split + public training data
    x_val, y_val, x_pub, y_pub = x_pool[:cfg.lin_n_val], y_pool[:cfg.lin_n_val], x_pool[cfg.lin_n_val:], \
        y_pool[cfg.lin_n_val:]
    x_priv, y_priv = draw(n_priv)
    x_te, y_te = draw(cfg.lin_n_test)
    w_ls = torch.linalg.solve(x_pub.T @ x_pub, x_pub.T @ y_pub)  # warm start = throw-away baseline
    beta_eq = n_priv / (n_priv + n_pub)
    grid, one_knob = tuning_grids(linear_betas(cfg, ratio), cfg.lin_lrs)

    x_all, y_all = torch.cat([x_priv, x_pub]), torch.cat([y_priv, y_pub])

    def train(mode: str, lr: float, beta: float) -> torch.Tensor:
        model = torch.nn.Linear(p, 1, bias=False).to(cfg.device)
        with torch.no_grad():
            model.weight.copy_(w_ls[None])
        # non-private reference: the same clipped full-batch GD on all data without noise (public_only on all)
        xq, yq = (x_all, y_all) if mode == "non_private" else (x_pub, y_pub)
        # full batch under add/remove: the sum is divided by the data set's size declared by the design (n_priv,
        # or n_priv + n_pub when the public rows join the noisy batch), a public constant of the Config
        declared = n_priv + n_pub if mode == "dp_sgd_all" else n_priv
        with warnings.catch_warnings():  # seeded on purpose: the experiment must be reproducible
            warnings.simplefilter("ignore", ReproducibleNoiseWarning)
            train_semi_dp(model, _sq_loss, mode="public_only" if mode == "non_private" else mode,  # type: ignore
                          x_priv=x_priv, y_priv=y_priv, x_pub=xq, y_pub=yq, epsilon=cfg.lin_epsilon,
                          delta=cfg.delta, steps=cfg.lin_steps, lr=lr, beta=beta, max_grad_norm=cfg.clip_norm,
                          batch_size=None, expected_batch_size=declared, public_batch_size=None, generator=g)
        return model.weight.detach()[0]

    def fit(mode: str, beta: float) -> Any:
        def go(lr: float) -> tuple[float, float]:
            w = train(mode, lr, beta)
            return _lin_mse(w, x_val, y_val), _lin_mse(w, x_te, y_te)
        return go

    kw = {"maximize": False, "max_extra": cfg.grid_extra}
    t_all = tune_lr(fit("dp_sgd_all", 1.0), one_knob, **kw)
    t_eq = tune_lr(fit("semi_dp", beta_eq), one_knob, **kw)
    t_beta, t_semi, b_semi = tune_beta_lr(lambda b, lr: fit("semi_dp", b)(lr), linear_betas(cfg, ratio),
                                          list(cfg.lin_lrs), **kw)
    t_np = tune_lr(fit("non_private", 0.0), one_knob, **kw)
    tuned = {"dp_gd_all": t_all, "semi_dp_beta_eq": t_eq, "semi_dp": t_semi, "non_private": t_np}
    betas = {"dp_gd_all": 1.0, "semi_dp_beta_eq": beta_eq, "semi_dp": b_semi, "non_private": 0.0}
    return {"throw_away": _lin_mse(w_ls, x_te, y_te), **{a: t.at("test")[0] for a, t in tuned.items()},
            "hp": {a: {"lr": t.value, "beta": betas[a]} for a, t in tuned.items()},
            "grid": {"beta": [b for b, _ in grid], "lr": list(cfg.lin_lrs), "one_knob_lr": one_knob},
            "n_priv": n_priv, "beta_eq": beta_eq, "budget": len(grid),
            "tuning": {**{a: _tuned_summary(t) for a, t in tuned.items()},
                       **({"semi_dp_beta": _tuned_summary(t_beta, beta_scale=True)} if t_beta else {})},
            "tuned": {**tuned, "semi_dp_beta": t_beta}}


# ------------------------------------------------------------------------------------------------- E4
def _ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(out, y)


def run_digits(cfg: Config, seed: int) -> dict[str, Any]:
    """E4 for one seed: test accuracy (%) per ε of public-only SGD, DP-SGD on all data, semi-DP SGD, and the
    ε-independent non-private reference (the same clipped SGD on all training data without noise, for the regime
    sanity check).

    The public pool is ``dig_public_frac`` of the training split; ``dig_val_frac`` of the pool is the validation
    split on which every arm is tuned with the same number of configurations, the rest is the public training
    data; every other training point is private.
    """
    split = load_sklearn("digits", seed=seed, test_size=0.25, scale="none").to(cfg.device)
    # pixel range is known (0..16): data-independent scaling keeps the preprocessing free of privacy cost
    x, y = split.x_train / 16.0, split.y_train
    x_te, y_te = split.x_test / 16.0, split.y_test
    g = torch_generator(seed + 20_000, cfg.device)
    perm = torch.randperm(len(x), generator=g, device=cfg.device)
    n_pool = int(round(cfg.dig_public_frac * len(x)))
    n_val = max(1, int(round(cfg.dig_val_frac * n_pool)))
    if not 2 <= n_pool - n_val < len(x) - n_pool:
        raise ValueError(f"dp_public: dig_public_frac={cfg.dig_public_frac} and dig_val_frac={cfg.dig_val_frac} "
                         f"leave {n_pool - n_val} public training points of {len(x)}")
    iv, ipub, ipriv = perm[:n_val], perm[n_val:n_pool], perm[n_pool:]
    data = {"x_priv": x[ipriv], "y_priv": y[ipriv], "x_pub": x[ipub], "y_pub": y[ipub]}
    x_all, y_all = x[perm[n_val:]], y[perm[n_val:]]  # every training point outside the validation split
    grid, one_knob = tuning_grids(cfg.dig_betas, cfg.dig_lrs)

    def acc(m: torch.nn.Module, xx: torch.Tensor, yy: torch.Tensor) -> float:
        with torch.no_grad():
            return 100.0 * float((m(xx).argmax(1) == yy).float().mean())

    spent: dict[tuple[str, float], float] = {}

    def fit(mode: str, eps: float, b: float, lr: float) -> tuple[float, float]:
        torch.manual_seed(seed)
        model = torch.nn.Linear(x.shape[1], split.n_classes).to(cfg.device)
        # non-private reference: clipped minibatch SGD on all training data (public_only on the union)
        kw = dict(data, x_pub=x_all, y_pub=y_all) if mode == "non_private" else data
        with warnings.catch_warnings():  # seeded on purpose: the experiment must be reproducible
            warnings.simplefilter("ignore", ReproducibleNoiseWarning)
            tr = train_semi_dp(model, _ce, mode="public_only" if mode == "non_private" else mode,  # type: ignore
                               epsilon=eps, delta=cfg.delta,
                               steps=cfg.dig_steps, lr=lr, beta=b, max_grad_norm=cfg.clip_norm,
                               batch_size=cfg.dig_batch, public_batch_size=cfg.dig_batch,
                               clip_public=mode in ("semi_dp", "non_private"), generator=g, **kw)
        if tr.epsilon is not None:
            spent[(mode, eps)] = max(spent.get((mode, eps), 0.0), tr.epsilon)
        return acc(model, x[iv], y[iv]), acc(model, x_te, y_te)

    kw = {"maximize": True, "max_extra": cfg.grid_extra}
    t_pub = tune_lr(lambda lr: fit("public_only", 1.0, 0.0, lr), one_knob, **kw)  # ε-independent
    t_np = tune_lr(lambda lr: fit("non_private", 1.0, 0.0, lr), one_knob, **kw)  # ε-independent
    hp_pub = {"lr": t_pub.value, "beta": 0.0}
    out: dict[str, Any] = {"public_only": {}, "dp_sgd_all": {}, "semi_dp": {}, "hp": {}, "n_pub": n_pool - n_val,
                           "n_val": n_val, "n_priv": len(ipriv), "budget": len(grid),
                           "non_private": t_np.at("test")[0], "hp_non_private": {"lr": t_np.value, "beta": 0.0},
                           "grid": {"lr": list(cfg.dig_lrs), "beta": list(cfg.dig_betas), "one_knob_lr": one_knob},
                           "tuning": {"public_only": _tuned_summary(t_pub), "non_private": _tuned_summary(t_np)},
                           "tuned": {"public_only": t_pub, "non_private": t_np}}
    for eps in cfg.dig_epsilons:
        t_all = tune_lr(lambda lr, eps=eps: fit("dp_sgd_all", eps, 1.0, lr), one_knob, **kw)
        t_beta, t_semi, b_semi = tune_beta_lr(lambda b, lr, eps=eps: fit("semi_dp", eps, b, lr), cfg.dig_betas,
                                              list(cfg.dig_lrs), **kw)
        out["public_only"][eps] = t_pub.at("test")[0]
        out["dp_sgd_all"][eps] = t_all.at("test")[0]
        out["semi_dp"][eps] = t_semi.at("test")[0]
        out["hp"][eps] = {"public_only": hp_pub, "dp_sgd_all": {"lr": t_all.value, "beta": 1.0},
                          "semi_dp": {"lr": t_semi.value, "beta": b_semi}}
        out["tuning"][f"dp_sgd_all eps={eps:g}"] = _tuned_summary(t_all)
        out["tuning"][f"semi_dp eps={eps:g}"] = _tuned_summary(t_semi)
        out["tuned"][("dp_sgd_all", eps)] = t_all
        out["tuned"][("semi_dp", eps)] = t_semi
        if t_beta is not None:
            out["tuning"][f"semi_dp_beta eps={eps:g}"] = _tuned_summary(t_beta, beta_scale=True)
            out["tuned"][("semi_dp_beta", eps)] = t_beta
    out["epsilon_spent"] = {f"{m} eps={e:g}": v for (m, e), v in spent.items()}
    return out


# ------------------------------------------------------------------------------------------------- run
def _band_mask(ta: np.ndarray, tp: np.ndarray, ratio: float) -> np.ndarray:
    return np.maximum(ta, tp) / np.minimum(ta, tp) <= ratio


LIN_ARMS = ("throw_away", "dp_gd_all", "semi_dp_beta_eq", "semi_dp", "non_private")


def _band_gain(mse: dict[str, np.ndarray], base: np.ndarray, band: np.ndarray) -> tuple[float, float]:
    """Per seed: geometric means over the band cells of the weighted MSE and of the better baseline's MSE
    (``base`` names, per cell, the baseline with the lower pooled mean)."""
    w = mse["weighted"][band]
    b = np.where(base, mse["throw_away"], mse["treat_as_private"])[band]
    return float(np.exp(np.mean(np.log(w)))), float(np.exp(np.mean(np.log(b))))


def run(cfg: Config, out_dir: Path) -> RunResult:
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    rec = RunRecorder(SLUG, cfg, out_dir)
    out_dir = Path(out_dir)
    me_an, ldp_an = central_analytic(cfg), local_analytic(cfg)
    band = _band_mask(me_an["throw_away"], me_an["treat_as_private"], cfg.crossover_ratio)
    ldp_band = _band_mask(ldp_an["throw_away"], ldp_an["treat_as_private"], cfg.crossover_ratio)
    me_runs: dict[str, list[np.ndarray]] = {a: [] for a in ME_ARMS}
    ldp_runs: dict[str, list[np.ndarray]] = {a: [] for a in LDP_ARMS}
    lin_runs: list[dict[float, dict[str, Any]]] = []
    dig_runs: list[dict[str, Any]] = []
    for seed in progress(cfg.seeds, desc=SLUG):
        seed_everything(seed)
        metrics: dict[str, dict[str, float]] = {}
        me = run_central(cfg, seed)
        for a in ME_ARMS:
            me_runs[a].append(me[a])
        ld = run_local(cfg, seed)
        for a in LDP_ARMS:
            ldp_runs[a].append(ld[a])
        lin = {r: run_linear(cfg, seed, r) for r in cfg.lin_ratios}
        lin_runs.append(lin)
        for r, res in lin.items():
            for a in LIN_ARMS:
                metrics[f"E3 {a} ratio={r:g}"] = {"test_mse": res[a]}
        dig = run_digits(cfg, seed)
        dig_runs.append(dig)
        for eps in cfg.dig_epsilons:
            for a in ("public_only", "dp_sgd_all", "semi_dp"):
                metrics[f"E4 {a} eps={eps:g}"] = {"acc": dig[a][eps]}
        metrics["E4 non_private"] = {"acc": dig["non_private"]}
        metrics["E4 public_only"] = {"acc": dig["public_only"][cfg.dig_epsilons[0]]}
        rec.add_seed(seed, metrics)

    # E1/E2: the better baseline per cell from the pooled Monte Carlo means, then per seed the geometric mean
    # over the crossover band of the weighted MSE and of that baseline's MSE (the paired units are seeds)
    me_mean = {a: np.mean(v, axis=0) for a, v in me_runs.items()}
    ldp_mean = {a: np.mean(v, axis=0) for a, v in ldp_runs.items()}
    me_base = me_mean["throw_away"] <= me_mean["treat_as_private"]
    ldp_base = ldp_mean["throw_away"] <= ldp_mean["treat_as_private"]
    for i, seed in enumerate(cfg.seeds):
        row = next(r for r in rec.per_seed if r["seed"] == seed)["metrics"]
        for tag, runs, base, bnd in (("E1", me_runs, me_base, band), ("E2", ldp_runs, ldp_base, ldp_band)):
            if bnd.any():
                w, b = _band_gain({a: v[i] for a, v in runs.items()}, base, bnd)
                row[f"{tag} weighted"] = {"band_mse_geomean": w}
                row[f"{tag} best_baseline"] = {"band_mse_geomean": b}
    s = rec.summary()

    me_best = np.minimum(me_mean["throw_away"], me_mean["treat_as_private"])
    ldp_best = np.minimum(ldp_mean["throw_away"], ldp_mean["treat_as_private"])
    me_ratio = me_mean["weighted"] / me_best
    ldp_ratio = ldp_mean["weighted"] / ldp_best
    me_relerr = max(float(np.abs(me_mean[a] / me_an[a] - 1).max()) for a in me_an)
    ldp_relerr = max(float(np.abs(ldp_mean[a] / ldp_an[a] - 1).max()) for a in ldp_an)

    def base_names(base: np.ndarray, bnd: np.ndarray) -> str:
        return ", ".join("throw-away" if b else "treat-as-private" for b in base[bnd])

    checks = [
        # near-identities as built (each baseline is the weighted estimator at an end of its r range): mechanisms
        ClaimCheck(name="E1 weighted <= 1.02 x best baseline (all n_pub, ε)", metric="mse_ratio",
                   measured=float(me_ratio.max()), threshold=1.02, direction="<=", kind="mechanism",
                   method_arm="E1 weighted", paper_value="MSE(r*) <= min(throw-away, treat-as-private)",
                   detail=f"max over {me_ratio.size} grid points of pooled MSE_weighted / min(baselines); "
                          f"per grid point: {np.round(me_ratio, 3).tolist()}"),
        ClaimCheck(name="E1 analytic MSE matches Monte Carlo within 5%", metric="max_rel_err",
                   measured=me_relerr, threshold=0.05, direction="<=", kind="mechanism",
                   paper_value="closed forms (notes §2.2)",
                   detail=f"max |MC/analytic - 1| over arms {sorted(me_an)} and the grid; "
                          f"{len(cfg.seeds) * cfg.me_trials} trials per point"),
        ClaimCheck(name="E2 LDP weighted <= 1.02 x best baseline", metric="mse_ratio",
                   measured=float(ldp_ratio.max()), threshold=1.02, direction="<=", kind="mechanism",
                   method_arm="E2 weighted", paper_value="optimal incl. constants (abstract)",
                   detail=f"per grid point: {np.round(ldp_ratio, 3).tolist()}"),
        ClaimCheck(name="E2 LDP analytic MSE matches Monte Carlo within 5%", metric="max_rel_err",
                   measured=ldp_relerr, threshold=0.05, direction="<=", kind="mechanism",
                   paper_value="PrivUnitG variance",
                   detail=f"max |MC/analytic - 1| over arms {sorted(ldp_an)} and the grid; "
                          f"{len(cfg.seeds) * cfg.ldp_trials} trials per point"),
    ]
    for tag, bnd, thr, pv, base in (
            ("E1", band, math.log(0.9), "largest gain where the baselines cross (notes: < 0.9 x min)", me_base),
            ("E2", ldp_band, 0.0, "weighted <= both baselines (notes §5 E2)", ldp_base)):
        if not bnd.any():
            continue
        label = "< 0.9 x" if tag == "E1" else "<"
        checks.append(rec.paired(
            name=f"{tag} weighted {label} best baseline in the crossover band", metric="band_mse_geomean",
            method_arm=f"{tag} weighted", baseline_arm=f"{tag} best_baseline", direction="<=", threshold=thr,
            log_ratio=True, kind="claim", paper_value=pv,
            detail=f"{int(bnd.sum())} band cells (analytic baseline MSEs within x{cfg.crossover_ratio:g}); better "
                   f"baseline per cell (pooled): {base_names(base, bnd)}; per seed the log of the geometric-mean "
                   f"MSE ratio over the band"))
    lin_table = {}
    for r in cfg.lin_ratios:
        for base, pv in (("dp_gd_all", "semi-DP <= DP-GD on all data"),
                         ("semi_dp_beta_eq", "tuned β beats β = n_priv/n")):
            checks.append(rec.paired(
                name=e3_claim(r, base), metric="test_mse",
                method_arm=f"E3 semi_dp ratio={r:g}", baseline_arm=f"E3 {base} ratio={r:g}", direction="<=",
                threshold=0.0, log_ratio=True, kind="claim", paper_value=pv,
                detail="paired per-seed log(semi-DP tuned / baseline) against log 1; equal tuning budgets on the "
                       "public validation split"))
        lin_table[r] = {a: [lr[r][a] for lr in lin_runs] for a in LIN_ARMS}
    for eps in cfg.dig_epsilons:
        base = max(("public_only", "dp_sgd_all"), key=lambda a: s[f"E4 {a} eps={eps:g}"]["acc"]["mean"])
        checks.append(rec.paired(name=e4_claim(eps), metric="acc",
                                 method_arm=f"E4 semi_dp eps={eps:g}", baseline_arm=f"E4 {base} eps={eps:g}",
                                 direction=">=", threshold=-0.5, kind="claim", paper_value="semi-DP >= baselines"))

    checks += _sanity_checks(cfg, rec, lin_runs, dig_runs)

    arts = [_plot_mean(cfg, me_runs, me_an, out_dir / "mse_vs_npub_central.png", cfg.me_n_pub, cfg.me_epsilons,
                       "central (ε, δ)-DP", ME_ARMS),
            _plot_mean(cfg, ldp_runs, ldp_an, out_dir / "mse_vs_npub_local.png", cfg.ldp_n_pub,
                       cfg.ldp_epsilons, "local ε-DP (PrivUnitG)", LDP_ARMS),
            _plot_linear(cfg, lin_table, out_dir / "linreg_mse_vs_ratio.png"),
            _plot_digits(cfg, dig_runs, out_dir / "digits_acc_vs_eps.png")]
    chosen = {str(r): [lr[r]["hp"]["semi_dp"]["beta"] for lr in lin_runs] for r in cfg.lin_ratios}
    tuning = {"E3": {f"ratio={r:g}": [lr[r]["tuning"] for lr in lin_runs] for r in cfg.lin_ratios},
              "E4": [dr["tuning"] for dr in dig_runs], "grid_extra": cfg.grid_extra}
    for lr in lin_runs:  # the Tuned objects were for the checks; extra keeps their JSON summaries
        for res in lr.values():
            res.pop("tuned", None)
    for dr in dig_runs:
        dr.pop("tuned", None)
    extra = {
        "E1": {"n_pub": cfg.me_n_pub, "epsilons": cfg.me_epsilons, "band": band, "better_baseline_is_throw_away":
               me_base, "mc_mse": me_mean, "analytic_mse": me_an, "weighted_over_best": me_ratio},
        "E2": {"n_pub": cfg.ldp_n_pub, "epsilons": cfg.ldp_epsilons, "band": ldp_band,
               "better_baseline_is_throw_away": ldp_base, "mc_mse": ldp_mean, "analytic_mse": ldp_an,
               "weighted_over_best": ldp_ratio,
               "privunitg": {str(e): vars(privunitg_params(epsilon=e)) for e in cfg.ldp_epsilons}},
        "E3": {"per_seed": [{str(r): v for r, v in lr.items()} for lr in lin_runs], "chosen_beta": chosen,
               "beta_grid": {str(r): linear_betas(cfg, r) for r in cfg.lin_ratios}},
        "E4": {"per_seed": [{k: ({str(e): vv for e, vv in v.items()} if isinstance(v, dict) else v)
                             for k, v in dr.items()} for dr in dig_runs]},
        "tuning": tuning,
    }
    return rec.finish(checks, artifacts=arts, extra=extra)


def e3_claim(ratio: float, base: str) -> str:
    """The name of E3's claim against ``base`` at public fraction ``ratio`` (guards name claims exactly)."""
    return f"E3 tuned-β semi-DP test MSE < {base} (ratio {ratio:g})"


def e4_claim(eps: float) -> str:
    """The name of E4's claim at privacy level ``eps``."""
    return f"E4 semi-DP acc >= best baseline - 0.5 pt (ε={eps:g})"


def _lead(check: ClaimCheck, sentence: str) -> ClaimCheck:
    """Put the one sentence naming what a sanity check guards against first in its detail."""
    check.detail = f"{sentence} {check.detail}".strip()
    return check


def _sanity_checks(cfg: Config, rec: RunRecorder, lin_runs: list[dict[float, dict[str, Any]]],
                   dig_runs: list[dict[str, Any]]) -> list[ClaimCheck]:
    """The regime (DP noise hurts; public data alone are not enough) and tuned values inside their grids.

    Regime, against the non-private reference (the same clipped GD / SGD on all data without noise), paired over
    seeds with the 95% t interval: E3 per public fraction, DP-GD on all data and public least squares each have a
    test MSE >= ``regime_mse_ratio`` x the reference; E4 the reference beats DP-SGD on all data (per ε) and
    public-only SGD by >= ``regime_acc_gap`` points. Each regime check guards the claims of its cell (E3: its public
    fraction; E4: its ε, or every ε for the ε-independent public-only check). Tuning (``tuning_check``): per arm and
    knob, the fraction of (seed, cell) picks strictly inside the evaluated grid, after up to ``grid_extra``
    extensions, is >= ``interior_min_fraction``; it guards the claims of its experiment that depend on the arm
    (E3 dp_gd_all / semi_dp_beta_eq: the claims against that arm; the method and the non-private reference, which
    conditions the regime checks: every claim of the experiment).
    """
    thr = math.log(cfg.regime_mse_ratio)
    e3_all = [e3_claim(r, b) for r in cfg.lin_ratios for b in ("dp_gd_all", "semi_dp_beta_eq")]
    e4_all = [e4_claim(e) for e in cfg.dig_epsilons]
    out: list[ClaimCheck] = []
    for r in cfg.lin_ratios:
        for base, what, why in (
                ("dp_gd_all", "DP noise hurts: DP-GD on all data",
                 "the regime: DP noise must cost accuracy at this public fraction, else there is nothing for the "
                 "public data to recover."),
                ("throw_away", "public data alone are not enough: public least squares",
                 "the regime: the public data alone must not suffice at this public fraction, else throwing the "
                 "private data away is optimal.")):
            out.append(_lead(rec.paired(
                name=f"E3 regime (ratio {r:g}): {what} >= {cfg.regime_mse_ratio:g} x non-private GD test MSE",
                metric="test_mse", method_arm=f"E3 {base} ratio={r:g}", baseline_arm=f"E3 non_private ratio={r:g}",
                direction=">=", threshold=thr, log_ratio=True, kind="sanity",
                guards=[e3_claim(r, b) for b in ("dp_gd_all", "semi_dp_beta_eq")],
                detail="paired per-seed log(test MSE arm / non-private clipped full-batch GD on all data, η tuned "
                       "on the same validation split with the same budget)"), why))
    for eps in cfg.dig_epsilons:
        out.append(_lead(rec.paired(
            name=f"E4 regime (ε={eps:g}): DP noise hurts: non-private SGD >= DP-SGD on all data + "
                 f"{cfg.regime_acc_gap:g} pt", metric="acc", method_arm="E4 non_private",
            baseline_arm=f"E4 dp_sgd_all eps={eps:g}", direction=">=", threshold=cfg.regime_acc_gap, kind="sanity",
            guards=[e4_claim(eps)], detail="paired per-seed accuracy difference (points)"),
            "the regime: DP noise must cost accuracy at this ε, else there is nothing for the public data to "
            "recover."))
    out.append(_lead(rec.paired(
        name=f"E4 regime: public data alone are not enough: non-private SGD >= public-only SGD + "
             f"{cfg.regime_acc_gap:g} pt", metric="acc", method_arm="E4 non_private", baseline_arm="E4 public_only",
        direction=">=", threshold=cfg.regime_acc_gap, kind="sanity", guards=e4_all,
        detail="paired per-seed accuracy difference"),
        "the regime: the public data alone must not suffice (at every ε: public-only SGD does not depend on ε), "
        "else throwing the private data away is optimal."))
    thr_in = cfg.interior_min_fraction
    cells = [lr[r]["tuned"] for lr in lin_runs for r in cfg.lin_ratios]
    ext = f"up to {cfg.grid_extra} extensions past an edge that keeps winning"
    if cells[0]["semi_dp_beta"] is not None:
        out.append(tuning_check(
            name="E3 semi-DP's tuned β lies inside its grid", arm="E3 semi_dp", threshold=thr_in,
            tuned=[c["semi_dp_beta"] for c in cells], guards=e3_all,
            detail=("tuning: semi-DP's β must lie inside its evaluated grid, else every E3 claim may compare an "
                    "untuned method. (seed, public fraction) cells; grid {n_priv/n} ∪ lin_betas, tuned on the "
                    f"public weight 1 − β (the values below), {ext}")))
    out.append(tuning_check(
        name="E3 semi-DP's tuned η lies inside its grid", arm="E3 semi_dp", threshold=thr_in,
        tuned=[c["semi_dp"] for c in cells], guards=e3_all,
        detail=("tuning: semi-DP's η (at its tuned β) must lie inside its evaluated grid, else every E3 claim may "
                f"compare an untuned method. (seed, public fraction) cells, {ext}")))
    for arm, guards, role in (
            ("dp_gd_all", [e3_claim(r, "dp_gd_all") for r in cfg.lin_ratios], "the claims against it"),
            ("semi_dp_beta_eq", [e3_claim(r, "semi_dp_beta_eq") for r in cfg.lin_ratios], "the claims against it"),
            ("non_private", e3_all, "the regime checks, hence every E3 claim")):
        out.append(tuning_check(
            name=f"E3 {arm}'s tuned η lies inside its grid", arm=f"E3 {arm}", threshold=thr_in,
            tuned=[c[arm] for c in cells], guards=guards,
            detail=(f"tuning: {arm}'s η must lie inside its evaluated grid, else {role} may rest on an untuned arm. "
                    "one-knob arm: as many η as semi-DP's (β, η) grid, log-spaced over the same range; "
                    f"{ext}")))
    dcells = [(d, e) for d in dig_runs for e in cfg.dig_epsilons]
    if ("semi_dp_beta", cfg.dig_epsilons[0]) in dig_runs[0]["tuned"]:
        out.append(tuning_check(
            name="E4 semi-DP's tuned β lies inside its grid", arm="E4 semi_dp", threshold=thr_in,
            tuned=[d["tuned"][("semi_dp_beta", e)] for d, e in dcells], guards=e4_all,
            detail=("tuning: semi-DP's β must lie inside its evaluated grid, else every E4 claim may compare an "
                    f"untuned method. (seed, ε) cells, tuned on the public weight 1 − β, {ext}")))
    beta_note = (f"β fixed at {', '.join(f'{b:g}' for b in cfg.dig_betas)}" if len(set(cfg.dig_betas)) == 1
                 else "at its tuned β")
    for name, arm, tuned, what, role in (
            ("E4 semi-DP's tuned η lies inside its grid", "E4 semi_dp",
             [d["tuned"][("semi_dp", e)] for d, e in dcells], f"(seed, ε) cells; {beta_note}",
             "every E4 claim may compare an untuned method"),
            ("E4 DP-SGD's tuned η lies inside its grid", "E4 dp_sgd_all",
             [d["tuned"][("dp_sgd_all", e)] for d, e in dcells], "(seed, ε) cells",
             "the best baseline of every E4 claim may be an untuned arm"),
            ("E4 public-only's tuned η lies inside its grid", "E4 public_only",
             [d["tuned"]["public_only"] for d in dig_runs], "seeds (ε-independent)",
             "the best baseline of every E4 claim may be an untuned arm"),
            ("E4 non-private reference's tuned η lies inside its grid", "E4 non_private",
             [d["tuned"]["non_private"] for d in dig_runs], "seeds (ε-independent)",
             "the regime checks, hence every E4 claim, may rest on an untuned reference")):
        out.append(tuning_check(
            name=name, arm=arm, threshold=thr_in, tuned=tuned, guards=e4_all,
            detail=f"tuning: {arm.split()[1]}'s η must lie inside its evaluated grid, else {role}. {what}, {ext}"))
    return out


# ------------------------------------------------------------------------------------------------- plots
_COLORS = {"throw_away": "C0", "treat_as_private": "C1", "private_only": "C4", "weighted": "C3",
           "weighted_oracle": "C2", "public_only": "C0", "dp_sgd_all": "C1", "dp_gd_all": "C1", "semi_dp": "C3",
           "semi_dp_beta_eq": "C5", "non_private": "k"}


def _plot_mean(cfg: Config, runs: dict[str, list[np.ndarray]], analytic: dict[str, np.ndarray], path: Path,
               n_pub: tuple[int, ...], epsilons: tuple[float, ...], title: str, arms: tuple[str, ...]) -> Path:
    fig, axes = new_figure(len(epsilons), width=4.2)
    for i, (ax, eps) in enumerate(zip(axes, epsilons, strict=True)):
        for a in arms:
            y = np.stack(runs[a])[:, i, :]
            m = y.mean(0)
            sd = y.std(0, ddof=1) if len(y) > 1 else np.zeros_like(m)
            ax.errorbar(n_pub, m, yerr=sd, label=a, color=_COLORS[a], marker="o", ms=3, capsize=2)
            if a in analytic:
                ax.plot(n_pub, analytic[a][i], ls=":", color=_COLORS[a], lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n_pub (public samples)")
        ax.set_ylabel("MSE  E||mu_hat - mu||^2")
        ax.set_title(f"{title}, ε={eps:g}")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)


def _plot_linear(cfg: Config, table: dict[float, dict[str, list[float]]], path: Path) -> Path:
    fig, axes = new_figure(1)
    rs = list(cfg.lin_ratios)
    for a in LIN_ARMS:
        y = np.array([table[r][a] for r in rs]).T
        sd = y.std(0, ddof=1) if len(y) > 1 else np.zeros(len(rs))
        axes[0].errorbar(rs, y.mean(0), yerr=sd, label=a, color=_COLORS[a], marker="o", capsize=2)
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("public fraction n_pub / n")
    axes[0].set_ylabel("test MSE")
    axes[0].set_title(f"E3 linear regression, p={cfg.lin_dim}, ε={cfg.lin_epsilon:g}")
    axes[0].legend()
    return save_figure(fig, path)


def _plot_digits(cfg: Config, runs: list[dict[str, Any]], path: Path) -> Path:
    fig, axes = new_figure(1)
    es = list(cfg.dig_epsilons)
    for a in ("public_only", "dp_sgd_all", "semi_dp"):
        y = np.array([[r[a][e] for e in es] for r in runs])
        sd = y.std(0, ddof=1) if len(y) > 1 else np.zeros(len(es))
        axes[0].errorbar(es, y.mean(0), yerr=sd, label=a, color=_COLORS[a], marker="o", capsize=2)
    axes[0].axhline(float(np.mean([r["non_private"] for r in runs])), color=_COLORS["non_private"], ls="--", lw=1,
                    label="non_private (reference)")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("ε")
    axes[0].set_ylabel("test accuracy (%)")
    axes[0].set_title(f"E4 digits logistic regression, {cfg.dig_public_frac:.0%} public")
    axes[0].legend()
    return save_figure(fig, path)
