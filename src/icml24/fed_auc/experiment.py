"""Reproduction of "A Federated Stochastic Multi-Level Compositional Minimax Algorithm for Deep AUC Maximization".

Imbalanced MNIST-1D one-vs-rest (the positive classes ``positive_classes``, optionally with ``label_noise``; issue 29:
class 0 alone is too easy, so the task is chosen by a pilot of CE-FedAvg vs AUC-M only, on seeds the run does not
use), positives subsampled to p = 5%, split over K = 4 and 8 clients non-IID by a Dirichlet(0.3) draw of each
client's positive share. Arms, all on the same code path (``FederatedCompositionalAUC`` driven by the in-process
simulator), the same data, initialisation, rounds R = 150 and local steps I = 4 per seed, and LibAUC's stabilisers
for every arm (elementwise gradient clip 1.0, the epoch-decay proximal term, η/10 at 50% and 75% of R):

- ``ce``: CE-FedAvg with momentum (LocalSGDM);
- ``aucm``: federated AUC-M minimax (LocalSGDAM / CoDA-style);
- ``comp2``: two-level compositional (LocalSCGDAM, L = 2);
- ``comp3``: the multi-level method, L = 3 (notes §2.2 [R]), with the Jacobian form named in ``Config.jacobian``
  before the run (the JVP estimators; NOTE(deviation)); ``comp4``: L = 4 (extra row at comp3's step, first K);
- controls at comp3's tuned step: ``comp3_frozen`` (function estimators frozen, β = 0: the weakened arm) and
  ``local`` (every client trains comp3 alone, no communication; AUC averaged over clients);
- reported variants (not claims) at comp3's tuned step: ``comp3_<form>`` for the other Jacobian forms (exact HVP,
  identity).

Every tuned arm picks its step η (= η_x = η_y; η0 = 0.1 fixed) per K from the same declared grid by mean validation
AUC over the seeds, with ``common.tuning.tune_grid`` (schema 3, issue 26): a log grid that grows by its own ratio
past an edge that beats its neighbour by more than one standard error over seeds, up to ``grid_extra`` points (the
same budget for every arm; no natural bound: no step size turns an arm into another), picked by the one-SE rule
toward the grid's centre; test AUC (sklearn ``roc_auc_score``, in points) is read only at the chosen step. Claims
(issue 12): comp3 no worse than comp2 and than aucm by more than 0.5 points, better than ce by ≥ 0.5 points (paired
95% t-intervals over seeds). Guards: per K, each arm's tuning check guards that K's claims comparing the arm (comp3's
guards all three), the regime check "AUC-M ≥ CE-FedAvg" (issue 29) guards that K's two compositional claims, the
regime check "federation beats clients alone" guards that K's claims, the frozen-estimator negative control guards
the claim whose test it applies (comp3 vs aucm); the ceiling check guards every claim.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from icml24.common.config import ExperimentConfig, help_text
from icml24.common.parallel import run_jobs
from icml24.common.nets import MLP
from icml24.common.plotting import band, new_figure, save_figure
from icml24.common.results import ClaimCheck, RunRecorder, RunResult, paired_check
from icml24.common.seeding import seed_everything
from icml24.common.tuning import Tuned, tune_grid, tuning_check
from icml24.fed_auc.algorithm import JACOBIANS, FederatedCompositionalAUC
from icml24.fed_auc.backends import simulate
from icml24.fed_auc.data import TASKS, BinaryTask, dirichlet_split, load_task

SLUG = "fed_auc"
TUNED_ARMS = ("ce", "aucm", "comp2", "comp3")
CONTROL_ARMS = ("comp3_frozen", "local")
EXTRA_ARMS = ("comp4",)  # run at comp3's tuned step, first K only
COLORS = {"ce": "tab:gray", "aucm": "tab:blue", "comp2": "tab:green", "comp3": "tab:red", "comp4": "tab:purple",
          "comp3_frozen": "tab:brown", "local": "tab:olive", "comp3_hvp": "tab:orange", "comp3_identity": "tab:cyan",
          "comp3_estimator": "tab:pink"}


@dataclass(frozen=True)
class Config(ExperimentConfig):
    seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata=help_text("seeds (issue 12: >= 5)"))
    task: str = field(default="mnist1d", metadata=help_text(
        "mnist1d | make_classification | breast_cancer (issue 12: MNIST-1D one-vs-rest is the main task)"))
    positive_classes: tuple[int, ...] = field(default=(0,), metadata=help_text(
        "MNIST-1D classes taken as positive (issue 29: clean class 0 is too easy; the CE/AUC-M pilot on seeds "
        "100-102 chose class 0 with 10% label noise over {3, 5, 8}, where both baselines stay near chance)"))
    label_noise: float = field(default=0.1, metadata=help_text(
        "MNIST-1D: fraction of train/val series whose class is redrawn uniformly among 10 (issue 29: 10%; pilot)"))
    imratio: float = field(default=0.05, metadata=help_text("p, positive ratio of train/val (issue 12: 5-10%)"))
    clients: tuple[int, ...] = field(default=(4, 8), metadata=help_text("K values (issue 12: 4 and 8)"))
    dirichlet_alpha: float = field(default=0.3, metadata=help_text(
        "Dirichlet concentration of the clients' positive shares (notes §5: 0.3)"))
    rounds: int = field(default=150, metadata=help_text(
        "communication rounds R (notes §5: 300; issue 29: 150)"))
    local_steps: int = field(default=4, metadata=help_text("I, local steps per round (notes §5: 8; 4 here)"))
    batch_size: int = field(default=32, metadata=help_text("local minibatch (notes §5 / CODASCA example: 32)"))
    hidden: tuple[int, ...] = field(default=(64, 64), metadata=help_text("MLP hidden widths (ours)"))
    lr_grid: tuple[float, ...] = field(default=(0.1, 0.2, 0.4), metadata=help_text(
        "η grid, η_x = η_y = η, tuned per arm on validation AUC (notes §5: {0.05, 0.1}; issue 29: η0 no longer "
        "tied to it; placed by the CE/AUC-M pilot); a log grid for tune_grid"))
    eta0: float = field(default=0.1, metadata=help_text(
        "η0, the inner CE step of the compositional maps (issue 29: fixed at LibAUC's 0.1, lr0 = lr = 0.1 in "
        "example 09; not tuned, not decayed)"))
    clip_value: float = field(default=1.0, metadata=help_text(
        "elementwise clip of every arm's primal stochastic gradient (LibAUC PESG/PDSCA: 1.0; issue 29)"))
    epoch_decay: float = field(default=2e-3, metadata=help_text(
        "λ0 of LibAUC's epoch-decay proximal term λ0(x − x_ref), every arm (PESG/PDSCA default 2e-3; issue 29)"))
    decay_fractions: tuple[float, ...] = field(default=(0.5, 0.75), metadata=help_text(
        "fractions of R after which every arm's η is divided by decay_factor and x_ref reset (LibAUC: 50%/75%)"))
    decay_factor: float = field(default=10.0, metadata=help_text("LibAUC's update_regularizer(decay_factor=10)"))
    grid_extra: int = field(default=2, metadata=help_text(
        "extra grid points tune_grid may add past an edge that keeps winning (issue 26); every arm gets the same "
        "budget"))
    levels: int = field(default=3, metadata=help_text("L of the multi-level method (issue 12: 3)"))
    extra_levels: int = field(default=4, metadata=help_text("L of the extra row (issue 12: 4), first K only"))
    beta: float = field(default=0.9, metadata=help_text("β, new-value weight of the estimators (notes §5: 0.9)"))
    gamma: float = field(default=0.9, metadata=help_text("γ, new-gradient weight of the momenta (notes §5: 0.9)"))
    margin: float = field(default=1.0, metadata=help_text("m, AUC-M margin (LibAUC default 1.0)"))
    loss_version: str = field(default="v2", metadata=help_text(
        "AUC-M form: v2 (class means; LibAUC's recommendation) or v1 (prior p: gradients scale with p(1−p))"))
    jacobian: str = field(default="estimator", metadata=help_text(
        "the CLAIM arm's Jacobian form, named before the run (issue 29): estimator (JVPs tracked by moving "
        "averages, the companion work's form; NOTE(deviation)), hvp (exact per-batch HVPs) or identity (PDSCA)"))
    jacobian_variants: tuple[str, ...] = field(default=("hvp", "identity"), metadata=help_text(
        "other Jacobian forms run as reported variants comp3_<form> at comp3's tuned step (not claims)"))
    workers: int = field(default=2, metadata=help_text(
        "processes for the independent runs (common.parallel.run_jobs; the numbers do not depend on it)"))
    eval_every: int = field(default=5, metadata=help_text("rounds between AUC evaluations for the curves"))
    margin_points: float = field(default=0.5, metadata=help_text(
        "non-inferiority margin and CE superiority margin, AUC points (issue 12: 0.5)"))
    local_gap_points: float = field(default=2.0, metadata=help_text(
        "sanity: federation − clients alone >= this, AUC points (issue 12: 2)"))
    aucm_ce_points: float = field(default=0.0, metadata=help_text(
        "sanity (issue 29): AUC-M − CE-FedAvg >= this (lower 95% bound, AUC points) per K, the premise that AUC "
        "maximisation matters; guards that K's compositional claims (vs two-level and vs AUC-M)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if not 0.0 < self.imratio <= 0.5:
            raise ValueError(f"imratio must be in (0, 0.5], got {self.imratio}")
        if not self.clients or any(k < 1 for k in self.clients) or len(set(self.clients)) != len(self.clients):
            raise ValueError(f"clients must be distinct K values >= 1, got {self.clients!r}")
        for name in ("rounds", "local_steps", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden widths must be >= 1, got {self.hidden!r}")
        if len(set(self.lr_grid)) < 2 or any(not (math.isfinite(x) and x > 0) for x in self.lr_grid):
            raise ValueError(f"lr_grid must hold >= 2 distinct finite values > 0 (tune_grid), got {self.lr_grid!r}")
        if isinstance(self.grid_extra, bool) or not isinstance(self.grid_extra, int) or self.grid_extra < 0:
            raise ValueError(f"grid_extra must be an int >= 0, got {self.grid_extra!r}")
        if self.levels < 2 or self.extra_levels < 2:
            raise ValueError(f"levels and extra_levels must be >= 2 (L < 2 is not compositional), got "
                             f"{self.levels}, {self.extra_levels}")
        for name in ("beta", "gamma"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("dirichlet_alpha", "margin"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be finite and > 0, got {getattr(self, name)}")
        if self.loss_version not in ("v1", "v2"):
            raise ValueError(f"loss_version must be v1 or v2, got {self.loss_version!r}")
        if self.jacobian not in JACOBIANS or any(j not in JACOBIANS or j == self.jacobian
                                                  for j in self.jacobian_variants):
            raise ValueError(f"jacobian and jacobian_variants must be distinct forms among {JACOBIANS}, got "
                             f"{self.jacobian!r}, {self.jacobian_variants!r}")
        if len(set(self.jacobian_variants)) != len(self.jacobian_variants):
            raise ValueError(f"jacobian_variants must be distinct, got {self.jacobian_variants!r}")
        if self.task == "mnist1d" and (not self.positive_classes or len(set(self.positive_classes)) !=
                                       len(self.positive_classes) or any(not 0 <= c <= 9 for c in self.positive_classes)):
            raise ValueError(f"positive_classes must be distinct MNIST-1D classes 0-9, got {self.positive_classes!r}")
        if not 0.0 <= self.label_noise < 1.0 or (self.label_noise > 0 and self.task != "mnist1d"):
            raise ValueError(f"label_noise must be in [0, 1) and needs task mnist1d, got {self.label_noise}")
        if not (math.isfinite(self.eta0) and self.eta0 >= 0):
            raise ValueError(f"eta0 must be finite and >= 0, got {self.eta0}")
        for name in ("clip_value", "decay_factor"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be finite and > 0, got {getattr(self, name)}")
        if not (math.isfinite(self.epoch_decay) and self.epoch_decay >= 0):
            raise ValueError(f"epoch_decay must be finite and >= 0, got {self.epoch_decay}")
        if any(not 0.0 < f < 1.0 for f in self.decay_fractions) or len(set(self.decay_at)) != len(self.decay_at):
            raise ValueError(f"decay_fractions must be distinct fractions in (0, 1) giving distinct rounds, got "
                             f"{self.decay_fractions!r} at R={self.rounds}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        for name in ("margin_points", "local_gap_points", "aucm_ce_points"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)}")

    @property
    def decay_rounds(self) -> tuple[int, ...]:
        """Rounds after which η decays (LibAUC's 50%/75% of training), at least 1."""
        return tuple(max(1, round(f * self.rounds)) for f in self.decay_fractions)

    @property
    def decay_at(self) -> tuple[int, ...]:
        """The decay points as local step counts (round boundaries) for ``FederatedCompositionalAUC``."""
        return tuple(r * self.local_steps for r in self.decay_rounds)

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=(0, 1), clients=(4,), rounds=8, local_steps=3, lr_grid=(0.1, 0.2, 0.4), eval_every=4,
                   grid_extra=2, workers=1)


def _auc(y: torch.Tensor, s: torch.Tensor) -> float:
    s = np.nan_to_num(s.detach().cpu().numpy(), nan=0.0, posinf=1.0, neginf=0.0)
    return 100.0 * float(roc_auc_score(y.cpu().numpy(), s))


def variant_arms(cfg: Config) -> tuple[str, ...]:
    """The reported (non-claim) Jacobian variants of comp3, e.g. ``comp3_hvp``, ``comp3_identity``."""
    return tuple(f"comp3_{j}" for j in cfg.jacobian_variants)


def _arm_algo(arm: str, *, net: torch.nn.Module, lr: float, cfg: Config, imratio: float) -> FederatedCompositionalAUC:
    # every arm: LibAUC's stabilisers (clip, epoch-decay proximal term, η/10 at 50%/75% of R); η0 fixed (issue 29)
    kw: dict[str, Any] = dict(eta0=cfg.eta0, lr_x=lr, lr_y=lr, beta=cfg.beta, gamma=cfg.gamma,
                              local_steps=cfg.local_steps, margin=cfg.margin, imratio=imratio, jacobian=cfg.jacobian,
                              loss_version=cfg.loss_version, clip_value=cfg.clip_value, epoch_decay=cfg.epoch_decay,
                              decay_at=cfg.decay_at, decay_factor=cfg.decay_factor)
    if arm in ("ce", "aucm"):
        return FederatedCompositionalAUC(net, objective=arm, **kw)
    if arm.startswith("comp3_") and arm != "comp3_frozen":
        kw["jacobian"] = arm.removeprefix("comp3_")
        return FederatedCompositionalAUC(net, objective="compositional", levels=cfg.levels, **kw)
    levels = {"comp2": 2, "comp3": cfg.levels, "comp4": cfg.extra_levels, "comp3_frozen": cfg.levels,
              "local": cfg.levels}[arm]
    if arm == "comp3_frozen":
        kw["beta"] = 0.0  # the weakened arm: function estimators never track u_l(x) after their first value
        kw["jvp_beta"] = cfg.beta  # (the JVP estimators, if any, still track)
    return FederatedCompositionalAUC(net, objective="compositional", levels=levels, **kw)


def run_arm(task: BinaryTask, parts: list[torch.Tensor], *, arm: str, lr: float, cfg: Config,
            seed: int) -> dict[str, Any]:
    """One arm on one split: final validation/test AUC (points), curves vs round and floats communicated."""
    torch.manual_seed(seed)  # identical initial model for every arm
    net = MLP(in_features=task.x_train.shape[1], hidden=cfg.hidden, out_features=1).to(cfg.device)
    algo = _arm_algo(arm, net=net, lr=lr, cfg=cfg, imratio=task.imratio)
    dev = cfg.device
    clients = [(task.x_train[p].to(dev), task.y_train[p].to(dev)) for p in parts]
    x_val, x_test = task.x_val.to(dev), task.x_test.to(dev)
    if arm == "local":
        res = simulate(algo, clients, rounds=cfg.rounds, batch_size=cfg.batch_size, seed=seed, communicate=False)
        vals = [_auc(task.y_val, algo.scores(s, x_val)) for s in res.client_states]
        tests = [_auc(task.y_test, algo.scores(s, x_test)) for s in res.client_states]
        return {"val_auc": float(np.mean(vals)), "test_auc": float(np.mean(tests)), "per_client_test": tests}

    def cb(r: int, state: dict[str, torch.Tensor], floats: int) -> tuple[int, int, float]:
        return r, floats, _auc(task.y_test, algo.scores(state, x_test))

    res = simulate(algo, clients, rounds=cfg.rounds, batch_size=cfg.batch_size, seed=seed, callback=cb,
                   callback_every=cfg.eval_every)
    return {"val_auc": _auc(task.y_val, algo.scores(res.state, x_val)),
            "test_auc": _auc(task.y_test, algo.scores(res.state, x_test)),
            "test_auc_at_x": _auc(task.y_test, algo.scores(res.state, x_test, weights="x")),
            "alpha": float(res.state["alpha"][0]), "floats": res.floats_communicated,
            "floats_per_round": algo.floats_per_client() * len(clients),
            "curve_round": [c[0] for c in res.callbacks], "curve_floats": [c[1] for c in res.callbacks],
            "curve_test_auc": [c[2] for c in res.callbacks]}


def _arms_for(cfg: Config, K: int) -> tuple[str, ...]:
    return TUNED_ARMS


@functools.lru_cache(maxsize=64)
def _task(task: str, seed: int, imratio: float, positive_classes: tuple[int, ...], label_noise: float) -> BinaryTask:
    kw: dict[str, Any] = dict(positive_class=positive_classes, label_noise=label_noise) if task == "mnist1d" else {}
    return load_task(task, seed=seed, imratio=imratio, **kw)


def task_for(cfg: Config, seed: int) -> BinaryTask:
    """The seed's imbalanced task (cached per process)."""
    return _task(cfg.task, seed, cfg.imratio, tuple(cfg.positive_classes), cfg.label_noise)


def split_for(cfg: Config, K: int, seed: int) -> list[torch.Tensor]:
    return dirichlet_split(task_for(cfg, seed).y_train, num_clients=K, alpha=cfg.dirichlet_alpha, seed=seed)


def run_job(cfg: Config, job: tuple[int, str, float, int]) -> dict[str, Any]:
    """One (K, arm, η, seed) run, fully seeded (the same numbers in any process): for ``common.parallel.run_jobs``."""
    K, arm, lr, s = job
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(s)
    return run_arm(task_for(cfg, s), split_for(cfg, K, s), arm=arm, lr=lr, cfg=cfg, seed=s)


def run(cfg: Config, out_dir: Path) -> RunResult:
    out_dir = Path(out_dir)
    rec = RunRecorder(SLUG, cfg, out_dir)
    tasks = {s: task_for(cfg, s) for s in cfg.seeds}
    splits = {(K, s): split_for(cfg, K, s) for K in cfg.clients for s in cfg.seeds}
    job = functools.partial(run_job, cfg)
    # 1) every tuned arm on its grid (validation AUC picks the step; test AUC is only read afterwards)
    grid: dict[tuple[int, str, float, int], dict[str, Any]] = {}
    tuning: dict[tuple[int, str], Tuned] = {}
    for K in cfg.clients:
        for arm in _arms_for(cfg, K):
            def evaluate(lrs: list[float], K: int = K, arm: str = arm) -> list[list[float]]:
                jobs = [(K, arm, lr, s) for lr in lrs for s in cfg.seeds]
                for j, r in zip(jobs, run_jobs(job, jobs, workers=cfg.workers, threads=cfg.threads,
                                               desc=f"{SLUG} K={K} {arm} η={list(lrs)}"), strict=True):
                    grid[j] = r
                return [[grid[K, arm, lr, s]["val_auc"] for s in cfg.seeds] for lr in lrs]
            tuning[K, arm] = tune_grid(evaluate, cfg.lr_grid, maximize=True, log=True, max_extra=cfg.grid_extra)
    tuned = {key: t.value for key, t in tuning.items()}
    final = {(K, arm, s): grid[K, arm, tuned[K, arm], s] for (K, arm) in tuned for s in cfg.seeds}
    # 2) controls, the L = 4 row and the Jacobian variants at comp3's tuned step
    jobs2 = [(K, arm, tuned[K, "comp3"], s) for K in cfg.clients
             for arm in (*CONTROL_ARMS, *EXTRA_ARMS, *variant_arms(cfg)) for s in cfg.seeds
             if arm not in EXTRA_ARMS or K == cfg.clients[0]]
    for (K, arm, _lr, s), r in zip(jobs2, run_jobs(job, jobs2, workers=cfg.workers, threads=cfg.threads,
                                                   desc=f"{SLUG} controls"), strict=True):
        final[K, arm, s] = r

    for s in cfg.seeds:
        metrics: dict[str, dict[str, float]] = {}
        for (K, arm, s2), r in final.items():
            if s2 == s:
                m = metrics.setdefault(arm, {})
                m[f"test_auc_K{K}"], m[f"val_auc_K{K}"] = r["test_auc"], r["val_auc"]
                if "floats" in r:
                    m[f"floats_K{K}"] = r["floats"]
        rec.add_seed(s, metrics)

    mp = cfg.margin_points
    checks: list[ClaimCheck] = []
    sanity: list[ClaimCheck] = []
    names_all: list[str] = []
    for K in cfg.clients:
        met = f"test_auc_K{K}"
        names = {"comp2": f"K={K}: multi-level (L={cfg.levels}) no worse than two-level (L=2) by > {mp} pt",
                 "aucm": f"K={K}: multi-level no worse than AUC-M minimax by > {mp} pt",
                 "ce": f"K={K}: multi-level better than CE-FedAvg by >= {mp} pt"}
        names_all += names.values()
        checks += [
            rec.paired(name=names["comp2"], metric=met, method_arm="comp3", baseline_arm="comp2", direction=">=",
                       threshold=-mp, kind="claim", paper_value="multi-level ≥ two-level (abstract, directional)"),
            rec.paired(name=names["aucm"], metric=met, method_arm="comp3", baseline_arm="aucm", direction=">=",
                       threshold=-mp, kind="claim",
                       paper_value="minimax AUC 'cannot achieve satisfactory performance' (abstract)"),
            rec.paired(name=names["ce"], metric=met, method_arm="comp3", baseline_arm="ce", direction=">=",
                       threshold=mp, kind="claim", paper_value="AUC methods > CE under imbalance (notes §3)"),
        ]
        premise = rec.paired(
            name=f"K={K}: regime: AUC-M minimax >= CE-FedAvg (AUC maximisation matters)", metric=met,
            method_arm="aucm", baseline_arm="ce", direction=">=", threshold=cfg.aucm_ce_points, kind="sanity",
            guards=[names["comp2"], names["aucm"]])
        sanity.append(dataclasses.replace(premise, detail=(
            f"the regime: (issue 29) the premise chain is 'AUC-M beats CE under imbalance, and the compositional form "
            f"beats minimax'; where AUC-M's lower 95% bound over CE-FedAvg is below {cfg.aucm_ce_points} pt the "
            f"first link is absent and the K={K} compositional claims (vs two-level, vs AUC-M) are void; computed "
            f"from the two baselines only. {premise.detail}")))
        regime = rec.paired(
            name=f"K={K}: regime: federation beats clients training alone by >= {cfg.local_gap_points} pt",
            metric=met, method_arm="comp3", baseline_arm="local", direction=">=", threshold=cfg.local_gap_points,
            kind="sanity", guards=list(names.values()))
        sanity.append(dataclasses.replace(regime, detail=(
            f"the regime: at K={K} communication must matter (the federated method beats its clients training "
            f"alone), else the K={K} comparisons are not about federated learning. {regime.detail}")))
        neg = paired_check(name="(weakened)", metric=met, method=rec.values("comp3_frozen", met),
                           baseline=rec.values("aucm", met), direction=">=", threshold=-mp, kind="mechanism")
        sanity.append(ClaimCheck(
            name=f"K={K}: negative control: the non-inferiority test rejects comp3 with frozen estimators",
            metric=met, measured=float(neg.ci_low), threshold=-mp, direction="<=", kind="sanity",
            method_arm="comp3_frozen", baseline_arm="aucm", guards=[names["aucm"]],
            detail=f"negative control: a variant the paper's argument says must fail, here comp3 with frozen inner "
                   f"estimators (β = 0) at comp3's tuned step; the lower 95% bound of comp3_frozen − aucm must be "
                   f"<= −{mp} (the claim's non-inferiority test rejects it). {neg.detail}"))
        for arm in _arms_for(cfg, K):
            t = tuning[K, arm]
            guards = list(names.values()) if arm == "comp3" else [names[arm]]
            sanity.append(tuning_check(
                name=f"K={K}: tuning: {arm}'s step η lies inside its grid", tuned=t, threshold=1.0, arm=arm,
                guards=guards,
                detail=f"tuning: the claims compare against each arm at its best step on validation AUC, and a step "
                       f"still at an edge of the grid after {len(t.extensions)}/{cfg.grid_extra} extensions may not "
                       f"be {arm}'s best (guards the K={K} claims with {arm})"))
    best = max(rec.summary()[a][f"test_auc_K{K}"]["mean"] for K in cfg.clients for a in _arms_for(cfg, K))
    sanity.append(ClaimCheck(
        name="regime: best arm's mean test AUC below the ceiling (99 pt)", metric="test_auc", measured=best,
        threshold=99.0, direction="<=", kind="sanity",
        detail="the regime: below the AUC ceiling there is room for one arm to beat another (guards every claim); "
               f"best mean test AUC over arms and K: {best:.2f}"))
    checks += sanity

    artifacts = _plots(cfg, final, out_dir)
    curve_keys = [*tuned, *((cfg.clients[0], a) for a in EXTRA_ARMS), *((K, a) for K in cfg.clients
                                                                         for a in variant_arms(cfg))]
    extra = {
        "tuned_lr": {f"K{K}/{arm}": lr for (K, arm), lr in tuned.items()},
        "control_lr": {f"K{K}": tuned[K, "comp3"] for K in cfg.clients},
        "tuning": {f"K{K}/{arm}": {**t.record(), "grid_extra": cfg.grid_extra} for (K, arm), t in tuning.items()},
        "claim_arm_jacobian": cfg.jacobian,
        "jacobian_variants": {f"K{K}/{arm}": {"jacobian": arm.removeprefix("comp3_"),
                                              "test_auc": [final[K, arm, s]["test_auc"] for s in cfg.seeds]}
                              for K in cfg.clients for arm in (*variant_arms(cfg), "comp3")},
        "decay_rounds": list(cfg.decay_rounds),
        "grid_val_auc_mean": {f"K{K}/{arm}/{lr}": float(np.mean([grid[K, arm, lr, s]["val_auc"] for s in cfg.seeds]))
                              for (K, arm, lr, _s) in grid},
        "test_auc_at_x_mean": {f"K{K}/{arm}": float(np.mean([final[K, arm, s]["test_auc_at_x"] for s in cfg.seeds]))
                               for (K, arm) in curve_keys},
        "floats_per_round": {f"K{K}/{arm}": final[K, arm, cfg.seeds[0]]["floats_per_round"] for (K, arm) in curve_keys},
        "local_per_client_test_auc": {f"K{K}/seed{s}": final[K, "local", s]["per_client_test"]
                                      for K in cfg.clients for s in cfg.seeds},
        "positives_per_client": {f"K{K}/seed{s}": [int(tasks[s].y_train[p].sum()) for p in splits[K, s]]
                                 for K in cfg.clients for s in cfg.seeds},
        "imratio_train": {str(s): tasks[s].imratio for s in cfg.seeds},
        "curves": {f"K{K}/{arm}": {"round": final[K, arm, cfg.seeds[0]]["curve_round"],
                                   "floats": final[K, arm, cfg.seeds[0]]["curve_floats"],
                                   "test_auc": [final[K, arm, s]["curve_test_auc"] for s in cfg.seeds]}
                   for (K, arm) in curve_keys},
    }
    return rec.finish(checks, artifacts=artifacts, extra=extra)


def _plots(cfg: Config, final: dict[tuple[int, str, int], dict[str, Any]], out_dir: Path) -> list[Path]:
    arts = []
    arms = [a for a in (*TUNED_ARMS, *EXTRA_ARMS, *variant_arms(cfg), "comp3_frozen")
            if (cfg.clients[0], a, cfg.seeds[0]) in final]
    for xkey, fname, xlabel in (("curve_round", "auc_vs_round.png", "communication round"),
                                ("curve_floats", "auc_vs_floats.png", "floats communicated (uploads, all clients)")):
        fig, axes = new_figure(len(cfg.clients))
        for ax, K in zip(axes, cfg.clients, strict=True):
            for arm in arms:
                if (K, arm, cfg.seeds[0]) not in final:
                    continue
                runs = [final[K, arm, s]["curve_test_auc"] for s in cfg.seeds]
                band(ax, final[K, arm, cfg.seeds[0]][xkey], runs, label=arm, color=COLORS.get(arm, "tab:pink"))
            loc = float(np.mean([final[K, "local", s]["test_auc"] for s in cfg.seeds]))
            ax.axhline(loc, color=COLORS["local"], ls=":", label="clients alone (final)")
            if xkey == "curve_floats":
                ax.set_xscale("log")
            ax.set(title=f"{cfg.task}, K={K}, p={cfg.imratio}: test AUC", xlabel=xlabel, ylabel="test AUC (points)")
            ax.legend(fontsize=7)
        arts.append(save_figure(fig, out_dir / fname))
    return arts
