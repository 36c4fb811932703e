"""One FixMatch-style trainer for SimPro and its baselines (same views, batches, optimizer and EMA model).

Per step (official ``train()``): a labeled batch (weak + strong view), an unlabeled batch of μB (one weak + two
strong views), ONE forward pass over the concatenation, pseudo-labels from the weak view, the loss of
:class:`~icml24.simpro.core.SimProLoss`, SGD (momentum 0.9, Nesterov, weight decay on weights only) with the
schedule lr·cos(7πt/16T), an EMA copy of the model for evaluation, and the priors' M-step every
``update_period`` steps. The arms differ only in the criterion :func:`make_criterion` builds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from icml24.common import validate as v
from icml24.simpro.core import SimProLoss, kl_divergence

__all__ = ["METHODS", "make_criterion", "train_ssl", "evaluate", "class_recall"]

METHODS: tuple[str, ...] = ("supervised", "fixmatch", "fixmatch_la", "simpro", "simpro_no_em")
_OWNER = "train_ssl"
Augment = Callable[..., torch.Tensor]


def make_criterion(method: str, *, num_classes: int, labeled_counts: Sequence[int], tau: float = 1.0,
                   threshold: float = 0.95, ema_u: float = 0.9, pi_estimate_on: str = "confident") -> SimProLoss:
    """The criterion of one arm; all arms are :class:`SimProLoss` with different switches.

    * ``supervised``: labeled CE only, no adjustment.
    * ``fixmatch``: hard pseudo-labels from softmax(f(A_w x)), no adjustment (τ = 0), priors never updated.
    * ``fixmatch_la``: logit adjustment by the labeled prior everywhere (π̂_u = π̂ = π_l fixed, "assume the
      unlabeled set is consistent"), hard pseudo-labels.
    * ``simpro``: soft Bayes pseudo-labels under π̂_u, losses adjusted by π̂, both estimated by the M-step.
    * ``simpro_no_em``: SimPro with the M-step switched off (π̂_u stays uniform, π̂ stays π_l): the negative
      control that isolates the prior estimation.
    """
    v.one_of(_OWNER, "method", method, METHODS)
    common = dict(num_classes=num_classes, labeled_counts=labeled_counts, threshold=threshold, ema_u=ema_u,
                  pi_estimate_on=pi_estimate_on)
    if method in ("supervised", "fixmatch"):
        return SimProLoss(**common, tau=0.0, soft_targets=False, estimate_priors=False)
    if method == "fixmatch_la":
        return SimProLoss(**common, tau=tau, soft_targets=False, estimate_priors=False, pi_u_init="labeled")
    return SimProLoss(**common, tau=tau, soft_targets=True, estimate_priors=method == "simpro")


class _Cycler:
    """Epoch-wise random permutations of ``range(n)`` in batches (drop_last), like a shuffled DataLoader."""

    def __init__(self, n: int, batch: int, generator: torch.Generator) -> None:
        self.n, self.batch, self.g = n, min(batch, n), generator
        self.perm, self.pos = torch.randperm(n, generator=generator), 0

    def __len__(self) -> int:
        return self.n // self.batch

    def next(self) -> torch.Tensor:
        if self.pos + self.batch > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        out = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return out


@torch.no_grad()
def _ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    ep, mp = list(ema.parameters()), list(model.parameters())
    torch._foreach_lerp_(ep, mp, 1.0 - decay)
    for eb, mb in zip(ema.buffers(), model.buffers(), strict=True):
        eb.copy_(mb)


def train_ssl(*, model: nn.Module, criterion: SimProLoss, x_l: torch.Tensor, y_l: torch.Tensor,
              x_u: torch.Tensor | None, augment: Augment, steps: int, batch_size: int = 32, mu: int = 4,
              lr: float = 0.03, momentum: float = 0.9, weight_decay: float = 5e-4, update_period: int = 100,
              ema_decay: float = 0.999, strong_views: int = 2, seed: int = 0,
              pi_u_true: torch.Tensor | None = None) -> dict[str, Any]:
    """Train ``model`` in place with ``criterion`` and return the EMA model and diagnostics.

    Args:
        model: any module mapping a batch of inputs to ``(N, K)`` logits.
        criterion: the arm's :class:`SimProLoss` (see :func:`make_criterion`).
        x_l, y_l: labeled inputs and labels in ``[0, K)``.
        x_u: unlabeled inputs; ``None`` trains on the labeled set only (the supervised arm).
        augment: ``augment(x, strong=bool, generator=g)`` returning a view of the batch.
        steps: optimizer steps.
        batch_size: B, labeled batch size.
        mu: μ >= 1, unlabeled batch = μB.
        lr, momentum, weight_decay: SGD (Nesterov); weight decay on parameters with ``dim > 1``.
        update_period: steps between M-steps (the official "epoch" of 500 steps).
        ema_decay: decay of the evaluated EMA model.
        strong_views: strong views per unlabeled sample (official 2).
        seed: seeds the batch order and the augmentations.
        pi_u_true: the true unlabeled prior, for the KL diagnostics only (never used in training).

    Returns:
        ``{"ema_model", "kl_history" [(step, KL(π_u‖π̂_u), KL(π_u‖e))], "mask_rate", "pi_u_hat", "pi_train_hat"}``.
    """
    steps = v.integer(_OWNER, "steps", steps, minimum=1)
    batch_size = v.integer(_OWNER, "batch_size", batch_size, minimum=1)
    mu = v.integer(_OWNER, "mu", mu, minimum=1)
    update_period = v.integer(_OWNER, "update_period", update_period, minimum=1)
    strong_views = v.integer(_OWNER, "strong_views", strong_views, minimum=1)
    v.positive(_OWNER, "lr", lr)
    v.probability(_OWNER, "momentum", momentum, open_high=True)
    v.non_negative(_OWNER, "weight_decay", weight_decay)
    v.probability(_OWNER, "ema_decay", ema_decay, open_high=True)
    if not isinstance(criterion, SimProLoss):
        raise TypeError(f"{_OWNER}: criterion must be a SimProLoss, got {type(criterion).__name__}")
    v.tensor(_OWNER, "y_l", y_l, ndim=1, dtype=torch.long)
    k = criterion.num_classes
    if len(y_l) == 0 or len(x_l) != len(y_l):
        raise ValueError(f"{_OWNER}: x_l and y_l must be non-empty and of equal length, got {len(x_l)}, {len(y_l)}")
    if (y_l < 0).any() or (y_l >= k).any():
        raise ValueError(f"{_OWNER}: labels y_l must lie in [0, {k}), got range [{int(y_l.min())}, {int(y_l.max())}]")
    if x_u is not None and len(x_u) == 0:
        raise ValueError(f"{_OWNER}: the unlabeled set x_u is empty; pass x_u=None for supervised training")

    g = torch.Generator().manual_seed(int(seed))
    dev = x_l.device
    gd = g if dev.type == "cpu" else torch.Generator(device=dev).manual_seed(int(seed))
    ema = copy.deepcopy(model)
    for p in ema.parameters():
        p.requires_grad_(False)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=lr, momentum=momentum, nesterov=momentum > 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: math.cos(7 * math.pi * t / (16 * steps)))
    lab = _Cycler(len(y_l), batch_size, g)
    unl = _Cycler(len(x_u), mu * batch_size, g) if x_u is not None else None
    scale_ratio = max(len(unl), 1) / max(len(lab), 1) if unl is not None else 1.0
    kl_hist: list[tuple[int, float, float]] = []
    masks: list[float] = []
    model.train()
    for step in range(steps):
        il = lab.next()
        xb, yb = x_l[il], y_l[il]
        views = [augment(xb, strong=False, generator=gd), augment(xb, strong=True, generator=gd)]
        nb = len(yb)
        if unl is not None:
            xu = x_u[unl.next()]
            views += [augment(xu, strong=False, generator=gd)]
            views += [augment(xu, strong=True, generator=gd) for _ in range(strong_views)]
        logits = model(torch.cat(views, 0))  # one forward: the BN batch mixes all views (official)
        logits_l = [logits[:nb], logits[nb:2 * nb]]
        if unl is not None:
            lu = logits[2 * nb:].chunk(1 + strong_views)
            q, mask = criterion.pseudo_label(lu[0])
            loss = criterion(logits_l=logits_l, y_l=yb, logits_u=list(lu[1:]), q=q, mask=mask,
                             scale_ratio=scale_ratio)
            masks.append(float(mask.mean()))
        else:
            loss = criterion(logits_l=logits_l, y_l=yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        _ema_update(ema, model, ema_decay)
        if (step + 1) % update_period == 0:
            e = criterion.update_priors()
            if pi_u_true is not None and unl is not None:
                kl_hist.append((step + 1, kl_divergence(pi_u_true, criterion.pi_u.cpu()),
                                kl_divergence(pi_u_true, e.cpu())))
    ema.eval()
    return {"ema_model": ema, "kl_history": kl_hist, "mask_rate": float(np.mean(masks)) if masks else 0.0,
            "pi_u_hat": criterion.pi_u.detach().cpu().clone(), "pi_train_hat": criterion.pi_train.detach().cpu().clone()}


@torch.no_grad()
def class_recall(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, num_classes: int,
                 batch: int = 4096) -> np.ndarray:
    """Per-class recall (%) of ``argmax f(x)`` (the Bayes rule under a uniform test prior)."""
    model.eval()
    pred = torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)])
    rec = np.zeros(num_classes)
    for c in range(num_classes):
        sel = y == c
        rec[c] = float((pred[sel] == c).float().mean()) * 100 if sel.any() else float("nan")
    return rec


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, num_classes: int, head: int = 3,
             tail: int = 3) -> dict[str, Any]:
    """Balanced accuracy (mean per-class recall, %), recall of the ``head`` first / ``tail`` last classes of the
    labeled order, and the per-class recalls."""
    r = class_recall(model, x, y, num_classes=num_classes)
    return {"bal_acc": float(np.nanmean(r)), "head_recall": float(np.nanmean(r[:head])),
            "tail_recall": float(np.nanmean(r[-tail:])), "recall": r.tolist()}
