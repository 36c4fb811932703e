"""Reproduction: rates and adaptivity of private projection density estimators (Lalanne & Gadat, ICML 2024).

For densities of known Sobolev smoothness beta on [0,1]^d (d = 1, 2), every arm is run on the same samples, at a
fixed small zCDP budget rho and at a budget rho_n that holds the privacy cost constant: the all-cutoffs oracle,
the within-family oracle (best member of the released dyadic family), the private Lepskii estimator, and three
negative controls (the non-private optimal cutoff released with the same noise; classical Lepskii on the same
private family; the oracle cutoff of the smallest n kept for every n). ISE is exact by Parseval. Claim (issue 29,
"adaptive up to a log factor" as a rate statement): per (d, beta), the slope of log(private Lepskii / oracle
MISE) against log n stays below rate_bound (a log factor, slope ~ 1/ln n, passes; n^a with a > rate_bound fails),
guarded per (d, beta) by the fixed-cutoff control, which must fail the same statistic (amendment A6). The
privacy-naive arms lose a constant factor, not a rate: mechanisms check that their ratio to the oracle exceeds
private Lepskii's (paired log-ratio over seeds), guarding nothing. Mechanisms also: the empirical MISE matches
the closed form, and at rho_n the oracle MISE decays with slope -2beta/(beta+d) in n sqrt(rho_n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from threadpoolctl import threadpool_limits

from icml24.common import validate as val
from icml24.common.config import ExperimentConfig
from icml24.common.config import help_text as _h
from icml24.common.plotting import new_figure, save_figure
from icml24.common.progress import progress
from icml24.common.results import ClaimCheck, RunRecorder, RunResult, one_sample_check, paired_check
from icml24.common.seeding import numpy_generator, seed_everything
from icml24.common.stats import one_sample_ci
from icml24.common.tuning import Tuned, tune_grid
from icml24.private_density.projection import (
    CALIBRATED_KAPPA_PRIV,
    ZCDP,
    PrivateLepskiiDensity,
    TrigDensity,
    cube_index_set,
    empirical_coefficients,
    expected_mise,
    privatize_coefficients,
)

SLUG = "private_density"
ARMS = ("oracle", "within_family", "lepskii_private", "lepskii_naive", "nonprivate_cutoff", "fixed_cutoff")
"""Arms per path: the all-cutoffs oracle, the within-family oracle, the method, and three negative controls."""
CONTROLS = {"nonprivate_cutoff": "non-private optimal cutoff", "lepskii_naive": "privacy-naive Lepskii",
            "fixed_cutoff": "fixed cutoff (the oracle cutoff of the smallest n, not adapted to n)"}
"""The negative controls of the C3 rate claims (arm -> label)."""
PATHS = ("fixed", "scaled")
"""fixed: rho = cfg.rho at every n; scaled: rho_n at constant closed-form privacy cost cfg.cost_target."""


@dataclass(frozen=True)
class Config(ExperimentConfig):
    seeds: tuple[int, ...] = field(default=(10, 11, 12, 13, 14), metadata=_h(
        "seeds; each seed draws its own density (random coefficient signs), samples and noise. Amendment A6: "
        "fresh seeds 10-14 (not the first run's 0-4, not the pilot's 100); no pooling with seeds 0-4"))
    dims: tuple[int, ...] = field(default=(1, 2), metadata=_h("d, dimensions of the hypercube (notes §5)"))
    betas: tuple[float, ...] = field(default=(0.5, 1.5, 2.5), metadata=_h(
        "beta, Sobolev smoothness of the test densities (notes §5 grid, non-integers included)"))
    n_grid: tuple[int, ...] = field(default=(10_000, 30_000, 100_000, 300_000), metadata=_h(
        "n, sample sizes (log-spaced; shifted up from notes §5 so that rho below keeps privacy dominant; "
        "1e6 dropped from the schema-1 grid for the CPU budget)"))
    rho: float = field(default=1e-5, metadata=_h(
        "rho, zCDP budget (small: the privacy-dominated regime, notes §2.3 / §5 C2)"))
    degree_d1: int = field(default=64, metadata=_h("M, truncation |k|_inf <= M of the d=1 densities (notes §5)"))
    degree_d2: int = field(default=16, metadata=_h(
        "M for d=2 (notes: 24; 16 keeps sampling at n=1e6 affordable)"))
    max_cutoff_d1: int = field(default=32, metadata=_h("N_max, largest cutoff in d=1 (oracle search and Lepskii)"))
    max_cutoff_d2: int = field(default=16, metadata=_h("N_max in d=2 (notes §5)"))
    samples_per_cell: int = field(default=2, metadata=_h("independent data sets per (d, beta, n) cell and seed"))
    noise_draws: int = field(default=25, metadata=_h(
        "privacy-noise draws per data set (reps per cell = samples_per_cell * noise_draws)"))
    scheme: Literal["shell", "independent"] = field(default="shell", metadata=_h(
        "Lepskii budget split (notes §2.4 (b) shell / (a) independent)"))
    kappa_stat: float = field(default=1.0, metadata=_h("kappa_1, statistical Lepskii constant (notes §2.4)"))
    kappa_priv: float = field(default=CALIBRATED_KAPPA_PRIV, metadata=_h(
        "kappa_2, privacy-penalty constant (absorbs log(M/eta)); frozen from calibrate_kappa_priv on a held-out "
        "density (beta=1, seed 1000), see README"))
    decay_excess: float = field(default=0.0, metadata=_h(
        "extra coefficient decay (notes: 0.05); 0 makes the bias exactly of order N^{-2 beta}"))
    scaling: Literal["bound", "grid"] = field(default="grid", metadata=_h(
        "density scale: 'grid' min f = 0.2 on a grid (stronger signal), 'bound' certified bound (notes)"))
    dominated_cost: float = field(default=2.0, metadata=_h(
        "a cell is privacy-dominated when (closed-form) private oracle MISE >= this x non-private oracle MISE"))
    slope_tol: float = field(default=0.1, metadata=_h("C2 tolerance on the log-log slope (notes §5 C2)"))
    cost_target: float = field(default=3.0, metadata=_h(
        "C2: privacy cost (closed-form private / non-private oracle MISE) held at this value for every n by "
        "scaling rho_n, so that the rate is measured inside one regime; it must stay below the cost of the "
        "noise-free cutoff-0 estimator (3.6-3.95 for d=2, beta=0.5 at n=1e4)"))
    cost_ceiling_fraction: float = field(default=0.9, metadata=_h(
        "amendment A7: a density whose cutoff-0 cost ceiling at the smallest n is below cost_target / this gets the "
        "scaled-path target this x that ceiling (constant over its n grid) instead of cost_target, which it cannot "
        "reach (closed form of the known density, before any data; a no-op on seeds 0-4, whose ceilings are >= 3.53)"))
    cost_band: float = field(default=2.0, metadata=_h(
        "C2 regime sanity check: every cell's measured privacy cost lies in [cost_target / this, cost_target x "
        "this]"))
    closed_form_tol: float = field(default=0.1, metadata=_h(
        "C1: |empirical oracle MISE / closed form - 1| <= this in every cell (notes §5 C1: 10%)"))
    grid_extra: int = field(default=2, metadata=_h(
        "extra grid points tune_grid may add past an edge that keeps winning (issue 26); every arm gets the same "
        "budget (used by tune_kappa_priv, the held-out calibration of kappa_2; the run itself tunes nothing)"))
    rate_bound: float = field(default=0.25, metadata=_h(
        "C3 (issue 29): per (d, beta), the mean per-seed slope of log(median ISE ratio to the all-cutoffs oracle) "
        "against log n must have its upper 95% t bound <= this. An exact log factor C log n has slope 1/ln n = "
        "0.109..0.079 over n = 1e4..3e5 (with C log M of the dyadic family, M = log2 N_max + 1, constant in n), so "
        "it passes; a polynomial loss n^a with a > 0.25 fails. Fixed before the run; the constant C is reported "
        "unchecked"))
    claim_path: Literal["fixed", "scaled"] = field(default="fixed", metadata=_h(
        "C3 path in (n, rho): 'fixed' rho = cfg.rho at every n (the old C3 cells, all privacy-dominated), "
        "'scaled' the constant-privacy-cost rho_n of C2; the other path is reported unchecked"))
    rate_control_arms: tuple[str, ...] = field(default=("fixed_cutoff",), metadata=_h(
        "negative controls of the C3 rate claims (amendment A6): the claim's own rate statistic is applied to each "
        "on the claim path and must reject it (upper 95% bound of its slope > rate_bound); each guards the C3 "
        "claim of its (d, beta). The fixed cutoff (not adapted to n) is the variant the adaptivity argument says "
        "must lose a rate; the privacy-naive arms lose a constant factor that shrinks with n on a fixed family "
        "(slope (a-2)(1-beta/(beta+d)) <= 0 along rho_n ~ n^-a, a <= 2), so a rate statistic cannot reject them"))
    constant_control_arms: tuple[str, ...] = field(default=("nonprivate_cutoff", "lepskii_naive"), metadata=_h(
        "constant-factor controls of C3 (amendment A6; mechanisms, guarding nothing): per (d, beta) and arm, per "
        "seed the mean over the claim path's privacy-dominated cells of log(median ISE arm / median ISE private "
        "Lepskii), i.e. the paired log-ratio of their geometric-mean ratios to the oracle; holds when the lower "
        "end of its 95% t interval over seeds is >= 0"))

    def __post_init__(self) -> None:
        super().__post_init__()
        w = "Config"
        val.each(w, "dims", self.dims, val.one_of, (1, 2, 3))
        val.each(w, "betas", self.betas, val.positive)
        val.each(w, "n_grid", self.n_grid, val.integer, minimum=2)
        if len(self.n_grid) < 2 or list(self.n_grid) != sorted(set(self.n_grid)):
            raise ValueError(f"{w}: n_grid must hold >= 2 increasing sizes >= 2, got {self.n_grid}")
        val.positive(w, "rho", self.rho)
        for name in ("degree_d1", "degree_d2", "max_cutoff_d1", "max_cutoff_d2", "samples_per_cell", "noise_draws"):
            val.integer(w, name, getattr(self, name), minimum=1)
        for name in ("kappa_stat", "kappa_priv", "decay_excess"):
            val.non_negative(w, name, getattr(self, name))
        val.in_range(w, "dominated_cost", self.dominated_cost, 1.0, math.inf)
        val.positive(w, "slope_tol", self.slope_tol)
        val.in_range(w, "cost_target", self.cost_target, 1.0, math.inf, low_open=True)
        val.in_range(w, "cost_band", self.cost_band, 1.0, math.inf, low_open=True)
        val.in_range(w, "cost_ceiling_fraction", self.cost_ceiling_fraction, 0.0, 1.0, low_open=True, high_open=True)
        val.positive(w, "closed_form_tol", self.closed_form_tol)
        val.integer(w, "grid_extra", self.grid_extra, minimum=0)
        val.positive(w, "rate_bound", self.rate_bound)
        val.one_of(w, "claim_path", self.claim_path, PATHS)
        val.each(w, "rate_control_arms", self.rate_control_arms, val.one_of, tuple(CONTROLS))
        val.each(w, "constant_control_arms", self.constant_control_arms, val.one_of, tuple(CONTROLS))

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=(0, 1), betas=(1.5,), n_grid=(10_000, 30_000, 100_000), degree_d1=32, degree_d2=12,
                   max_cutoff_d1=16, max_cutoff_d2=8, samples_per_cell=2, noise_draws=6)

    def degree(self, d: int) -> int:
        return self.degree_d1 if d == 1 else self.degree_d2

    def max_cutoff(self, d: int) -> int:
        return self.max_cutoff_d1 if d == 1 else self.max_cutoff_d2


def theory_slope(beta: float, d: int) -> float:
    """-2 beta / (beta + d): the privacy-dominated zCDP rate exponent in n (notes §2.3)."""
    return -2.0 * beta / (beta + d)


def _mise_curves(pieces: dict[int, dict[str, float]], n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form MISE for every cutoff 0..N_max: private at rho-zCDP, and non-private."""
    nmax = max(pieces)
    mise_np = np.array([pieces[N]["bias2"] + pieces[N]["stat"] / n for N in range(nmax + 1)])
    mise_p = mise_np + np.array([pieces[N]["priv"] for N in range(nmax + 1)]) / (n * n * rho)
    return mise_p, mise_np


def cost_ceiling(pieces: dict[int, dict[str, float]], *, n: int) -> float:
    """The largest closed-form privacy cost reachable at n: as rho -> 0 the best estimator is the noise-free
    cutoff 0, so the cost tends to bias^2(0) / min_N MISE_np(N)."""
    mise_np = _mise_curves(pieces, n, 1.0)[1]
    return float(mise_np[0] / mise_np.min())


def scaled_cost_target(cfg: Config, pieces: dict[int, dict[str, float]]) -> float:
    """Amendment A7: the scaled path's constant privacy cost for one density: cfg.cost_target, or, when the
    density cannot reach it at the smallest n (the ceiling rises with n), cfg.cost_ceiling_fraction x that
    ceiling. Computed from the known density's closed form before any data are drawn."""
    return min(cfg.cost_target, cfg.cost_ceiling_fraction * cost_ceiling(pieces, n=min(cfg.n_grid)))


def rho_for_cost(pieces: dict[int, dict[str, float]], *, n: int, cost: float) -> float:
    """The zCDP budget rho_n at which the closed-form privacy cost min_N MISE_rho(N) / min_N MISE_np(N) equals
    ``cost`` (bisection in log rho; the cost decreases monotonically in rho). A design choice made from the
    known test density, before any data are drawn."""
    lo, hi = math.log(1e-30), math.log(1e30)

    def c(log_rho: float) -> float:
        mp, mn = _mise_curves(pieces, n, math.exp(log_rho))
        return float(mp.min() / mn.min())

    ceiling = c(lo)  # as rho -> 0 the best estimator is the noise-free cutoff 0: the cost cannot exceed this
    if not 1.0 < cost < ceiling:
        raise ValueError(f"rho_for_cost: a privacy cost of {cost:g} is not reachable at n={n}: it must lie in "
                         f"(1, {ceiling:.4g}) (the cutoff-0 estimator, which adds no noise, bounds it)")

    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if c(mid) > cost else (lo, mid)
        if hi - lo < 1e-10:
            break
    return math.exp(0.5 * (lo + hi))


def _family_oracle_cutoff(pieces: dict[int, dict[str, float]], *, n: int, noise_energy: dict[int, float]) -> int:
    """The within-family oracle: the member of the released dyadic family with the smallest closed-form MISE,
    bias^2 + sum Var/n + its exact noise energy under the family's budget split (it knows f, like the oracle)."""
    return min(noise_energy, key=lambda c: (pieces[c]["bias2"] + pieces[c]["stat"] / n + noise_energy[c], c))


def _cell(cfg: Config, dens: TrigDensity, d: int, n: int, pieces: dict[int, dict[str, float]],
          rng: np.random.Generator, kappa_grid: tuple[float, ...] = (), rho_scaled: float | None = None,
          fixed_cuts: dict[str, int] | None = None) -> dict:
    """All arms on the same data sets for one (density, n): ISE per rep and chosen cutoffs, at the fixed budget
    ``cfg.rho`` (path "fixed") and, with ``rho_scaled``, at the constant-privacy-cost budget rho_n (path "scaled").

    Arms per path: the all-cutoffs oracle (closed-form argmin over 0..N_max, full budget), the within-family oracle
    (closed-form best member of the released dyadic family), private Lepskii (the method), privacy-naive Lepskii
    (kappa_2 = 0 on the same release), the non-private optimal cutoff and the fixed cutoff ``fixed_cuts[path]``
    (the oracle cutoff of the path's smallest n, never adapted to n), each released at the full budget."""
    nmax = cfg.max_cutoff(d)
    kmax = cube_index_set(cutoff=nmax, dim=d)
    linf = np.abs(kmax).max(1)
    true = dens.coefficients_on(kmax)
    bias2 = {N: pieces[N]["bias2"] for N in range(nmax + 1)}

    def ise(coefs: np.ndarray, N: int) -> float:
        return float(np.sum((coefs - true[linf <= N]) ** 2)) + bias2[N]

    levels = {"fixed": cfg.rho} | ({"scaled": rho_scaled} if rho_scaled is not None else {})
    plan: dict[str, dict] = {}
    for p, rho in levels.items():
        mise_p, mise_np = _mise_curves(pieces, n, rho)
        n_or = int(mise_p.argmin())
        plan[p] = {"rho": rho, "mise_p": mise_p, "mise_np": mise_np, "within": None,
                   "cuts": {"oracle": n_or, "nonprivate_cutoff": int(mise_np.argmin())}}
        if fixed_cuts is not None:  # without it (the kappa calibration) the control is not drawn: same stream as before
            plan[p]["cuts"]["fixed_cutoff"] = int(fixed_cuts[p])
    n_np = plan["fixed"]["cuts"]["nonprivate_cutoff"]
    acc = {p: {a: [] for a in (*ARMS, "cut_lepskii_private", "cut_lepskii_naive")} for p in levels}
    nonprivate_oracle: list[float] = []
    by_kappa: dict[float, list[float]] = {k: [] for k in kappa_grid}
    for _ in range(cfg.samples_per_cell):
        x = dens.sample(n, rng=rng)
        theta_hat = empirical_coefficients(x, cutoff=nmax)
        nonprivate_oracle.append(ise(theta_hat[linf <= n_np], n_np) if n_np > 0 else bias2[0])
        for _ in range(cfg.noise_draws):
            for p, pl in plan.items():
                priv = ZCDP(pl["rho"])
                for arm, N in pl["cuts"].items():
                    sel = linf <= N
                    coefs, _ = privatize_coefficients(theta_hat[sel], index_set=kmax[sel], n=n, privacy=priv,
                                                      rng=rng)
                    acc[p][arm].append(ise(coefs, N))
                lep = PrivateLepskiiDensity(privacy=priv, max_cutoff=nmax, scheme=cfg.scheme,
                                            kappa_stat=cfg.kappa_stat, kappa_priv=cfg.kappa_priv, random_state=rng)
                lep.fit_from_coefficients(theta_hat, n=n, dim=d)
                if pl["within"] is None:  # deterministic: the noise energies depend on n, rho and the family only
                    pl["within"] = _family_oracle_cutoff(pieces, n=n, noise_energy=lep.candidate_noise_energy_)
                    pl["within_energy"] = float(lep.candidate_noise_energy_[pl["within"]])
                w = pl["within"]
                naive = lep.select_cutoff(kappa_priv=0.0)
                acc[p]["within_family"].append(ise(lep.candidate_coefficients_[w], w))
                acc[p]["lepskii_private"].append(ise(lep.coefficients_, lep.cutoff_))
                acc[p]["lepskii_naive"].append(ise(lep.candidate_coefficients_[naive], naive))
                acc[p]["cut_lepskii_private"].append(lep.cutoff_)
                acc[p]["cut_lepskii_naive"].append(naive)
                if p == "fixed":
                    for kap in kappa_grid:  # post-processing of the same release
                        cut = lep.select_cutoff(kappa_priv=kap)
                        by_kappa[kap].append(ise(lep.candidate_coefficients_[cut], cut))
    m_np = float(np.mean(nonprivate_oracle))
    paths = {}
    for p, pl in plan.items():
        mise_p, mise_np = pl["mise_p"], pl["mise_np"]
        w = pl["within"]
        paths[p] = {
            "rho": pl["rho"], "cuts": pl["cuts"] | {"within_family": w},
            "closed_form": {"oracle": float(mise_p[pl["cuts"]["oracle"]]),
                            "within_family": pieces[w]["bias2"] + pieces[w]["stat"] / n + pl["within_energy"],
                            "nonprivate_oracle": float(mise_np.min())},
            "privacy_cost": float(mise_p.min() / mise_np.min()),
            "mise": {a: float(np.mean(acc[p][a])) for a in ARMS if acc[p][a]},
            "median_ise": {a: float(np.median(acc[p][a])) for a in ARMS if acc[p][a]},
            "median_cut": {a: float(np.median(acc[p][f"cut_{a}"])) for a in ("lepskii_private", "lepskii_naive")}}
    fx = paths["fixed"]
    res = {"n": n, "cut_oracle": fx["cuts"]["oracle"], "cut_nonprivate": n_np,
           "cut_within_family": fx["cuts"]["within_family"], "cut_fixed": fx["cuts"].get("fixed_cutoff"),
           "closed_form_oracle_mise": fx["closed_form"]["oracle"],
           "closed_form_nonprivate_mise": fx["closed_form"]["nonprivate_oracle"],
           "privacy_cost": fx["privacy_cost"], "privacy_dominated": bool(fx["privacy_cost"] >= cfg.dominated_cost),
           "mise": fx["mise"] | {"nonprivate_oracle": m_np}, "median_ise": fx["median_ise"],
           "median_cut": fx["median_cut"], "median_ise_by_kappa": {k: float(np.median(v)) for k, v in by_kappa.items()},
           "paths": paths}
    if rho_scaled is not None:
        sc = paths["scaled"]
        res["scaled"] = {"rho": rho_scaled, "cut_oracle": sc["cuts"]["oracle"], "mise": sc["mise"]["oracle"],
                         "closed_form_mise": sc["closed_form"]["oracle"],
                         "measured_cost": sc["mise"]["oracle"] / m_np}
    return res


KAPPA_GRID: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The kappa_2 grid of the held-out calibration (README: kappa_2 = 2 was picked on it and frozen)."""


def calibrate_kappa_priv(cfg: Config, *, kappa_grid: tuple[float, ...] = KAPPA_GRID,
                         beta: float = 1.0, seed: int = 1000) -> dict[float, dict[str, float]]:
    """Held-out calibration of kappa_2 (notes §8: calibrate once, freeze): on a density with a beta and a
    seed that the reproduction grid does not use, the worst and median ratio (median ISE of private Lepskii
    / median ISE of the oracle) over the privacy-dominated cells of ``cfg.dims`` x ``cfg.n_grid``."""
    rng = numpy_generator(seed)
    ratios: dict[float, list[float]] = {k: [] for k in kappa_grid}
    with threadpool_limits(limits=1):
        for d in cfg.dims:
            dens = TrigDensity.sobolev(beta=beta, dim=d, degree=cfg.degree(d), seed=seed + d,
                                       decay_excess=cfg.decay_excess, scaling=cfg.scaling)
            pieces = {N: expected_mise(dens, cutoff=N, n=1, privacy=ZCDP(1.0)) for N in range(cfg.max_cutoff(d) + 1)}
            for n in cfg.n_grid:
                c = _cell(cfg, dens, d, n, pieces, rng, kappa_grid)
                if c["privacy_dominated"]:
                    for k in kappa_grid:
                        ratios[k].append(c["median_ise_by_kappa"][k] / c["median_ise"]["oracle"])
    return {k: {"worst": max(v, default=math.nan), "median": float(np.median(v)) if v else math.nan,
                "cells": len(v)} for k, v in ratios.items()}


def tune_kappa_priv(cfg: Config, *, kappa_grid: tuple[float, ...] = KAPPA_GRID, beta: float = 1.0,
                    seed: int = 1000) -> Tuned:
    """The held-out calibration's pick of kappa_2, made by ``common.tuning.tune_grid`` (issue 26).

    The score is the calibration's own: the worst ratio (median ISE of private Lepskii / of the oracle) over the
    held-out density's privacy-dominated cells, one number per kappa (one unit, so the pick is its argmin), and
    an edge that keeps winning extends the (geometric) grid by up to ``cfg.grid_extra`` points. Each evaluation
    redraws the same data sets and noise (the generator is seeded by ``seed``; kappa only post-processes the
    release), so extended values are scored on the very releases of the declared grid. The run does not call
    this: it uses the frozen ``cfg.kappa_priv`` (notes §8: calibrate once, freeze), which this reproduces.
    """
    def evaluate(kappas: list[float]) -> list[dict[str, list[float]]]:
        table = calibrate_kappa_priv(cfg, kappa_grid=tuple(kappas), beta=beta, seed=seed)
        return [{"worst_ratio": [table[k]["worst"]], "median_ratio": [table[k]["median"]]} for k in kappas]

    return tune_grid(evaluate, kappa_grid, score="worst_ratio", maximize=False, log=True, max_extra=cfg.grid_extra)


def _slope(ns: list[float], vals: list[float]) -> float:
    """Least-squares slope of log(vals) against log(ns); NaN with fewer than 3 points."""
    if len(ns) < 3:
        return float("nan")
    return float(np.polyfit(np.log(ns), np.log(vals), 1)[0])


def _key(d: int, beta: float) -> str:
    return f"d{d}_b{beta:g}"


def c3_name(d: int, beta: float) -> str:
    """Name of the C3 rate claim of one (d, beta) (the controls' guards name it)."""
    return f"C3 private Lepskii / oracle MISE grows at most like a log factor in n, d={d}, beta={beta:g}"


def ratio_slopes(series: list[dict], path: str, *, baseline: str = "oracle") -> dict[str, float]:
    """Per arm, the slope of log(median ISE of the arm / median ISE of ``baseline``) against log n over one
    (d, beta) series of cells on ``path`` (the C3 rate statistic)."""
    ns = [c["n"] for c in series]
    return {a: _slope(ns, [c["paths"][path]["median_ise"][a] / c["paths"][path]["median_ise"][baseline]
                           for c in series]) for a in ARMS if a != baseline}


def constant_control_name(arm: str, d: int, beta: float) -> str:
    """Name of the constant-factor control mechanism of one naive arm and (d, beta) (amendment A6)."""
    return (f"C3 constant-factor control: the {CONTROLS[arm].split(' (')[0]}'s ratio to the oracle exceeds "
            f"private Lepskii's, d={d}, beta={beta:g}")


def constant_control_values(cfg: Config, cells: dict[int, list[dict]], d: int, beta: float, arm: str,
                            *, method: str = "lepskii_private") -> tuple[list[float], list[float], list[int]]:
    """Per seed, the geometric-mean ratio to the all-cutoffs oracle of ``arm`` and of ``method`` over the
    privacy-dominated cells (closed-form cost >= cfg.dominated_cost on the claim path) of one (d, beta), and the
    number of such cells; NaN for a seed with none. Their log-ratio is the mean per-cell log(arm / method)."""
    P = cfg.claim_path
    g_arm, g_method, counts = [], [], []
    for sd in cfg.seeds:
        cs = [c["paths"][P] for c in cells[sd] if c["d"] == d and c["beta"] == beta
              and c["paths"][P]["privacy_cost"] >= cfg.dominated_cost]
        counts.append(len(cs))
        for out, a in ((g_arm, arm), (g_method, method)):
            out.append(float(np.exp(np.mean([np.log(c["median_ise"][a] / c["median_ise"]["oracle"]) for c in cs])))
                       if cs else math.nan)
    return g_arm, g_method, counts


def constant_control_check(cfg: Config, cells: dict[int, list[dict]], d: int, beta: float, arm: str,
                           *, detail: str = "") -> ClaimCheck:
    """Amendment A6: the privacy-naive ``arm`` loses to private Lepskii by a constant factor (a mechanism: the
    paired log-ratio over seeds of their geometric-mean ratios to the oracle, scipy t interval, lower end >= 0).
    It guards no claim. A seed without a privacy-dominated cell gives NaN, and the check fails."""
    g_arm, g_lep, counts = constant_control_values(cfg, cells, d, beta, arm)
    if not (np.all(np.isfinite(g_arm)) and np.all(np.isfinite(g_lep))):  # a NaN fails the check
        return ClaimCheck(
            name=constant_control_name(arm, d, beta), metric=f"log_ratio_to_lepskii_{cfg.claim_path}_{_key(d, beta)}",
            measured=math.nan, threshold=0.0, direction=">=", kind="mechanism", baseline_arm="lepskii_private",
            method_arm=arm, ci_low=math.nan, ci_high=math.nan, n=len(counts),
            detail=f"no privacy-dominated cell in some seed (cells per seed {counts}). {detail}".strip())
    return paired_check(
        name=constant_control_name(arm, d, beta), metric=f"log_ratio_to_lepskii_{cfg.claim_path}_{_key(d, beta)}",
        method=g_arm, baseline=g_lep, direction=">=", threshold=0.0, kind="mechanism", method_arm=arm,
        baseline_arm="lepskii_private", log_ratio=True,
        paper_value="a privacy-naive choice pays a larger constant factor than the privacy-aware rule",
        detail=f"constant-factor control (amendment A6, guards no claim): per seed, geometric-mean median-ISE ratio "
               f"to the oracle over the {cfg.claim_path}-path privacy-dominated cells (per seed {counts}) of the "
               f"{CONTROLS[arm]} ({', '.join(f'{v:.3g}' for v in g_arm)}) vs private Lepskii "
               f"({', '.join(f'{v:.3g}' for v in g_lep)}); holds when the lower 95% bound of the mean log-ratio "
               f"is >= 0. {detail}".strip())


def run(cfg: Config, out_dir: Path) -> RunResult:
    rec = RunRecorder(SLUG, cfg, out_dir)
    cells: dict[int, list[dict]] = {}
    per_seed_slopes: dict[int, dict[str, float]] = {}
    per_seed_fixed: dict[int, dict[str, float]] = {}
    # rate[seed][path][key][arm]: C3 slope of log(arm / all-cutoffs oracle); rate_wf: of log(arm / within-family)
    rate: dict[int, dict[str, dict[str, dict[str, float]]]] = {}
    rate_wf: dict[int, dict[str, dict[str, dict[str, float]]]] = {}
    # NOTE: the products here are small; one BLAS thread avoids oversubscription on shared CPUs.
    with threadpool_limits(limits=1):
        for seed in progress(cfg.seeds, desc=SLUG):
            seed_everything(seed)
            rng = numpy_generator(seed)
            rows = []
            slopes: dict[str, float] = {}
            slopes_fixed: dict[str, float] = {}
            rate[seed] = {p: {} for p in PATHS}
            rate_wf[seed] = {p: {} for p in PATHS}
            for d in cfg.dims:
                for bi, beta in enumerate(cfg.betas):
                    dens = TrigDensity.sobolev(beta=beta, dim=d, degree=cfg.degree(d), seed=10_000 * seed + 100 * d + bi,
                                               decay_excess=cfg.decay_excess, scaling=cfg.scaling)
                    pieces = {N: expected_mise(dens, cutoff=N, n=1, privacy=ZCDP(1.0))
                              for N in range(cfg.max_cutoff(d) + 1)}
                    target = scaled_cost_target(cfg, pieces)  # A7: cfg.cost_target unless out of reach
                    rhos = {n: rho_for_cost(pieces, n=n, cost=target) for n in cfg.n_grid}
                    n0 = cfg.n_grid[0]
                    # the fixed-cutoff control: each path's oracle cutoff at the smallest n, kept for every n
                    fixed_cuts = {"fixed": int(_mise_curves(pieces, n0, cfg.rho)[0].argmin()),
                                  "scaled": int(_mise_curves(pieces, n0, rhos[n0])[0].argmin())}
                    series = []
                    for n in cfg.n_grid:
                        c = _cell(cfg, dens, d, n, pieces, rng, rho_scaled=rhos[n], fixed_cuts=fixed_cuts)
                        c.update(d=d, beta=beta)
                        c["scaled"]["cost_target"] = target
                        series.append(c)
                    key = _key(d, beta)
                    dom = [c for c in series if c["privacy_dominated"]]
                    # schema 1's slope (fixed rho, privacy-dominated n only), kept for comparison, not checked
                    slopes_fixed[key] = _slope([c["n"] for c in dom], [c["mise"]["oracle"] for c in dom])
                    # C2: constant privacy cost; the rate in the effective sample size n sqrt(rho_n)
                    slopes[key] = _slope([c["n"] * math.sqrt(c["scaled"]["rho"]) for c in series],
                                         [c["scaled"]["mise"] for c in series])
                    for p in PATHS:
                        rate[seed][p][key] = ratio_slopes(series, p)
                        rate_wf[seed][p][key] = ratio_slopes(series, p, baseline="within_family")
                    rows += series
            cells[seed] = rows
            per_seed_slopes[seed] = slopes
            per_seed_fixed[seed] = slopes_fixed
            dom = [c for c in rows if c["privacy_dominated"]]
            metrics: dict[str, dict[str, float]] = {a: {} for a in ARMS}
            for a in ARMS:
                # the constant factor (reported, unchecked): worst and mean log ratio over the privacy-dominated
                # fixed-rho cells, and per (d, beta, path) the C3 slopes
                r = [c["median_ise"][a] / c["median_ise"]["oracle"] for c in dom]
                metrics[a]["worst_ratio_to_oracle"] = max(r) if r else math.nan
                metrics[a]["best_ratio_to_oracle"] = min(r) if r else math.nan
                metrics[a]["mean_log10_ratio_to_oracle"] = float(np.mean(np.log10(r))) if r else math.nan
                if a == "oracle":
                    continue
                for p in PATHS:
                    for key, sl in rate[seed][p].items():
                        metrics[a][f"rate_slope_{p}_{key}"] = sl[a]
                        if a != "within_family":
                            metrics[a][f"rate_slope_vs_within_family_{p}_{key}"] = rate_wf[seed][p][key][a]
            metrics["oracle_scaled"] = {}
            for key, sl in slopes.items():
                d, beta = int(key[1]), float(key.split("_b")[1])
                metrics["oracle_scaled"][f"slope_{key}"] = sl
                metrics["oracle_scaled"][f"slope_dev_{key}"] = abs(sl - theory_slope(beta, d))
                metrics["oracle"][f"slope_fixed_rho_{key}"] = slopes_fixed[key]
            costs = [c["scaled"]["measured_cost"] for c in rows]
            metrics["oracle_scaled"]["min_measured_cost"] = min(costs)
            metrics["oracle_scaled"]["max_measured_cost"] = max(costs)
            metrics["oracle"]["n_privacy_dominated_cells"] = len(dom)
            rec.add_seed(seed, metrics)

    checks: list[ClaimCheck] = []
    # C1: empirical MISE vs the closed form, per (d, beta, n) cell averaged over seeds (each seed its own density)
    rel: dict[str, float] = {}
    for d in cfg.dims:
        for beta in cfg.betas:
            for n in cfg.n_grid:
                cs = [next(c for c in cells[sd] if c["d"] == d and c["beta"] == beta and c["n"] == n)
                      for sd in cfg.seeds]
                rel[f"fixed rho d={d} beta={beta:g} n={n}"] = float(np.mean(
                    [c["mise"]["oracle"] / c["closed_form_oracle_mise"] for c in cs]))
                rel[f"scaled rho d={d} beta={beta:g} n={n}"] = float(np.mean(
                    [c["scaled"]["mise"] / c["scaled"]["closed_form_mise"] for c in cs]))
    worst_cell = max(rel, key=lambda k: abs(rel[k] - 1))
    reps = cfg.samples_per_cell * cfg.noise_draws * len(cfg.seeds)
    checks.append(ClaimCheck(
        name="C1 empirical oracle MISE matches the closed form (every cell)", metric="max_rel_err",
        measured=abs(rel[worst_cell] - 1), threshold=cfg.closed_form_tol, direction="<=", kind="mechanism",
        method_arm="oracle", paper_value="bias^2 + sum Var/n + |K| sigma^2 (notes §2.2)",
        detail=f"{len(rel)} cells (fixed rho and scaled rho_n), {reps} reps each ({cfg.samples_per_cell} data sets x "
               f"{cfg.noise_draws} noise draws x {len(cfg.seeds)} seeds); ratios empirical/closed form in "
               f"[{min(rel.values()):.3f}, {max(rel.values()):.3f}], worst {worst_cell}"))
    costs = [c["scaled"]["measured_cost"] for sd in cfg.seeds for c in cells[sd]]
    lo, hi = cfg.cost_target / cfg.cost_band, cfg.cost_target * cfg.cost_band
    worst = max(costs, key=lambda x: max(x / cfg.cost_target, cfg.cost_target / x))
    # The C2 regime (the scaled-rho series stays at the target cost, measured, not closed form, in every cell)
    # conditions only the C2 mechanisms, no claim; a sanity check cannot guard no claim (guards=[] means every
    # claim), so it is reported in each C2 mechanism's detail and in extra, never a vote (issue 26).
    regime_factor = max(worst / cfg.cost_target, cfg.cost_target / worst)
    regime_ok = bool(regime_factor <= cfg.cost_band)
    regime_note = (f"regime (not a vote: conditions only the C2 mechanisms): measured privacy cost within "
                   f"x{cfg.cost_band:g} of {cfg.cost_target:g} at every n: {'yes' if regime_ok else 'NO'} (worst "
                   f"factor {regime_factor:.3g} over {len(costs)} cells in [{min(costs):.3g}, {max(costs):.3g}], "
                   f"band [{lo:.3g}, {hi:.3g}]; measured cost = empirical MISE of the oracle at rho_n / empirical "
                   f"MISE of the non-private oracle, same data sets)")
    for d in cfg.dims:
        for beta in cfg.betas:
            key = _key(d, beta)
            vals = [per_seed_slopes[sd][key] for sd in cfg.seeds]
            fixed = [per_seed_fixed[sd][key] for sd in cfg.seeds]
            mean_slope = float(np.mean(vals))
            ci = one_sample_ci(vals)
            th = theory_slope(beta, d)
            targets = [next(c for c in cells[sd] if c["d"] == d and c["beta"] == beta)["scaled"]["cost_target"]
                       for sd in cfg.seeds]
            # the rate of the oracle-cutoff estimator: the scaling law the theory states (a mechanism)
            checks.append(ClaimCheck(
                name=f"C2 oracle MISE slope in n sqrt(rho_n) at constant privacy cost, d={d}, beta={beta:g}",
                metric=f"slope_{key}", measured=abs(mean_slope - th), threshold=cfg.slope_tol, direction="<=",
                kind="mechanism", method_arm="oracle_scaled", paper_value=f"{th:.3f}",
                detail=f"slope {mean_slope:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}] (per seed "
                       f"{', '.join(f'{v:.3f}' for v in vals)}) vs theory {th:.3f}; rho_n sets the closed-form "
                       f"privacy cost to {cfg.cost_target:g} at every n (A7, per seed: "
                       f"{', '.join(f'{t:.3g}' for t in targets)}); schema-1 fixed-rho slope over the "
                       f"privacy-dominated n: {np.mean(fixed):.3f}; {regime_note}"))

    # C3 (issue 29): "adaptive up to a log factor" as a rate statement, per (d, beta), on cfg.claim_path
    P = cfg.claim_path
    other = next(p for p in PATHS if p != P)
    summary_c3: dict[str, dict] = {}

    def fmt(st: dict) -> str:
        return f"{st['mean']:.3f} [{st['ci_low']:.3f}, {st['ci_high']:.3f}]"

    def geo(cs: list[dict], path: str, arm: str, base: str = "oracle") -> float:
        """Geometric-mean median-ISE ratio over cells (the constant factor, reported unchecked)."""
        return float(np.exp(np.mean([np.log(c["paths"][path]["median_ise"][arm] / c["paths"][path]["median_ise"][base])
                                     for c in cs])))

    controls: list[ClaimCheck] = []
    constants: list[ClaimCheck] = []
    for d in cfg.dims:
        for beta in cfg.betas:
            key = _key(d, beta)
            name = c3_name(d, beta)
            cs = [c for sd in cfg.seeds for c in cells[sd] if c["d"] == d and c["beta"] == beta]
            st = {p: {a: one_sample_ci([rate[sd][p][key][a] for sd in cfg.seeds]) for a in ARMS if a != "oracle"}
                  for p in PATHS}
            st_wf = {p: one_sample_ci([rate_wf[sd][p][key]["lepskii_private"] for sd in cfg.seeds]) for p in PATHS}
            summary_c3[key] = {
                "claim_path": P, "slopes": st, "lepskii_vs_within_family_slopes": st_wf,
                "constant_geo_mean_ratio": {p: {a: geo(cs, p, a) for a in ARMS} for p in PATHS},
                "lepskii_vs_within_family_geo_mean_ratio": {p: geo(cs, p, "lepskii_private", "within_family")
                                                            for p in PATHS},
                "worst_ratio": {p: max(c["paths"][p]["median_ise"]["lepskii_private"]
                                       / c["paths"][p]["median_ise"]["oracle"] for c in cs) for p in PATHS}}
            sm = summary_c3[key]
            checks.append(one_sample_check(
                name=name, metric=f"rate_slope_{P}_{key}",
                values=[rate[sd][P][key]["lepskii_private"] for sd in cfg.seeds], direction="<=",
                threshold=cfg.rate_bound, kind="claim", arm="lepskii_private",
                paper_value="adaptive up to a log factor: slope of log(ratio) ~ 1/ln n = 0.08-0.11",
                detail=f"per seed, slope of log(median ISE private Lepskii / median ISE all-cutoffs oracle) against "
                       f"log n over n = {', '.join(f'{n:g}' for n in cfg.n_grid)} at "
                       f"{'rho = ' + format(cfg.rho, 'g') if P == 'fixed' else 'constant privacy cost'}; bound "
                       f"{cfg.rate_bound:g} (a log factor passes, a polynomial loss n^a, a > {cfg.rate_bound:g}, "
                       f"fails). Unchecked: constant factor (geometric-mean ratio over cells x seeds) "
                       f"{sm['constant_geo_mean_ratio'][P]['lepskii_private']:.3g}, worst cell "
                       f"{sm['worst_ratio'][P]:.3g}; within-family oracle / oracle: slope "
                       f"{fmt(st[P]['within_family'])}, constant {sm['constant_geo_mean_ratio'][P]['within_family']:.3g} "
                       f"(the family's granularity and budget split); private Lepskii / within-family oracle: slope "
                       f"{fmt(st_wf[P])}, constant {sm['lepskii_vs_within_family_geo_mean_ratio'][P]:.3g} (the "
                       f"selection rule's own loss); on the {other} path: slope {fmt(st[other]['lepskii_private'])}, "
                       f"constant {sm['constant_geo_mean_ratio'][other]['lepskii_private']:.3g}"))
            for arm in cfg.rate_control_arms:
                sa = st[P][arm]
                # negative control (DESIGN § Verdicts): the claim's own statistic on a variant that must lose a rate;
                # the claim rejects it when its upper bound exceeds the rate bound (the claim's check would not pass)
                controls.append(ClaimCheck(
                    name=f"C3 negative control: the rate statistic rejects the {CONTROLS[arm].split(' (')[0]}, "
                         f"d={d}, beta={beta:g}",
                    metric=f"rate_slope_ci_high_{P}_{key}", measured=sa["ci_high"], threshold=cfg.rate_bound,
                    direction=">=", kind="sanity", baseline_arm="oracle", method_arm=arm, guards=[name],
                    paper_value="a choice that does not adapt to n must lose a rate",
                    detail=f"negative control: the {CONTROLS[arm]} under the claim's own statistic; rejected when "
                           f"the upper 95% bound of its mean per-seed slope exceeds {cfg.rate_bound:g}. Slope "
                           f"{fmt(sa)} over {sa['n']} seeds (per seed "
                           f"{', '.join(f'{rate[sd][P][key][arm]:.3f}' for sd in cfg.seeds)}); constant "
                           f"(geometric-mean ratio, unchecked) {sm['constant_geo_mean_ratio'][P][arm]:.3g}; on the "
                           f"{other} path: slope {fmt(st[other][arm])}"))
            for arm in cfg.constant_control_arms:
                # amendment A6: the privacy-naive arms lose a constant factor, not a rate; a mechanism, no guard.
                # Their rate slopes (negative on a fixed family, by algebra) are reported, unchecked.
                constants.append(constant_control_check(
                    cfg, cells, d, beta, arm,
                    detail=f"Unchecked: its rate slope on the {P} path {fmt(st[P][arm])}, on the {other} path "
                           f"{fmt(st[other][arm])} (not a rate control: A6)"))
    checks += constants + controls

    artifacts = _plots(cfg, cells, Path(out_dir))
    table = [{k: v for k, v in c.items()} | {"seed": sd} for sd in cfg.seeds for c in cells[sd]]
    return rec.finish(checks, artifacts=artifacts, extra={
        "ratio_definition": "median ISE of the arm / median ISE of the oracle-cutoff arm, same data sets",
        "c3_rate": summary_c3, "rate_slopes": rate, "rate_slopes_vs_within_family": rate_wf,
        "cells": table, "slopes": per_seed_slopes, "slopes_fixed_rho": per_seed_fixed,
        "closed_form_ratio_mean_over_seeds": rel,
        "c2_regime": {"cost_band_factor": regime_factor, "cost_band": cfg.cost_band, "holds": regime_ok,
                      "min_cost": min(costs), "max_cost": max(costs)},
        "tuning": {"kappa_priv": {"value": cfg.kappa_priv, "frozen": True,
                                  "how": "tune_kappa_priv(cfg): tune_grid on the held-out calibration (beta=1, "
                                         "seed 1000), worst ratio to the oracle; not run here"}}})


def _plots(cfg: Config, cells: dict[int, list[dict]], out_dir: Path) -> list[Path]:
    paths = []
    ns = np.array(cfg.n_grid, dtype=float)
    fig, axes = new_figure(len(cfg.dims), width=5.2)
    fig2, axes2 = new_figure(len(cfg.dims), width=5.2)
    for ax, ax2, d in zip(axes, axes2, cfg.dims, strict=True):
        for i, beta in enumerate(cfg.betas):
            color = f"C{i}"

            def series(key, arm=None, d=d, beta=beta):
                return np.array([[next(c for c in cells[sd] if c["d"] == d and c["beta"] == beta and c["n"] == n)
                                  [key] if arm is None else
                                  next(c for c in cells[sd] if c["d"] == d and c["beta"] == beta and c["n"] == n)
                                  [key][arm] for n in cfg.n_grid] for sd in cfg.seeds])

            orc = series("mise", "oracle")
            ax.errorbar(ns, orc.mean(0), yerr=orc.std(0), color=color, marker="o", label=f"oracle N, β={beta:g}")
            ax.plot(ns, series("mise", "lepskii_private").mean(0), color=color, ls="--", marker="x",
                    label=f"private Lepskii, β={beta:g}")
            anchor = orc.mean(0)[-1]
            ax.plot(ns, anchor * (ns / ns[-1]) ** theory_slope(beta, d), color=color, ls=":", alpha=0.8,
                    label=f"theory slope {theory_slope(beta, d):.2f}")
            ax2.plot(ns, series("cut_oracle").mean(0), color=color, marker="o", label=f"oracle, β={beta:g}")
            ax2.plot(ns, series("median_cut", "lepskii_private").mean(0), color=color, ls="--", marker="x",
                     label=f"private Lepskii, β={beta:g}")
            ax2.plot(ns, series("median_cut", "lepskii_naive").mean(0), color=color, ls=":", marker="^",
                     label=f"naive Lepskii, β={beta:g}")
            ax2.plot(ns, series("cut_nonprivate").mean(0), color=color, ls="-.", marker="s", alpha=0.6,
                     label=f"non-private optimal, β={beta:g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_ylabel("MISE")
        ax.set_title(f"d={d}, ρ={cfg.rho:g} (zCDP)")
        ax.legend(fontsize=6)
        ax2.set_xscale("log")
        ax2.set_yscale("symlog", linthresh=1)
        ax2.set_xlabel("n")
        ax2.set_ylabel("cutoff N (median over reps, mean over seeds)")
        ax2.set_title(f"chosen cutoff, d={d}")
        ax2.legend(fontsize=6)
    paths.append(save_figure(fig, out_dir / "mise_vs_n.png"))
    fig3, axes3 = new_figure(len(cfg.dims), width=5.2)
    for ax, d in zip(axes3, cfg.dims, strict=True):
        for i, beta in enumerate(cfg.betas):
            rows = [[next(c for c in cells[sd] if c["d"] == d and c["beta"] == beta and c["n"] == n)["scaled"]
                     for n in cfg.n_grid] for sd in cfg.seeds]
            m = np.array([[r["mise"] for r in row] for row in rows])
            eff = np.array([[n * math.sqrt(r["rho"]) for n, r in zip(cfg.n_grid, row, strict=True)]
                            for row in rows])
            for j, (x, y) in enumerate(zip(eff, m, strict=True)):
                ax.plot(x, y, color=f"C{i}", marker="o", ms=3, alpha=0.6,
                        label=f"oracle N at rho_n, β={beta:g}" if j == 0 else None)
            x0 = np.exp(np.log(eff).mean(0))
            y0 = np.exp(np.log(m).mean(0))
            ax.plot(x0, y0[-1] * (x0 / x0[-1]) ** theory_slope(beta, d), color=f"C{i}", ls=":",
                    label=f"theory slope {theory_slope(beta, d):.2f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n sqrt(rho_n)")
        ax.set_ylabel("MISE")
        ax.set_title(f"d={d}, privacy cost held at {cfg.cost_target:g}")
        ax.legend(fontsize=6)
    paths.append(save_figure(fig3, out_dir / "mise_vs_n_sqrt_rho_constant_cost.png"))
    paths.append(save_figure(fig2, out_dir / "cutoff_vs_n.png"))
    return paths
