"""Reproduction of "Resisting Stochastic Risks in Diffusion Planners with the Trajectory Aggregation Tree"
(arXiv 2405.17879) in a self-made Maze2D (D4RL layouts, numpy point mass).

Per maze and training seed: a D4RL-like dataset (BFS waypoints + noisy PD controller) and one small Diffuser
(MLP x_0-denoiser, start/goal inpainting) trained on it, then closed-loop episodes from random start-goal pairs,
2.5 H steps long, ended by the first wall contact. Every arm acts on the SAME batch of N = 128 sampled plans
(paired): vanilla (the first sample, as Diffuser's maze2d policy executes), the medoid of the batch, TAT (official
λ = 0.98, 1 − α = 5e-4, cosine), TAT with a random branch choice (a negative control), and the oracle best of the
N samples (the headroom any selection from the batch has). A second batch from the same noise seed with a third
of the denoising steps gives vanilla_fast / tat_fast; a few more step counts give the score-vs-steps curve.

Claims (issue 30, named before the run; 95% CIs by a cluster bootstrap: training seeds, then plans within them):
per maze, (1) TAT's infeasible-plan rate is below vanilla's and (2) TAT's normalised score is no lower than
vanilla's; pooled over mazes, (3) TAT at T/3 denoising steps scores no lower than vanilla at T steps.
Regime guards per maze (each guards that maze's claims): the batch's infeasible rate lies inside the risky-minority
band, and the best of the N samples beats vanilla (room to select).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml24.common import validate as val
from icml24.common.config import ExperimentConfig, help_text
from icml24.common.parallel import run_jobs
from icml24.common.plotting import new_figure, save_figure
from icml24.common.progress import progress
from icml24.common.results import ClaimCheck, RunRecorder, RunResult, one_sample_check, paired_check
from icml24.common.rl_stats import iqm_with_ci
from icml24.common.seeding import seed_everything, torch_generator
from icml24.tat.diffuser import GaussianDiffusion, LimitsNormalizer, MLPDenoiser, TemporalUnet, train_diffuser
from icml24.tat.maze import MAZE_NAMES, Maze, PointMaze2D, collect_dataset, expert_return
from icml24.tat.planner import DiffuserPlanner, execute_plans
from icml24.tat.tree import aggregate_plan, medoid_index

SLUG = "tat"
STRICT = 1e-9  # "below": the CI's upper end must be < 0, i.e. <= -STRICT
MAIN_ARMS = ("vanilla", "medoid", "tat", "tat_random", "vanilla_fast", "tat_fast")
ORACLE = "best_of_n"  # the best of the N samples by its own executed score (an oracle: it needs N executions)
BATCH = "batch"       # the average over the N samples of a batch
METRICS = ("infeasible", "contact", "success", "score")


@dataclass(frozen=True)
class Config(ExperimentConfig):
    seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata=help_text(
        "training seeds: per maze, each trains its own Diffuser (dataset, init, minibatches) and draws its own "
        "start-goal pairs and sampling noise (the clusters of the cluster bootstrap)"))
    mazes: tuple[str, ...] = field(default=("umaze", "medium"), metadata=help_text(
        "D4RL Maze2D layouts (issue: U-maze and medium in the full run, large in the slow variant)"))
    horizons: tuple[int, ...] = field(default=(48, 72), metadata=help_text(
        "H per maze (ours: ~1.5x the longest BFS path at the data's speed; Diffuser uses 128/256/384 MuJoCo steps)"))
    data_steps: int = field(default=30_000, metadata=help_text("dataset stream length per maze (D4RL: 1e6)"))
    denoiser: str = field(default="mlp", metadata=help_text("mlp (CPU default, notes §5) or unet (official)"))
    hidden: int = field(default=256, metadata=help_text("MLP denoiser width (notes §5: 3x512; 256 for the CPU budget)"))
    unet_dim: int = field(default=16, metadata=help_text("U-Net base width (official 32; notes §5: 16 on CPU)"))
    n_timesteps: int = field(default=20, metadata=help_text("T, diffusion steps (notes §5: 20-32; official 64-256)"))
    train_steps: tuple[int, ...] = field(default=(2000, 30000), metadata=help_text(
        "optimiser steps per maze, set by the vanilla-only pilot (README: the issue's ~3000 on U-maze sits on the "
        "risky band's edge; no length piloted puts medium inside it, 30000 is the longest piloted)"))
    batch_size: int = field(default=64, metadata=help_text("training batch (official 32 x grad-accumulate 2)"))
    lr: float = field(default=1e-3, metadata=help_text("Adam lr (official 2e-4; larger for the short CPU budget)"))
    n_samples: int = field(default=128, metadata=help_text("N plans per decision (official maze2d: 128)"))
    fast_steps: int = field(default=7, metadata=help_text("denoising steps of the fast arms: ceil(T/3) (claim 3)"))
    steps_grid: tuple[int, ...] = field(default=(20, 7, 4), metadata=help_text(
        "denoising step counts for the score-vs-steps curve (vanilla and TAT)"))
    episodes_per_seed: int = field(default=64, metadata=help_text(
        "start-goal pairs per training seed and maze (5 x 64 = 320 >= 300 paired plans per maze, issue)"))
    episode_factor: float = field(default=2.5, metadata=help_text(
        "episode length = factor x H env steps (issue: 2-3 H; D4RL maze2d: 300 steps for H = 128)"))
    terminate_on_contact: bool = field(default=True, metadata=help_text(
        "a wall contact ends the episode (issue 30: a plan through a wall fails instead of sliding along it)"))
    lambda_: float = field(default=0.98, metadata=help_text("λ, TAT weight decay (official 0.98)"))
    merge_threshold: float = field(default=5e-4, metadata=help_text("1 − α, TAT merge threshold (official 5e-4)"))
    distance: str = field(default="cosine", metadata=help_text("TAT distance (official cosine)"))
    risky_band: tuple[float, float] = field(default=(0.02, 0.4), metadata=help_text(
        "sanity per maze: the batch's infeasible-sample rate (its CI) lies inside this band (a risky minority)"))
    iqm_reps: int = field(default=2000, metadata=help_text("rliable stratified-bootstrap resamples"))
    workers: int = field(default=2, metadata=help_text("processes over the (maze, training seed) jobs"))
    plot_examples: bool = field(default=True, metadata=help_text("draw example plans per maze"))

    def __post_init__(self) -> None:
        super().__post_init__()
        w = "Config"
        val.each(w, "mazes", self.mazes, val.one_of, MAZE_NAMES)
        val.each(w, "horizons", self.horizons, val.integer, minimum=2)
        if len(self.horizons) != len(self.mazes):
            raise ValueError(f"{w}: horizons must give one H per maze, got {self.horizons!r} for {self.mazes!r}")
        val.one_of(w, "denoiser", self.denoiser, ("mlp", "unet"))
        val.one_of(w, "distance", self.distance, ("cosine", "euclidean"))
        val.each(w, "train_steps", self.train_steps, val.integer, minimum=1)
        if len(self.train_steps) != len(self.mazes):
            raise ValueError(f"{w}: train_steps must give one count per maze, got {self.train_steps!r}")
        for n in ("data_steps", "hidden", "unet_dim", "n_timesteps", "batch_size", "n_samples",
                  "fast_steps", "episodes_per_seed", "iqm_reps", "workers"):
            val.integer(w, n, getattr(self, n), minimum=1)
        val.positive(w, "lr", self.lr)
        val.at_least(w, "episode_factor", self.episode_factor, 1.0)
        val.in_range(w, "lambda_", self.lambda_, 0.0, 1.0, low_open=True)
        val.non_negative(w, "merge_threshold", self.merge_threshold)
        band = tuple(self.risky_band)
        if len(band) != 2 or not 0.0 <= band[0] < band[1] <= 1.0:
            raise ValueError(f"{w}: risky_band must be (low, high) with 0 <= low < high <= 1, got {self.risky_band!r}")
        val.each(w, "steps_grid", self.steps_grid, val.integer, minimum=1)
        if self.fast_steps >= self.n_timesteps:
            raise ValueError(f"{w}: fast_steps ({self.fast_steps}) must be < n_timesteps ({self.n_timesteps})")
        if self.n_samples < 2:
            raise ValueError(f"{w}: n_samples must be >= 2 (a batch to aggregate), got {self.n_samples}")
        if len(self.seeds) < 2:
            raise ValueError(f"{w}: seeds must give >= 2 training seeds (the clusters of the bootstrap)")
        if len(self.seeds) * self.episodes_per_seed < 10:
            raise ValueError(f"{w}: seeds x episodes_per_seed must be >= 10 plans (bootstrap CIs)")

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=(0, 1), mazes=("umaze",), horizons=(32,), data_steps=8000, hidden=128, train_steps=(250,),
                   n_samples=16, steps_grid=(20, 7), episodes_per_seed=6, iqm_reps=100, workers=1,
                   plot_examples=True)

    @classmethod
    def slow(cls) -> Config:
        """The large maze too (issue: documented slow variant)."""
        return cls(mazes=("umaze", "medium", "large"), horizons=(48, 72, 96), train_steps=(2000, 30000, 60000))


# ---------------------------------------------------------------------------------------------- training
def train_maze_model(cfg: Config, maze: str, horizon: int, *, seed: int = 0, train_steps: int | None = None,
                     on_step: Callable[[int, GaussianDiffusion], None] | None = None
                     ) -> tuple[DiffuserPlanner, dict[str, Any]]:
    """Dataset + normaliser + Diffuser for one maze and training seed; returns the planner and training info.
    ``on_step(steps_done, ema)`` is passed to :func:`train_diffuser` (the pilot evaluates snapshots with it)."""
    t0 = time.perf_counter()
    data = collect_dataset(maze, n_steps=cfg.data_steps, seed=seed)
    norm = LimitsNormalizer(data.observations)
    obs = torch.as_tensor(norm.normalize(data.observations), dtype=torch.float32, device=cfg.device)
    starts = torch.as_tensor(data.windows(horizon), device=cfg.device)
    ar = torch.arange(horizon, device=cfg.device)

    def windows(b: int, g: torch.Generator | None) -> torch.Tensor:
        i = starts[torch.randint(0, len(starts), (b,), generator=g, device="cpu").to(cfg.device)]
        return obs[i[:, None] + ar[None, :]]

    torch.manual_seed(seed)
    if cfg.denoiser == "mlp":
        net = MLPDenoiser(horizon=horizon, transition_dim=4, hidden=cfg.hidden)
    else:
        net = TemporalUnet(horizon=horizon, transition_dim=4, dim=cfg.unet_dim, dim_mults=(1, 2, 4))
    diff = GaussianDiffusion(net, horizon=horizon, transition_dim=4, n_timesteps=cfg.n_timesteps).to(cfg.device)
    steps = cfg.train_steps[0] if train_steps is None else train_steps
    ema, curve = train_diffuser(diff, windows, steps=steps, batch_size=cfg.batch_size, lr=cfg.lr,
                                generator=torch_generator(seed), on_step=on_step,
                                progress=lambda it: progress(it, desc=f"{SLUG} train {maze} s{seed}"))
    ema.eval()
    info = {"data_steps": cfg.data_steps, "episodes_in_data": len(data.episodes()),
            "data_speed_mean": float(np.linalg.norm(data.observations[:, 2:], axis=1).mean()),
            "loss_first100": float(np.mean(curve[:100])), "loss_last100": float(np.mean(curve[-100:])),
            "train_wall_s": time.perf_counter() - t0, "curve": curve[:: max(1, len(curve) // 200)]}
    return DiffuserPlanner(diffusion=ema, normalizer=norm, maze=Maze(maze)), info


# ---------------------------------------------------------------------------------------------- evaluation
def _task(m: Maze, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    cells = m.free_cells
    while True:
        s, g = cells[rng.integers(len(cells))], cells[rng.integers(len(cells))]
        if s != g:
            return np.array(s, float) + rng.uniform(-0.1, 0.1, 2), np.array(g, float)


def eval_env(cfg: Config, planner: DiffuserPlanner) -> tuple[PointMaze2D, int]:
    """The evaluation env (wall contact ends the episode) and the episode length (``episode_factor`` x H)."""
    steps = int(round(cfg.episode_factor * planner.horizon))
    return PointMaze2D(planner.maze, max_episode_steps=steps, terminate_on_contact=cfg.terminate_on_contact), steps


def evaluate_maze(cfg: Config, planner: DiffuserPlanner, *, seed: int, keep_example: bool = False,
                  vanilla_only: bool = False) -> dict[str, Any]:
    """Episodes of one maze and training seed; every arm on the same sampled batch. Returns per-episode lists
    ``arms[arm][metric]`` for ``MAIN_ARMS`` (+ the score-vs-steps arms), ``best_of_n`` and ``batch``;
    ``vanilla_only`` (the pilot) keeps vanilla, the oracle and the batch average and skips every aggregation."""
    m = planner.maze
    env, steps = eval_env(cfg, planner)
    rng = np.random.default_rng(10_000 + seed)
    extra_steps = [s for s in cfg.steps_grid if s not in (cfg.n_timesteps, cfg.fast_steps)]
    arms = ["vanilla"] if vanilla_only else list(MAIN_ARMS) + [f"{a}_s{s}" for s in extra_steps
                                                                 for a in ("vanilla", "tat")]
    out: dict[str, dict[str, list[float]]] = {a: {k: [] for k in METRICS} for a in arms + [ORACLE, BATCH]}
    extra: dict[str, list[float]] = {k: [] for k in ("t_sample", "t_sample_fast", "t_tat", "t_medoid",
                                                     "root_children", "root_max_count", "tat_is_sample0",
                                                     "expert_return")}
    example = None
    tat_kw = {"lambda_": cfg.lambda_, "merge_threshold": cfg.merge_threshold, "distance": cfg.distance}
    unnorm = planner.normalizer.unnormalize
    for e in range(cfg.episodes_per_seed):
        start, goal = _task(m, rng)
        ref = max(expert_return(env, start=start, goal=goal, steps=steps), 1.0)
        noise_seed = 1_000_003 * (seed + 1) + e
        t0 = time.perf_counter()
        xn, xu = planner.sample(start=start, goal=goal, n_samples=cfg.n_samples,
                                generator=torch_generator(noise_seed, cfg.device))
        extra["t_sample"].append(time.perf_counter() - t0)
        rows: dict[str, np.ndarray] = {}  # arm -> its plan, executed after the N samples
        if not vanilla_only:
            t0 = time.perf_counter()
            med = medoid_index(xn)
            t1 = time.perf_counter()
            tat_plan, tinfo = aggregate_plan(xn, return_tree=True, **tat_kw)
            extra["t_medoid"].append(t1 - t0)
            extra["t_tat"].append(time.perf_counter() - t1)
            rows["tat"] = unnorm(tat_plan)
            rows["tat_random"] = unnorm(aggregate_plan(xn, rng=np.random.default_rng(noise_seed), **tat_kw))
            t0 = time.perf_counter()
            fn, fu = planner.sample(start=start, goal=goal, n_samples=cfg.n_samples, n_steps=cfg.fast_steps,
                                    generator=torch_generator(noise_seed, cfg.device))
            extra["t_sample_fast"].append(time.perf_counter() - t0)
            rows["vanilla_fast"], rows["tat_fast"] = fu[0], unnorm(aggregate_plan(fn, **tat_kw))
            for s in extra_steps:
                sn, su = planner.sample(start=start, goal=goal, n_samples=cfg.n_samples, n_steps=s,
                                        generator=torch_generator(noise_seed, cfg.device))
                rows[f"vanilla_s{s}"], rows[f"tat_s{s}"] = su[0], unnorm(aggregate_plan(sn, **tat_kw))
            extra["root_children"].append(float(tinfo["root_children"]))
            extra["root_max_count"].append(float(tinfo["root_max_count"]))
            extra["tat_is_sample0"].append(float(np.allclose(tat_plan, xn[0])))
        n = cfg.n_samples
        res = execute_plans(env, np.concatenate([xu, np.stack(list(rows.values()))]) if rows else xu,
                            start=start, goal=goal, steps=steps)
        res["score"] = 100.0 * res["ret"] / ref
        index = {"vanilla": 0, **({} if vanilla_only else {"medoid": med}),
                 **{a: n + k for k, a in enumerate(rows)}, ORACLE: int(np.argmax(res["score"][:n]))}
        for a, i in index.items():
            for k in METRICS:
                out[a][k].append(float(res[k][i]))
        for k in METRICS:
            out[BATCH][k].append(float(np.mean(res[k][:n])))
        extra["expert_return"].append(ref)
        if keep_example and not vanilla_only and (
                example is None or (not example["contrast"] and out["vanilla"]["infeasible"][-1]
                                    and not out["tat"]["infeasible"][-1])):
            example = {"samples": xu, "vanilla": xu[0], "tat": rows["tat"], "medoid": xu[med], "start": start,
                       "goal": goal, "episode": e, "contrast": bool(out["vanilla"]["infeasible"][-1]
                                                      and not out["tat"]["infeasible"][-1])}
    return {"arms": out, "extra": extra, "example": example}


def maze_seed_job(cfg: Config, job: tuple[str, int, int, int]) -> dict[str, Any]:
    """One (maze, H, training steps, training seed) job: train, then evaluate (a module-level function, so that
    :func:`run_jobs` can ship it to a worker process; every job seeds itself)."""
    maze, horizon, steps, seed = job
    seed_everything(seed)
    planner, info = train_maze_model(cfg, maze, horizon, seed=seed, train_steps=steps)
    ev = evaluate_maze(cfg, planner, seed=seed, keep_example=cfg.plot_examples and seed == cfg.seeds[0])
    return {**ev, "train": info}


@dataclass
class Outcomes:
    """Per-plan outcomes of a run: ``get(maze or None for pooled, arm, metric)`` and the matching cluster labels
    ``clusters(maze or None)`` (``maze/seed``: the plans of one trained model form one cluster)."""

    mazes: tuple[str, ...]
    seeds: tuple[int, ...]
    evals: dict[tuple[str, int], dict[str, Any]]

    def _ms(self, maze: str | None) -> tuple[str, ...]:
        return self.mazes if maze is None else (maze,)

    def get(self, maze: str | None, arm: str, metric: str) -> np.ndarray:
        return np.array([x for mz in self._ms(maze) for s in self.seeds for x in self.evals[mz, s]["arms"][arm][metric]])

    def clusters(self, maze: str | None) -> list[str]:
        return [f"{mz}/{s}" for mz in self._ms(maze) for s in self.seeds
                for _ in self.evals[mz, s]["arms"]["vanilla"]["score"]]

    def extra_mean(self, maze: str, key: str) -> float:
        return float(np.mean([x for s in self.seeds for x in self.evals[maze, s]["extra"][key]]))


# ---------------------------------------------------------------------------------------------- run
def run(cfg: Config, out_dir: Path) -> RunResult:
    out_dir = Path(out_dir)
    rec = RunRecorder(SLUG, cfg, out_dir)
    jobs = [(mz, h, n, s) for mz, h, n in zip(cfg.mazes, cfg.horizons, cfg.train_steps, strict=True)
            for s in cfg.seeds]
    done = run_jobs(functools.partial(maze_seed_job, cfg), jobs, workers=cfg.workers, threads=cfg.threads,
                    desc=f"{SLUG} train + eval")
    evals = {(j[0], j[3]): d for j, d in zip(jobs, done, strict=True)}
    o = Outcomes(cfg.mazes, cfg.seeds, evals)
    arms = list(evals[jobs[0][0], jobs[0][3]]["arms"])
    for s in cfg.seeds:
        rec.add_seed(s, {a: {f"{mz}_{k}": float(np.mean(evals[mz, s]["arms"][a][k])) for mz in cfg.mazes
                             for k in METRICS} for a in arms})
    checks = build_checks(cfg, o)
    iqm = {a: e.as_dict() for a, e in iqm_with_ci(
        {a: np.array([o.get(mz, a, "score") for mz in cfg.mazes]).T / 100.0 for a in (*MAIN_ARMS, ORACLE)},
        reps=cfg.iqm_reps, seed=0).items()}
    timing = {k: float(np.mean([x for d in done for x in d["extra"][k]]))
              for k in ("t_sample", "t_sample_fast", "t_tat", "t_medoid")}
    artifacts = _plots(cfg, o, out_dir)
    extra = {
        "train": {f"{mz}/{s}": {k: v for k, v in evals[mz, s]["train"].items() if k != "curve"}
                  for mz, s in evals},
        "loss_curves": {mz: evals[mz, cfg.seeds[0]]["train"]["curve"] for mz in cfg.mazes},
        "rates": {mz: {a: {k: float(np.mean(o.get(mz, a, k))) for k in METRICS} for a in arms}
                  for mz in cfg.mazes},
        "per_seed_rates": {f"{mz}/{s}": {a: {k: float(np.mean(evals[mz, s]["arms"][a][k])) for k in METRICS}
                                         for a in ("vanilla", "tat", ORACLE, BATCH)} for mz, s in evals},
        "root_children_mean": {mz: o.extra_mean(mz, "root_children") for mz in cfg.mazes},
        "root_max_count_mean": {mz: o.extra_mean(mz, "root_max_count") for mz in cfg.mazes},
        "tat_plan_is_sample0": {mz: o.extra_mean(mz, "tat_is_sample0") for mz in cfg.mazes},
        "iqm_score": iqm,
        "planning_time_s": timing,
        "plans_per_maze": len(cfg.seeds) * cfg.episodes_per_seed,
        "score_vs_steps": _score_vs_steps(cfg, o),
    }
    return rec.finish(checks, artifacts=artifacts, extra=extra)


def claim_names(cfg: Config) -> dict[str, str]:
    """The claims' names: ``infeasible/<maze>`` (1) and ``score/<maze>`` (2) per maze, ``fast`` (3) pooled."""
    return {**{f"infeasible/{mz}": f"(1) {mz}: TAT's infeasible-plan rate is below vanilla's" for mz in cfg.mazes},
            **{f"score/{mz}": f"(2) {mz}: TAT's normalised score is no lower than vanilla's" for mz in cfg.mazes},
            "fast": f"(3) TAT with {cfg.fast_steps}/{cfg.n_timesteps} denoising steps scores no lower than vanilla "
                    f"with {cfg.n_timesteps} (pooled)"}


def build_checks(cfg: Config, o: Outcomes) -> list[ClaimCheck]:
    """Every check of the run from the per-plan outcomes; CIs by the cluster bootstrap over training seeds.

    Guards (schema 3): per maze, the risky-minority band and the room-to-select check guard that maze's two
    claims, and the random-branch negative control guards its infeasibility claim (whose statistic it applies);
    the pooled claim (3) is guarded by no per-maze check.
    """
    names = claim_names(cfg)
    checks: list[ClaimCheck] = []
    lo, hi = cfg.risky_band
    for mz in cfg.mazes:
        cl = o.clusters(mz)
        n_inf, n_score = names[f"infeasible/{mz}"], names[f"score/{mz}"]
        checks.append(paired_check(
            name=n_inf, metric=f"{mz}_infeasible", method=o.get(mz, "tat", "infeasible"),
            baseline=o.get(mz, "vanilla", "infeasible"), method_arm="tat", baseline_arm="vanilla", direction="<=",
            threshold=-STRICT, kind="claim", clusters=cl,
            paper_value="TAT resists infeasible/unsafe sampled plans (stochastic risks)",
            detail=f"rates tat={o.get(mz, 'tat', 'infeasible').mean():.3f}, "
                   f"vanilla={o.get(mz, 'vanilla', 'infeasible').mean():.3f}"))
        checks.append(paired_check(
            name=n_score, metric=f"{mz}_score", method=o.get(mz, "tat", "score"),
            baseline=o.get(mz, "vanilla", "score"), method_arm="tat", baseline_arm="vanilla", direction=">=",
            threshold=0.0, kind="claim", clusters=cl, paper_value="performance boosting in 100% of tasks",
            detail=f"success tat={o.get(mz, 'tat', 'success').mean():.3f}, "
                   f"vanilla={o.get(mz, 'vanilla', 'success').mean():.3f}"))
        band = o.get(mz, BATCH, "infeasible")
        for direction, bound, what in ((">=", lo, "low"), ("<=", hi, "high")):
            checks.append(one_sample_check(
                name=f"{mz}: batch infeasible rate {'>=' if what == 'low' else '<='} {bound} (a risky minority)",
                metric=f"{mz}_batch_infeasible", values=band, direction=direction, threshold=bound, kind="sanity",
                arm=BATCH, clusters=cl, guards=[n_inf, n_score],
                detail=f"the regime: a minority of the N = {cfg.n_samples} samples is infeasible, so there is a risk "
                       f"to resist and a majority to aggregate (band [{lo}, {hi}]; guards {mz}'s claims)"))
        checks.append(paired_check(
            name=f"{mz}: the best of the N samples beats vanilla (room to select)", metric=f"{mz}_score",
            method=o.get(mz, ORACLE, "score"), baseline=o.get(mz, "vanilla", "score"), method_arm=ORACLE,
            baseline_arm="vanilla", direction=">=", threshold=STRICT, kind="sanity", clusters=cl,
            guards=[n_inf, n_score],
            detail=f"the regime: an oracle choice among the same N samples must beat the first sample by more than "
                   f"the score claim's margin (0), or no aggregation of the batch can (guards {mz}'s claims)"))
        neg = paired_check(name="neg", metric="infeasible", method=o.get(mz, "tat_random", "infeasible"),
                           baseline=o.get(mz, "vanilla", "infeasible"), direction="<=", threshold=-STRICT,
                           kind="mechanism", clusters=cl)
        checks.append(ClaimCheck(
            name=f"{mz}: negative control: claim (1) rejects TAT with a random branch choice (CI upper end >= 0)",
            metric=f"{mz}_infeasible", measured=float(neg.ci_high), threshold=-STRICT, direction=">=",
            kind="sanity", method_arm="tat_random", baseline_arm="vanilla", guards=[n_inf],
            detail="negative control: a variant the paper's argument says must fail, the same tree with a random "
                   f"branch choice, must be rejected by claim (1)'s statistic (it guards {mz}'s claim (1)). "
                   f"{neg.detail}"))
    cl = o.clusters(None)
    checks.append(paired_check(
        name=names["fast"], metric="score", method=o.get(None, "tat_fast", "score"),
        baseline=o.get(None, "vanilla", "score"), method_arm="tat_fast", baseline_arm="vanilla",
        direction=">=", threshold=0.0, kind="claim", clusters=cl,
        paper_value="tolerance margin for sample quality: > 3x acceleration"))
    checks.append(paired_check(
        name="TAT's infeasible-plan rate is below the medoid's (pooled; an equal-sample baseline)",
        metric="infeasible", method=o.get(None, "tat", "infeasible"), baseline=o.get(None, "medoid", "infeasible"),
        method_arm="tat", baseline_arm="medoid", direction="<=", threshold=-STRICT, kind="mechanism", clusters=cl))
    checks.append(paired_check(
        name="TAT's infeasible rate <= the batch's average rate (aggregation acts as a consensus)",
        metric="infeasible", method=o.get(None, "tat", "infeasible"), baseline=o.get(None, BATCH, "infeasible"),
        method_arm="tat", baseline_arm=BATCH, direction="<=", threshold=0.0, kind="mechanism", clusters=cl))
    return checks


def _arm_at(cfg: Config, kind: str, s: int) -> str:
    if s == cfg.n_timesteps:
        return kind
    if s == cfg.fast_steps:
        return f"{kind}_fast"
    return f"{kind}_s{s}"


def _score_vs_steps(cfg: Config, o: Outcomes) -> dict[str, dict[str, dict[str, float]]]:
    grid = sorted(set(cfg.steps_grid) | {cfg.n_timesteps, cfg.fast_steps}, reverse=True)
    return {mz: {k: {str(s): float(np.mean(o.get(mz, _arm_at(cfg, k, s), "score"))) for s in grid}
                 for k in ("vanilla", "tat")} for mz in cfg.mazes}


def _plots(cfg: Config, o: Outcomes, out_dir: Path) -> list[Path]:
    arts = []
    # 1) example plans
    if cfg.plot_examples:
        fig, axes = new_figure(len(cfg.mazes), width=4.5, height=4.5)
        for ax, mz in zip(axes, cfg.mazes, strict=True):
            ex = o.evals[mz, cfg.seeds[0]]["example"]
            m = Maze(mz)
            ax.imshow(m.walls, cmap="Greys", origin="upper", extent=(-0.5, m.shape[1] - 0.5, m.shape[0] - 0.5, -0.5))
            for tr in ex["samples"]:
                ax.plot(tr[:, 1], tr[:, 0], color="0.6", lw=0.4, alpha=0.5)
            ax.plot(ex["vanilla"][:, 1], ex["vanilla"][:, 0], color="tab:red", lw=1.5, label="vanilla (sample 0)")
            ax.plot(ex["medoid"][:, 1], ex["medoid"][:, 0], color="tab:green", lw=1.2, ls="--", label="medoid")
            ax.plot(ex["tat"][:, 1], ex["tat"][:, 0], color="tab:blue", lw=1.8, label="TAT")
            ax.plot(ex["start"][1], ex["start"][0], "ko")
            ax.plot(ex["goal"][1], ex["goal"][0], "r*", ms=12)
            ax.set(title=f"{mz}: {len(ex['samples'])} sampled plans", xticks=[], yticks=[])
            ax.legend(fontsize=7, loc="lower left")
        arts.append(save_figure(fig, out_dir / "plans.png"))
    # 2) infeasibility, wall contact, success and score per maze per arm (normal 95% error bars over plans)
    arms = [*MAIN_ARMS, ORACLE]
    fig, axes = new_figure(len(METRICS), width=4.2)
    for ax, met in zip(axes, METRICS, strict=True):
        w = 0.8 / len(arms)
        for k, a in enumerate(arms):
            vals = [o.get(mz, a, met) for mz in cfg.mazes]
            ax.bar(np.arange(len(cfg.mazes)) + k * w, [v.mean() for v in vals], w,
                   yerr=[1.96 * v.std() / np.sqrt(len(v)) for v in vals], label=a)
        ax.set_xticks(np.arange(len(cfg.mazes)) + 0.4 - w / 2, cfg.mazes)
        ax.set(title={"infeasible": "infeasible-plan rate", "contact": "wall contact (episode ended)",
                      "success": "success rate", "score": "normalised score"}[met])
    axes[0].legend(fontsize=7)
    arts.append(save_figure(fig, out_dir / "rates.png"))
    # 3) score vs sampling steps
    sv = _score_vs_steps(cfg, o)
    fig, axes = new_figure(len(cfg.mazes))
    for ax, mz in zip(axes, cfg.mazes, strict=True):
        for k, c in (("vanilla", "tab:red"), ("tat", "tab:blue")):
            xs = sorted(int(s) for s in sv[mz][k])
            ax.plot(xs, [sv[mz][k][str(s)] for s in xs], "o-", color=c, label=k)
        ax.set(title=f"{mz}: score vs denoising steps", xlabel="denoising steps", ylabel="normalised score")
        ax.legend()
    arts.append(save_figure(fig, out_dir / "score_vs_steps.png"))
    return arts
