"""Reproduction of ALH (Quang & Lauw, ICML 2024; no arXiv id; official code nbtpj/ALH).

Primary claim, on the paper's analysis environment ``MultiNormEnv`` with the biased early-data scheme (all
training resets in [200, 260], warm-up actions 0, no exploration noise; evaluation from unbiased resets):
ALH-g (and, with ``alh_a`` in ``test_arms``, ALH-a) improves TD3 early in training, paired per seed on the mean
of the last two evaluations, 10 seeds. Every arm's learning rate is chosen from the same grid on separate
validation seeds. The bias story is a ``mechanism`` beside the verdict (issue 30), never a gate on the claims:
TD3 and ALH-g also train on unbiased data (the official unbiased scheme, exploration noise 0.1) on every test
seed, and the run reports the interaction (ALH-g − TD3 | biased) − (ALH-g − TD3 | unbiased) and
TD3 unbiased − TD3 biased, each paired over the seeds with its 95% t interval.
Tuning (issue 26): each tuned arm's lr goes through :func:`icml24.common.tuning.tune_grid` (log grid, extended
past an edge that keeps winning by at most ``grid_extra`` points, the same budget for every arm; no natural
bound: an lr grid has none), and :func:`~icml24.common.tuning.tuning_check` guards the claims that use or compare
against that arm.
MuJoCo tasks run as separate resumable jobs (``mujoco_only``): ``InvertedPendulum-v5`` (issue: ALH no worse than TD3
by 5% of the return range, 50k steps) and, in the slow variant, ``InvertedDoublePendulum-v5`` and ``Hopper-v5``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.stats as st

from icml24.alh.alh import ALHAgent
from icml24.alh.envs import box_bounds, make_env
from icml24.alh.runner import train
from icml24.alh.td3 import TD3Agent
from icml24.common import validate as val
from icml24.common.config import ExperimentConfig, help_text
from icml24.common.parallel import run_jobs
from icml24.common.plotting import new_figure, save_figure
from icml24.common.results import ClaimCheck, Kind, RunRecorder, RunResult, one_sample_check, paired_check
from icml24.common.rl_stats import iqm_with_ci
from icml24.common.seeding import seed_everything
from icml24.common.tuning import Tuned, tune_grid, tuning_check

SLUG = "alh"
ARMS = ("td3", "alh_g", "alh_a")
UNBIASED = "_unbiased"  # suffix of an arm trained on the official unbiased scheme
_LABELS = {"td3": "TD3", "alh_g": "ALH-g", "alh_a": "ALH-a", "td3_unbiased": "TD3 (unbiased data)",
           "alh_g_unbiased": "ALH-g (unbiased data)", "alh_a_unbiased": "ALH-a (unbiased data)"}
# best return reachable per episode (1000 steps): InvertedPendulum 1 per step; InvertedDoublePendulum ≈ 9.36 per
# step (its maximum alive bonus minus zero penalties); Hopper: TD3's 1M-step score (Fujimoto et al. 2018, ≈ 3564)
RETURN_RANGE = {"InvertedPendulum-v5": 1000.0, "InvertedDoublePendulum-v5": 9360.0, "Hopper-v5": 3600.0}
_COLORS = {"td3": "tab:blue", "alh_g": "tab:red", "alh_a": "tab:orange", "td3_unbiased": "tab:gray",
           "alh_g_unbiased": "tab:pink", "alh_a_unbiased": "tab:brown"}


@dataclass(frozen=True)
class Config(ExperimentConfig):
    seeds: tuple[int, ...] = field(default=tuple(range(10)), metadata=help_text(
        "test seeds (official: 10 seeds 0-9 online; issue: 10)"))
    val_seeds: tuple[int, ...] = field(default=(100, 101), metadata=help_text(
        "validation seeds used only to pick each arm's lr (ours; disjoint from the test seeds; 2 for CPU)"))
    lr_grid: tuple[float, ...] = field(default=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3), metadata=help_text(
        "Adam lr grid shared by all networks of an arm, same budget for every tuned arm (official: 3e-4; runs "
        "with {3e-4, 1e-3, 3e-3} and {1e-4, ..., 1e-2} put picks on the lower edge, so the grid moved down); "
        "with >= 2 points it is tuned with tune_grid (log scale, no natural bound) and a sanity check requires "
        "every tuned lr strictly inside the evaluated grid"))
    grid_extra: int = field(default=2, metadata=help_text(
        "extra grid points tune_grid may add past an edge that keeps winning (issue 26); every arm gets the same "
        "budget"))
    test_arms: tuple[str, ...] = field(default=("td3", "alh_g"), metadata=help_text(
        "arms trained on the biased data on every test seed; each ALH arm among them makes a claim against TD3 "
        "(issue 30 amendment: ALH-a's 10 runs are left out of the default full run to fit 30 min on 2 cores; "
        "add 'alh_a' for its claim)"))
    unbiased_arms: tuple[str, ...] = field(default=("td3", "alh_g"), metadata=help_text(
        "arms (a subset of test_arms) also trained on the official unbiased scheme on every test seed, with their "
        "tuned lrs: the bias mechanisms need td3 (TD3 unbiased − biased) and alh_g (the interaction); () = off "
        "(issue 30)"))
    tune_arms: tuple[str, ...] = field(default=("td3", "alh_g"), metadata=help_text(
        "arms tuned on the grid; ALH-a takes ALH-g's lr (ours: the same ALH networks)"))
    total_steps: int = field(default=45_000, metadata=help_text(
        "environment steps per run incl. warm-up: 20k updates (official toy: 2e6; notes' CPU set: 45k = 20k "
        "updates; 60 runs ≈ 45 min of CPU, ≈ 23 min with workers=2: README, amendment)"))
    start_steps: int = field(default=25_000, metadata=help_text("random-action warm-up steps (official: 25k)"))
    eval_every: int = field(default=500, metadata=help_text(
        "evaluation period in steps after the warm-up (official: 5000 over 2M steps)"))
    eval_episodes: int = field(default=10, metadata=help_text("episodes per evaluation (official: 10)"))
    batch_size: int = field(default=128, metadata=help_text("B (official toy: 512; notes' CPU set: 128)"))
    subset_size: int = field(default=32, metadata=help_text("m, rows per subset (official toy: 128; CPU: 32)"))
    hidden: int = field(default=64, metadata=help_text("actor/critic width (official toy: 64)"))
    mem_hidden: int = field(default=64, metadata=help_text("E/D width (official toy: 64)"))
    hypo_dim: int = field(default=64, metadata=help_text("k, hypothesis size (official: 64)"))
    expl_noise: float = field(default=0.0, metadata=help_text(
        "exploration noise / a_max during training on the biased data (official bias scheme: 0)"))
    unbiased_expl_noise: float = field(default=0.1, metadata=help_text(
        "exploration noise / a_max during training on the unbiased data (official unbiased scheme "
        "share_not_hard_config: main_toy.py's default 0.1)"))
    biased: bool = field(default=True, metadata=help_text("the biased early-data scheme (official 'hard')"))
    mujoco_env: str = field(default="", metadata=help_text(
        "gymnasium id of the MuJoCo sanity task ('' = off; slow variant: InvertedPendulum-v5)"))
    mujoco_seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata=help_text(
        "seeds of the MuJoCo task (issue: 5)"))
    mujoco_only: bool = field(default=False, metadata=help_text(
        "run only the MuJoCo sanity task (a separate, resumable job; results/alh/mujoco_pendulum)"))
    # NOTE(deviation): MuJoCo at CPU sizes (width 64, lr 1e-3, TD3 paper's 1k/10k warm-up; ALH code: 256, 3e-4,
    # 25k): at the official sizes TD3 had not learned InvertedPendulum after 20k steps (README, MuJoCo)
    mujoco_steps: int = field(default=50_000, metadata=help_text("MuJoCo steps incl. warm-up (issue: 50k)"))
    mujoco_start: int = field(default=1_000, metadata=help_text(
        "MuJoCo warm-up steps (official repo: 25k; TD3 paper for the pendulum tasks: 1k)"))
    mujoco_eval_every: int = field(default=2_500, metadata=help_text("MuJoCo eval period (official: 5000)"))
    mujoco_batch: int = field(default=256, metadata=help_text("MuJoCo B (official: 256)"))
    mujoco_hidden: int = field(default=64, metadata=help_text(
        "MuJoCo actor/critic width (official: 256; CPU: 64, the width of the official toy scripts)"))
    mujoco_mem_hidden: int = field(default=64, metadata=help_text("MuJoCo E/D width (official 256; CPU 64)"))
    mujoco_subset: int = field(default=32, metadata=help_text("MuJoCo m (official B/2 = 128; CPU 32)"))
    mujoco_lr: float = field(default=1e-3, metadata=help_text(
        "MuJoCo Adam lr, both arms, untuned (official repo: 3e-4; TD3 paper: 1e-3)"))
    mujoco_return_range: float = field(default=0.0, metadata=help_text(
        "return range of the MuJoCo task for the 5% margin (issue) and the learned-task check; 0 = from "
        "RETURN_RANGE (InvertedPendulum 1000, InvertedDoublePendulum 9360, Hopper 3600)"))
    margin_fraction: float = field(default=0.05, metadata=help_text(
        "MuJoCo no-worse margin as a fraction of the return range (issue: 5%)"))
    workers: int = field(default=2, metadata=help_text(
        "processes running independent runs at once (each fully seeded: the numbers do not depend on it; 2 for "
        "the 2-core machine)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        w = "Config"
        val.each(w, "val_seeds", self.val_seeds, val.integer, minimum=0)
        if set(self.val_seeds) & set(self.seeds):
            raise ValueError(f"{w}: val_seeds {self.val_seeds} must be disjoint from seeds {self.seeds}")
        val.each(w, "lr_grid", self.lr_grid, val.positive)
        val.integer(w, "grid_extra", self.grid_extra, minimum=0)
        val.each(w, "test_arms", self.test_arms, val.one_of, ARMS)
        if "td3" not in self.test_arms or len(set(self.test_arms)) < 2 or len(set(self.test_arms)) != len(
                self.test_arms):
            raise ValueError(f"{w}: test_arms {self.test_arms} must hold td3 (every claim's baseline) and at least "
                             "one ALH arm, each once")
        for name in ("unbiased_arms", "tune_arms"):
            arms = getattr(self, name)
            if not set(arms) <= set(self.test_arms):
                raise ValueError(f"{w}: {name} {arms} must be a subset of test_arms {self.test_arms}")
        for name in ("total_steps", "eval_every", "eval_episodes", "batch_size", "subset_size", "hidden",
                     "mem_hidden", "mujoco_steps", "mujoco_eval_every", "mujoco_batch", "mujoco_hidden",
                     "mujoco_mem_hidden", "mujoco_subset", "workers"):
            val.integer(w, name, getattr(self, name), minimum=1)
        val.integer(w, "hypo_dim", self.hypo_dim, minimum=1)
        val.integer(w, "start_steps", self.start_steps, minimum=0)
        val.integer(w, "mujoco_start", self.mujoco_start, minimum=0)
        val.non_negative(w, "expl_noise", self.expl_noise)
        val.non_negative(w, "unbiased_expl_noise", self.unbiased_expl_noise)
        val.non_negative(w, "mujoco_return_range", self.mujoco_return_range)
        if self.mujoco_env and not self.mujoco_return_range and self.mujoco_env not in RETURN_RANGE:
            raise ValueError(f"{w}: no known return range for {self.mujoco_env!r}; set mujoco_return_range")
        val.positive(w, "mujoco_lr", self.mujoco_lr)
        val.probability(w, "margin_fraction", self.margin_fraction)
        if self.mujoco_only and not self.mujoco_env:
            raise ValueError(f"{w}: mujoco_only needs mujoco_env (e.g. 'InvertedPendulum-v5')")
        if self.batch_size > self.start_steps:
            raise ValueError(f"{w}: batch_size ({self.batch_size}) is larger than the buffer when training starts "
                             f"(start_steps={self.start_steps})")
        if self.mujoco_env and self.mujoco_batch > self.mujoco_start:
            raise ValueError(f"{w}: mujoco_batch ({self.mujoco_batch}) is larger than the buffer when training "
                             f"starts (mujoco_start={self.mujoco_start})")
        if self.total_steps - self.start_steps < 2 * self.eval_every:
            raise ValueError(f"{w}: total_steps - start_steps must cover >= 2 evaluations of training "
                             f"(eval_every={self.eval_every})")

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=(0, 1), val_seeds=(100,), lr_grid=(3e-4, 1e-3), grid_extra=1, total_steps=1_500,
                   start_steps=1_000, eval_every=250, eval_episodes=2, batch_size=32, subset_size=8, hidden=32,
                   mem_hidden=32, hypo_dim=16, test_arms=ARMS, workers=1)

    @classmethod
    def slow(cls) -> Config:
        """The full run plus the MuJoCo InvertedPendulum-v5 sanity task (50k steps, 5 seeds)."""
        return cls(mujoco_env="InvertedPendulum-v5")

    @classmethod
    def slow_bias(cls) -> Config:
        """The slow tier of issue 30: the official toy protocol (``run_experiments_toy.sh``: B = 512, m = 128,
        widths 64, k = 64, evaluation every 5000 steps) at 75k steps (25k warm-up + 50k updates, the official
        curves' first evaluation where the bias regime shows), 10 seeds, four arms: TD3 and ALH-g on biased and
        on unbiased data, each lr tuned on the full run's grid and validation seeds. Same as
        ``icml24 run alh --set total_steps=75000 --set eval_every=5000 --set batch_size=512 --set subset_size=128``
        (README, slow tier)."""
        return cls(total_steps=75_000, eval_every=5_000, batch_size=512, subset_size=128)


def _agent(arm: str, *, state_dim: int, action_dim: int, max_action: float, lr: float, seed: int, hidden: int,
           mem_hidden: int, hypo_dim: int, subset_size: int, device: str) -> TD3Agent:
    kw = dict(state_dim=state_dim, action_dim=action_dim, max_action=max_action, hidden=hidden, lr=lr, seed=seed,
              device=device)
    if arm.startswith("td3"):
        return TD3Agent(**kw)
    return ALHAgent(variant=arm[-1], hypo_dim=hypo_dim, mem_hidden=mem_hidden, subset_size=subset_size,
                    mem_lr=lr, **kw)


def expl_noise(cfg: Config, *, biased: bool) -> float:
    """Training exploration noise of a MultiNormEnv run: ``expl_noise`` on the biased data (official bias scheme:
    0), ``unbiased_expl_noise`` on the unbiased data (official ``share_not_hard_config``: 0.1)."""
    return cfg.expl_noise if biased else cfg.unbiased_expl_noise


def run_one(cfg: Config, *, arm: str, seed: int, lr: float, biased: bool | None = None, mujoco: bool = False,
            checkpoint: Path | None = None) -> dict[str, Any]:
    """Train one arm on one seed; returns the evaluation curve and ``final`` = mean of the last two evaluations."""
    seed_everything(seed)
    if mujoco:
        env, eval_env = make_env(cfg.mujoco_env, seed=seed), make_env(cfg.mujoco_env, seed=seed + 100)
        sizes = dict(hidden=cfg.mujoco_hidden, mem_hidden=cfg.mujoco_mem_hidden, subset_size=cfg.mujoco_subset)
        loop = dict(total_steps=cfg.mujoco_steps, start_steps=cfg.mujoco_start, batch_size=cfg.mujoco_batch,
                    expl_noise=0.1, eval_every=cfg.mujoco_eval_every, timeout_is_terminal=False)
    else:
        b = cfg.biased if biased is None else biased
        env, eval_env = make_env("MultiNormEnv", biased=b, seed=seed), make_env("MultiNormEnv", seed=seed + 100)
        sizes = dict(hidden=cfg.hidden, mem_hidden=cfg.mem_hidden, subset_size=cfg.subset_size)
        loop = dict(total_steps=cfg.total_steps, start_steps=cfg.start_steps, batch_size=cfg.batch_size,
                    expl_noise=expl_noise(cfg, biased=b), eval_every=cfg.eval_every, timeout_is_terminal=True)
    sd, ad, ma = box_bounds("alh", env)
    agent = _agent(arm, state_dim=sd, action_dim=ad, max_action=ma, lr=lr, seed=seed, hypo_dim=cfg.hypo_dim,
                   device=cfg.device, **sizes)
    log = train(agent=agent, env=env, eval_env=eval_env, eval_episodes=cfg.eval_episodes, seed=seed,
                checkpoint=checkpoint, desc=f"{SLUG} {arm} s{seed}", **loop)
    log["final"] = float(np.mean(log["returns"][-2:]))
    log["lr"] = lr
    return log


def _cached_run(cfg: Config, cache: Path, job: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """``run_one(cfg, **kwargs)`` for ``job = (key, kwargs)`` unless ``cache/key.json`` exists (a rerun of an
    interrupted experiment skips finished runs)."""
    key, kwargs = job
    path = cache / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    out = run_one(cfg, **kwargs)
    path.write_text(json.dumps(out))
    return out


def _run_all(cfg: Config, cache: Path, jobs: list[tuple[str, dict[str, Any]]], desc: str) -> list[dict[str, Any]]:
    """Every job through :func:`_cached_run`, in ``cfg.workers`` processes."""
    return run_jobs(functools.partial(_cached_run, cfg, cache), jobs, workers=cfg.workers, threads=cfg.threads,
                    desc=desc)


def _iqm(final: dict[str, list[float]], reps: int) -> dict[str, dict[str, float]]:
    """rliable IQM of the per-seed scores (one task) with stratified-bootstrap 95% CIs (``common.rl_stats``)."""
    return {arm: e.as_dict() for arm, e in iqm_with_ci(final, reps=reps, seed=0).items()}


def _curve_plot(ax: Any, curves: dict[str, list[dict[str, Any]]], title: str) -> None:
    for arm, logs in curves.items():
        x = np.asarray(logs[0]["steps"])
        y = np.asarray([lg["returns"] for lg in logs], float)
        m = y.mean(0)
        if y.shape[0] > 1:
            half = st.t.ppf(0.975, y.shape[0] - 1) * y.std(0, ddof=1) / math.sqrt(y.shape[0])
        else:
            half = np.zeros_like(m)
        (line,) = ax.plot(x, m, label=f"{_LABELS[arm]} (n={y.shape[0]})", color=_COLORS[arm])
        ax.fill_between(x, m - half, m + half, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set(title=title, xlabel="environment steps", ylabel="evaluation return (mean, 95% t CI)")
    ax.legend(fontsize=8)


def _lead(check: ClaimCheck, sentence: str) -> ClaimCheck:
    """``check`` with its detail opened by ``sentence``: what the sanity check guards against (issue 26)."""
    check.detail = f"{sentence} {check.detail}" if check.detail else sentence
    return check


def _claim_names(cfg: Config) -> dict[str, str]:
    """The claims' names by method arm (sanity checks guard them by name): what each tests, ALH improving TD3
    early in training on the biased data, not that the bias is what ALH overcomes (a mechanism, issue 30)."""
    updates = cfg.total_steps - cfg.start_steps
    return {a: f"{_LABELS[a]} improves TD3 early in training (biased data, {updates} updates; mean of the last 2 "
               "evals)" for a in cfg.test_arms if a != "td3"}


def bias_interaction(final: dict[str, dict[int, float]], seeds: Sequence[int], arm: str = "alh_g") -> list[float]:
    """Per seed, (``arm`` − TD3 | biased) − (``arm`` − TD3 | unbiased) of the final returns ``final[arm][seed]``
    (unbiased arms carry the ``_unbiased`` suffix): > 0 when ALH's gain over TD3 is larger on the biased data."""
    u = UNBIASED
    return [(final[arm][s] - final["td3"][s]) - (final[arm + u][s] - final["td3" + u][s]) for s in seeds]


def bias_mechanisms(cfg: Config, final: dict[str, dict[int, float]]) -> list[ClaimCheck]:
    """The bias story as ``mechanism`` checks beside the verdict (issue 30; never a gate on the claims), paired
    over every test seed, 95% t intervals: the interaction (ALH-g − TD3 | biased) − (ALH-g − TD3 | unbiased) > 0
    and TD3 unbiased − TD3 biased > 0 (the biased data hurt TD3)."""
    if not cfg.biased:  # the main arms already train on unbiased data: no bias to compare with
        return []
    seeds = list(cfg.seeds)
    scheme = (f"unbiased arms: the official unbiased scheme (resets anywhere in [0, 600], random warm-up actions, "
              f"exploration noise {cfg.unbiased_expl_noise:g}), each arm's tuned lr; {len(seeds)} seeds")
    checks = []
    if "td3" in cfg.unbiased_arms:
        checks.append(paired_check(
            name="mechanism: the biased data hurt TD3 (TD3 unbiased − TD3 biased > 0)", metric="final_return",
            method=[final["td3" + UNBIASED][s] for s in seeds], baseline=[final["td3"][s] for s in seeds],
            method_arm="td3" + UNBIASED, baseline_arm="td3", direction=">=", threshold=0.0, kind="mechanism",
            paper_value="official curves, 10 seeds (issue 30): +0.37 [−1.88, +2.62] at 45k steps, +4.09 [+2.03, "
                        "+6.15] at 75k; −2.7 vs −9.7 at 2M",
            detail=f"the bias regime: reported beside the verdict, it guards no claim. {scheme}"))
    if {"td3", "alh_g"} <= set(cfg.unbiased_arms):
        checks.append(one_sample_check(
            name="mechanism: ALH-g's gain over TD3 is larger on biased data ((ALH-g − TD3 | biased) − "
                 "(ALH-g − TD3 | unbiased) > 0)", metric="final_return_interaction",
            values=bias_interaction(final, seeds), direction=">=", threshold=0.0, kind="mechanism", arm="alh_g",
            paper_value="official 10-seed mean curves: (−5.1 + 9.7) − (−13.3 + 5.5) = +12.4 at 75k steps, "
                        "(−2.2 + 9.7) − (−2.0 + 2.7) = +6.8 at 2M",
            detail=f"the bias story: ALH overcomes the biased data (reported beside the verdict, it guards no "
                   f"claim). Per seed (ALH-g − TD3 | biased) − (ALH-g − TD3 | unbiased). {scheme}"))
    return checks


def lr_source(cfg: Config, arm: str) -> str:
    """The arm whose tuned lr ``arm`` uses: itself when tuned; ALH-a takes ALH-g's when only ALH-g is tuned."""
    if arm in cfg.tune_arms:
        return arm
    return "alh_g" if arm.startswith("alh") and "alh_g" in cfg.tune_arms else arm


def tuning_guards(cfg: Config, arm: str) -> list[str]:
    """The claims a tuning check of ``arm`` conditions: every claim compares against TD3, so TD3's guards all of
    them; an ALH arm's guards the claims of the arms that use its lr."""
    names = _claim_names(cfg)
    return [n for m, n in names.items() if arm == "td3" or lr_source(cfg, m) == arm]


def lr_tuning_check(*, arm: str, tuned: Tuned, guards: list[str], n_val: int) -> ClaimCheck:
    """``sanity``: the validation-tuned lr of ``arm`` lies strictly inside its evaluated grid (after at most
    ``grid_extra`` extensions past an edge that keeps winning); an lr grid has no natural bound, so an edge pick
    means the arm may be under-tuned and the comparison unfair. One pick per arm: threshold 1."""
    return tuning_check(
        name=f"{_LABELS[arm]}'s tuned lr lies strictly inside its grid", tuned=tuned, threshold=1.0, arm=arm,
        guards=guards,
        detail=f"tuning: an lr at the edge of its grid may leave {_LABELS[arm]} under-tuned, which would make the "
               f"claims that use or compare against it unfair; score = mean validation final return over {n_val} "
               "seeds per lr")


def _mujoco_runs(cfg: Config, out_dir: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """TD3 and ALH-g on the MuJoCo task, seed-major, each run cached and checkpointed at every evaluation under
    ``out_dir/cache_mujoco/<hash of the MuJoCo settings>`` (kept after the run so that it can be extended)."""
    keyed = {k: v for k, v in cfg.to_dict().items() if k.startswith("mujoco_") and k not in ("mujoco_seeds",
                                                                                              "mujoco_only")}
    keyed |= {"hypo_dim": cfg.hypo_dim, "eval_episodes": cfg.eval_episodes, "device": cfg.device}
    cache = out_dir / "cache_mujoco" / hashlib.sha1(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    cache.mkdir(parents=True, exist_ok=True)
    mj: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in ("td3", "alh_g")}
    runs = [(a, s) for s in cfg.mujoco_seeds for a in mj]
    logs = _run_all(cfg, cache, [(f"mujoco_{a}_{s}", dict(arm=a, seed=s, lr=cfg.mujoco_lr, mujoco=True,
                                                          checkpoint=cache / f"ckpt_mujoco_{a}_{s}.pt"))
                                 for a, s in runs], desc=f"{SLUG} {cfg.mujoco_env}")
    for (a, s), lg in zip(runs, logs, strict=True):
        mj[a][s] = lg
    return mj


def _mujoco_checks(cfg: Config, mj: dict[str, dict[int, dict[str, Any]]], *, kind: Kind = "sanity"
                   ) -> list[ClaimCheck]:
    """ALH-g no worse than TD3 by the issue's margin (paired), and TD3 learns the task within the budget (mean
    final return >= half the return range), without which "no worse" would say nothing.

    ``kind="sanity"`` in the MuJoCo job (``mujoco_only``: it has no claim). In the full run with a MuJoCo task
    they are ``mechanism`` checks, shown beside the verdict: a per-environment sanity check guards only its
    environment's claims, MuJoCo has none here, and a schema-3 sanity check that names no claim guards them all.
    """
    span = cfg.mujoco_return_range or RETURN_RANGE[cfg.mujoco_env]
    margin = cfg.margin_fraction * span
    td3 = [mj["td3"][s]["final"] for s in cfg.mujoco_seeds]
    budget = f"{cfg.mujoco_steps} steps ({cfg.mujoco_start} warm-up), {len(cfg.mujoco_seeds)} seeds"
    where = ("" if kind == "sanity" else
             " Reported beside the verdict: the MuJoCo task has no claim of its own in this run.")
    checks = [
        paired_check(name=f"{cfg.mujoco_env}: ALH-g no worse than TD3 by {cfg.margin_fraction:.0%} of the "
                          "return range", metric="mujoco_final_return",
                     method=[mj["alh_g"][s]["final"] for s in cfg.mujoco_seeds], baseline=td3, direction=">=",
                     threshold=-margin, kind=kind, method_arm="alh_g", baseline_arm="td3",
                     paper_value=("official curves: both reach 1000 (no early-speed gain)"
                                  if cfg.mujoco_env.startswith("InvertedPendulum") else ""),
                     detail=f"{budget}, final = mean of the last 2 evaluations, margin {margin:g} of {span:g}"),
        ClaimCheck(name=f"regime: TD3 learns {cfg.mujoco_env} within the budget (mean final return >= half the "
                        "return range)", metric="td3_mujoco_final_return", measured=float(np.mean(td3)),
                   threshold=0.5 * span, direction=">=", kind=kind,
                   detail=f"{budget}; per seed: " + ", ".join(f"{v:.0f}" for v in td3)),
    ]
    _lead(checks[0], f"the issue's MuJoCo task: ALH must not break a standard task ({cfg.mujoco_env}).{where}")
    _lead(checks[1], f"the regime: TD3 must learn {cfg.mujoco_env} within the budget, or 'no worse' says "
                     f"nothing.{where}")
    return checks


def _mujoco_summary(cfg: Config, mj: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    return {a: {"final": [mj[a][s]["final"] for s in cfg.mujoco_seeds],
                "curves": [mj[a][s]["returns"] for s in cfg.mujoco_seeds],
                "steps": mj[a][cfg.mujoco_seeds[0]]["steps"]} for a in mj}


def _run_mujoco_only(cfg: Config, out_dir: Path) -> RunResult:
    """The MuJoCo sanity task alone (``mujoco_only``): TD3 vs ALH-g, a ``sanity`` check and its curve plot."""
    rec = RunRecorder(SLUG, cfg, out_dir)
    make_env(cfg.mujoco_env, seed=0).close()  # fail early, before any compute, when the extra is missing
    mj = _mujoco_runs(cfg, out_dir)
    for s in cfg.mujoco_seeds:
        rec.add_seed(s, {a: {"mujoco_final_return": mj[a][s]["final"], "last_return": mj[a][s]["returns"][-1],
                             "finite_losses": int(mj[a][s]["finite"])} for a in mj})
    n_bad = sum(1 - lg["finite"] for a in mj for lg in mj[a].values())
    checks = [*_mujoco_checks(cfg, mj),
              ClaimCheck(name="every run's critic loss stays finite", metric="nonfinite_runs", measured=float(n_bad),
                         threshold=0.0, direction="<=", kind="sanity",
                         detail=f"convergence: a run whose critic loss is not finite diverged and its return means "
                                f"nothing. {n_bad} of {2 * len(cfg.mujoco_seeds)} runs had a non-finite critic "
                                "loss")]
    finals = {a: [mj[a][s]["final"] for s in cfg.mujoco_seeds] for a in mj}
    iqm = _iqm(finals, reps=2000 if len(cfg.mujoco_seeds) >= 5 else 200)
    fig, axes = new_figure(1, width=6.0)
    _curve_plot(axes[0], {a: [mj[a][s] for s in cfg.mujoco_seeds] for a in mj}, cfg.mujoco_env)
    artifacts = [save_figure(fig, out_dir / "eval_return.png")]
    return rec.finish(checks, artifacts=artifacts, extra={"mujoco": _mujoco_summary(cfg, mj),
                                                          "iqm_final_return": iqm})


def run(cfg: Config, out_dir: Path) -> RunResult:
    out_dir = Path(out_dir)
    if cfg.mujoco_only:
        return _run_mujoco_only(cfg, out_dir)
    rec = RunRecorder(SLUG, cfg, out_dir)
    keyed = {k: v for k, v in cfg.to_dict().items()
             if k not in ("seeds", "val_seeds", "mujoco_seeds", "threads", "workers")}
    cache = out_dir / "cache" / hashlib.sha1(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    cache.mkdir(parents=True, exist_ok=True)
    if cfg.mujoco_env:  # fail early, before any compute, when the extra is missing
        make_env(cfg.mujoco_env, seed=0).close()

    # 1) tuning: each tuned arm's lr by tune_grid on the validation seeds (same grid and extension budget for
    # every arm); the declared grid of every tuned arm runs first in one batch, the extensions per arm after it
    tunings: dict[str, Tuned] = {}
    if len(cfg.lr_grid) > 1:
        _run_all(cfg, cache, [(f"tune_{arm}_{lr:g}_{s}", dict(arm=arm, seed=s, lr=lr))
                              for arm in cfg.tune_arms for lr in cfg.lr_grid for s in cfg.val_seeds],
                 desc=f"{SLUG} tune")
        for arm in cfg.tune_arms:
            def evaluate(lrs: list[float], arm: str = arm) -> list[dict[str, list[float]]]:
                jobs = [(f"tune_{arm}_{lr:g}_{s}", dict(arm=arm, seed=s, lr=lr)) for lr in lrs for s in cfg.val_seeds]
                finals = [r["final"] for r in _run_all(cfg, cache, jobs, desc=f"{SLUG} tune {arm}")]
                k = len(cfg.val_seeds)
                return [{"final": finals[i * k:(i + 1) * k]} for i in range(len(lrs))]
            tunings[arm] = tune_grid(evaluate, cfg.lr_grid, score="final", maximize=True, log=True,
                                     max_extra=cfg.grid_extra)
    lr_of: dict[str, float] = {}
    for arm in cfg.test_arms:
        src = lr_source(cfg, arm)
        lr_of[arm] = tunings[src].value if src in tunings else cfg.lr_grid[0]

    # 2) test runs: every arm on the biased data on every seed, and the unbiased arms on the official unbiased
    # scheme on every seed too (the bias mechanisms, paired per seed), each with its tuned lr
    unbiased = list(cfg.unbiased_arms) if cfg.biased else []
    arms = list(cfg.test_arms) + [a + UNBIASED for a in unbiased]
    logs: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in arms}
    jobs = [(a, s) for s in cfg.seeds for a in arms]
    tested = _run_all(cfg, cache, [(f"test_{a}_{s}", dict(arm=a.removesuffix(UNBIASED), seed=s,
                                                          lr=lr_of[a.removesuffix(UNBIASED)],
                                                          biased=False if a.endswith(UNBIASED) else None))
                                   for a, s in jobs], desc=f"{SLUG} test")
    for (a, s), lg in zip(jobs, tested, strict=True):
        logs[a][s] = lg

    # 3) MuJoCo sanity task (slow variant), resumable through per-run checkpoints
    mj = _mujoco_runs(cfg, out_dir) if cfg.mujoco_env else {}

    for s in cfg.seeds:
        rec.add_seed(s, {a: {"final_return": logs[a][s]["final"], "last_return": logs[a][s]["returns"][-1],
                             "mean_return": float(np.mean(logs[a][s]["returns"][1:])),
                             "finite_losses": int(logs[a][s]["finite"])} for a in arms if s in logs[a]})

    paper = {"alh_g": "official curves, bias scheme, 10 seeds: ALH-g − TD3 = +4.6 at 75k steps (+7.5 at 2M); "
                      "issue 30: +3.30 [−0.19, +6.79] at 75k; issue 20: ≈ +2",
             "alh_a": "official curves: ALH-a − TD3 = +4.3 at 75k steps (+4.7 at 2M)"}
    names = _claim_names(cfg)
    checks: list[ClaimCheck] = [
        rec.paired(name=names[a], metric="final_return", method_arm=a, baseline_arm="td3", direction=">=",
                   threshold=0.0, kind="claim", paper_value=paper[a]) for a in names]
    # the bias story: mechanisms beside the verdict, not a gate on the claims (issue 30)
    checks += bias_mechanisms(cfg, {a: {s: lg["final"] for s, lg in logs[a].items()} for a in arms})
    checks += [lr_tuning_check(arm=a, tuned=tunings[a], guards=tuning_guards(cfg, a), n_val=len(cfg.val_seeds))
               for a in cfg.tune_arms if a in tunings]
    n_bad = sum(1 - lg["finite"] for a in arms for lg in logs[a].values())
    n_all = sum(len(logs[a]) for a in arms)
    checks.append(ClaimCheck(name="every run's critic loss stays finite", metric="nonfinite_runs",
                             measured=float(n_bad), threshold=0.0, direction="<=", kind="sanity",
                             detail=f"convergence: a run whose critic loss is not finite diverged and its return "
                                    f"means nothing. {n_bad} of {n_all} runs had a non-finite critic loss"))
    mj_summary: dict[str, Any] = {}
    if mj:  # per-environment: MuJoCo has no claim in this run, so its checks are shown beside the verdict
        checks += _mujoco_checks(cfg, mj, kind="mechanism")
        mj_summary = _mujoco_summary(cfg, mj)

    # rliable IQM (stratified bootstrap over seeds; one task)
    finals = {a: [logs[a][s]["final"] for s in cfg.seeds if s in logs[a]] for a in arms}
    iqm = _iqm(finals, reps=2000 if len(cfg.seeds) >= 5 else 200)

    # plots
    artifacts = []
    fig, axes = new_figure(2 if mj else 1, width=6.0)
    _curve_plot(axes[0], {a: list(logs[a].values()) for a in arms},
                f"MultiNormEnv ({'biased' if cfg.biased else 'unbiased'} training data)")
    if mj:
        _curve_plot(axes[1], {a: [mj[a][s] for s in cfg.mujoco_seeds] for a in mj}, cfg.mujoco_env)
    artifacts.append(save_figure(fig, out_dir / "eval_return.png"))
    fig, axes = new_figure(1, width=5.0)
    ax = axes[0]
    for i, a in enumerate(arms):
        q = iqm[a]
        ax.errorbar([i], [q["iqm"]], yerr=[[q["iqm"] - q["ci_low"]], [q["ci_high"] - q["iqm"]]], fmt="o",
                    color=_COLORS[a], capsize=4)
        ax.scatter(np.full(len(finals[a]), i) + 0.15, finals[a], s=8, color=_COLORS[a], alpha=0.5)
    ax.set_xticks(range(len(arms)), [_LABELS[a] for a in arms], rotation=15)
    ax.set(title="final return: IQM, 95% stratified-bootstrap CI (dots: seeds)", ylabel="mean of last 2 evals")
    artifacts.append(save_figure(fig, out_dir / "iqm.png"))

    extra = {
        "tuned_lr": lr_of,
        "val_final_return": {f"{a}@{lr:g}": t.records[lr]["final"] for a, t in tunings.items() for lr in t.grid},
        "tuning": {a: t.record() for a, t in tunings.items()},
        "iqm_final_return": iqm,
        "curves": {a: {"steps": next(iter(logs[a].values()))["steps"],
                       "seeds": list(logs[a]), "returns": [lg["returns"] for lg in logs[a].values()]} for a in arms},
        "mujoco": mj_summary,
    }
    result = rec.finish(checks, artifacts=artifacts, extra=extra)
    shutil.rmtree(out_dir / "cache", ignore_errors=True)  # finished: the per-run cache is only for resuming
    return result
