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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from icml24.common import validate as v
from icml24.simpro.acr import ACRLoss, DualHeadNet
from icml24.simpro.core import SimProLoss, kl_divergence

__all__ = ["METHODS", "make_criterion", "train_ssl", "evaluate", "class_recall"]

METHODS: tuple[str, ...] = ("supervised", "fixmatch", "fixmatch_la", "acr", "simpro", "simpro_no_em")
_OWNER = "train_ssl"
Augment = Callable[..., torch.Tensor]


def make_criterion(method: str, *, num_classes: int, labeled_counts: Sequence[int], tau: float = 1.0,
                   threshold: float = 0.95, ema_u: float = 0.9, pi_estimate_on: str = "confident",
                   acr_tau: float | None = None, acr_ema_u: float = 0.9, acr_est_start: int = 5
                   ) -> SimProLoss | ACRLoss:
    """The criterion of one arm; all arms but ACR are :class:`SimProLoss` with different switches.

    * ``supervised``: labeled CE only, no adjustment.
    * ``fixmatch``: hard pseudo-labels from softmax(f(A_w x)), no adjustment (τ = 0), priors never updated.
    * ``fixmatch_la``: logit adjustment by the labeled prior everywhere (π̂_u = π̂ = π_l fixed, "assume the
      unlabeled set is consistent"), hard pseudo-labels.
    * ``simpro``: soft Bayes pseudo-labels under π̂_u, losses adjusted by π̂, both estimated by the M-step.
    * ``simpro_no_em``: SimPro with the M-step switched off (π̂_u stays uniform, π̂ stays π_l): the negative
      control that isolates the prior estimation.
    * ``acr``: :class:`~icml24.simpro.acr.ACRLoss` (two heads: train with ``dual_head(model)``), with
      τ1 = τ12 = τ2 = ``acr_tau`` (default: ``tau``), its own per-step estimate of π_u (EMA ``acr_ema_u``) from
      period ``acr_est_start`` on.
    """
    v.one_of(_OWNER, "method", method, METHODS)
    if method == "acr":
        at = tau if acr_tau is None else acr_tau
        return ACRLoss(num_classes=num_classes, labeled_counts=labeled_counts, tau1=at, tau12=at, tau2=at,
                       threshold=threshold, ema_u=acr_ema_u, est_start=acr_est_start)
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


_MISSING: Any = object()


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} elements"
    return f"an object of type {type(x).__name__}"


class _TensorBatches:
    """Batches of in-memory tensors in the order of a :class:`_Cycler` (drawn lazily: the RNG order is fixed)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor | None, batch: int, generator: torch.Generator) -> None:
        self.x, self.y, self.cycler = x, y, _Cycler(len(x), batch, generator)

    def __len__(self) -> int:
        return len(self.cycler)

    def next(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        i = self.cycler.next()
        return self.x[i], (self.y[i] if self.y is not None else None)


class _LoaderBatches:
    """Batches of a DataLoader or any re-iterable, restarted when a pass ends (the official ``train()``), checked
    one by one before they reach the model and moved to ``device``."""

    def __init__(self, source: Iterable[Any], name: str, *, labeled: bool, num_classes: int,
                 device: torch.device) -> None:
        self.source, self.name, self.labeled, self.k, self.dev = source, name, labeled, num_classes, device
        self.it: Iterator[Any] | None = None
        self.total = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        for restart in (False, True):
            if self.it is None or restart:
                self.it = iter(self.source)
            try:
                batch = next(self.it)
                break
            except StopIteration:
                if restart:
                    why = (f"after {self.total} batches: a one-shot iterator (a generator, an iter(...)) is "
                           "exhausted; pass a re-iterable (a DataLoader, a list) or one holding all steps' batches"
                           if self.total else "")
                    raise ValueError(f"{_OWNER}: {self.name} yielded no batches {why}".rstrip()) from None
        where = f"{self.name} batch {self.total}"
        self.total += 1
        if self.labeled:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise TypeError(f"{_OWNER}: {where} must be an (x, y) pair, got {_describe(batch)}")
            x, y = batch
            v.tensor(_OWNER, f"{where}: y", y, ndim=1, dtype=torch.long)
        else:  # a tensor, or a tuple/list whose first element is x (e.g. TensorDataset(x_u); any label is ignored)
            x, y = (batch[0] if isinstance(batch, (tuple, list)) and len(batch) > 0 else batch), None
        v.tensor(_OWNER, f"{where}: x", x)
        if x.dim() == 0 or len(x) == 0:
            raise ValueError(f"{_OWNER}: {where} is empty (x has shape {tuple(x.shape)})")
        if y is not None:
            if len(y) != len(x):
                raise ValueError(f"{_OWNER}: {where} has {len(x)} inputs but {len(y)} labels")
            if (y < 0).any() or (y >= self.k).any():
                raise ValueError(f"{_OWNER}: {where}: labels must lie in [0, {self.k}), got range "
                                 f"[{int(y.min())}, {int(y.max())}]")
            y = y.to(self.dev, non_blocking=True)
        return x.to(self.dev, non_blocking=True), y


def _check_source(source: Any, name: str) -> Iterable[Any]:
    if isinstance(source, torch.Tensor):
        raise TypeError(f"{_OWNER}: {name} must be a DataLoader or an iterable of batches, got a tensor; pass "
                        "in-memory tensors as x_l, y_l (labeled) or x_u (unlabeled)")
    if isinstance(source, Dataset) and not isinstance(source, IterableDataset):
        raise TypeError(f"{_OWNER}: {name} is a map-style Dataset ({type(source).__name__}), whose items are single "
                        "samples; wrap it in a torch.utils.data.DataLoader(..., batch_size=...) to get batches")
    if not isinstance(source, Iterable):
        raise TypeError(f"{_OWNER}: {name} must be a DataLoader or an iterable of batches, got {_describe(source)}")
    return source


def _batches_per_pass(source: Any, name: str) -> int | None:
    try:
        n = len(source)
    except TypeError:  # generators, IterableDataset loaders
        return None
    if n == 0:
        raise ValueError(f"{_OWNER}: {name} has no batches (len 0); with drop_last=True the data must fill one batch")
    return n


def train_ssl(*, model: nn.Module, criterion: SimProLoss | ACRLoss, x_l: torch.Tensor | None = None,
              y_l: torch.Tensor | None = None, x_u: torch.Tensor | None = _MISSING,
              labeled: Iterable[Any] | None = None, unlabeled: Iterable[Any] | None = None, augment: Augment,
              steps: int, batch_size: int | None = None, mu: int | None = None, lr: float = 0.03,
              momentum: float = 0.9, weight_decay: float = 5e-4, update_period: int = 100, ema_decay: float = 0.999,
              strong_views: int = 2, seed: int = 0, scale_ratio: float | None = None,
              pi_u_true: torch.Tensor | None = None) -> dict[str, Any]:
    """Train ``model`` in place with ``criterion`` and return the EMA model and diagnostics.

    The data come as in-memory tensors (``x_l``, ``y_l``, ``x_u``; shuffled batches drawn here, drop_last) or as a
    ``torch.utils.data.DataLoader`` / any re-iterable of batches (``labeled``, ``unlabeled``; used as they come and
    restarted when a pass ends, like the official ``train()``); the two sides may mix. A loader yields raw inputs
    (``augment`` makes the views here), labeled batches as ``(x, y)`` pairs, unlabeled batches as ``x`` or a
    tuple/list whose first element is ``x`` (e.g. from ``TensorDataset(x_u)``). Loader batches are checked one by
    one before they reach the model and moved to the device of the model's parameters.

    Args:
        model: any module mapping a batch of inputs to ``(N, K)`` logits.
        criterion: the arm's :class:`SimProLoss` or :class:`~icml24.simpro.acr.ACRLoss` (see
            :func:`make_criterion`); with ACR the model must be a :class:`~icml24.simpro.acr.DualHeadNet`
            (``dual_head(model)``), its labeled loss uses the weak view only (the strong labeled view is still
            drawn, so every arm sees the same batches and views) and the EMA model predicts with the balanced head.
        x_l, y_l: labeled inputs and labels in ``[0, K)`` (or pass ``labeled``).
        x_u: unlabeled inputs; ``None`` trains on the labeled set only (the supervised arm). Required unless
            ``unlabeled`` is given.
        labeled: a DataLoader (or re-iterable) of ``(x, y)`` batches, instead of ``x_l``, ``y_l``.
        unlabeled: a DataLoader (or re-iterable) of unlabeled batches, instead of ``x_u``.
        augment: ``augment(x, strong=bool, generator=g)`` returning a view of the batch.
        steps: optimizer steps.
        batch_size: B, labeled batch size of tensor inputs (default 32; a loader sets its own).
        mu: μ >= 1, unlabeled batch of tensor inputs = μB (default 4; a loader sets its own).
        lr, momentum, weight_decay: SGD (Nesterov); weight decay on parameters with ``dim > 1``.
        update_period: steps between M-steps (the official "epoch" of 500 steps).
        ema_decay: decay of the evaluated EMA model.
        strong_views: strong views per unlabeled sample (official 2).
        seed: seeds the batch order of tensor inputs and the augmentations.
        scale_ratio: r, unlabeled batches per labeled batch per pass over each set; ``None`` computes it from the
            batches per pass (``len`` of a loader), which an iterable without ``len`` cannot give.
        pi_u_true: the true unlabeled prior, for the KL diagnostics only (never used in training).

    Returns:
        ``{"ema_model", "kl_history" [(step, KL(π_u‖π̂_u), KL(π_u‖e))], "mask_rate", "pi_u_hat", "pi_train_hat"}``.
    """
    steps = v.integer(_OWNER, "steps", steps, minimum=1)
    update_period = v.integer(_OWNER, "update_period", update_period, minimum=1)
    strong_views = v.integer(_OWNER, "strong_views", strong_views, minimum=1)
    v.positive(_OWNER, "lr", lr)
    v.probability(_OWNER, "momentum", momentum, open_high=True)
    v.non_negative(_OWNER, "weight_decay", weight_decay)
    v.probability(_OWNER, "ema_decay", ema_decay, open_high=True)
    if not isinstance(criterion, (SimProLoss, ACRLoss)):
        raise TypeError(f"{_OWNER}: criterion must be a SimProLoss or an ACRLoss, got {type(criterion).__name__}")
    is_acr = isinstance(criterion, ACRLoss)
    if is_acr and not isinstance(model, DualHeadNet):
        raise TypeError(f"{_OWNER}: ACRLoss trains two heads: pass model=dual_head(model) (a DualHeadNet), got "
                        f"{type(model).__name__}")
    k = criterion.num_classes
    # ---- which data source each side uses (tensors xor a loader), and which batch-size knobs apply
    if labeled is not None and (x_l is not None or y_l is not None):
        raise ValueError(f"{_OWNER}: pass the labeled data either as x_l, y_l or as labeled=, not both")
    if labeled is None and (x_l is None or y_l is None):
        raise ValueError(f"{_OWNER}: the labeled data is missing: pass x_l and y_l, or labeled= (a DataLoader)")
    if unlabeled is not None and x_u is not _MISSING and x_u is not None:
        raise ValueError(f"{_OWNER}: pass the unlabeled data either as x_u or as unlabeled=, not both")
    if unlabeled is None and x_u is _MISSING:
        raise TypeError(f"{_OWNER}: pass x_u (unlabeled tensors; None for supervised training) or unlabeled= "
                        "(a DataLoader)")
    x_u = None if x_u is _MISSING else x_u
    with_u = x_u is not None or unlabeled is not None
    if batch_size is not None and labeled is not None and (unlabeled is not None or not with_u):
        raise ValueError(f"{_OWNER}: batch_size sizes tensor inputs only; the labeled loader sets its own batch size")
    if mu is not None and unlabeled is not None:
        raise ValueError(f"{_OWNER}: mu sizes unlabeled tensor batches (μB) only; the unlabeled loader sets its own "
                         "batch size")
    batch_size = v.integer(_OWNER, "batch_size", 32 if batch_size is None else batch_size, minimum=1)
    mu = v.integer(_OWNER, "mu", 4 if mu is None else mu, minimum=1)
    if scale_ratio is not None:
        scale_ratio = v.positive(_OWNER, "scale_ratio", scale_ratio)
    if labeled is None:
        v.tensor(_OWNER, "y_l", y_l, ndim=1, dtype=torch.long)
        v.tensor(_OWNER, "x_l", x_l)
        if len(y_l) == 0 or len(x_l) != len(y_l):
            raise ValueError(f"{_OWNER}: x_l and y_l must be non-empty and of equal length, got {len(x_l)}, "
                             f"{len(y_l)}")
        if (y_l < 0).any() or (y_l >= k).any():
            raise ValueError(f"{_OWNER}: labels y_l must lie in [0, {k}), got range [{int(y_l.min())}, "
                             f"{int(y_l.max())}]")
        dev = x_l.device
    else:
        labeled = _check_source(labeled, "labeled")
        dev = next(model.parameters()).device if any(True for _ in model.parameters()) else torch.device("cpu")
    if x_u is not None:
        v.tensor(_OWNER, "x_u", x_u)
        if len(x_u) == 0:
            raise ValueError(f"{_OWNER}: the unlabeled set x_u is empty; pass x_u=None for supervised training")
    if unlabeled is not None:
        unlabeled = _check_source(unlabeled, "unlabeled")
    if is_acr and x_u is None and unlabeled is None:
        raise ValueError(f"{_OWNER}: ACRLoss needs unlabeled data (x_u or unlabeled=)")
    n_lab = len(x_l) // min(batch_size, len(x_l)) if labeled is None else _batches_per_pass(labeled, "labeled")
    n_unl = (len(x_u) // min(mu * batch_size, len(x_u)) if x_u is not None
             else _batches_per_pass(unlabeled, "unlabeled") if unlabeled is not None else 1)
    if scale_ratio is None:
        if n_lab is None or n_unl is None:
            side = "labeled" if n_lab is None else "unlabeled"
            raise ValueError(f"{_OWNER}: {side} has no len(), so the batches per pass are unknown; pass scale_ratio= "
                             "(unlabeled batches per labeled batch per pass over each set; 1.0 weighs them equally)")
        scale_ratio = n_unl / n_lab if with_u else 1.0

    g = torch.Generator().manual_seed(int(seed))
    gd = g if dev.type == "cpu" else torch.Generator(device=dev).manual_seed(int(seed))
    ema = copy.deepcopy(model)
    for p in ema.parameters():
        p.requires_grad_(False)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=lr, momentum=momentum, nesterov=momentum > 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: math.cos(7 * math.pi * t / (16 * steps)))
    # the tensor path draws its first permutations here, labeled first (the RNG order of every committed run)
    lab: _TensorBatches | _LoaderBatches = (
        _TensorBatches(x_l, y_l, batch_size, g) if labeled is None
        else _LoaderBatches(labeled, "labeled", labeled=True, num_classes=k, device=dev))
    unl: _TensorBatches | _LoaderBatches | None = (
        _TensorBatches(x_u, None, mu * batch_size, g) if x_u is not None
        else _LoaderBatches(unlabeled, "unlabeled", labeled=False, num_classes=k, device=dev)
        if unlabeled is not None else None)
    kl_hist: list[tuple[int, float, float]] = []
    masks: list[float] = []
    model.train()
    for step in range(steps):
        xb, yb = lab.next()
        views = [augment(xb, strong=False, generator=gd), augment(xb, strong=True, generator=gd)]
        nb = len(yb)
        if unl is not None:
            xu = unl.next()[0].to(dev)
            views += [augment(xu, strong=False, generator=gd)]
            views += [augment(xu, strong=True, generator=gd) for _ in range(strong_views)]
        if is_acr:
            # ACR: the labeled weak view and the unlabeled views in one forward (official ``train.py``: the
            # interleaved batch; one forward sees the same BN batch); the strong labeled view is drawn, not used
            f, gb = model.forward_both(torch.cat([views[0], *views[2:]], 0))
            fu, gu = f[nb:].chunk(1 + strong_views), gb[nb:].chunk(1 + strong_views)
            loss = criterion(f_l=f[:nb], g_l=gb[:nb], y_l=yb, f_u_w=fu[0], g_u_w=gu[0], f_u_s=list(fu[1:]),
                             g_u_s=list(gu[1:]))
            with torch.no_grad():
                p1 = torch.softmax((fu[0].float() - criterion.adj_1) / criterion.temperature, -1)
                masks.append(float((p1.max(-1).values >= criterion.threshold).float().mean()))
            logits_l = []
        else:
            logits = model(torch.cat(views, 0))  # one forward: the BN batch mixes all views (official)
            logits_l = [logits[:nb], logits[nb:2 * nb]]
        if is_acr:
            pass
        elif unl is not None:
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
                                kl_divergence(pi_u_true, e.cpu())))  # ACR: e is its current π̂_u
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
