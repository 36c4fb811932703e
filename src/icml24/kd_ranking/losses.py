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


Reduction = Literal["mean", "sum", "none"]


def _check_pair(name: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    v.tensor(name, "student_logits", student_logits, floating=True)
    v.tensor(name, "teacher_logits", teacher_logits, floating=True)
    if student_logits.ndim not in (2, 3):
        raise ValueError(f"{name}: student_logits must have shape (B, C) or (B, T, V), got "
                         f"{tuple(student_logits.shape)}")
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"{name}: teacher_logits shape {tuple(teacher_logits.shape)} != student_logits shape "
                         f"{tuple(student_logits.shape)}")
    if student_logits.shape[-1] < 2:
        raise ValueError(f"{name}: need C >= 2 classes, got {student_logits.shape[-1]}")


def _rows_and_mask(name: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                   mask: torch.Tensor | None, labels: torch.Tensor | None,
                   ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Flatten ``(B, C)``/``(B, T, V)`` logits to rows ``(N, C)`` and the boolean row mask (None: all rows)."""
    _check_pair(name, student_logits, teacher_logits)
    lead = student_logits.shape[:-1]
    keep = None
    if mask is not None:
        v.tensor(name, "mask", mask)
        if mask.shape != lead:
            raise ValueError(f"{name}: mask must have shape {tuple(lead)} (the logits without the class "
                             f"dimension), got {tuple(mask.shape)}")
        if mask.is_floating_point() or mask.is_complex():
            raise TypeError(f"{name}: mask must be a bool or integer tensor (1 = keep), got {mask.dtype}")
        keep = mask.to(device=student_logits.device, dtype=torch.bool)
    if labels is not None:
        v.tensor(name, "labels", labels)
        if labels.shape != lead:
            raise ValueError(f"{name}: labels must have shape {tuple(lead)}, got {tuple(labels.shape)}")
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise TypeError(f"{name}: labels must be an integer tensor, got {labels.dtype}")
        valid = labels.to(student_logits.device) != ignore_index
        keep = valid if keep is None else keep & valid
    c = student_logits.shape[-1]
    s = student_logits.reshape(-1, c)
    t = teacher_logits.detach().to(student_logits.device).reshape(-1, c)
    keep_rows = None if keep is None else keep.reshape(-1)
    checked = t if keep_rows is None else t[keep_rows]
    if not torch.isfinite(checked).all():
        raise ValueError(f"{name}: teacher_logits contain NaN or inf")
    return s, t, keep_rows


def _reduce(per_row: torch.Tensor, keep: torch.Tensor | None, lead: torch.Size, reduction: str) -> torch.Tensor:
    """Reduce the losses of the kept rows (``per_row`` has one entry per kept row)."""
    if reduction == "none":
        if keep is None:
            return per_row.reshape(lead)
        full = per_row.new_zeros(keep.shape).masked_scatter(keep, per_row)
        return full.reshape(lead)
    if reduction == "sum":
        return per_row.sum()
    return per_row.mean() if per_row.numel() else per_row.sum()


class KLDistillLoss(nn.Module):
    """Vanilla (Hinton) KD: ``tau^2 * mean_i KL(softmax(t_i/tau) || softmax(s_i/tau_s))``.

    Rows ``i`` are the samples of ``(B, C)`` logits or the tokens of ``(B, T, V)`` logits (token-level
    distillation of a language model); ``mask``/``labels == ignore_index`` drop tokens (padding, prompt).

    Args:
        tau: teacher temperature ``tau`` (Hinton et al.: 4).
        student_tau: student temperature ``tau_s``; ``None`` uses ``tau`` (the group's ATS code keeps them
            separate, ``s_tau = 1`` there).
        scale_by_tau2: multiply by ``tau^2`` so gradient magnitudes do not shrink with ``tau``.
        reduction: ``"mean"`` over the kept rows (default; ``batchmean`` for ``(B, C)``), ``"sum"`` over them, or
            ``"none"``: per-row losses of shape ``(B,)`` or ``(B, T)``, 0 at dropped rows.
        ignore_index: label value whose rows are dropped when ``labels`` is given (default -100, as in
            ``F.cross_entropy`` and ``transformers``).

    Raises:
        ValueError: ``tau <= 0`` or ``student_tau <= 0``, unknown ``reduction``; at call time, NaN/inf teacher
            logits in a kept row, a ``mask``/``labels`` shape other than the logits' without the last dimension.
    """

    def __init__(self, *, tau: float = 4.0, student_tau: float | None = None, scale_by_tau2: bool = True,
                 reduction: Reduction = "mean", ignore_index: int = -100) -> None:
        super().__init__()
        self.tau = v.positive("KLDistillLoss", "tau", tau)
        self.student_tau = (self.tau if student_tau is None
                            else v.positive("KLDistillLoss", "student_tau", student_tau))
        self.scale_by_tau2 = bool(scale_by_tau2)
        self.reduction = v.one_of("KLDistillLoss", "reduction", reduction, ("mean", "sum", "none"))
        self.ignore_index = v.integer("KLDistillLoss", "ignore_index", ignore_index)

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, *,
                mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Loss for student logits ``s`` and teacher logits ``t`` of shape ``(B, C)`` or ``(B, T, V)``.

        Args:
            student_logits: ``s``.
            teacher_logits: ``t`` (detached; moved to the student's device and dtype).
            mask: optional ``(B,)``/``(B, T)`` bool or integer mask, 1 = keep (e.g. an attention mask).
            labels: optional ``(B,)``/``(B, T)`` labels; rows equal to ``ignore_index`` are dropped.
        """
        s, t, keep = _rows_and_mask("KLDistillLoss", student_logits, teacher_logits, mask, labels,
                                    self.ignore_index)
        if keep is not None:
            s, t = s[keep], t[keep]  # dropped rows (padding) cost nothing and cannot poison the gradient
        log_q = F.log_softmax(s / self.student_tau, dim=1)
        log_p = F.log_softmax(t.to(dtype=log_q.dtype) / self.tau, dim=1)
        per_row = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(1)
        per_row = per_row * (self.tau**2 if self.scale_by_tau2 else 1.0)
        return _reduce(per_row, keep, student_logits.shape[:-1], self.reduction)

    def extra_repr(self) -> str:
        return (f"tau={self.tau}, student_tau={self.student_tau}, scale_by_tau2={self.scale_by_tau2}, "
                f"reduction={self.reduction!r}")


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
    all), and ListMLE sums the first ``K`` positions. The pairwise kinds gather the ``K`` top rows, so they
    cost O(N·K·C) memory and time for N rows (O(N·C²) without ``top_k``): use ``top_k`` for large vocabularies.

    Rows are the samples of ``(B, C)`` logits or the tokens of ``(B, T, V)`` logits; ``mask`` (1 = keep, e.g.
    an attention mask) and ``labels == ignore_index`` drop rows.

    Args:
        kind: ``"pairwise"`` (default), ``"listmle"`` or ``"kendall_soft"``.
        top_k: ``K``, or ``None`` for all ``C`` classes. Must be in ``[1, C]`` (checked at call time).
        tau_s: student temperature ``tau_s > 0`` (margin scale of the student's logits).
        reduction: ``"mean"`` over kept rows (default), ``"sum"``, or ``"none"`` (shape ``(B,)``/``(B, T)``, 0 at
            dropped rows).
        ignore_index: label value whose rows are dropped when ``labels`` is given (default -100).

    Raises:
        ValueError: unknown ``kind`` or ``reduction``, ``top_k < 1`` or ``tau_s <= 0``.
    """

    def __init__(self, *, kind: Literal["pairwise", "listmle", "kendall_soft"] = "pairwise",
                 top_k: int | None = None, tau_s: float = 1.0, reduction: Reduction = "mean",
                 ignore_index: int = -100) -> None:
        super().__init__()
        v.one_of("RankingKDLoss", "kind", kind, RANKING_KINDS)
        if top_k is not None:
            top_k = v.integer("RankingKDLoss", "top_k", top_k, minimum=1)
        self.kind = kind
        self.top_k = top_k
        self.tau_s = v.positive("RankingKDLoss", "tau_s", tau_s)
        self.reduction = v.one_of("RankingKDLoss", "reduction", reduction, ("mean", "sum", "none"))
        self.ignore_index = v.integer("RankingKDLoss", "ignore_index", ignore_index)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, top_k={self.top_k}, tau_s={self.tau_s}, reduction={self.reduction!r}"

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, *,
                mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Loss for student logits ``s`` and teacher logits ``t`` of shape ``(B, C)`` or ``(B, T, V)``.

        Args:
            student_logits: ``s``.
            teacher_logits: ``t`` (detached; only its order is used).
            mask: optional ``(B,)``/``(B, T)`` bool or integer mask, 1 = keep (e.g. an attention mask).
            labels: optional ``(B,)``/``(B, T)`` labels; rows equal to ``ignore_index`` are dropped.
        """
        _check_pair("RankingKDLoss", student_logits, teacher_logits)
        c = student_logits.shape[-1]
        k = c if self.top_k is None else self.top_k
        if k > c:
            raise ValueError(f"RankingKDLoss: top_k ({k}) must be <= number of classes ({c})")
        s, t, keep = _rows_and_mask("RankingKDLoss", student_logits, teacher_logits, mask, labels,
                                    self.ignore_index)
        if keep is not None:
            s, t = s[keep], t[keep]  # dropped rows (padding) cost nothing
        return _reduce(self._per_row(s, t, k), keep, student_logits.shape[:-1], self.reduction)

    def _per_row(self, s: torch.Tensor, t: torch.Tensor, k: int) -> torch.Tensor:
        c = s.shape[1]
        s = s / self.tau_s
        order = torch.argsort(t, dim=1, descending=True, stable=True)  # teacher order pi (descending, stable)
        if self.kind == "listmle":
            s_pi = s.gather(1, order)
            # reverse cumulative logsumexp: lse[r] = logsumexp_{q >= r} s_pi[q]
            lse = torch.logcumsumexp(s_pi.flip(1), dim=1).flip(1)
            return (lse[:, :k] - s_pi[:, :k]).mean(1)
        if k < c:  # only the teacher's top-K classes can be the higher member of a pair: (N, K, C) tensors
            top = order[:, :k]
            s_hi, t_hi = s.gather(1, top), t.gather(1, top)
        else:
            s_hi, t_hi = s, t
        above = t_hi[:, :, None] > t[:, None, :]  # (N, K, C): class j (a top class) strictly above class k
        diff = s_hi[:, :, None] - s[:, None, :]  # s_j - s_k
        if self.kind == "pairwise":
            per_pair = F.softplus(-diff)
        else:  # kendall_soft
            per_pair = 1.0 - torch.tanh(diff)
        per_pair = torch.where(above, per_pair, torch.zeros_like(per_pair))
        n_pairs = above.sum(dim=(1, 2))
        return per_pair.sum(dim=(1, 2)) / n_pairs.clamp_min(1).to(per_pair.dtype)


def distill(student: nn.Module, teacher: nn.Module | Callable[[torch.Tensor], torch.Tensor] | None,
            loader: Iterable, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, *,
            epochs: int = 1, kd_weight: float = 0.5, optimizer: torch.optim.Optimizer | None = None,
            lr: float = 1e-3, device: str | torch.device | None = None) -> dict[str, list[float]]:
    """Train ``student`` by ``L = (1 - lambda) * CE(y, s) + lambda * L_kd(s, t)`` (in place).

    Args:
        student: the model being trained (``train()`` during the loop; its previous mode is restored after).
        teacher: a frozen model or callable giving teacher logits for a batch ``x`` (run under ``no_grad``;
            an ``nn.Module`` is put in ``eval()`` for the loop and every submodule's mode restored after), or ``None`` when ``loader`` yields ``(x, y, t)`` with
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
    lam = float(kd_weight) if loss is not None else 0.0
    hist: dict[str, list[float]] = {"loss": [], "ce": [], "kd": []}
    was_training = student.training
    teacher_modes = ([(m, m.training) for m in teacher.modules()] if isinstance(teacher, nn.Module)
                     and teacher is not student else [])
    if isinstance(teacher, nn.Module):
        teacher.eval()
    student.train()
    try:
        _distill_loop(student, teacher, loader, loss, epochs=epochs, lam=lam, opt=opt, dev=dev, hist=hist)
    finally:
        student.train(was_training)
        for m, mode in teacher_modes:  # every submodule's own flag, as the caller left it
            m.training = mode
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
