"""GCDRO reproduction: noisy selection-bias regression (D1) and noisy sub-population shift (D2), 5 seeds.

Arms (same data, same seeds, same linear model and training loop): ERM, KL-DRO, χ²-DRO, CVaR-DRO, GDRO
(GCDRO with α = β = 0) and GCDRO. Each DRO arm's radius (and GCDRO's α) is selected on a validation set
drawn from the *training* distribution (noisy labels included; no test-domain access).
Claims: (C2, non-inferiority) GCDRO's mean RMSE over the shifted test environments <= 1.05 × the best of
KL/χ²/CVaR (D1) and its minority-group RMSE likewise (D2), ERM reported alongside; (C1) with a fixed loss vector
(the ERM fit's), KL/χ²/CVaR put most worst-case mass on the 5 % noisy points while GCDRO puts at most twice
their uniform share AND moves mass onto the clean high-loss region (>= 1.5 × its uniform share).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from icml24.common import validate as val
from icml24.common.config import ExperimentConfig
from icml24.common.config import help_text as _h
from icml24.common.plotting import band, new_figure, save_figure
from icml24.common.progress import progress
from icml24.common.results import ClaimCheck, RunRecorder, RunResult
from icml24.common.seeding import numpy_generator, seed_everything
from icml24.gcdro import core
from icml24.gcdro.estimator import DRORegressor, GCDRORegressor
from icml24.gcdro.simulate import corrupt_labels, selection_bias_regression, subpopulation_regression

SLUG = "gcdro"
BASELINES = ("kl", "chi2", "cvar")
ARMS = ("erm", "kl", "chi2", "cvar", "gdro", "gcdro")


@dataclass(frozen=True)
class Config(ExperimentConfig):
    seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata=_h("random seeds (issue: 5 seeds)"))
    n_train: int = field(default=1000, metadata=_h("n, training samples per data set (notes §5: 2000; halved for CPU)"))
    n_val: int = field(default=500, metadata=_h("validation samples from the training distribution (model selection)"))
    n_test: int = field(default=1000, metadata=_h("samples per test environment"))
    r_train: float = field(default=1.7, metadata=_h("D1 selection bias r of training (GDRO §4.1 / notes §5)"))
    r_test: tuple[float, ...] = field(default=(-1.5, -1.7, -2.3, -2.7, -3.0),
                                      metadata=_h("D1 shifted test environments r (notes §5)"))
    noise_frac: float = field(default=0.05, metadata=_h("fraction of training labels with gross noise (notes §5: 5%)"))
    noise_scale: float = field(default=5.0, metadata=_h("label noise N(0, (scale·std y)²) (notes §5)"))
    d2_minority: float = field(default=0.1, metadata=_h("D2 minority share (DN20_2 style, notes §5)"))
    model: Literal["linear", "mlp"] = field(default="linear", metadata=_h("model (notes §2.4: linear for simulations)"))
    lr: float = field(default=1e-2, metadata=_h("η, Adam learning rate (notes §2.6)"))
    max_iter: int = field(default=300, metadata=_h("outer full-batch steps (notes §2.6: 2000; reduced for CPU)"))
    n_neighbors: int = field(default=10, metadata=_h("k of the kNN graph (notes §2.6)"))
    beta: float = field(default=0.1, metadata=_h("β, entropy weight / temperature (notes §2.6 grid {0.01,0.1,1})"))
    n_inner: int = field(default=10, metadata=_h("T_in, flow steps per outer step (notes §2.6)"))
    restart: bool = field(default=False, metadata=_h("restart the flow at p̂ each outer step (False: warm start)"))
    alphas: tuple[float, ...] = field(default=(1.0, 10.0, 100.0), metadata=_h("α grid for GCDRO (notes §2.6)"))
    kl_grid: tuple[float, ...] = field(default=(1.0, 10.0, 100.0), metadata=_h("KL temperature λ grid (normalised loss)"))
    chi2_grid: tuple[float, ...] = field(default=(1.0, 10.0, 100.0), metadata=_h("χ² penalty λ grid (normalised loss)"))
    cvar_grid: tuple[float, ...] = field(default=(0.05, 0.2, 0.5), metadata=_h("CVaR level grid"))
    c1_kl: float = field(default=1.0, metadata=_h("C1: KL temperature on the fixed ERM losses"))
    c1_chi2: float = field(default=1.0, metadata=_h("C1: χ² λ on the fixed ERM losses"))
    c1_cvar: float = field(default=0.05, metadata=_h("C1: CVaR level on the fixed ERM losses"))
    c1_alpha: float = field(default=10.0, metadata=_h("C1: GCDRO α on the fixed ERM losses"))
    c1_steps: int = field(default=600, metadata=_h("C1: flow steps from p̂ on the fixed ERM losses"))
    margin: float = field(default=1.05, metadata=_h("claim: GCDRO RMSE <= margin × best DRO baseline (issue)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        w = "Config"
        for name in ("n_train", "n_val", "n_test", "max_iter", "c1_steps"):
            val.integer(w, name, getattr(self, name), minimum=1)
        val.integer(w, "n_neighbors", self.n_neighbors, minimum=1, maximum=self.n_train - 1)
        val.in_range(w, "noise_frac", self.noise_frac, 0.0, 1.0, high_open=True)
        val.probability(w, "d2_minority", self.d2_minority, open_low=True, open_high=True)
        val.positive(w, "lr", self.lr)
        val.non_negative(w, "beta", self.beta)
        val.each(w, "alphas", self.alphas, val.non_negative)
        val.each(w, "kl_grid", self.kl_grid, val.positive)
        val.each(w, "chi2_grid", self.chi2_grid, val.positive)
        val.each(w, "cvar_grid", self.cvar_grid, val.probability, open_low=True)
        if not self.r_test or any(abs(r) <= 1 for r in (self.r_train, *self.r_test)):
            raise ValueError(f"{w}: r_train and r_test need |r| > 1 (r_test non-empty)")

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=(0, 1), n_train=500, n_val=300, n_test=500, max_iter=150, alphas=(10.0,),
                   kl_grid=(10.0,), chi2_grid=(10.0,), cvar_grid=(0.2,), c1_steps=300, n_inner=5)


def _rmse(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((model.predict(x) - y) ** 2)))


def _candidates(cfg: Config, seed: int) -> dict[str, list[tuple[float, Any]]]:
    common = dict(model=cfg.model, lr=cfg.lr, max_iter=cfg.max_iter, random_state=seed, device=cfg.device)
    graph = dict(n_neighbors=cfg.n_neighbors, n_inner=cfg.n_inner, restart=cfg.restart, **common)
    return {
        "erm": [(0.0, DRORegressor(method="erm", **common))],
        "kl": [(v, DRORegressor(method="kl", radius=v, **common)) for v in cfg.kl_grid],
        "chi2": [(v, DRORegressor(method="chi2", radius=v, **common)) for v in cfg.chi2_grid],
        "cvar": [(v, DRORegressor(method="cvar", radius=v, **common)) for v in cfg.cvar_grid],
        "gdro": [(0.0, GCDRORegressor(alpha=0.0, beta=0.0, **graph))],
        "gcdro": [(a, GCDRORegressor(alpha=a, beta=cfg.beta, **graph)) for a in cfg.alphas],
    }


def _fit_select(cfg: Config, seed: int, xtr, ytr, xva, yva, evaluate) -> tuple[dict, dict]:
    """Fit every candidate of every arm; pick each arm's by validation RMSE; return (chosen, grid table)."""
    chosen: dict[str, tuple[float, Any]] = {}
    grid: dict[str, list[dict[str, float]]] = {}
    for arm, cands in _candidates(cfg, seed).items():
        rows = []
        for v, est in cands:
            est.fit(xtr, ytr)
            rows.append({"param": v, "val_rmse": _rmse(est, xva, yva), **evaluate(est)})
            if arm not in chosen or rows[-1]["val_rmse"] < chosen[arm][2]:
                chosen[arm] = (v, est, rows[-1]["val_rmse"])
        grid[arm] = rows
    return chosen, grid


def _c1_fixed_loss(cfg: Config, losses: np.ndarray, x: np.ndarray, noisy: np.ndarray) -> dict[str, np.ndarray]:
    """Worst-case weights of every method for one fixed (normalised) loss vector."""
    ell = torch.as_tensor(losses / losses.mean(), dtype=torch.float64)
    edges = core.EdgeList.from_adjacency(core.knn_graph(x, n_neighbors=cfg.n_neighbors))
    return {
        "erm": core.erm_weights(ell).numpy(),
        "kl": core.kl_worst_case(ell, temperature=cfg.c1_kl).numpy(),
        "chi2": core.chi2_worst_case(ell, lam=cfg.c1_chi2).numpy(),
        "cvar": core.cvar_worst_case(ell, alpha=cfg.c1_cvar).numpy(),
        "gdro": core.gradient_flow(ell, edges, alpha=0.0, beta=0.0, n_steps=cfg.c1_steps).numpy(),
        "gcdro": core.gradient_flow(ell, edges, alpha=cfg.c1_alpha, beta=cfg.beta, n_steps=cfg.c1_steps).numpy(),
    }


def c1_bump(losses: np.ndarray, noisy: np.ndarray, *, quantile: float = 0.9) -> np.ndarray:
    """The clean high-loss region: clean points whose loss is >= the ``quantile`` of the clean losses.

    The notes' C1 mechanism (§2.3 / §5) is that GCDRO moves worst-case mass *onto* such a smooth high-loss
    region ("0 % spike, 98 % bump") rather than onto the isolated noisy spikes; ``mass(bump) / bump.mean()``
    is its mass relative to the uniform share (1 = uniform).
    """
    clean = ~noisy
    return clean & (losses >= np.quantile(losses[clean], quantile))


def _grid_edges(cfg: Config, chosen: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """How often each arm's validation-selected hyper-parameter sits at the low / high end of its grid."""
    grids = {"kl": cfg.kl_grid, "chi2": cfg.chi2_grid, "cvar": cfg.cvar_grid, "gcdro": cfg.alphas}
    out: dict[str, dict[str, Any]] = {}
    for arm, grid in grids.items():
        sel = chosen[arm]
        out[arm] = {"grid": list(grid), "selected": sel, "n_seeds": len(sel), "single_value_grid": len(grid) == 1,
                    "at_low_edge": sum(v == min(grid) for v in sel) if len(grid) > 1 else 0,
                    "at_high_edge": sum(v == max(grid) for v in sel) if len(grid) > 1 else 0}
    return out


def run(cfg: Config, out_dir: Path) -> RunResult:
    rec = RunRecorder(SLUG, cfg, out_dir)
    out_dir = Path(out_dir)
    env_rmse: dict[str, list[list[float]]] = {a: [] for a in ARMS}
    grids: dict[int, dict] = {}
    c1_example: dict[str, Any] = {}
    per_seed_metrics: list[dict[str, dict[str, float]]] = []
    for seed in progress(cfg.seeds, desc=SLUG):
        seed_everything(seed)
        rng = numpy_generator(seed)
        metrics: dict[str, dict[str, float]] = {a: {} for a in ARMS}
        # ---------------- D1: selection bias + label noise
        xtr, ytr_clean = selection_bias_regression(n=cfg.n_train, r=cfg.r_train, rng=rng)
        ytr, noisy = corrupt_labels(ytr_clean, frac=cfg.noise_frac, scale=cfg.noise_scale, rng=rng)
        xva, yva_clean = selection_bias_regression(n=cfg.n_val, r=cfg.r_train, rng=rng)
        yva, _ = corrupt_labels(yva_clean, frac=cfg.noise_frac, scale=cfg.noise_scale, rng=rng)
        tests = [selection_bias_regression(n=cfg.n_test, r=r, rng=rng) for r in cfg.r_test]

        def eval_d1(est: Any, tests: list = tests) -> dict[str, float]:
            return {f"rmse_r{r:g}": _rmse(est, xt, yt) for r, (xt, yt) in zip(cfg.r_test, tests, strict=True)}

        chosen, grid1 = _fit_select(cfg, seed, xtr, ytr, xva, yva, eval_d1)
        for arm, (v, est, _) in chosen.items():
            per_env = [_rmse(est, xt, yt) for xt, yt in tests]
            env_rmse[arm].append(per_env)
            metrics[arm].update({"d1_rmse_mean": float(np.mean(per_env)), "d1_rmse_worst": float(np.max(per_env)),
                                 "d1_param": v, "d1_train_noisy_mass": float(est.weights_[noisy].sum())})
        # C1: one fixed loss vector (the ERM fit's squared errors on D1 train), graph on standardised x
        erm = chosen["erm"][1]
        xs = (xtr - xtr.mean(0)) / xtr.std(0)
        w = _c1_fixed_loss(cfg, erm.train_losses_, xs, noisy)
        bump = c1_bump(erm.train_losses_, noisy)
        for arm in ARMS:
            metrics[arm]["c1_noisy_mass"] = float(w[arm][noisy].sum())
            metrics[arm]["c1_bump_mass_ratio"] = float(w[arm][bump].sum() / bump.mean())
            metrics[arm]["c1_tv_from_uniform"] = float(0.5 * np.abs(w[arm] - 1.0 / len(noisy)).sum())
        if not c1_example:
            c1_example = {"losses": erm.train_losses_, "noisy": noisy, "weights": w}
        # ---------------- D2: sub-population shift + label noise
        x2, y2c, _ = subpopulation_regression(n=cfg.n_train, rng=rng, minority=cfg.d2_minority)
        y2, _ = corrupt_labels(y2c, frac=cfg.noise_frac, scale=cfg.noise_scale, rng=rng)
        x2v, y2vc, _ = subpopulation_regression(n=cfg.n_val, rng=rng, minority=cfg.d2_minority)
        y2v, _ = corrupt_labels(y2vc, frac=cfg.noise_frac, scale=cfg.noise_scale, rng=rng)
        groups = {g: subpopulation_regression(n=cfg.n_test, rng=rng, group=g)[:2] for g in ("majority", "minority")}

        def eval_d2(est: Any, groups: dict = groups) -> dict[str, float]:
            return {f"rmse_{g}": _rmse(est, *xy) for g, xy in groups.items()}

        chosen2, grid2 = _fit_select(cfg, seed, x2, y2, x2v, y2v, eval_d2)
        for arm, (v, est, _) in chosen2.items():
            r = eval_d2(est)
            metrics[arm].update({"d2_rmse_minority": r["rmse_minority"], "d2_rmse_majority": r["rmse_majority"],
                                 "d2_param": v})
        grids[seed] = {"d1": grid1, "d2": grid2}
        per_seed_metrics.append(metrics)
        rec.add_seed(seed, metrics)

    s = rec.summary()
    checks = []
    pct = round(100 * (cfg.margin - 1))
    for metric, label in (("d1_rmse_mean", "D1 mean RMSE over shifted test environments"),
                          ("d2_rmse_minority", "D2 minority-group RMSE")):
        # non-inferiority (GCDRO within margin of the best DRO baseline), NOT superiority; ERM is reported too
        best = min(BASELINES, key=lambda a: s[a][metric]["mean"])
        g, b, e = s["gcdro"][metric]["mean"], s[best][metric]["mean"], s["erm"][metric]["mean"]
        checks.append(rec.paired(
            name=f"C2: gcdro non-inferior within {pct:g}% to best of KL/chi2/CVaR ({label})", metric=metric,
            method_arm="gcdro", baseline_arm=best, direction="<=", threshold=float(np.log(cfg.margin)),
            log_ratio=True, kind="claim", paper_value="GCDRO beats DRO (no number)",
            detail=(f"non-inferiority: paired per-seed log(gcdro/{best}) against log {cfg.margin:g}; ratio of "
                    f"means {g:.4g}/{b:.4g} = {g / b:.4g}; "
                    f"erm={e:.4g}, gcdro/erm = {g / e:.4g} ({'better' if g < e else 'not better'} than ERM)")))
    frac = cfg.noise_frac
    gm = s["gcdro"]["c1_noisy_mass"]["mean"]
    # C1 as measured here is a property of GCDRO's worst-case distribution at its own strength (uniform weights
    # pass the first check too), not a matched-strength comparison with the baselines: mechanisms
    checks.append(ClaimCheck(name="C1: GCDRO worst-case mass on noisy points <= 2x uniform share",
                             metric="c1_noisy_mass", measured=gm, threshold=2 * frac, direction="<=",
                             kind="mechanism", method_arm="gcdro", paper_value="qualitative (no number)",
                             detail=f"gcdro noisy mass={gm:.4g}, uniform share={frac:g}"))
    # the noisy-mass check alone cannot separate GCDRO from "no reweighting" (uniform q passes it); the flow
    # must also have moved mass onto the clean high-loss region (notes §2.3: "98 % bump")
    gb, eb = s["gcdro"]["c1_bump_mass_ratio"]["mean"], s["erm"]["c1_bump_mass_ratio"]["mean"]
    gtv = s["gcdro"]["c1_tv_from_uniform"]["mean"]
    checks.append(ClaimCheck(name="C1: GCDRO moves mass onto the clean high-loss region (>= 1.5x its uniform share)",
                             metric="c1_bump_mass_ratio", measured=gb, threshold=1.5, direction=">=",
                             kind="mechanism", method_arm="gcdro", paper_value="qualitative (notes: 98% on the bump)",
                             detail=(f"bump = clean points with ERM loss >= 0.9-quantile of clean losses; "
                                     f"gcdro mass(bump)/uniform share={gb:.4g} (erm={eb:.4g}); "
                                     f"gcdro TV distance from uniform={gtv:.4g}")))
    bm = {a: s[a]["c1_noisy_mass"]["mean"] for a in BASELINES}
    # the regime GCDRO addresses: the plain DRO sets are over-pessimistic on the noisy points here
    checks.append(ClaimCheck(name="C1: KL/chi2/CVaR put most worst-case mass on noisy points",
                             metric="c1_noisy_mass", measured=min(bm.values()), threshold=0.5, direction=">=",
                             kind="sanity", baseline_arm=min(bm, key=bm.get), paper_value="qualitative (no number)",
                             detail=", ".join(f"{a}={v:.4g}" for a, v in bm.items())))

    artifacts = [_plot_weights(cfg, c1_example, out_dir / "worst_case_weights.png"),
                 _plot_env_rmse(cfg, env_rmse, s, out_dir / "rmse_per_environment.png"),
                 _plot_sensitivity(grids, out_dir / "sensitivity.png")]
    grid_edges = {d: _grid_edges(cfg, {arm: [m[arm][f"{d}_param"] for m in per_seed_metrics]
                                       for arm in ("kl", "chi2", "cvar", "gcdro")}) for d in ("d1", "d2")}
    extra = {"d1_env_rmse": {a: v for a, v in env_rmse.items()}, "r_test": list(cfg.r_test),
             "grids": {str(k): v for k, v in grids.items()}, "selected_at_grid_edge": grid_edges}
    return rec.finish(checks, artifacts=artifacts, extra=extra)


def _plot_weights(cfg: Config, ex: dict[str, Any], path: Path) -> Path:
    order = np.argsort(ex["losses"])
    noisy = ex["noisy"][order]
    arms = ("kl", "chi2", "cvar", "gdro", "gcdro")
    fig, axes = new_figure(len(arms), width=3.4, height=3.0)
    n = len(order)
    for ax, arm in zip(axes, arms, strict=True):
        q = ex["weights"][arm][order] * n
        idx = np.arange(n)
        ax.scatter(idx[~noisy], q[~noisy], s=4, c="tab:blue", label="clean")
        ax.scatter(idx[noisy], q[noisy], s=8, c="tab:red", label="noisy")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(f"{arm}: noisy mass {ex['weights'][arm][ex['noisy']].sum():.2f}", fontsize=9)
        ax.set_xlabel("sample (sorted by ERM loss)")
    axes[0].set_ylabel("n · q_i (1 = uniform)")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)


def _plot_env_rmse(cfg: Config, env_rmse: dict[str, list[list[float]]], s: dict, path: Path) -> Path:
    fig, axes = new_figure(2)
    x = [abs(r) for r in cfg.r_test]
    for arm in ARMS:
        band(axes[0], x, env_rmse[arm], label=arm, marker="o", log_y=True)
    axes[0].set_xlabel("|r| of the shifted test environment (r < 0)")
    axes[0].set_ylabel("test RMSE (D1)")
    axes[0].legend(fontsize=7)
    means = [s[a]["d2_rmse_minority"]["mean"] for a in ARMS]
    stds = [s[a]["d2_rmse_minority"]["std"] for a in ARMS]
    axes[1].bar(list(ARMS), means, yerr=stds, color="tab:gray")
    axes[1].set_ylabel("minority-group RMSE (D2)")
    return save_figure(fig, path)


def _plot_sensitivity(grids: dict[int, dict], path: Path) -> Path:
    """D1 shifted-test RMSE of every candidate (grid ordered from most to least pessimistic), mean ± std."""
    fig, axes = new_figure(1, width=5.5)
    ax = axes[0]
    seeds = list(grids)
    for arm in ("kl", "chi2", "cvar", "gcdro"):
        params = [row["param"] for row in grids[seeds[0]]["d1"][arm]]
        runs = [[float(np.mean([v for k, v in row.items() if k.startswith("rmse_r")])) for row in grids[s]["d1"][arm]]
                for s in seeds]
        band(ax, list(range(len(params))), runs, label=f"{arm} ({', '.join(f'{p:g}' for p in params)})",
             marker="o", log_y=True)
    erm = [float(np.mean([v for k, v in grids[s]["d1"]["erm"][0].items() if k.startswith("rmse_r")])) for s in seeds]
    ax.axhline(float(np.mean(erm)), color="k", ls="--", lw=1, label="erm")
    ax.set_xticks(list(range(len(params))))
    ax.set_xlabel("grid position (most -> least pessimistic)")
    ax.set_ylabel("D1 mean shifted-test RMSE")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
