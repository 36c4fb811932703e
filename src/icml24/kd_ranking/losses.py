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

import warnings
from collections.abc import Callable, Iterable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from icml24.common import validate as v

__all__ = ["KLDistillLoss", "RankingKDLoss", "RANKING_KINDS", "AUTO_TOP_K", "AUTO_TOP_K_ABOVE", "distill"]

RANKING_KINDS = ("pairwise", "listmle", "kendall_soft")

#: ``top_k="auto"`` keeps every class up to this many classes ``C`` (all pairs: C = 1000 costs ~C²/2 = 5e5
#: pair terms per row) and switches the pairwise kinds to the teacher's top :data:`AUTO_TOP_K` above it.
AUTO_TOP_K_ABOVE = 1024
#: the ``K`` that ``top_k="auto"`` picks above :data:`AUTO_TOP_K_ABOVE` classes (K·C pair terms per row: at
#: V = 32k about the cost of all pairs at C = 1000; see ``benchmarks/kd_ranking_pairwise_cost.py``).
AUTO_TOP_K = 16
#: default ``chunk_size``: pair terms evaluated at once (a few 4 MiB float32 buffers per chunk).
DEFAULT_CHUNK = 2**20


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


def _top_indices(t: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(n, k)`` of each row's top-``k`` teacher classes; ties at the boundary go to the lower index.

    The same set as the first ``k`` of a stable descending argsort, without sorting all ``C`` classes.
    """
    kth = t.topk(k, dim=1, sorted=False).values.amin(1, keepdim=True)
    gt = t > kth
    eq = t == kth
    fill = eq & (eq.cumsum(1) <= k - gt.sum(1, keepdim=True))  # the lowest-index ties fill the last places
    return (gt | fill).nonzero()[:, 1].view(t.shape[0], k)


def _pair_pass(s: torch.Tensor, t: torch.Tensor, k: int, kind: str, chunk: int,
               want_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunked pass over the pairs ``(j, k)``, ``j`` among the teacher's top ``k``, ``t_j > t_k``.

    Returns the per-row sum of ``phi(s_j - s_k)``, the per-row pair count and, with ``want_grad``, the
    gradient of each row's sum with respect to its row of ``s`` (computed in the same sweep: the loss is a
    per-row sum, so the backward only rescales it). At most about ``chunk`` pair terms exist at once.
    With ``4k > C`` the rows are sorted by the teacher (stable): the pair ``(r, q)`` of sorted positions needs
    ``q > r``, so a block of top positions ``[r0, r1)`` only meets the columns ``q >= r0`` (blocks of ``k/8``
    positions: about 56% of the ``k·C`` terms); otherwise the top ``k`` are selected without a sort and meet
    every column.
    """
    n, c = s.shape
    acc = torch.float32 if s.dtype in (torch.float16, torch.bfloat16) else s.dtype
    sort = 4 * k > c
    r_block = max(1, min(k, chunk // c, -(-k // 8) if sort else k))
    rows = max(1, chunk // (r_block * c))
    pairwise = kind == "pairwise"
    total = torch.zeros(n, dtype=acc, device=s.device)
    count = torch.zeros(n, dtype=torch.long, device=s.device)
    grad = torch.zeros(n, c, dtype=acc, device=s.device) if want_grad else None

    def terms(s_hi: torch.Tensor, s_col: torch.Tensor, off: torch.Tensor | None, g: torch.Tensor | None,
              hi_slice: slice | torch.Tensor, col0: int, row: slice) -> None:
        """Add the terms of the pairs (hi, col) (``off``: pairs that are not pairs, or None) to total/g."""
        d = s_col[:, None, :] - s_hi[:, :, None]  # s_k - s_j
        # pairwise: softplus(-(s_j - s_k)); kendall_soft: 1 - tanh(s_j - s_k) = 1 + tanh(s_k - s_j)
        val = F.softplus(d) if pairwise else torch.tanh(d).add_(1.0)
        if off is not None:
            val.masked_fill_(off, 0.0)
        total[row] += val.sum((1, 2), dtype=acc)
        if g is None:
            return
        # w = -phi'(s_j - s_k) >= 0: sigmoid(s_k - s_j), resp. 1 - tanh^2(s_k - s_j)
        w = torch.sigmoid(d) if pairwise else 1.0 - torch.tanh(d).square_()
        if off is not None:
            w.masked_fill_(off, 0.0)
        g[:, col0:col0 + s_col.shape[1]] += w.sum(1, dtype=acc)  # d/ds_k = +w
        if isinstance(hi_slice, slice):
            g[:, hi_slice] -= w.sum(2, dtype=acc)  # d/ds_j = -w
        else:
            g.scatter_add_(1, hi_slice, -w.sum(2, dtype=acc))

    for a in range(0, n, rows):
        row = slice(a, a + rows)
        sc, tc = s[row], t[row]
        g = torch.zeros(sc.shape, dtype=acc, device=s.device) if want_grad else None
        if sort:
            order = torch.argsort(tc, dim=1, descending=True, stable=True)
            sc, tc = sc.gather(1, order), tc.gather(1, order)
            # sorted position r is above exactly the positions q >= first_less[r] (a suffix): ties excluded
            n_less = torch.searchsorted(tc.flip(1).contiguous(), tc[:, :k].contiguous(), right=False)
            first_less = c - n_less
            count[row] = n_less.sum(1)
            for r0 in range(0, k, r_block):
                r1 = min(k, r0 + r_block)
                m = int(first_less[:, r0:r1].max())  # >= r1; columns from m on are below every r of the block
                q = torch.arange(r0, m, device=s.device)
                off = q[None, None, :] < first_less[:, r0:r1, None]
                terms(sc[:, r0:r1], sc[:, r0:m], off, g, slice(r0, r1), r0, row)
                if m < c:
                    terms(sc[:, r0:r1], sc[:, m:], None, g, slice(r0, r1), m, row)
            if want_grad:
                grad[row] = torch.empty_like(g).scatter_(1, order, g)  # back to class order
        else:
            top = _top_indices(tc, k)
            for r0 in range(0, k, r_block):
                idx = top[:, r0:r0 + r_block]
                t_hi = tc.gather(1, idx)
                off = t_hi[:, :, None] <= tc[:, None, :]  # (n, R, C): j not strictly above k in the teacher
                count[row] += off.shape[1] * c - off.sum((1, 2))
                terms(sc.gather(1, idx), sc, off, g, idx, 0, row)
            if want_grad:
                grad[row] = g
    return total, count, grad


class _PairwiseRank(torch.autograd.Function):
    """Per-row pairwise ranking loss, chunked: the pair terms are evaluated chunk by chunk and the gradient of
    each row's sum is accumulated in the same sweep, so no ``(N, K, C)`` tensor is ever stored; the backward
    rescales that ``(N, C)`` gradient (no double backward)."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, t: torch.Tensor, k: int, kind: str, chunk: int) -> torch.Tensor:
        total, count, grad = _pair_pass(s, t, k, kind, chunk, ctx.needs_input_grad[0])
        n_pairs = count.clamp_min(1).to(total.dtype)
        ctx.save_for_backward(grad, n_pairs)
        ctx.s_dtype = s.dtype
        return (total / n_pairs).to(s.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        grad, n_pairs = ctx.saved_tensors
        coef = grad_out.to(n_pairs.dtype) / n_pairs
        return (grad * coef[:, None]).to(ctx.s_dtype), None, None, None, None


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
    all; ties at the K-th place go to the lower class index, as in a stable sort), and ListMLE sums the first
    ``K`` positions.

    **Cost.** The pairwise kinds evaluate about ``N·K·C`` pair terms for ``N`` rows (``N·C²/2`` with all
    classes), in chunks of at most ``chunk_size`` terms, forward and backward alike (the backward recomputes
    the terms and is analytic): memory is ``O(N·C + chunk_size)`` whatever ``K`` and ``C``, and the result
    equals the unchunked sum up to floating-point summation order. ``top_k="auto"`` (default) keeps every class
    up to :data:`AUTO_TOP_K_ABOVE` = 1024 classes and uses ``K =`` :data:`AUTO_TOP_K` = 16 above it (a language
    model's vocabulary): the choice is warned once per class count and shown in ``repr``; ``top_k=None``
    (all classes) or an integer overrides it. ListMLE costs ``O(N·C log C)`` and ``"auto"`` keeps all of its
    positions.

    Rows are the samples of ``(B, C)`` logits or the tokens of ``(B, T, V)`` logits; ``mask`` (1 = keep, e.g.
    an attention mask) and ``labels == ignore_index`` drop rows.

    Args:
        kind: ``"pairwise"`` (default), ``"listmle"`` or ``"kendall_soft"``.
        top_k: ``K``; ``None`` for all ``C`` classes; ``"auto"`` (default) for all classes up to
            ``C = 1024`` and ``K = 16`` above. An integer must be in ``[1, C]`` (checked at call time).
        tau_s: student temperature ``tau_s > 0`` (margin scale of the student's logits).
        reduction: ``"mean"`` over kept rows (default), ``"sum"``, or ``"none"`` (shape ``(B,)``/``(B, T)``, 0 at
            dropped rows).
        ignore_index: label value whose rows are dropped when ``labels`` is given (default -100).
        chunk_size: most pair terms evaluated at once by the pairwise kinds (default ``2**20``; memory, not
            the result, depends on it).

    Raises:
        ValueError: unknown ``kind`` or ``reduction``, ``top_k`` not ``None``/``"auto"``/an integer ``>= 1``,
            ``tau_s <= 0``, ``chunk_size < 1``.
    """

    def __init__(self, *, kind: Literal["pairwise", "listmle", "kendall_soft"] = "pairwise",
                 top_k: int | None | Literal["auto"] = "auto", tau_s: float = 1.0, reduction: Reduction = "mean",
                 ignore_index: int = -100, chunk_size: int = DEFAULT_CHUNK) -> None:
        super().__init__()
        v.one_of("RankingKDLoss", "kind", kind, RANKING_KINDS)
        if isinstance(top_k, str):
            if top_k != "auto":
                raise ValueError(f"RankingKDLoss: top_k must be None, 'auto' or an integer >= 1, got {top_k!r}")
        elif top_k is not None:
            top_k = v.integer("RankingKDLoss", "top_k", top_k, minimum=1)
        self.kind = kind
        self.top_k = top_k
        self.tau_s = v.positive("RankingKDLoss", "tau_s", tau_s)
        self.reduction = v.one_of("RankingKDLoss", "reduction", reduction, ("mean", "sum", "none"))
        self.ignore_index = v.integer("RankingKDLoss", "ignore_index", ignore_index)
        self.chunk_size = v.integer("RankingKDLoss", "chunk_size", chunk_size, minimum=1)
        #: the automatic choices made so far, ``{C: K}`` (``top_k="auto"`` only; shown in ``repr``)
        self.auto_top_k: dict[int, int] = {}

    def extra_repr(self) -> str:
        top = repr(self.top_k)
        if self.auto_top_k:
            top += " (chose " + ", ".join(f"top_k={k} at C={c}" for c, k in sorted(self.auto_top_k.items())) + ")"
        return (f"kind={self.kind!r}, top_k={top}, tau_s={self.tau_s}, reduction={self.reduction!r}, "
                f"chunk_size={self.chunk_size}")

    def resolve_top_k(self, num_classes: int) -> int:
        """The ``K`` used at ``C = num_classes`` (``C`` for all classes); an automatic choice is recorded and
        warned once per ``C``."""
        c = num_classes
        if self.top_k is None:
            return c
        if self.top_k != "auto":
            if self.top_k > c:
                raise ValueError(f"RankingKDLoss: top_k ({self.top_k}) must be <= number of classes ({c})")
            return self.top_k
        if self.kind == "listmle" or c <= AUTO_TOP_K_ABOVE:
            return c
        if c not in self.auto_top_k:
            self.auto_top_k[c] = AUTO_TOP_K
            warnings.warn(f"RankingKDLoss: top_k='auto' uses the teacher's top_k={AUTO_TOP_K} classes at C={c} > "
                          f"{AUTO_TOP_K_ABOVE} (all pairs would cost ~C^2/2 = {c * c // 2:.2e} terms per row); "
                          "pass top_k=None for all pairs or an integer to choose", stacklevel=3)
        return self.auto_top_k[c]

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
        k = self.resolve_top_k(student_logits.shape[-1])
        s, t, keep = _rows_and_mask("RankingKDLoss", student_logits, teacher_logits, mask, labels,
                                    self.ignore_index)
        if keep is not None:
            s, t = s[keep], t[keep]  # dropped rows (padding) cost nothing
        return _reduce(self._per_row(s, t, k), keep, student_logits.shape[:-1], self.reduction)

    def _per_row(self, s: torch.Tensor, t: torch.Tensor, k: int) -> torch.Tensor:
        s = s / self.tau_s
        if self.kind == "listmle":
            order = torch.argsort(t, dim=1, descending=True, stable=True)  # teacher order pi
            s_pi = s.gather(1, order)
            # reverse cumulative logsumexp: lse[r] = logsumexp_{q >= r} s_pi[q]
            lse = torch.logcumsumexp(s_pi.flip(1), dim=1).flip(1)
            return (lse[:, :k] - s_pi[:, :k]).mean(1)
        if s.shape[0] == 0:
            return s.new_zeros(0)
        return _PairwiseRank.apply(s, t.to(s.dtype) if t.dtype != s.dtype else t, k, self.kind, self.chunk_size)


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
