"""Distillation losses for "Revisit the Essence of Distilling Knowledge through Calibration".

Fan, Lu, Li, Zhan, Gan, ICML 2024 (PMLR 235, ``fan24d``); no arXiv version, no official code.

KL-KD matches the teacher's whole tempered distribution, so it depends on the teacher's confidence scale
(calibration)::

    L_KL = tau^2 * mean_i KL( softmax(t_i / tau) || softmax(s_i / tau) )

A ranking loss depends on the teacher only through the order of its logits, hence is exactly invariant to
any strictly increasing map of them (``kappa * t + b``, temperature scaling), e.g. pairwise (RankNet)::

    L_rank = mean_i mean_{(j,k): t_ij > t_ik} softplus( -(s_ij - s_ik) / tau_s )

Student objective (replacement of KL by the ranking loss): ``L = (1 - lambda) * CE(y, s) + lambda * L_kd``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from icml24.common import validate as v

__all__ = ["KLDistillLoss", "RankingKDLoss", "RANKING_KINDS", "distill"]

RANKING_KINDS = ("pairwise", "listmle", "kendall_soft")


def _check_pair(name: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    v.tensor(name, "student_logits", student_logits, floating=True)
    v.tensor(name, "teacher_logits", teacher_logits, floating=True)
    if student_logits.ndim != 2:
        raise ValueError(f"{name}: student_logits must have shape (B, C), got {tuple(student_logits.shape)}")
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"{name}: teacher_logits shape {tuple(teacher_logits.shape)} != student_logits shape "
                         f"{tuple(student_logits.shape)}")
    if student_logits.shape[1] < 2:
        raise ValueError(f"{name}: need C >= 2 classes, got {student_logits.shape[1]}")


class KLDistillLoss(nn.Module):
    """Vanilla (Hinton) KD: ``tau^2 * mean_i KL(softmax(t_i/tau) || softmax(s_i/tau_s))``.

    Args:
        tau: teacher temperature ``tau`` (Hinton et al.: 4).
        student_tau: student temperature ``tau_s``; ``None`` uses ``tau`` (the group's ATS code keeps them
            separate, ``s_tau = 1`` there).
        scale_by_tau2: multiply by ``tau^2`` so gradient magnitudes do not shrink with ``tau``.

    Raises:
        ValueError: ``tau <= 0`` or ``student_tau <= 0``; at call time, NaN/inf teacher logits.
    """

    def __init__(self, *, tau: float = 4.0, student_tau: float | None = None, scale_by_tau2: bool = True) -> None:
        super().__init__()
        self.tau = v.positive("KLDistillLoss", "tau", tau)
        self.student_tau = (self.tau if student_tau is None
                            else v.positive("KLDistillLoss", "student_tau", student_tau))
        self.scale_by_tau2 = bool(scale_by_tau2)

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        """Loss for ``(B, C)`` student logits ``s`` and teacher logits ``t`` (the teacher is detached)."""
        _check_pair("KLDistillLoss", student_logits, teacher_logits)
        if not torch.isfinite(teacher_logits).all():
            raise ValueError("KLDistillLoss: teacher_logits contain NaN or inf")
        log_q = F.log_softmax(student_logits / self.student_tau, dim=1)
        log_p = F.log_softmax(teacher_logits.detach().to(device=log_q.device, dtype=log_q.dtype) / self.tau, dim=1)
        kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
        return kl * (self.tau**2 if self.scale_by_tau2 else 1.0)

    def extra_repr(self) -> str:
        return f"tau={self.tau}, student_tau={self.student_tau}, scale_by_tau2={self.scale_by_tau2}"


class RankingKDLoss(nn.Module):
    """Ranking-based distillation: the student matches the *order* of the teacher's logits, not their scale.

    The paper replaces KL divergence by "a ranking-based loss" but its exact form is not public; this class
    implements three standard ranking losses that all satisfy the paper's stated requirement (insensitivity
    to the teacher's calibration), with ``"pairwise"`` as the default. Each depends on the teacher only
    through strict comparisons ``t_ij > t_ik`` (tied pairs are dropped) and a stable sort, so it is exactly
    invariant (loss and gradients, bit for bit when the order is unchanged) to ``kappa * t + b``,
    ``kappa > 0``, and to temperature scaling.

    Kinds (``s`` = student logits divided by ``tau_s``, ``pi`` = teacher order, descending):

    - ``"pairwise"`` (RankNet): ``mean_{(j,k): t_j > t_k} softplus(-(s_j - s_k))``.
    - ``"listmle"`` (Plackett-Luce likelihood of ``pi``):
      ``(1/K) * sum_{r=1..K} [logsumexp_{q >= r} s_{pi_q} - s_{pi_r}]``.
    - ``"kendall_soft"`` (smoothed Kendall tau): ``1 - mean_{(j,k): t_j > t_k} tanh(s_j - s_k)``, in [0, 2].

    With ``top_k = K`` only pairs whose higher-ranked class is among the teacher's top ``K`` count (top-K vs
    all), and ListMLE sums the first ``K`` positions; this keeps the cost manageable for large ``C``.

    Args:
        kind: ``"pairwise"`` (default), ``"listmle"`` or ``"kendall_soft"``.
        top_k: ``K``, or ``None`` for all ``C`` classes. Must be in ``[1, C]`` (checked at call time).
        tau_s: student temperature ``tau_s > 0`` (margin scale of the student's logits).

    Raises:
        ValueError: unknown ``kind``, ``top_k < 1`` or ``tau_s <= 0``.
    """

    def __init__(self, *, kind: Literal["pairwise", "listmle", "kendall_soft"] = "pairwise",
                 top_k: int | None = None, tau_s: float = 1.0) -> None:
        super().__init__()
        v.one_of("RankingKDLoss", "kind", kind, RANKING_KINDS)
        if top_k is not None:
            v.integer("RankingKDLoss", "top_k", top_k, minimum=1)
        self.kind = kind
        self.top_k = top_k
        self.tau_s = v.positive("RankingKDLoss", "tau_s", tau_s)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, top_k={self.top_k}, tau_s={self.tau_s}"

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch for ``(B, C)`` student logits ``s`` and teacher logits ``t``."""
        _check_pair("RankingKDLoss", student_logits, teacher_logits)
        c = student_logits.shape[1]
        k = c if self.top_k is None else self.top_k
        if k > c:
            raise ValueError(f"RankingKDLoss: top_k ({k}) must be <= number of classes ({c})")
        if not torch.isfinite(teacher_logits).all():
            raise ValueError("RankingKDLoss: teacher_logits contain NaN or inf")
        t = teacher_logits.detach().to(student_logits.device)
        s = student_logits / self.tau_s
        # teacher order pi (descending, stable); rank_of[i, j] = position of class j in pi
        order = torch.argsort(t, dim=1, descending=True, stable=True)
        if self.kind == "listmle":
            s_pi = s.gather(1, order)
            # reverse cumulative logsumexp: lse[r] = logsumexp_{q >= r} s_pi[q]
            lse = torch.logcumsumexp(s_pi.flip(1), dim=1).flip(1)
            return (lse[:, :k] - s_pi[:, :k]).mean(1).mean()
        above = t[:, :, None] > t[:, None, :]  # (B, C, C): class j strictly above class k
        if k < c:
            rank_of = torch.empty_like(order).scatter_(1, order, torch.arange(c, device=t.device).expand_as(order))
            above = above & (rank_of < k)[:, :, None]
        diff = s[:, :, None] - s[:, None, :]  # s_j - s_k
        if self.kind == "pairwise":
            per_pair = F.softplus(-diff)
        else:  # kendall_soft
            per_pair = 1.0 - torch.tanh(diff)
        per_pair = torch.where(above, per_pair, torch.zeros_like(per_pair))
        n_pairs = above.sum(dim=(1, 2))
        per_sample = per_pair.sum(dim=(1, 2)) / n_pairs.clamp_min(1).to(per_pair.dtype)
        return per_sample.mean()


def distill(student: nn.Module, teacher: nn.Module | Callable[[torch.Tensor], torch.Tensor] | None,
            loader: Iterable, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, *,
            epochs: int = 1, kd_weight: float = 0.5, optimizer: torch.optim.Optimizer | None = None,
            lr: float = 1e-3, device: str | torch.device | None = None) -> dict[str, list[float]]:
    """Train ``student`` by ``L = (1 - lambda) * CE(y, s) + lambda * L_kd(s, t)`` (in place).

    Args:
        student: the model being trained (``train()`` during the loop; its previous mode is restored after).
        teacher: a frozen model or callable giving teacher logits for a batch ``x`` (run under ``no_grad``;
            an ``nn.Module`` is put in ``eval()``), or ``None`` when ``loader`` yields ``(x, y, t)`` with
            precomputed teacher logits ``t``. Unused (and may be ``None``) when ``loss`` is ``None``.
        loader: re-iterable of ``(x, y)`` (or ``(x, y, t)``) batches, iterated once per epoch.
        loss: a KD loss ``L_kd(student_logits, teacher_logits)`` such as :class:`KLDistillLoss` or
            :class:`RankingKDLoss`; ``None`` trains with CE only.
        epochs: passes over ``loader``.
        kd_weight: ``lambda`` in ``[0, 1]`` (0.5 in the group's ATS code).
        optimizer: optimizer over the student's parameters; ``None`` builds ``Adam(lr=lr)``.
        lr: Adam learning rate when ``optimizer`` is ``None``.
        device: where batches are moved; ``None`` uses the device of the student's parameters.

    Returns:
        ``{"loss": [...], "ce": [...], "kd": [...]}``, per-epoch means.

    Raises:
        TypeError: ``student`` not an ``nn.Module``, ``teacher``/``loss`` not callable, ``kd_weight`` not a
            real number, non-integer labels.
        ValueError: ``epochs < 1``, ``kd_weight`` outside ``[0, 1]``, ``lr <= 0``, labels outside ``[0, C)``
            (checked on the first batch), an empty loader.
    """
    if not isinstance(student, nn.Module):
        raise TypeError(f"distill: student must be an nn.Module, got {type(student).__name__}")
    if teacher is not None and not callable(teacher):
        raise TypeError(f"distill: teacher must be an nn.Module, a callable or None, got {type(teacher).__name__}")
    if loss is not None and not callable(loss):
        raise TypeError(f"distill: loss must be callable or None, got {type(loss).__name__}")
    v.integer("distill", "epochs", epochs, minimum=1)
    v.probability("distill", "kd_weight", kd_weight)
    if optimizer is None:
        v.positive("distill", "lr", lr)
    params = list(student.parameters())
    if not params:
        raise ValueError("distill: student has no parameters")
    dev = torch.device(device) if device is not None else params[0].device
    opt = optimizer if optimizer is not None else torch.optim.Adam(params, lr=lr)
    if isinstance(teacher, nn.Module):
        teacher.eval()
    lam = float(kd_weight) if loss is not None else 0.0
    hist: dict[str, list[float]] = {"loss": [], "ce": [], "kd": []}
    was_training = student.training
    student.train()
    try:
        _distill_loop(student, teacher, loader, loss, epochs=epochs, lam=lam, opt=opt, dev=dev, hist=hist)
    finally:
        student.train(was_training)
    return hist


def _distill_loop(student: nn.Module, teacher: Callable[[torch.Tensor], torch.Tensor] | None, loader: Iterable,
                  loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, *, epochs: int, lam: float,
                  opt: torch.optim.Optimizer, dev: torch.device, hist: dict[str, list[float]]) -> None:
    checked = False
    for _ in range(epochs):
        tot = ce_tot = kd_tot = 0.0
        n = 0
        for batch in loader:
            if loss is None or lam == 0.0:
                x, y, t = batch[0].to(dev), batch[1].to(dev), None
            elif teacher is None:
                if len(batch) != 3:
                    raise ValueError("distill: with teacher=None the loader must yield (x, y, teacher_logits)")
                x, y, t = (b.to(dev) for b in batch)
            else:
                x, y = batch[0].to(dev), batch[1].to(dev)
                with torch.no_grad():
                    t = teacher(x)
            s = student(x)
            if not checked:
                if s.ndim != 2:
                    raise ValueError(f"distill: student output must have shape (B, C), got {tuple(s.shape)}")
                if y.dtype in (torch.bool,) or y.is_floating_point() or y.is_complex():
                    raise TypeError(f"distill: labels y must be an integer tensor, got {y.dtype}")
                c = s.shape[1]
                if y.numel() and (int(y.min()) < 0 or int(y.max()) >= c):
                    raise ValueError(f"distill: labels y must be in [0, {c}), got range "
                                     f"[{int(y.min())}, {int(y.max())}]")
                checked = True
            ce = F.cross_entropy(s, y)
            kd = loss(s, t) if t is not None else s.new_zeros(())
            obj = (1.0 - lam) * ce + lam * kd
            opt.zero_grad(set_to_none=True)
            obj.backward()
            opt.step()
            tot += float(obj.detach())
            ce_tot += float(ce.detach())
            kd_tot += float(kd.detach())
            n += 1
        if n == 0:
            raise ValueError("distill: loader yielded no batches")
        hist["loss"].append(tot / n)
        hist["ce"].append(ce_tot / n)
        hist["kd"].append(kd_tot / n)
